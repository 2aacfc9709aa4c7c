//! What every layer of a decoder on the GPU shares: the sizes and options the engine's view
//! gave, checked once at load.

use synapse_engine::attention::AttnShape;
use synapse_engine::delta_net::DeltaNetShape;
use synapse_engine::model::GateView;
use synapse_engine::ops::{AttnTemp, Rope};

pub(crate) struct Shape {
    pub n_embd: usize,
    pub n_vocab: usize,
    pub eps: f32,
    pub attn: AttnShape,
    /// The distinct RoPEs of the layers (Gemma's local and global ones).
    pub ropes: Vec<Rope>,
    pub gate: GateView,
    pub n_ff: usize,
    /// Multiplies the queries after RoPE.
    pub q_scale: Option<f32>,
    /// Multiplies the queries after that by a factor of their position.
    pub q_temp: Option<AttnTemp>,
    /// LongRoPE: `(short, long, n_ctx_orig)`, see `DecoderView::rope_long`.
    pub rope_long: Option<(Rope, Rope, usize)>,
    /// Multiplies each block's output before its residual add.
    pub residual_scale: Option<f32>,
    /// The delta-net layers' shape, where the model has them.
    pub dn: Option<DeltaNetShape>,
    /// Attention layers (each with its KV cache) and delta-net layers (each with its state).
    pub n_attn_layers: usize,
    pub n_dn_layers: usize,
    /// Whether some attention layer's queries come with gates (`wq` twice as tall).
    pub gated: bool,
}

impl Shape {
    /// The RoPE a state of `n_ctx` positions rotates by where a layer's is `rope`.
    pub fn rope_for<'r>(&'r self, rope: &'r Rope, n_ctx: usize) -> &'r Rope {
        match &self.rope_long {
            Some((short, long, orig)) if rope == short && n_ctx > *orig => long,
            _ => rope,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.attn.n_head * self.attn.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.attn.n_head_kv * self.attn.head_dim
    }
}

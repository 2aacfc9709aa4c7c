//! A loaded decoder described for another backend (the GPU's): its shape and its weights where
//! they lie, read-only. The engine keeps every decision about what a file means
//! (hyperparameters, tensor names, RoPE, which optional tensors a layer has); a backend only
//! runs what the view says, and refuses what it does not run.

use synapse_gguf::GgmlType;

use crate::attention::AttnShape;
use crate::delta_net::DeltaNetShape;
use crate::matmul::Matrix;
use crate::ops::{AttnTemp, Rope};

/// A weight matrix: `rows` outputs of `cols` inputs, the file's bytes in its format.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'m> {
    pub name: &'m str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'m [u8],
}

impl<'m> WeightView<'m> {
    pub(crate) fn of(m: &'m Matrix<'_>) -> WeightView<'m> {
        WeightView {
            name: m.name,
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            bytes: m.data(),
        }
    }
}

/// The gate's activation of a layer's feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateView {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GEGLU with ggml's tanh GELU of the argument rounded to F16, rounded to F16.
    Gelu,
}

/// A layer's attention: `Wo · attn(rope(q), rope(k), v)` with `q = Wq · h + bq?` (then a
/// per-head norm), likewise `k`, and `v = Wv · h + bv?`.
#[derive(Debug, Clone)]
pub struct AttentionView<'m> {
    pub wq: WeightView<'m>,
    pub wk: WeightView<'m>,
    pub wv: WeightView<'m>,
    pub wo: WeightView<'m>,
    pub bq: Option<&'m [f32]>,
    pub bk: Option<&'m [f32]>,
    pub bv: Option<&'m [f32]>,
    /// RMSNorm of queries and keys after their biases, before RoPE: per head, or over the
    /// whole vector where the weights are that long (OLMo 2).
    pub q_norm: Option<&'m [f32]>,
    pub k_norm: Option<&'m [f32]>,
    /// `wq` gives each head's query followed by its gate, and each head's output is multiplied
    /// by the sigmoid of its gate before `wo` (Qwen 3.5).
    pub gated: bool,
    /// The RoPE its queries and keys take, if any (Gemma's local and global layers differ).
    pub rope: Option<&'m Rope>,
    /// Keys a query sees, itself included, where the layer's attention is local.
    pub window: Option<usize>,
}

/// A gated delta-net layer (Qwen 3.5): `q, k, v = split(silu(conv1d(Wqkv · h)))` (causal,
/// stateful), `beta = sigmoid(Wbeta · h)`, `g = softplus(Walpha · h + dt_bias) * a`, the gated
/// delta rule over L2-normed `q`, `k` per value head (key head `h % n_k_heads`), then
/// `Wout · (norm(o) * silu(Wgate · h))`, the norm per head. The arithmetic is
/// [`crate::delta_net`]'s.
#[derive(Debug, Clone)]
pub struct DeltaNetView<'m> {
    pub shape: DeltaNetShape,
    pub wqkv: WeightView<'m>,
    pub wgate: WeightView<'m>,
    pub wbeta: WeightView<'m>,
    pub walpha: WeightView<'m>,
    pub wout: WeightView<'m>,
    /// `(conv_dim, d_conv)`: each channel's taps, the current input's last.
    pub conv1d: &'m [f32],
    pub dt_bias: &'m [f32],
    /// `-exp(A_log)` per value head.
    pub a: &'m [f32],
    pub norm: &'m [f32],
}

/// What mixes positions in a layer.
#[derive(Debug, Clone)]
pub enum MixerView<'m> {
    Attention(AttentionView<'m>),
    DeltaNet(DeltaNetView<'m>),
}

/// One layer: `x += post_norm?(mixer(norm?(x)))`, then
/// `x += post_norm?(Wdown · (act(Wgate · norm?(x)) * (Wup · norm?(x))))`.
#[derive(Debug, Clone)]
pub struct LayerView<'m> {
    /// RMSNorm of the mixer's input (OLMo 2 has none: the mixer takes `x` itself).
    pub attn_norm: Option<&'m [f32]>,
    pub mixer: MixerView<'m>,
    /// RMSNorm of the mixer's output before its residual add (Gemma).
    pub attn_post_norm: Option<&'m [f32]>,
    /// RMSNorm of the feed-forward block's input (none in OLMo 2).
    pub ffn_norm: Option<&'m [f32]>,
    pub gate: WeightView<'m>,
    pub up: WeightView<'m>,
    pub down: WeightView<'m>,
    /// RMSNorm of the feed-forward block's output before its residual add (Gemma).
    pub ffn_post_norm: Option<&'m [f32]>,
}

/// A decoder (llama, SmolLM2, Mistral, Qwen 2 and 3, Granite, Phi-3, Gemma 2 and 3, OLMo 2,
/// the Qwen 3.5 hybrid):
/// `x = token_embd[token] * embd_scale?`, the layers,
/// `logits = softcap?(output · norm(x) + bias?) / logit_scale?`.
#[derive(Debug, Clone)]
pub struct DecoderView<'m> {
    pub arch: &'m str,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub eps: f32,
    pub attn: AttnShape,
    pub gate: GateView,
    pub tok_embd: WeightView<'m>,
    pub layers: Vec<LayerView<'m>>,
    pub output_norm: &'m [f32],
    pub output: WeightView<'m>,
    pub output_bias: Option<&'m [f32]>,
    /// Multiplies the token embeddings.
    pub embd_scale: Option<f32>,
    /// Multiplies each block's output before its residual add.
    pub residual_scale: Option<f32>,
    /// Multiplies the queries after RoPE (attention then scales by `attn.scale`).
    pub q_scale: Option<f32>,
    /// Divides the logits.
    pub logit_scale: Option<f32>,
    /// Soft-caps the logits: `cap * tanh(logit / cap)` (Gemma 2).
    pub logit_softcap: Option<f32>,
    /// Multiplies the queries after RoPE (and `q_scale`) by a factor of their position
    /// (Mistral 3's attention temperature).
    pub q_temp: Option<AttnTemp>,
    /// LongRoPE (Phi-3): `(short, long, n_ctx_orig)`, a state of more than `n_ctx_orig`
    /// positions rotates by `long` wherever a layer's RoPE is `short`.
    pub rope_long: Option<(&'m Rope, &'m Rope, usize)>,
}

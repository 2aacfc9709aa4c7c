//! The pre-norm decoder that llama, Qwen2 and Qwen3 share: a stack of [`DecoderLayer`]s between
//! the token embedding and the output head. An architecture of this family is a loader that
//! makes a [`DecoderSpec`] of its checked hyperparameters ([`Common`]).
//!
//! ```text
//! x = token_embd[token]
//! per layer:  x += Wo · attn(rope(qk_norm?(Wq · norm(x) + bq?)), rope(qk_norm?(Wk · norm(x) + bk?)),
//!                            Wv · norm(x) + bv?)
//!             x += Wdown · (silu(Wgate · norm(x)) * (Wup · norm(x)))
//! logits = Woutput · norm(x) + b?      (Woutput = token_embd when the file has no output.weight)
//! ```

use synapse_gguf::GgufFile;

use super::batch::{embed_runs, logit_rows};
use super::blocks::{
    add_bias_rows, embed, matrix, optional_vector, output_logits, output_matrix, Activation,
    DecoderLayer, FeedForward, LayerCtx, LayerSpec,
};
use super::hparams::{Common, MoeParams};
use super::{
    attn_shape, vector, DecoderView, ForwardBody, GateView, LayerView, Logits, MixerView,
    ModelInfo, Scratch, ScratchDims, Seq, State, WeightView,
};
use crate::attention::AttnShape;
use crate::matmul::{Matrix, Threads};
use crate::ops::{AttnTemp, Rope};
use crate::ModelError;

/// What distinguishes one architecture of the family.
pub(crate) struct DecoderSpec {
    pub arch: &'static str,
    /// The hyperparameters, checked.
    pub hp: Common,
    pub rope: Rope,
    /// LongRoPE's other factors (Phi-3): the RoPE a state of more positions than the model's
    /// original context takes instead of `rope`.
    pub rope_long: Option<LongRope>,
    /// Per-head RMSNorm of queries and keys before RoPE (`attn_{q,k}_norm`).
    pub qk_norm: bool,
    /// Every layer's feed-forward block a mixture of these experts, where it is one.
    pub moe: Option<MoeParams>,
    /// The gate's activation (SwiGLU, or gpt-oss's clamped form).
    pub act: Activation,
    /// A sliding window of this many keys on the layers flagged (gpt-oss).
    pub window: Option<(usize, Vec<bool>)>,
    /// The output projection's bias and the heads' attention sinks (gpt-oss).
    pub out_bias_and_sinks: bool,
    /// The name of the feed-forward block's norm (`ffn_norm`; gpt-oss's `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// Scales and RoPE-less layers some members of the family add.
    pub extras: Extras,
}

impl DecoderSpec {
    /// The llama layer's: SwiGLU, every key seen, no output bias or sinks, `ffn_norm`.
    pub fn llama_layer(
        arch: &'static str,
        hp: Common,
        rope: Rope,
        qk_norm: bool,
        moe: Option<MoeParams>,
    ) -> DecoderSpec {
        DecoderSpec {
            arch,
            hp,
            rope,
            rope_long: None,
            qk_norm,
            moe,
            act: Activation::Silu,
            window: None,
            out_bias_and_sinks: false,
            ffn_norm: "ffn_norm",
            extras: Extras::default(),
        }
    }
}

/// The RoPE of a LongRoPE model's long contexts.
pub(crate) struct LongRope {
    pub rope: Rope,
    /// The original context: states of more positions take [`LongRope::rope`], as llama.cpp
    /// chooses by the context of each sequence.
    pub n_ctx_orig: usize,
}

/// What some members of the family add to the llama layer; the default adds nothing.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Extras {
    /// Every `n`-th layer (the `n`-th, `2n`-th, ...) takes no RoPE (SmolLM3's NoPE layers).
    pub nope_every: Option<usize>,
    /// No layer takes RoPE (Granite's `rope.scaling.finetuned = false`).
    pub no_rope: bool,
    /// Multiplies the token embeddings (Granite).
    pub embd_scale: Option<f32>,
    /// Multiplies each block's output before its residual add (Granite).
    pub residual_scale: Option<f32>,
    /// Multiplies `q . k` instead of `1 / sqrt(head_dim)` (Granite's `attention.scale`).
    pub attn_scale: Option<f32>,
    /// Divides the logits (Granite's `logit_scale`: they are multiplied by its f32 inverse).
    pub logit_scale: Option<f32>,
    /// Multiplies the queries after RoPE, attention then scaling by 1 (Phi-3's
    /// `1 / sqrt(head_dim)`, a separate f32 product as llama.cpp's graph has it).
    pub q_scale: Option<f32>,
    /// Multiplies the queries after RoPE by a factor of their position (Mistral 3's
    /// `attention.temperature_scale`).
    pub q_temp: Option<AttnTemp>,
}

pub struct Decoder<'a> {
    info: ModelInfo,
    n_ff: usize,
    moe: Option<MoeParams>,
    act: Activation,
    extras: Extras,
    eps: f32,
    attn: AttnShape,
    rope: Rope,
    rope_long: Option<LongRope>,
    tok_embd: Matrix<'a>,
    layers: Vec<DecoderLayer<'a>>,
    output_norm: Vec<f32>,
    output: Matrix<'a>,
    output_bias: Option<Vec<f32>>,
    tap: crate::Tap,
}

impl<'a> Decoder<'a> {
    pub(crate) fn load(file: &'a GgufFile, spec: DecoderSpec) -> Result<Decoder<'a>, ModelError> {
        let dims = &spec.hp.dims;
        let n_embd = dims.n_embd;
        let mut attn = attn_shape(dims.n_head, dims.n_head_kv, dims.head_dim);
        if let Some(scale) = spec.extras.attn_scale {
            attn.scale = scale;
        }
        if spec.extras.q_scale.is_some() {
            attn.scale = 1.0;
        }
        let x = spec.extras;
        let rotates = |l: usize| !x.no_rope && x.nope_every.is_none_or(|n| (l + 1) % n != 0);
        let tok_embd = matrix(file, "token_embd.weight", n_embd, Some(spec.hp.n_vocab))?;
        let n_vocab = tok_embd.rows;
        let layer_spec = LayerSpec {
            qk_norm: spec.qk_norm,
            out_bias_and_sinks: spec.out_bias_and_sinks,
            ffn_norm: spec.ffn_norm,
            moe: spec.moe.as_ref(),
        };
        let window = |l: usize| match &spec.window {
            Some((w, local)) if local[l] => Some(*w),
            _ => None,
        };
        let layers = (0..dims.n_layer)
            .map(|i| {
                let layer = DecoderLayer::load(file, i, dims, &attn, &layer_spec);
                layer.map(|l| DecoderLayer {
                    rotates: rotates(i),
                    window: window(i),
                    ..l
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Decoder {
            info: ModelInfo::new(
                spec.arch,
                n_vocab,
                spec.hp.n_ctx_train,
                n_embd,
                dims.n_layer,
            ),
            // A mixture's layers have no dense block to size the scratch for.
            n_ff: spec.moe.map_or(dims.n_ff, |p| p.n_ff_exp),
            moe: spec.moe,
            act: spec.act,
            extras: spec.extras,
            eps: spec.hp.eps,
            attn,
            rope: spec.rope,
            rope_long: spec.rope_long,
            tok_embd: tok_embd.clone(),
            layers,
            output_norm: vector(file, "output_norm.weight", n_embd)?,
            output: output_matrix(file, tok_embd, n_embd)?,
            output_bias: optional_vector(file, "output.bias", n_vocab)?,
            tap: crate::Tap::configured(),
        })
    }
}

impl Decoder<'_> {
    /// The RoPE of a state of `n_ctx` positions.
    fn rope_for(&self, n_ctx: usize) -> &Rope {
        match &self.rope_long {
            Some(long) if n_ctx > long.n_ctx_orig => &long.rope,
            _ => &self.rope,
        }
    }

    /// The token embeddings times the model's embedding scale, where it has one (ggml's
    /// `ggml_scale`: one f32 product each).
    #[inline(always)]
    fn scale_embeddings(&self, x: &mut [f32]) {
        if let Some(scale) = self.extras.embd_scale {
            x.iter_mut().for_each(|v| *v *= scale);
        }
    }

    /// The logits of the last `rows` of the `n` rows of `s.x`, the output bias added.
    #[inline(always)]
    fn logits(&self, s: &mut Scratch, n: usize, rows: usize, out: &mut [f32], threads: &Threads) {
        let (norm, eps) = (&self.output_norm, self.eps);
        output_logits(norm, eps, &self.output, s, n, rows, out, threads);
        if let Some(b) = &self.output_bias {
            add_bias_rows(out, b, rows);
        }
        if let Some(scale) = self.extras.logit_scale {
            let inv = 1.0 / scale;
            out[..rows * self.info.n_vocab]
                .iter_mut()
                .for_each(|v| *v *= inv);
        }
    }
}

impl ForwardBody for Decoder<'_> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError> {
        State::for_decoder(&self.info, &self.attn, self.n_ff, self.moe, n_ctx, n_batch)
    }

    fn matrices(&self) -> Vec<&Matrix<'_>> {
        let layers = self.layers.iter();
        let per_layer = layers.flat_map(|l| l.attn.matrices().into_iter().chain(l.ffn.matrices()));
        per_layer.chain([&self.output]).collect()
    }

    fn view(&self) -> Option<DecoderView<'_>> {
        let w = WeightView::of;
        let layers = self.layers.iter().map(|l| {
            let FeedForward::Dense(f) = &l.ffn else {
                return None;
            };
            if l.window.is_some() || l.attn.sinks.is_some() || l.attn.bo.is_some() {
                return None;
            }
            Some(LayerView {
                attn_norm: Some(&l.attn_norm),
                mixer: MixerView::Attention(l.attn.view(l.rotates.then_some(&self.rope), None)),
                attn_post_norm: None,
                ffn_norm: Some(&l.ffn_norm),
                gate: w(&f.gate),
                up: w(&f.up),
                down: w(&f.down),
                ffn_post_norm: None,
            })
        });
        Some(DecoderView {
            arch: &self.info.arch,
            n_vocab: self.info.n_vocab,
            n_embd: self.info.n_embd,
            eps: self.eps,
            attn: self.attn,
            gate: GateView::Silu,
            tok_embd: w(&self.tok_embd),
            layers: layers.collect::<Option<Vec<_>>>()?,
            output_norm: &self.output_norm,
            output: w(&self.output),
            output_bias: self.output_bias.as_deref(),
            embd_scale: self.extras.embd_scale,
            residual_scale: self.extras.residual_scale,
            q_scale: self.extras.q_scale,
            logit_scale: self.extras.logit_scale,
            logit_softcap: None,
            q_temp: self.extras.q_temp,
            rope_long: self
                .rope_long
                .as_ref()
                .map(|l| (&self.rope, &l.rope, l.n_ctx_orig)),
        })
    }

    #[inline(always)]
    fn forward_body(
        &self,
        st: &mut State,
        tokens: &[u32],
        logits: Logits,
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError> {
        let n = tokens.len();
        let d = self.info.n_embd;
        let rope = self.rope_for(st.n_ctx());
        let (s, pos0) = (&mut st.s, st.pos);
        embed(&self.tok_embd, tokens, &mut s.x)?;
        self.scale_embeddings(&mut s.x[..n * d]);
        let c = LayerCtx {
            a: &self.attn,
            rope,
            eps: self.eps,
            act: self.act,
            residual_scale: self.extras.residual_scale,
            q_scale: self.extras.q_scale,
            q_temp: self.extras.q_temp,
            threads,
            tap: &self.tap,
        };
        // The last layer goes on only with the rows whose logits are asked for.
        let rows = logits.rows(n);
        let last = self.layers.len().saturating_sub(1);
        // The rows of `s.x` the layers leave.
        let mut left = n;
        for (l, layer) in self.layers.iter().enumerate() {
            let keep = if l == last { rows } else { n };
            layer.forward(&c, l, s, &mut st.kv, pos0, n, keep);
            left = keep;
        }
        st.pos += n;

        if rows > 0 {
            let n_vocab = self.info.n_vocab;
            self.logits(s, left, rows, out, threads);
            let pos = st.pos - rows;
            self.tap.rows("result_norm", 0, pos, &s.h[..rows * d], rows);
            self.tap
                .rows("result_output", 0, pos, &out[..rows * n_vocab], rows);
        }
        Ok(())
    }

    fn batch_dims(&self, n_tokens: usize) -> Option<ScratchDims> {
        Some(ScratchDims {
            moe: self.moe,
            ..ScratchDims::for_decoder(&self.info, &self.attn, self.n_ff, n_tokens)
        })
    }

    #[inline(always)]
    fn forward_runs_body(
        &self,
        seqs: &mut [Seq<'_>],
        s: &mut Scratch,
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError> {
        let d = self.info.n_embd;
        // One RoPE for the pass: LongRoPE's choice must be the same for every sequence.
        let a = seqs.first().map_or(0, |q| q.state.n_ctx());
        let rope = self.rope_for(a);
        if let Some(long) = &self.rope_long {
            let mut contexts = seqs.iter().map(|q| q.state.n_ctx());
            if let Some(b) = contexts.find(|&b| !std::ptr::eq(self.rope_for(b), rope)) {
                let n_ctx_orig = long.n_ctx_orig;
                return Err(ModelError::MixedRopes { a, b, n_ctx_orig });
            }
        }
        let (mut runs, n) = embed_runs(&self.tok_embd, seqs, s)?;
        self.scale_embeddings(&mut s.x[..n * d]);
        // The taps name rows by one sequence's positions: a batched pass has several.
        let off = crate::Tap::default();
        let c = LayerCtx {
            a: &self.attn,
            rope,
            eps: self.eps,
            act: self.act,
            residual_scale: self.extras.residual_scale,
            q_scale: self.extras.q_scale,
            q_temp: self.extras.q_temp,
            threads,
            tap: &off,
        };
        for (l, layer) in self.layers.iter().enumerate() {
            layer.forward_runs(&c, l, s, &mut runs, n);
        }
        drop(runs);
        let rows = logit_rows(seqs, s, d);
        if rows > 0 {
            self.logits(s, rows, rows, out, threads);
        }
        Ok(())
    }
}

//! `olmo2`: OLMo 2, as llama.cpp's `src/models/olmo2.cpp` runs it.
//!
//! ```text
//! x = token_embd[token]
//! per layer:  q, k, v = Wq · x, Wk · x, Wv · x                       (no norm before)
//!             q, k = rope(norm(q)), rope(norm(k))    (RMSNorm over all heads at once)
//!             x += post_attn_norm(Wo · attn(q, k, v))
//!             x += post_ffn_norm(Wdown · (silu(Wgate · x) * (Wup · x)))
//! logits = Woutput · norm(x)
//! ```
//! RoPE rotates halves (NeoX style) of whole heads. OLMo 3's sliding-window layers
//! (`attention.sliding_window`) are not supported. Sequences of a batched pass run one after
//! another.

use synapse_gguf::GgufFile;

use super::blocks::{
    attend_causal, embed, keep_last_rows, layer_matrices, matrix, norm_rows, output_logits,
    rope_and_store, Activation, Attention, Ffn,
};
use super::hparams::{Arch, Common};
use super::{
    attn_shape, vector, AttentionView, DecoderView, GateView, LayerView, Logits, MixerView,
    ModelInfo, State, WeightView,
};
use crate::attention::{AttnShape, LayerAttn};
use crate::matmul::{Matrix, Threads};
use crate::ops::{add_inplace, Rope, RopeStyle};
use crate::ModelError;

struct Layer<'a> {
    attn: Attention<'a>,
    /// RMSNorm weights over the whole query and key vectors (`n_head * head_dim`,
    /// `n_head_kv * head_dim`).
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    attn_post_norm: Vec<f32>,
    ffn: Ffn<'a>,
    ffn_post_norm: Vec<f32>,
}

pub struct Olmo2<'a> {
    info: ModelInfo,
    n_ff: usize,
    eps: f32,
    attn: AttnShape,
    rope: Rope,
    tok_embd: Matrix<'a>,
    layers: Vec<Layer<'a>>,
    output_norm: Vec<f32>,
    output: Matrix<'a>,
    tap: crate::Tap,
}

impl<'a> Olmo2<'a> {
    pub fn load(file: &'a GgufFile) -> Result<Olmo2<'a>, ModelError> {
        let arch = "olmo2";
        let hp = Common::read(
            file,
            &Arch {
                name: arch,
                eps: None,
                n_ctx_train: 4096,
                rope_scalings: &[],
                yarn_keys: false,
                whole_head_rope: true,
                q_rows_per_dim: 1,
                experts: false,
                fused_up: false,
            },
        )?;
        let window = format!("{arch}.attention.sliding_window");
        if file.metadata().get(&window).is_some() {
            return Err(ModelError::Hparams(format!(
                "`{window}`: OLMo 3's sliding-window layers are not supported"
            )));
        }
        let dims = &hp.dims;
        let (n_embd, n_ff) = (dims.n_embd, dims.n_ff);
        let attn = attn_shape(dims.n_head, dims.n_head_kv, dims.head_dim);
        let tok_embd = matrix(file, "token_embd.weight", n_embd, Some(hp.n_vocab))?;
        let n_vocab = tok_embd.rows;
        let mut layers = Vec::with_capacity(dims.n_layer);
        for i in 0..dims.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn: Attention::load(file, i, n_embd, &attn, false)?,
                q_norm: vector(file, &p("attn_q_norm"), dims.q_dim)?,
                k_norm: vector(file, &p("attn_k_norm"), dims.kv_dim)?,
                attn_post_norm: vector(file, &p("post_attention_norm"), n_embd)?,
                ffn: Ffn::load(file, i, n_embd, n_ff)?,
                ffn_post_norm: vector(file, &p("post_ffw_norm"), n_embd)?,
            });
        }
        Ok(Olmo2 {
            info: ModelInfo::new(arch, n_vocab, hp.n_ctx_train, n_embd, dims.n_layer),
            n_ff,
            eps: hp.eps,
            attn,
            rope: hp.rope(RopeStyle::Neox, None),
            output: matrix(file, "output.weight", n_embd, Some(n_vocab))?,
            tok_embd,
            layers,
            output_norm: vector(file, "output_norm.weight", n_embd)?,
            tap: crate::Tap::configured(),
        })
    }
}

impl super::ForwardBody for Olmo2<'_> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError> {
        State::for_decoder(&self.info, &self.attn, self.n_ff, None, n_ctx, n_batch)
    }

    fn matrices(&self) -> Vec<&Matrix<'_>> {
        let layers = self.layers.iter();
        let per_layer = layers.flat_map(|l| layer_matrices(&l.attn, &l.ffn));
        per_layer.chain([&self.output]).collect()
    }

    fn view(&self) -> Option<DecoderView<'_>> {
        let w = WeightView::of;
        let layers = self.layers.iter().map(|l| {
            LayerView {
                attn_norm: None,
                // Its query and key norms are the layer's, over all heads at once.
                mixer: MixerView::Attention(AttentionView {
                    q_norm: Some(&l.q_norm),
                    k_norm: Some(&l.k_norm),
                    ..l.attn.view(Some(&self.rope), None)
                }),
                attn_post_norm: Some(&l.attn_post_norm),
                ffn_norm: None,
                gate: w(&l.ffn.gate),
                up: w(&l.ffn.up),
                down: w(&l.ffn.down),
                ffn_post_norm: Some(&l.ffn_post_norm),
            }
        });
        Some(DecoderView {
            arch: &self.info.arch,
            n_vocab: self.info.n_vocab,
            n_embd: self.info.n_embd,
            eps: self.eps,
            attn: self.attn,
            gate: GateView::Silu,
            tok_embd: w(&self.tok_embd),
            layers: layers.collect(),
            output_norm: &self.output_norm,
            output: w(&self.output),
            output_bias: None,
            embd_scale: None,
            residual_scale: None,
            q_scale: None,
            logit_scale: None,
            logit_softcap: None,
            q_temp: None,
            rope_long: None,
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
        let (d, eps) = (self.info.n_embd, self.eps);
        let a = &self.attn;
        let (q_dim, kv_dim) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let (s, pos0) = (&mut st.s, st.pos);
        let tap = &self.tap;
        embed(&self.tok_embd, tokens, &mut s.x)?;
        // The last layer goes on only with the rows whose logits are asked for.
        let rows = logits.rows(n);
        let last = self.layers.len().saturating_sub(1);
        let mut left = n;
        for (l, layer) in self.layers.iter().enumerate() {
            let keep = if l == last { rows } else { n };
            let (first, m) = (n - keep, keep);
            let p = pos0 + first;
            // No norm before attention: the projections take the residual stream itself.
            s.h[..n * d].copy_from_slice(&s.x[..n * d]);
            layer.attn.qkv(s, (n, first), a, eps, threads, tap, l, pos0);
            norm_rows(&mut s.q, q_dim, m, &layer.q_norm, eps);
            norm_rows(&mut s.k, kv_dim, n, &layer.k_norm, eps);
            crate::profile::mark("norm");
            tap.rows("Qcur_normed", l, p, &s.q[..m * q_dim], m);
            tap.rows("Kcur_normed", l, pos0, &s.k[..n * kv_dim], n);
            rope_and_store(&self.rope, s, &mut st.kv, l, pos0, (n, first), a);
            keep_last_rows(&mut s.x, d, n, keep);
            left = keep;
            if m == 0 {
                continue;
            }
            attend_causal(a, s, &st.kv, l, p, m, LayerAttn::FULL, threads);
            tap.rows("kqv_out", l, p, &s.att[..m * q_dim], m);
            layer.attn.output(s, m, threads);
            norm_rows(&mut s.o, d, m, &layer.attn_post_norm, eps);
            add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
            crate::profile::mark("residual");
            tap.rows("ffn_inp", l, p, &s.x[..m * d], m);
            // No norm before the feed-forward block either.
            s.h[..m * d].copy_from_slice(&s.x[..m * d]);
            layer
                .ffn
                .forward(Activation::Silu, s, m, threads, tap, l, p);
            norm_rows(&mut s.o, d, m, &layer.ffn_post_norm, eps);
            add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
            crate::profile::mark("residual");
            tap.rows("l_out", l, p, &s.x[..m * d], m);
        }
        st.pos += n;
        if rows > 0 {
            let (norm, output) = (&self.output_norm, &self.output);
            output_logits(norm, eps, output, s, left, rows, out, threads);
        }
        Ok(())
    }
}

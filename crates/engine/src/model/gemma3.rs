//! `gemma3`: Gemma 3 (text), as llama.cpp's `src/models/gemma3.cpp` runs it.
//!
//! ```text
//! x = token_embd[token] * sqrt(n_embd)
//! per layer:  q, k, v = Wq · norm(x), Wk · norm(x), Wv · norm(x)
//!             q, k = rope(head_norm(q)) / sqrt(head_dim), rope(head_norm(k))
//!             x += post_norm(Wo · attn(q, k, v))            (local layers: the last 512 keys)
//!             x += post_norm(Wdown · (gelu(Wgate · norm(x)) * (Wup · norm(x))))
//! logits = token_embd · norm(x)                   (soft-capped when the file says so)
//! ```
//! Every norm is RMSNorm with the file's weights: llama.cpp's converter has already added the 1
//! that Gemma's checkpoints leave out. QK-norm is RMSNorm over each head. RoPE rotates halves
//! (NeoX style) with two bases: local (sliding-window) layers use `rope.freq_base_swa` (10000 if
//! absent), global ones `rope.freq_base` and the linear scaling, if any. Five local layers
//! alternate with one global one (`attention.sliding_window_pattern`: a period, 6 if absent, or
//! one flag per layer).
//!
//! `gemma2` (Gemma 2, llama.cpp's `src/models/gemma2.cpp`) is the same layer without QK-norm,
//! its attention scores soft-capped (`50 * tanh(q . k / 50)` by default, as ggml's flash
//! attention computes it), every other layer local (a window of 4096) with the global RoPE base,
//! and its logits soft-capped at 30 by default.
//!
//! The arithmetic follows ggml's order: the embedding scale and the query scale are separate f32
//! multiplications (the query's before its F16 rounding in flash attention, whose own scale is
//! then 1), and GELU is ggml's F16 table lookup ([`geglu`](crate::ops::geglu)).

use synapse_gguf::GgufFile;

use super::batch::{embed_runs, logit_rows};
use super::blocks::{
    attend_causal, attend_runs, embed, keep_last_rows, layer_matrices, matrix, norm_rows,
    output_logits, output_matrix, rope_and_store, rope_and_store_runs, Activation, Attention, Ffn,
};
use super::hparams::Gemma3Params;
use super::{
    vector, DecoderView, GateView, LayerView, Logits, MixerView, ModelInfo, Scratch, ScratchDims,
    Seq, State, WeightView,
};
use crate::attention::{AttnShape, LayerAttn};
use crate::matmul::{Matrix, Threads};
use crate::ops::{add_inplace, rms_norm_rows, scale_inplace, softcap_inplace, Rope, RopeStyle};
use crate::ModelError;

struct Layer<'a> {
    attn_norm: Vec<f32>,
    attn: Attention<'a>,
    attn_post_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    ffn: Ffn<'a>,
    ffn_post_norm: Vec<f32>,
    /// A local layer: attends to the last `window` positions only, with the local RoPE base.
    local: bool,
}

impl Layer<'_> {
    /// The layer after attention, for the `m` rows in `s.att` (positions `p..` for the taps,
    /// layer `l`): the output projection, its post-norm and residual, then the feed-forward
    /// block, its post-norm and residual.
    #[inline(always)]
    fn finish(
        &self,
        s: &mut Scratch,
        (l, p, m): (usize, usize, usize),
        (d, eps): (usize, f32),
        threads: &Threads,
        tap: &crate::Tap,
    ) {
        self.attn.output(s, m, threads);
        tap.rows("attn_out", l, p, &s.o[..m * d], m);
        norm_rows(&mut s.o, d, m, &self.attn_post_norm, eps);
        crate::profile::mark("norm");
        tap.rows("attn_post_norm", l, p, &s.o[..m * d], m);
        add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
        crate::profile::mark("residual");
        tap.rows("sa_out", l, p, &s.x[..m * d], m);

        rms_norm_rows(&s.x[..m * d], &self.ffn_norm, eps, &mut s.h, d);
        crate::profile::mark("norm");
        tap.rows("ffn_norm", l, p, &s.h[..m * d], m);
        self.ffn.forward(Activation::Gelu, s, m, threads, tap, l, p);
        norm_rows(&mut s.o, d, m, &self.ffn_post_norm, eps);
        crate::profile::mark("norm");
        tap.rows("ffn_post_norm", l, p, &s.o[..m * d], m);
        add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
        crate::profile::mark("residual");
        tap.rows("l_out", l, p, &s.x[..m * d], m);
    }
}

pub struct Gemma3<'a> {
    info: ModelInfo,
    n_ff: usize,
    eps: f32,
    /// Attention with scale 1: the query is scaled before it (`q_scale`), as llama.cpp does.
    attn: AttnShape,
    q_scale: f32,
    /// Keys a local layer's query sees, itself included (`attention.sliding_window`).
    window: usize,
    rope_global: Rope,
    rope_local: Rope,
    embd_scale: f32,
    softcap: Option<f32>,
    tok_embd: Matrix<'a>,
    layers: Vec<Layer<'a>>,
    output_norm: Vec<f32>,
    output: Matrix<'a>,
    tap: crate::Tap,
}

impl<'a> Gemma3<'a> {
    /// `arch`: `gemma3`, or `gemma2` (no QK-norm; attention scores soft-capped).
    pub fn load(file: &'a GgufFile, arch: &'static str) -> Result<Gemma3<'a>, ModelError> {
        let g = Gemma3Params::read(file, arch)?;
        let gemma2 = arch == "gemma2";
        let hp = &g.common;
        let dims = &hp.dims;
        let (n_embd, n_layer, n_ff, n_rot) = (dims.n_embd, dims.n_layer, dims.n_ff, dims.n_rot);
        let (n_head, n_head_kv, head_dim) = (dims.n_head, dims.n_head_kv, dims.head_dim);
        let eps = hp.eps;
        let rope_global = hp.rope(RopeStyle::Neox, None);
        // Linear RoPE scaling (Gemma 3 4B and up: 8) stretches the global layers' positions only
        // (llama.cpp's local layers keep `rope_freq_scale_train_swa`, 1).
        let rope_local = Rope {
            base: g.rope_base_local,
            scaling: hp.rope_scaling.rope(n_rot, g.rope_base_local, false),
            ..rope_global.clone()
        };
        // llama.cpp (after gemma_pytorch's config): 27B scales queries by 1/sqrt(n_embd/n_head),
        // the others by 1/sqrt(head_dim).
        let q_scale_dim = if n_layer == if gemma2 { 46 } else { 62 } {
            n_embd / n_head
        } else {
            head_dim
        };

        // Attention with scale 1: the query is scaled before it (`q_scale`), as llama.cpp does.
        // Gemma 2's soft-cap divides flash attention's scale, as ggml's does.
        let attn = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
            scale: g.attn_softcap.map_or(1.0, |cap| 1.0 / cap),
            softcap: g.attn_softcap,
        };
        let tok_embd = matrix(file, "token_embd.weight", n_embd, Some(hp.n_vocab))?;
        let n_vocab = tok_embd.rows;
        // `block_count` is known to number the file's layers.
        let mut layers = Vec::with_capacity(n_layer);
        for (i, &local) in g.local.iter().enumerate() {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(file, &p("attn_norm"), n_embd)?,
                attn: Attention::load(file, i, n_embd, &attn, !gemma2)?,
                attn_post_norm: vector(file, &p("post_attention_norm"), n_embd)?,
                ffn_norm: vector(file, &p("ffn_norm"), n_embd)?,
                ffn: Ffn::load(file, i, n_embd, n_ff)?,
                ffn_post_norm: vector(file, &p("post_ffw_norm"), n_embd)?,
                local,
            });
        }
        let output = output_matrix(file, tok_embd.clone(), n_embd)?;
        Ok(Gemma3 {
            info: ModelInfo::new(arch, n_vocab, hp.n_ctx_train, n_embd, n_layer),
            n_ff,
            eps,
            attn,
            q_scale: 1.0 / (q_scale_dim as f32).sqrt(),
            window: g.window,
            rope_global,
            rope_local,
            embd_scale: (n_embd as f32).sqrt(),
            softcap: g.softcap,
            tok_embd,
            layers,
            output_norm: vector(file, "output_norm.weight", n_embd)?,
            output,
            tap: crate::Tap::configured(),
        })
    }
}

impl super::ForwardBody for Gemma3<'_> {
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
        let layers = self.layers.iter().map(|l| LayerView {
            attn_norm: Some(&l.attn_norm),
            mixer: MixerView::Attention(l.attn.view(
                Some(if l.local {
                    &self.rope_local
                } else {
                    &self.rope_global
                }),
                l.local.then_some(self.window),
            )),
            attn_post_norm: Some(&l.attn_post_norm),
            ffn_norm: Some(&l.ffn_norm),
            gate: w(&l.ffn.gate),
            up: w(&l.ffn.up),
            down: w(&l.ffn.down),
            ffn_post_norm: Some(&l.ffn_post_norm),
        });
        Some(DecoderView {
            arch: &self.info.arch,
            n_vocab: self.info.n_vocab,
            n_embd: self.info.n_embd,
            eps: self.eps,
            attn: self.attn,
            gate: GateView::Gelu,
            tok_embd: w(&self.tok_embd),
            layers: layers.collect(),
            output_norm: &self.output_norm,
            output: w(&self.output),
            output_bias: None,
            embd_scale: Some(self.embd_scale),
            residual_scale: None,
            q_scale: Some(self.q_scale),
            logit_scale: None,
            logit_softcap: self.softcap,
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
        scale_inplace(&mut s.x[..n * d], self.embd_scale);
        tap.rows("inp_scaled", 0, pos0, &s.x[..n * d], n);

        // The last layer goes on only with the rows whose logits are asked for (as
        // `DecoderLayer::forward` does): every row's keys and values, then the last `keep`.
        let rows = logits.rows(n);
        let last = self.layers.len().saturating_sub(1);
        // The rows of `s.x` the layers leave.
        let mut left = n;
        for (l, layer) in self.layers.iter().enumerate() {
            let keep = if l == last { rows } else { n };
            let (first, m) = (n - keep, keep);
            let p = pos0 + first;
            // Attention block.
            rms_norm_rows(&s.x[..n * d], &layer.attn_norm, eps, &mut s.h, d);
            crate::profile::mark("norm");
            tap.rows("attn_norm", l, pos0, &s.h[..n * d], n);
            layer.attn.qkv(s, (n, first), a, eps, threads, tap, l, pos0);
            let (rope, window) = if layer.local {
                (&self.rope_local, Some(self.window))
            } else {
                (&self.rope_global, None)
            };
            rope_and_store(rope, s, &mut st.kv, l, pos0, (n, first), a);
            tap.rows("Qcur", l, p, &s.q[..m * q_dim], m);
            tap.rows("Kcur", l, pos0, &s.k[..n * kv_dim], n);
            tap.rows("Vcur", l, pos0, &s.v[..n * kv_dim], n);
            scale_inplace(&mut s.q[..m * q_dim], self.q_scale);
            crate::profile::mark("rope and KV store");
            keep_last_rows(&mut s.x, d, n, keep);
            left = keep;
            if m == 0 {
                continue;
            }
            attend_causal(a, s, &st.kv, l, p, m, LayerAttn::window(window), threads);
            tap.rows("kqv_out", l, p, &s.att[..m * q_dim], m);
            layer.finish(s, (l, p, m), (d, eps), threads, tap);
        }
        st.pos += n;

        if rows > 0 {
            let n_vocab = self.info.n_vocab;
            output_logits(
                &self.output_norm,
                eps,
                &self.output,
                s,
                left,
                rows,
                out,
                threads,
            );
            if let Some(cap) = self.softcap {
                softcap_inplace(&mut out[..rows * n_vocab], cap);
            }
            let pos = st.pos - rows;
            tap.rows("result_norm", 0, pos, &s.h[..rows * d], rows);
            tap.rows("result_output", 0, pos, &out[..rows * n_vocab], rows);
        }
        Ok(())
    }

    fn batch_dims(&self, n_tokens: usize) -> Option<ScratchDims> {
        Some(ScratchDims::for_decoder(
            &self.info, &self.attn, self.n_ff, n_tokens,
        ))
    }

    #[inline(always)]
    fn forward_runs_body(
        &self,
        seqs: &mut [Seq<'_>],
        s: &mut Scratch,
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError> {
        let (d, eps) = (self.info.n_embd, self.eps);
        let a = &self.attn;
        let q_dim = a.n_head * a.head_dim;
        let (mut runs, n) = embed_runs(&self.tok_embd, seqs, s)?;
        scale_inplace(&mut s.x[..n * d], self.embd_scale);
        // The taps name rows by one sequence's positions: a batched pass has several.
        let off = crate::Tap::default();
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm_rows(&s.x[..n * d], &layer.attn_norm, eps, &mut s.h, d);
            crate::profile::mark("norm");
            layer.attn.qkv(s, (n, 0), a, eps, threads, &off, l, 0);
            let (rope, window) = if layer.local {
                (&self.rope_local, Some(self.window))
            } else {
                (&self.rope_global, None)
            };
            rope_and_store_runs(rope, s, &mut runs, l, a);
            scale_inplace(&mut s.q[..n * q_dim], self.q_scale);
            attend_runs(a, s, &runs, l, LayerAttn::window(window), threads);
            layer.finish(s, (l, 0, n), (d, eps), threads, &off);
        }
        drop(runs);
        let rows = logit_rows(seqs, s, d);
        if rows > 0 {
            output_logits(
                &self.output_norm,
                eps,
                &self.output,
                s,
                rows,
                rows,
                out,
                threads,
            );
            if let Some(cap) = self.softcap {
                softcap_inplace(&mut out[..rows * self.info.n_vocab], cap);
            }
        }
        Ok(())
    }
}

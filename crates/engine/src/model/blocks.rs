//! Blocks the architectures are built from: token embedding, the attention block (Q/K/V
//! projections with optional biases and per-head norms, RoPE, KV store, causal attention, output
//! projection), the gated feed-forward block and the output head.
//!
//! Each block works on the rows of a batch in [`Scratch`] and does its arithmetic per token in
//! ggml's order, so an architecture built from them keeps G1 and D1 and llama.cpp's bits.

use synapse_gguf::GgufFile;

pub(crate) use super::common::{add_bias_rows, fused, matrix, optional_vector, output_matrix};
pub(crate) use super::ffn::{Activation, Ffn};
use super::hparams::{Dims, MoeParams};
use super::moe::Moe;
use super::{mm, mm_many, vector, Acts, AttentionView, Scratch, WeightView};
use crate::attention::{attend_batch, attend_rows, AttnShape, LayerAttn};
use crate::kv::KvCache;
use crate::matmul::{Matrix, Threads};
use crate::ops::{add_inplace, rms_norm_rows, AttnTemp, Rope};
use crate::{ModelError, Tap};

/// Look up each token's embedding row into `x` (`(n, n_embd)`).
#[inline(always)]
pub(crate) fn embed(tok_embd: &Matrix, tokens: &[u32], x: &mut [f32]) -> Result<(), ModelError> {
    let d = tok_embd.cols;
    for (t, &id) in tokens.iter().enumerate() {
        let row = tok_embd.row(id as usize);
        synapse_quant::dequantize_row(tok_embd.ty, row, &mut x[t * d..(t + 1) * d]).map_err(
            |e| ModelError::Tensor {
                tensor: "token_embd.weight".into(),
                source: e,
            },
        )?;
    }
    crate::profile::mark("embed");
    Ok(())
}

/// RMSNorm of each of the `n` rows of `width` values in `x`, in place: per-head QK-norm, and
/// norms of a block's output.
#[inline(always)]
pub(crate) fn norm_rows(x: &mut [f32], width: usize, n: usize, w: &[f32], eps: f32) {
    crate::ops::rms_norm_rows_inplace(&mut x[..n * width], w, eps, width);
}

/// The weights of an attention block: `blk.{i}.attn_{q,k,v,output}.weight`, the Q/K/V biases
/// when the file has them (Qwen2), and the per-head Q/K norms when the architecture has them
/// (Qwen3, Gemma 3).
pub(crate) struct Attention<'a> {
    pub wq: Matrix<'a>,
    pub wk: Matrix<'a>,
    pub wv: Matrix<'a>,
    pub wo: Matrix<'a>,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// The output projection's bias (gpt-oss).
    pub bo: Option<Vec<f32>>,
    /// One sink logit per query head (gpt-oss, [`LayerAttn::sinks`]).
    pub sinks: Option<Vec<f32>>,
}

impl<'a> Attention<'a> {
    /// Load layer `i`'s attention weights; `qk_norm`: the per-head norms are required.
    pub fn load(
        file: &'a GgufFile,
        i: usize,
        n_embd: usize,
        a: &AttnShape,
        qk_norm: bool,
    ) -> Result<Attention<'a>, ModelError> {
        let p = |s: &str| format!("blk.{i}.{s}");
        let (q_dim, kv_dim) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let norm = |s: &str| -> Result<Option<Vec<f32>>, ModelError> {
            if qk_norm {
                vector(file, &p(s), a.head_dim).map(Some)
            } else {
                Ok(None)
            }
        };
        // One fused `attn_qkv` (Phi-3), or the three projections.
        let [wq, wk, wv] = match file.tensor(&p("attn_qkv.weight")) {
            Ok(_) => {
                let parts = fused(
                    file,
                    &p("attn_qkv.weight"),
                    n_embd,
                    &[q_dim, kv_dim, kv_dim],
                )?;
                <[Matrix; 3]>::try_from(parts).unwrap_or_else(|_| unreachable!("three parts"))
            }
            Err(_) => [
                matrix(file, &p("attn_q.weight"), n_embd, Some(q_dim))?,
                matrix(file, &p("attn_k.weight"), n_embd, Some(kv_dim))?,
                matrix(file, &p("attn_v.weight"), n_embd, Some(kv_dim))?,
            ],
        };
        Ok(Attention {
            wq,
            wk,
            wv,
            wo: matrix(file, &p("attn_output.weight"), q_dim, Some(n_embd))?,
            bq: optional_vector(file, &p("attn_q.bias"), q_dim)?,
            bk: optional_vector(file, &p("attn_k.bias"), kv_dim)?,
            bv: optional_vector(file, &p("attn_v.bias"), kv_dim)?,
            q_norm: norm("attn_q_norm.weight")?,
            k_norm: norm("attn_k_norm.weight")?,
            bo: None,
            sinks: None,
        })
    }

    /// With gpt-oss's additions to layer `i`: the output projection's bias
    /// (`attn_output.bias`) and the heads' sinks (`attn_sinks.weight`), both required.
    pub fn with_output_bias_and_sinks(
        self,
        file: &'a GgufFile,
        i: usize,
        n_embd: usize,
        n_head: usize,
    ) -> Result<Attention<'a>, ModelError> {
        Ok(Attention {
            bo: Some(vector(file, &format!("blk.{i}.attn_output.bias"), n_embd)?),
            sinks: Some(vector(file, &format!("blk.{i}.attn_sinks.weight"), n_head)?),
            ..self
        })
    }

    /// `s.k`, `s.v` of the `n` normed rows in `s.h` and `s.q` of rows `q_from..n` (from its
    /// start: the rows whose attention is needed, see [`DecoderLayer::forward`]): the
    /// projections ([`project_qkv`]), their biases, then the per-head norms (before RoPE, as
    /// llama.cpp's Qwen3 and Gemma 3 graphs do).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn qkv(
        &self,
        s: &mut Scratch,
        (n, q_from): (usize, usize),
        a: &AttnShape,
        eps: f32,
        threads: &Threads,
        tap: &Tap,
        l: usize,
        pos0: usize,
    ) {
        let m = n - q_from;
        project_qkv(
            [&self.wq, &self.wk, &self.wv],
            &s.h,
            (n, q_from),
            &mut s.acts,
            [&mut s.q, &mut s.k, &mut s.v],
            threads,
        );
        for (b, x, rows) in [
            (&self.bq, &mut s.q, m),
            (&self.bk, &mut s.k, n),
            (&self.bv, &mut s.v, n),
        ] {
            if let Some(b) = b {
                add_bias_rows(x, b, rows);
            }
        }
        if self.bq.is_some() || self.bk.is_some() || self.bv.is_some() {
            crate::profile::mark("bias");
        }
        let (q_dim, kv_dim) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        if let Some(w) = &self.q_norm {
            norm_rows(&mut s.q, a.head_dim, m * a.n_head, w, eps);
            tap.rows("Qcur_normed", l, pos0 + q_from, &s.q[..m * q_dim], m);
        }
        if let Some(w) = &self.k_norm {
            norm_rows(&mut s.k, a.head_dim, n * a.n_head_kv, w, eps);
            tap.rows("Kcur_normed", l, pos0, &s.k[..n * kv_dim], n);
        }
        if self.q_norm.is_some() || self.k_norm.is_some() {
            crate::profile::mark("norm");
        }
    }

    /// It described for another backend: with its own per-head norms, the RoPE and window
    /// given.
    pub fn view<'m>(&'m self, rope: Option<&'m Rope>, window: Option<usize>) -> AttentionView<'m> {
        let w = WeightView::of;
        AttentionView {
            wq: w(&self.wq),
            wk: w(&self.wk),
            wv: w(&self.wv),
            wo: w(&self.wo),
            bq: self.bq.as_deref(),
            bk: self.bk.as_deref(),
            bv: self.bv.as_deref(),
            q_norm: self.q_norm.as_deref(),
            k_norm: self.k_norm.as_deref(),
            gated: false,
            rope,
            window,
        }
    }

    /// Its matrices, in the order a pass multiplies them.
    pub fn matrices(&self) -> [&Matrix<'a>; 4] {
        [&self.wq, &self.wk, &self.wv, &self.wo]
    }

    /// `s.o = Wo · s.att (+ bo)` for `n` rows.
    #[inline(always)]
    pub fn output(&self, s: &mut Scratch, n: usize, threads: &Threads) {
        mm(
            "attn_output",
            &self.wo,
            &s.att,
            n,
            &mut s.acts,
            &mut s.o,
            threads,
        );
        if let Some(b) = &self.bo {
            add_bias_rows(&mut s.o, b, n);
            crate::profile::mark("bias");
        }
    }
}

/// The query, key and value projections (`w`) of the `n` rows of `h` (`(n, cols)`): the keys
/// and values of every row, the queries of rows `q_from..n` only (into `q` from its start): all
/// three in one product when every row's queries are wanted.
pub(crate) fn project_qkv(
    w: [&Matrix; 3],
    h: &[f32],
    (n, q_from): (usize, usize),
    acts: &mut Acts,
    [q, k, v]: [&mut [f32]; 3],
    threads: &Threads,
) {
    let [wq, wk, wv] = w;
    if q_from == 0 {
        mm_many(
            "attn_qkv",
            &[wq, wk, wv],
            h,
            n,
            acts,
            &mut [q, k, v],
            threads,
        );
        return;
    }
    mm_many("attn_qkv", &[wk, wv], h, n, acts, &mut [k, v], threads);
    if q_from < n {
        let h = &h[q_from * wq.cols..n * wq.cols];
        mm("attn_qkv", wq, h, n - q_from, acts, q, threads);
    }
}

/// Rotate the `n` rows of `s.k` (positions `pos0..`) and the rows of `s.q`, which hold tokens
/// `q_from..n` ([`Attention::qkv`]), and store each token's keys and values in cache layer
/// `kv_layer`, token by token.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn rope_and_store(
    rope: &Rope,
    s: &mut Scratch,
    kv: &mut KvCache,
    kv_layer: usize,
    pos0: usize,
    (n, q_from): (usize, usize),
    a: &AttnShape,
) {
    let (hd, q_dim, kv_dim) = (a.head_dim, a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
    let width = s.rope.width();
    let angles = s.rope.positions(rope, pos0, n);
    for (t, cs) in angles.chunks_exact(width).enumerate() {
        if let Some(i) = t.checked_sub(q_from) {
            rope.apply(&mut s.q[i * q_dim..(i + 1) * q_dim], hd, cs);
        }
        let k = &mut s.k[t * kv_dim..(t + 1) * kv_dim];
        rope.apply(k, hd, cs);
        kv.store(kv_layer, pos0 + t, k, &s.v[t * kv_dim..(t + 1) * kv_dim]);
    }
    crate::profile::mark("rope and KV store");
}

/// Causal attention of the `n` queries in `s.q` (positions `pos0..`) over cache layer
/// `kv_layer`, into `s.att`: each token sees the positions up to its own, or only the last
/// `la.window` of them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_causal(
    a: &AttnShape,
    s: &mut Scratch,
    kv: &KvCache,
    kv_layer: usize,
    pos0: usize,
    n: usize,
    la: LayerAttn<'_>,
    threads: &Threads,
) {
    let q_dim = a.n_head * a.head_dim;
    attend_batch(
        a,
        &s.q[..n * q_dim],
        kv,
        kv_layer,
        pos0,
        la,
        &mut s.att,
        threads,
    );
    crate::profile::mark("attention");
}

/// A layer's feed-forward block: one gated FFN, or a mixture of experts.
// One a layer, and every model's layers of one kind: the size of the other kind costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum FeedForward<'a> {
    Dense(Ffn<'a>),
    Routed(Moe<'a>),
}

impl<'a> FeedForward<'a> {
    /// Layer `i`'s: the experts where the model has them (`moe`), else `blk.{i}.ffn_*`.
    pub fn load(
        file: &'a GgufFile,
        i: usize,
        dims: &Dims,
        moe: Option<&MoeParams>,
    ) -> Result<FeedForward<'a>, ModelError> {
        Ok(match moe {
            Some(p) => FeedForward::Routed(Moe::load(file, i, dims.n_embd, p)?),
            None => FeedForward::Dense(Ffn::load(file, i, dims.n_embd, dims.n_ff)?),
        })
    }

    /// Its matrices, in the order a pass multiplies them.
    pub fn matrices(&self) -> Vec<&Matrix<'a>> {
        match self {
            FeedForward::Dense(f) => f.matrices().to_vec(),
            FeedForward::Routed(m) => m.matrices().collect(),
        }
    }

    /// `s.o` of the `n` normed rows in `s.h`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn forward(
        &self,
        act: Activation,
        s: &mut Scratch,
        n: usize,
        threads: &Threads,
        tap: &Tap,
        l: usize,
        pos0: usize,
    ) {
        match self {
            FeedForward::Dense(f) => f.forward(act, s, n, threads, tap, l, pos0),
            FeedForward::Routed(m) => m.forward(act, s, n, threads, tap, l, pos0),
        }
    }
}

/// The logits of the last `rows` of the `n` rows of `s.x`: `output · norm(x)`, into `out`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn output_logits(
    norm: &[f32],
    eps: f32,
    output: &Matrix,
    s: &mut Scratch,
    n: usize,
    rows: usize,
    out: &mut [f32],
    threads: &Threads,
) {
    let d = norm.len();
    let first = n - rows;
    for t in 0..rows {
        let src = &s.x[(first + t) * d..(first + t + 1) * d];
        crate::ops::rms_norm(src, norm, eps, &mut s.h[t * d..(t + 1) * d]);
    }
    crate::profile::mark("norm");
    mm("output", output, &s.h, rows, &mut s.acts, out, threads);
}

/// The matrices of a layer of attention and a feed-forward block, in the order a pass
/// multiplies them.
pub(crate) fn layer_matrices<'m, 'a>(
    attn: &'m Attention<'a>,
    ffn: &'m Ffn<'a>,
) -> impl Iterator<Item = &'m Matrix<'a>> {
    attn.matrices().into_iter().chain(ffn.matrices())
}

/// A pre-norm decoder layer (llama, Qwen2, Qwen3, gpt-oss):
/// `x += Wo · attn(norm(x))`, then `x += ffn(norm(x))`.
pub(crate) struct DecoderLayer<'a> {
    pub attn_norm: Vec<f32>,
    pub attn: Attention<'a>,
    pub ffn_norm: Vec<f32>,
    pub ffn: FeedForward<'a>,
    /// Whether its queries and keys take RoPE (SmolLM3's every fourth layer does not).
    pub rotates: bool,
    /// The keys its queries see, where not all (gpt-oss's sliding-window layers).
    pub window: Option<usize>,
}

/// What a [`DecoderLayer`] of an architecture holds besides the llama layer's tensors.
pub(crate) struct LayerSpec<'m> {
    /// Per-head RMSNorm of queries and keys before RoPE (`attn_{q,k}_norm`).
    pub qk_norm: bool,
    /// The output projection's bias and the heads' sinks (gpt-oss).
    pub out_bias_and_sinks: bool,
    /// The name of the feed-forward block's norm: `ffn_norm`, or gpt-oss's `post_attention_norm`.
    pub ffn_norm: &'static str,
    /// Its feed-forward block a mixture of these experts, where it is one.
    pub moe: Option<&'m MoeParams>,
}

/// RoPE over no dimensions: what a layer without RoPE applies.
const NO_ROPE: Rope = Rope {
    style: crate::ops::RopeStyle::Adjacent,
    n_rot: 0,
    base: 1.0,
    freq_factors: None,
    scaling: crate::ops::RopeScaling::NONE,
};

/// What a [`DecoderLayer`] needs besides its weights.
pub(crate) struct LayerCtx<'r> {
    pub a: &'r AttnShape,
    pub rope: &'r Rope,
    pub eps: f32,
    pub act: Activation,
    /// Multiplies each block's output before its residual add (Granite).
    pub residual_scale: Option<f32>,
    /// Multiplies the queries after RoPE (Phi-3).
    pub q_scale: Option<f32>,
    /// Multiplies the queries after RoPE by a factor of their position (Mistral 3).
    pub q_temp: Option<AttnTemp>,
    pub threads: &'r Threads,
    pub tap: &'r Tap,
}

impl<'a> DecoderLayer<'a> {
    pub fn load(
        file: &'a GgufFile,
        i: usize,
        dims: &Dims,
        a: &AttnShape,
        spec: &LayerSpec,
    ) -> Result<DecoderLayer<'a>, ModelError> {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let mut attn = Attention::load(file, i, dims.n_embd, a, spec.qk_norm)?;
        if spec.out_bias_and_sinks {
            attn = attn.with_output_bias_and_sinks(file, i, dims.n_embd, a.n_head)?;
        }
        Ok(DecoderLayer {
            attn_norm: vector(file, &p("attn_norm"), dims.n_embd)?,
            attn,
            ffn_norm: vector(file, &p(spec.ffn_norm), dims.n_embd)?,
            ffn: FeedForward::load(file, i, dims, spec.moe)?,
            rotates: true,
            window: None,
        })
    }

    /// Its attention's window and sinks.
    fn la(&self) -> LayerAttn<'_> {
        LayerAttn {
            window: self.window,
            sinks: self.attn.sinks.as_deref(),
        }
    }

    /// Layer `l` over the `n` rows of `s.x` at positions `pos0..`, its keys and values stored in
    /// `kv` layer `l`; the rest of the layer (queries, attention, the output projection and
    /// the feed-forward block) only for the last `keep` rows, which it leaves as the first
    /// `keep` of `s.x` ([`keep_last_rows`]). Every layer but the last keeps all `n`; the last
    /// keeps the rows whose logits are asked for, as llama.cpp's graphs do (each row's
    /// arithmetic is its own, so the rows kept come out the same bits either way).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn forward(
        &self,
        c: &LayerCtx,
        l: usize,
        s: &mut Scratch,
        kv: &mut KvCache,
        pos0: usize,
        n: usize,
        keep: usize,
    ) {
        let d = self.attn_norm.len();
        let a = c.a;
        let (q_dim, kv_dim) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let (first, m) = (n - keep, keep);
        self.norm_qkv(c, l, s, pos0, n, first);
        rope_and_store(self.rope(c), s, kv, l, pos0, (n, first), a);
        scale_rows(&mut s.q[..m * q_dim], c.q_scale);
        let p = pos0 + first;
        if let Some(temp) = c.q_temp {
            temp.apply(&mut s.q[..m * q_dim], q_dim, p);
        }
        c.tap.rows("Qcur", l, p, &s.q[..m * q_dim], m);
        c.tap.rows("Kcur", l, pos0, &s.k[..n * kv_dim], n);
        c.tap.rows("Vcur", l, pos0, &s.v[..n * kv_dim], n);
        keep_last_rows(&mut s.x, d, n, keep);
        if m == 0 {
            return;
        }
        attend_causal(a, s, kv, l, p, m, self.la(), c.threads);
        c.tap.rows("kqv_out", l, p, &s.att[..m * q_dim], m);
        self.output_and_ffn(c, l, s, p, m);
    }

    /// Layer `l` over the `n` rows of `s.x` of a batched pass: one run of rows per sequence,
    /// each with its own cache and positions ([`Run`]). The products take every row at once;
    /// RoPE, the KV store and attention go run by run.
    #[inline(always)]
    pub fn forward_runs(
        &self,
        c: &LayerCtx,
        l: usize,
        s: &mut Scratch,
        runs: &mut [Run<'_>],
        n: usize,
    ) {
        self.norm_qkv(c, l, s, 0, n, 0);
        rope_and_store_runs(self.rope(c), s, runs, l, c.a);
        let q_dim = c.a.n_head * c.a.head_dim;
        scale_rows(&mut s.q[..n * q_dim], c.q_scale);
        if let Some(temp) = c.q_temp {
            let mut t = 0;
            for r in runs.iter() {
                temp.apply(&mut s.q[t * q_dim..(t + r.n) * q_dim], q_dim, r.pos0);
                t += r.n;
            }
        }
        attend_runs(c.a, s, runs, l, self.la(), c.threads);
        self.output_and_ffn(c, l, s, 0, n);
    }

    /// The RoPE this layer applies: the model's, or none.
    fn rope<'r>(&self, c: &LayerCtx<'r>) -> &'r Rope {
        if self.rotates {
            c.rope
        } else {
            &NO_ROPE
        }
    }

    /// The normed rows in `s.h`, and their queries, keys and values ([`Attention::qkv`]).
    #[inline(always)]
    fn norm_qkv(
        &self,
        c: &LayerCtx,
        l: usize,
        s: &mut Scratch,
        pos0: usize,
        n: usize,
        first: usize,
    ) {
        let d = self.attn_norm.len();
        rms_norm_rows(&s.x[..n * d], &self.attn_norm, c.eps, &mut s.h, d);
        crate::profile::mark("norm");
        c.tap.rows("attn_norm", l, pos0, &s.h[..n * d], n);
        self.attn
            .qkv(s, (n, first), c.a, c.eps, c.threads, c.tap, l, pos0);
    }

    /// The rest of the layer for the `m` rows of `s.x` whose attention is in `s.att` (positions
    /// `p..` for the taps): the output projection and its residual, the feed-forward block and
    /// its residual.
    #[inline(always)]
    fn output_and_ffn(&self, c: &LayerCtx, l: usize, s: &mut Scratch, p: usize, m: usize) {
        let d = self.attn_norm.len();
        self.attn.output(s, m, c.threads);
        c.tap.rows("attn_out", l, p, &s.o[..m * d], m);
        scale_rows(&mut s.o[..m * d], c.residual_scale);
        add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
        crate::profile::mark("residual");
        c.tap.rows("ffn_inp", l, p, &s.x[..m * d], m);

        rms_norm_rows(&s.x[..m * d], &self.ffn_norm, c.eps, &mut s.h, d);
        crate::profile::mark("norm");
        c.tap.rows("ffn_norm", l, p, &s.h[..m * d], m);
        self.ffn.forward(c.act, s, m, c.threads, c.tap, l, p);
        scale_rows(&mut s.o[..m * d], c.residual_scale);
        add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
        crate::profile::mark("residual");
        c.tap.rows("l_out", l, p, &s.x[..m * d], m);
    }
}

/// `x` times `scale` where there is one (ggml's `ggml_scale`: one f32 product each).
#[inline(always)]
fn scale_rows(x: &mut [f32], scale: Option<f32>) {
    if let Some(scale) = scale {
        x.iter_mut().for_each(|v| *v *= scale);
    }
}

/// One sequence's rows in a batched pass: its cache, and the positions its `n` rows take from
/// `pos0`. A pass's runs lie one after another in the scratch rows.
pub(crate) struct Run<'k> {
    pub kv: &'k mut KvCache,
    pub pos0: usize,
    pub n: usize,
}

/// [`rope_and_store`] for the runs of a batched pass (every row's queries wanted): each run's
/// rows rotated at its own positions and stored in its own cache.
#[inline(always)]
pub(crate) fn rope_and_store_runs(
    rope: &Rope,
    s: &mut Scratch,
    runs: &mut [Run<'_>],
    kv_layer: usize,
    a: &AttnShape,
) {
    let (hd, q_dim, kv_dim) = (a.head_dim, a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
    let width = s.rope.width();
    let spans: Vec<(usize, usize)> = runs.iter().map(|r| (r.pos0, r.n)).collect();
    let mut rows = s.rope.runs(rope, &spans).chunks_exact(width).enumerate();
    for r in runs.iter_mut() {
        for (i, (t, cs)) in rows.by_ref().take(r.n).enumerate() {
            rope.apply(&mut s.q[t * q_dim..(t + 1) * q_dim], hd, cs);
            let k = &mut s.k[t * kv_dim..(t + 1) * kv_dim];
            rope.apply(k, hd, cs);
            r.kv.store(kv_layer, r.pos0 + i, k, &s.v[t * kv_dim..(t + 1) * kv_dim]);
        }
    }
    crate::profile::mark("rope and KV store");
}

/// Causal attention of each run's queries over its own cache layer `kv_layer` (or only the last
/// `la.window` positions of it), into its rows of `s.att`: consecutive runs of one token
/// (decode steps) in one call ([`attend_rows`]), longer runs (prompt chunks) one call each.
#[inline(always)]
pub(crate) fn attend_runs(
    a: &AttnShape,
    s: &mut Scratch,
    runs: &[Run<'_>],
    kv_layer: usize,
    la: LayerAttn<'_>,
    threads: &Threads,
) {
    let q_dim = a.n_head * a.head_dim;
    let (mut t, mut i) = (0, 0);
    let mut rows = Vec::new();
    while i < runs.len() {
        let r = &runs[i];
        if r.n == 1 {
            rows.clear();
            rows.extend(
                runs[i..]
                    .iter()
                    .take_while(|r| r.n == 1)
                    .map(|r| (&*r.kv, r.pos0)),
            );
            let m = rows.len();
            let (q, att) = (&s.q[t * q_dim..(t + m) * q_dim], &mut s.att[t * q_dim..]);
            attend_rows(a, q, &rows, kv_layer, la, att, threads);
            (t, i) = (t + m, i + m);
            continue;
        }
        let (q, att) = (&s.q[t * q_dim..(t + r.n) * q_dim], &mut s.att[t * q_dim..]);
        attend_batch(a, q, r.kv, kv_layer, r.pos0, la, att, threads);
        (t, i) = (t + r.n, i + 1);
    }
    crate::profile::mark("attention");
}

/// Move the last `keep` of the `n` rows of `x` (`d` values each) to its start: the rows a
/// layer goes on with once every row's keys and values are in the cache.
#[inline(always)]
pub(crate) fn keep_last_rows(x: &mut [f32], d: usize, n: usize, keep: usize) {
    if keep < n {
        x.copy_within((n - keep) * d..n * d, 0);
    }
}

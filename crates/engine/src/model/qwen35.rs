//! `qwen35`: the Qwen 3.5 hybrid, as llama.cpp's `src/models/qwen35.cpp` runs it. Gated
//! delta-net layers (linear attention with a recurrent state) alternate with gated full-attention
//! layers; every layer has the same FFN.
//!
//! ```text
//! x = token_embd[token]
//! per layer:  h = norm(x)
//!   delta net:   q, k, v = split(silu(conv1d(Wqkv · h)))          (causal, d_conv taps, stateful)
//!                beta = sigmoid(Wbeta · h),  g = softplus(Walpha · h + dt_bias) * a
//!                o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta)   (per value head, stateful)
//!                x += Wout · (norm(o) * silu(Wgate · h))                  (norm per head)
//!   attention:   q | gate = Wq · h  (per head),  k = Wk · h,  v = Wv · h
//!                q, k = rope(head_norm(q)), rope(head_norm(k))
//!                x += Wo · (attn(q, k, v) * sigmoid(gate))
//!             x += Wdown · (silu(Wgate · post_norm(x)) * (Wup · post_norm(x)))
//! logits = Woutput · norm(x)
//! ```
//! Key heads serve value heads in turn (value head `h` reads key head `h % n_k_heads`, as ggml's
//! op indexes them). RoPE is interleaved M-RoPE over the first `rope.dimension_count` dims of a
//! head; for text every position id but the fourth is the token's position and the fourth is 0,
//! so the pairs that follow the fourth section do not turn (see `imrope_for_text`). The
//! delta-net arithmetic is in [`crate::delta_net`].

use synapse_gguf::GgufFile;

use super::blocks::{
    attend_causal, embed, keep_last_rows, matrix, norm_rows, output_logits, output_matrix,
    project_qkv, rope_and_store, Activation, FeedForward,
};
use super::hparams::{MoeParams, Qwen35Params};
use super::{
    attn_shape, bytes, mm, mm_many, pass_over_blocks, scratch_rows, vector, AttentionView,
    DecoderView, DeltaNetView, GateView, LayerView, Logits, MixerView, ModelInfo, Scratch,
    ScratchDims, State, StateBytes, WeightView,
};
use crate::attention::{AttnShape, LayerAttn};
use crate::delta_net::{
    conv_step, delta_rule_step, DeltaNetBuffers, DeltaNetShape, RecurrentState,
};
use crate::kv::KvCache;
use crate::matmul::{Acts, Matrix, Threads};
use crate::ops::{
    add_inplace, l2_norm_inplace, rms_norm_inplace, rms_norm_rows, sigmoid, silu_rows, softplus,
    Rope, RopeScaling, RopeStyle,
};
use crate::{ModelError, Tap};

/// A gated full-attention layer's weights; its keys and values go to cache layer `kv_layer`.
struct GatedAttention<'a> {
    /// `(2 * n_head * head_dim, n_embd)`: per head, the query then its gate.
    wq: Matrix<'a>,
    wk: Matrix<'a>,
    wv: Matrix<'a>,
    wo: Matrix<'a>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    kv_layer: usize,
}

/// A gated delta-net layer's weights; its state is recurrent layer `rs_layer`.
struct DeltaNet<'a> {
    wqkv: Matrix<'a>,
    wgate: Matrix<'a>,
    wbeta: Matrix<'a>,
    walpha: Matrix<'a>,
    /// `(conv_dim, d_conv)`.
    conv1d: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `-exp(A_log)` per value head.
    a: Vec<f32>,
    norm: Vec<f32>,
    wout: Matrix<'a>,
    rs_layer: usize,
}

enum Mixer<'a> {
    Attention(GatedAttention<'a>),
    DeltaNet(DeltaNet<'a>),
}

struct Layer<'a> {
    attn_norm: Vec<f32>,
    mixer: Mixer<'a>,
    post_norm: Vec<f32>,
    ffn: FeedForward<'a>,
}

pub struct Qwen35<'a> {
    info: ModelInfo,
    n_ff: usize,
    moe: Option<MoeParams>,
    eps: f32,
    attn: AttnShape,
    rope: Rope,
    dn: DeltaNetShape,
    n_attn_layers: usize,
    n_dn_layers: usize,
    tok_embd: Matrix<'a>,
    layers: Vec<Layer<'a>>,
    output_norm: Vec<f32>,
    output: Matrix<'a>,
    tap: Tap,
}

/// ggml's interleaved M-RoPE (`GGML_ROPE_TYPE_IMROPE`) for text, as a NeoX RoPE: pair `i`
/// follows section `i % 3` of `sections` (t, h, w) while `i % sum(sections)` lies within three
/// times that section's size, else the fourth (e). For text the t, h and w position ids all equal
/// the position and e is 0: so the pair turns by the position's angle, or not at all. A pair that
/// does not turn gets an infinite divisor (angle `theta / inf = 0`: cosine 1, sine 0, as ggml's
/// `theta_e = 0`).
///
/// `sections` are checked ([`Qwen35Params`]): their sum is not 0, and neither it nor three
/// times a section overflows.
fn imrope_for_text(sections: [usize; 4], n_rot: usize, base: f32, scaling: RopeScaling) -> Rope {
    let sect_dims: usize = sections.iter().sum();
    let follows_e = |i: usize| {
        let sector = i % sect_dims;
        let within = |k: usize| sector % 3 == k && sector < 3 * sections[k];
        !(within(0) || within(1) || within(2))
    };
    let factors: Vec<f32> = (0..n_rot / 2)
        .map(|i| if follows_e(i) { f32::INFINITY } else { 1.0 })
        .collect();
    Rope {
        style: RopeStyle::Neox,
        n_rot,
        base,
        freq_factors: factors.iter().any(|f| f.is_infinite()).then_some(factors),
        scaling,
    }
}

impl<'a> Qwen35<'a> {
    /// `arch`: `qwen35`, or `qwen35moe` (every FFN a mixture of experts with a shared one).
    pub fn load(file: &'a GgufFile, arch: &'static str) -> Result<Qwen35<'a>, ModelError> {
        let q = Qwen35Params::read(file, arch)?;
        let (hp, dn) = (&q.common, q.dn);
        let dims = &hp.dims;
        let (n_embd, n_layer, n_ff, eps) = (dims.n_embd, q.n_layer, dims.n_ff, hp.eps);
        // No scaling type is taken, but `rope.scaling.attn_factor` is, as for every model.
        let scaling = hp.rope_scaling.rope(dims.n_rot, hp.rope_base, true);
        let rope = imrope_for_text(q.sections, dims.n_rot, hp.rope_base, scaling);

        let attn = attn_shape(dims.n_head, dims.n_head_kv, dims.head_dim);
        let (q_dim, kv_dim) = (attn.n_head * attn.head_dim, attn.n_head_kv * attn.head_dim);
        let tok_embd = matrix(file, "token_embd.weight", n_embd, Some(hp.n_vocab))?;
        let n_vocab = tok_embd.rows;
        let (mut n_attn_layers, mut n_dn_layers) = (0, 0);
        // `block_count` is known to number the file's layers.
        let mut layers = Vec::with_capacity(n_layer);
        for (i, &rec) in q.recurrent.iter().enumerate() {
            let p = |s: &str| format!("blk.{i}.{s}");
            let mixer = if rec {
                n_dn_layers += 1;
                Mixer::DeltaNet(DeltaNet {
                    wqkv: matrix(file, &p("attn_qkv.weight"), n_embd, Some(dn.conv_dim()))?,
                    wgate: matrix(file, &p("attn_gate.weight"), n_embd, Some(dn.value_dim()))?,
                    wbeta: matrix(file, &p("ssm_beta.weight"), n_embd, Some(dn.n_v_heads))?,
                    walpha: matrix(file, &p("ssm_alpha.weight"), n_embd, Some(dn.n_v_heads))?,
                    conv1d: vector(file, &p("ssm_conv1d.weight"), dn.conv_dim() * dn.d_conv)?,
                    dt_bias: vector(file, &p("ssm_dt.bias"), dn.n_v_heads)?,
                    a: vector(file, &p("ssm_a"), dn.n_v_heads)?,
                    norm: vector(file, &p("ssm_norm.weight"), dn.head_dim)?,
                    wout: matrix(file, &p("ssm_out.weight"), dn.value_dim(), Some(n_embd))?,
                    rs_layer: n_dn_layers - 1,
                })
            } else {
                for b in [
                    "attn_q.bias",
                    "attn_k.bias",
                    "attn_v.bias",
                    "attn_qkv.weight",
                ] {
                    if file.tensor(&p(b)).is_ok() {
                        return Err(ModelError::Hparams(format!(
                            "tensor `{}` is not supported in a qwen35 attention layer",
                            p(b)
                        )));
                    }
                }
                n_attn_layers += 1;
                Mixer::Attention(GatedAttention {
                    wq: matrix(file, &p("attn_q.weight"), n_embd, Some(2 * q_dim))?,
                    wk: matrix(file, &p("attn_k.weight"), n_embd, Some(kv_dim))?,
                    wv: matrix(file, &p("attn_v.weight"), n_embd, Some(kv_dim))?,
                    wo: matrix(file, &p("attn_output.weight"), q_dim, Some(n_embd))?,
                    q_norm: vector(file, &p("attn_q_norm.weight"), attn.head_dim)?,
                    k_norm: vector(file, &p("attn_k_norm.weight"), attn.head_dim)?,
                    kv_layer: n_attn_layers - 1,
                })
            };
            layers.push(Layer {
                attn_norm: vector(file, &p("attn_norm.weight"), n_embd)?,
                mixer,
                post_norm: vector(file, &p("post_attention_norm.weight"), n_embd)?,
                ffn: FeedForward::load(file, i, dims, q.moe.as_ref())?,
            });
        }
        // The multi-token-prediction blocks after the trunk, which llama.cpp's main pass skips
        // too.
        pass_over_blocks(file, n_layer..dims.n_layer);
        Ok(Qwen35 {
            info: ModelInfo::new(arch, n_vocab, hp.n_ctx_train, n_embd, n_layer),
            // The widest dense FFN the scratch holds: a mixture's shared expert's.
            n_ff: q.moe.map_or(n_ff, |p| p.n_ff_shared.unwrap_or(p.n_ff_exp)),
            moe: q.moe,
            eps,
            attn,
            rope,
            dn,
            n_attn_layers,
            n_dn_layers,
            tok_embd: tok_embd.clone(),
            layers,
            output_norm: vector(file, "output_norm.weight", n_embd)?,
            output: output_matrix(file, tok_embd, n_embd)?,
            tap: Tap::configured(),
        })
    }

    /// A gated attention layer over the `n` normed rows of `s.h`: every row's keys and values
    /// into the cache, the output of rows `q_from..n` into `s.o` (from its start).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn attention(
        &self,
        w: &GatedAttention,
        l: usize,
        s: &mut Scratch,
        kv: &mut KvCache,
        pos0: usize,
        (n, q_from): (usize, usize),
        threads: &Threads,
    ) {
        let a = &self.attn;
        let (hd, q_dim, kv_dim) = (a.head_dim, a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let tap = &self.tap;
        let (m, p) = (n - q_from, pos0 + q_from);
        project_qkv(
            [&w.wq, &w.wk, &w.wv],
            &s.h,
            (n, q_from),
            &mut s.acts,
            [&mut s.q_full, &mut s.k, &mut s.v],
            threads,
        );
        // The queries: the first half of each head's pair.
        for (q, full) in s.q[..m * q_dim]
            .chunks_exact_mut(hd)
            .zip(s.q_full.chunks_exact(2 * hd))
        {
            q.copy_from_slice(&full[..hd]);
        }
        norm_rows(&mut s.q, hd, m * a.n_head, &w.q_norm, self.eps);
        norm_rows(&mut s.k, hd, n * a.n_head_kv, &w.k_norm, self.eps);
        crate::profile::mark("norm");
        tap.rows("Qcur_normed", l, p, &s.q[..m * q_dim], m);
        tap.rows("Kcur_normed", l, pos0, &s.k[..n * kv_dim], n);
        rope_and_store(&self.rope, s, kv, w.kv_layer, pos0, (n, q_from), a);
        tap.rows("Qcur", l, p, &s.q[..m * q_dim], m);
        tap.rows("Kcur", l, pos0, &s.k[..n * kv_dim], n);
        if m == 0 {
            return;
        }
        attend_causal(a, s, kv, w.kv_layer, p, m, LayerAttn::FULL, threads);
        tap.rows("attn_pregate", l, p, &s.att[..m * q_dim], m);
        // Each head's output times the sigmoid of its gate (the second half of the pair).
        for (o, full) in s.att[..m * q_dim]
            .chunks_exact_mut(hd)
            .zip(s.q_full.chunks_exact(2 * hd))
        {
            for (o, &g) in o.iter_mut().zip(&full[hd..]) {
                *o *= sigmoid(g);
            }
        }
        crate::profile::mark("attention gate");
        tap.rows("attn_gated", l, p, &s.att[..m * q_dim], m);
        mm(
            "attn_output",
            &w.wo,
            &s.att,
            m,
            &mut s.acts,
            &mut s.o,
            threads,
        );
    }

    /// A gated delta-net layer over the `n` normed rows of `s.h`, carrying its recurrent state
    /// token by token, the output of rows `out_from..n` into `s.o` (from its start).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn delta_net(
        &self,
        w: &DeltaNet,
        l: usize,
        s: &mut Scratch,
        rs: &mut RecurrentState,
        pos0: usize,
        (n, out_from): (usize, usize),
        threads: &Threads,
    ) {
        let dn = &self.dn;
        let (hd, h_v, h_k) = (dn.head_dim, dn.n_v_heads, dn.n_k_heads);
        let (conv_dim, key_dim, value_dim) = (dn.conv_dim(), dn.key_dim(), dn.value_dim());
        let tap = &self.tap;
        let b: &mut DeltaNetBuffers = &mut s.dn;
        mm_many(
            "ssm_in",
            &[&w.wqkv, &w.wgate, &w.wbeta, &w.walpha],
            &s.h,
            n,
            &mut s.acts,
            &mut [&mut b.mixed, &mut b.z, &mut b.beta, &mut b.g],
            threads,
        );
        tap.rows(
            "linear_attn_qkv_mixed",
            l,
            pos0,
            &b.mixed[..n * conv_dim],
            n,
        );
        tap.rows("z", l, pos0, &b.z[..n * value_dim], n);
        b.beta[..n * h_v].iter_mut().for_each(|x| *x = sigmoid(*x));
        // g = softplus(alpha + dt_bias) * a: three ggml ops, each rounded.
        for row in b.g[..n * h_v].chunks_exact_mut(h_v) {
            for ((g, &dt), &a) in row.iter_mut().zip(&w.dt_bias).zip(&w.a) {
                *g = softplus(*g + dt) * a;
            }
        }
        tap.rows("beta_sigmoid", l, pos0, &b.beta[..n * h_v], n);
        tap.rows("gate", l, pos0, &b.g[..n * h_v], n);

        let (conv_state, ssm) = rs.layer(w.rs_layer);
        for (x, out) in b.mixed[..n * conv_dim]
            .chunks_exact(conv_dim)
            .zip(b.conv.chunks_exact_mut(conv_dim))
        {
            conv_step(conv_state, &w.conv1d, x, out, dn.d_conv);
        }
        tap.rows("conv_output_raw", l, pos0, &b.conv[..n * conv_dim], n);
        silu_rows(&mut b.conv[..n * conv_dim], conv_dim);
        tap.rows("conv_output_silu", l, pos0, &b.conv[..n * conv_dim], n);
        // L2-normalised query and key heads (ggml: an RMSNorm with eps / head_dim, then a scale
        // by 1 / sqrt(head_dim)).
        for row in b.conv[..n * conv_dim].chunks_exact_mut(conv_dim) {
            for head in row[..2 * key_dim].chunks_exact_mut(hd) {
                l2_norm_inplace(head, self.eps);
            }
        }

        for t in 0..n {
            let row = &b.conv[t * conv_dim..(t + 1) * conv_dim];
            let (q, rest) = row.split_at(key_dim);
            let (k, v) = rest.split_at(key_dim);
            for h in 0..h_v {
                let kh = h % h_k;
                delta_rule_step(
                    &mut ssm[h * hd * hd..(h + 1) * hd * hd],
                    &q[kh * hd..(kh + 1) * hd],
                    &k[kh * hd..(kh + 1) * hd],
                    &v[h * hd..(h + 1) * hd],
                    b.g[t * h_v + h],
                    b.beta[t * h_v + h],
                    &mut b.delta,
                    &mut b.core[t * value_dim + h * hd..t * value_dim + (h + 1) * hd],
                );
            }
        }
        tap.rows("attn_output", l, pos0, &b.core[..n * value_dim], n);

        // Gated norm per head, norm(o) * silu(z), and the output projection: of the rows asked
        // for alone (the state above took every row).
        let (m, rows) = (n - out_from, out_from * value_dim..n * value_dim);
        silu_rows(&mut b.z[rows.clone()], hd);
        for (o, z) in b.core[rows.clone()]
            .chunks_exact_mut(hd)
            .zip(b.z[rows.clone()].chunks_exact(hd))
        {
            rms_norm_inplace(o, &w.norm, self.eps);
            o.iter_mut().zip(z).for_each(|(o, &z)| *o *= z);
        }
        crate::profile::mark("delta net");
        tap.rows("final_output", l, pos0 + out_from, &b.core[rows.clone()], m);
        if m > 0 {
            mm(
                "ssm_out",
                &w.wout,
                &b.core[rows],
                m,
                &mut s.acts,
                &mut s.o,
                threads,
            );
        }
    }
}

impl super::ForwardBody for Qwen35<'_> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn matrices(&self) -> Vec<&Matrix<'_>> {
        let mut ms = Vec::new();
        for l in &self.layers {
            match &l.mixer {
                Mixer::Attention(w) => ms.extend([&w.wq, &w.wk, &w.wv, &w.wo]),
                Mixer::DeltaNet(w) => ms.extend([&w.wqkv, &w.wgate, &w.wbeta, &w.walpha, &w.wout]),
            }
            ms.extend(l.ffn.matrices());
        }
        ms.push(&self.output);
        ms
    }

    fn view(&self) -> Option<DecoderView<'_>> {
        let w = WeightView::of;
        let layers = self.layers.iter().map(|l| {
            let FeedForward::Dense(f) = &l.ffn else {
                return None;
            };
            let mixer = match &l.mixer {
                Mixer::Attention(m) => MixerView::Attention(AttentionView {
                    wq: w(&m.wq),
                    wk: w(&m.wk),
                    wv: w(&m.wv),
                    wo: w(&m.wo),
                    bq: None,
                    bk: None,
                    bv: None,
                    q_norm: Some(&m.q_norm),
                    k_norm: Some(&m.k_norm),
                    gated: true,
                    rope: Some(&self.rope),
                    window: None,
                }),
                Mixer::DeltaNet(m) => MixerView::DeltaNet(DeltaNetView {
                    shape: self.dn,
                    wqkv: w(&m.wqkv),
                    wgate: w(&m.wgate),
                    wbeta: w(&m.wbeta),
                    walpha: w(&m.walpha),
                    wout: w(&m.wout),
                    conv1d: &m.conv1d,
                    dt_bias: &m.dt_bias,
                    a: &m.a,
                    norm: &m.norm,
                }),
            };
            Some(LayerView {
                attn_norm: Some(&l.attn_norm),
                mixer,
                attn_post_norm: None,
                // The FFN's input norm is the file's `post_attention_norm`.
                ffn_norm: Some(&l.post_norm),
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

    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError> {
        let a = &self.attn;
        let (q_dim, kv_dim) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let rows = scratch_rows(n_ctx, n_batch);
        let d = ScratchDims {
            n_batch: rows,
            n_embd: self.info.n_embd,
            q_dim,
            kv_dim,
            n_ff: self.n_ff,
            head_dim: a.head_dim,
            moe: self.moe,
        };
        let widest = [self.info.n_embd, q_dim, self.n_ff, self.dn.value_dim()]
            .into_iter()
            .max()
            .unwrap_or(0);
        let mut b = StateBytes::new(n_ctx, n_batch)?;
        d.count(&mut b)?;
        b.add("gated query rows", bytes(4 * 2, &[rows, q_dim]))?;
        b.add("quantized activations", bytes(4 * 3, &[rows, widest]))?;
        b.add("delta-net rows", DeltaNetBuffers::bytes(rows, &self.dn))?;
        b.add(
            "recurrent state",
            RecurrentState::bytes(self.n_dn_layers, &self.dn),
        )?;
        b.kv_cache(self.n_attn_layers, a)?;
        b.reserve()?;
        let mut s = Scratch::new(&d);
        s.q_full = vec![0.0; rows * 2 * q_dim];
        s.dn = DeltaNetBuffers::new(rows, &self.dn);
        s.acts = Acts::with_capacity(rows, widest);
        Ok(State {
            pos: 0,
            model: self.info.id,
            n_batch,
            kv: KvCache::new(self.n_attn_layers, n_ctx, a.n_head_kv, a.head_dim),
            rs: RecurrentState::new(self.n_dn_layers, self.dn),
            s,
            ext: None,
            ext_recurrent: false,
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
        let (s, pos0) = (&mut st.s, st.pos);
        let tap = &self.tap;
        embed(&self.tok_embd, tokens, &mut s.x)?;

        // The last layer goes on past its mixer's state only with the rows whose logits are
        // asked for: an attention layer takes every row's keys and values and the queries of
        // those rows alone; a delta-net layer carries its state over every row and projects
        // the output of those rows alone.
        let rows = logits.rows(n);
        let last = self.layers.len().saturating_sub(1);
        // The rows of `s.x` the layers leave.
        let mut left = n;
        for (l, layer) in self.layers.iter().enumerate() {
            let m = if l == last { rows } else { n };
            let p = pos0 + n - m;
            rms_norm_rows(&s.x[..n * d], &layer.attn_norm, eps, &mut s.h, d);
            crate::profile::mark("norm");
            tap.rows("attn_norm", l, pos0, &s.h[..n * d], n);
            let name = match &layer.mixer {
                Mixer::Attention(w) => {
                    self.attention(w, l, s, &mut st.kv, pos0, (n, n - m), threads);
                    "attn_output"
                }
                Mixer::DeltaNet(w) => {
                    self.delta_net(w, l, s, &mut st.rs, pos0, (n, n - m), threads);
                    "linear_attn_out"
                }
            };
            keep_last_rows(&mut s.x, d, n, m);
            left = m;
            if m == 0 {
                continue;
            }
            tap.rows(name, l, p, &s.o[..m * d], m);
            add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
            crate::profile::mark("residual");
            tap.rows("attn_residual", l, p, &s.x[..m * d], m);

            rms_norm_rows(&s.x[..m * d], &layer.post_norm, eps, &mut s.h, d);
            crate::profile::mark("norm");
            tap.rows("attn_post_norm", l, p, &s.h[..m * d], m);
            layer
                .ffn
                .forward(Activation::Silu, s, m, threads, tap, l, p);
            add_inplace(&mut s.x[..m * d], &s.o[..m * d]);
            crate::profile::mark("residual");
            tap.rows("l_out", l, p, &s.x[..m * d], m);
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
            let pos = st.pos - rows;
            tap.rows("result_norm", 0, pos, &s.h[..rows * d], rows);
            tap.rows("result_output", 0, pos, &out[..rows * n_vocab], rows);
        }
        Ok(())
    }
}

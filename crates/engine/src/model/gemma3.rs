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
//! The arithmetic follows ggml's order: the embedding scale and the query scale are separate f32
//! multiplications (the query's before its F16 rounding in flash attention, whose own scale is
//! then 1), and GELU is ggml's F16 table lookup ([`geglu`]).

use synapse_gguf::{GgufFile, Value};

use super::{mm, mm_many, vector, HParams, Logits, Model, ModelInfo, State};
use crate::attention::{AttnShape, MAX_HEAD_DIM};
use crate::matmul::{Matrix, Threads};
use crate::ops::{
    add_inplace, geglu, rms_norm, rms_norm_inplace, scale_inplace, softcap_inplace, Rope, RopeStyle,
};
use crate::ModelError;

struct Layer<'a> {
    attn_norm: Vec<f32>,
    wq: Matrix<'a>,
    wk: Matrix<'a>,
    wv: Matrix<'a>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: Matrix<'a>,
    attn_post_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Matrix<'a>,
    up: Matrix<'a>,
    down: Matrix<'a>,
    ffn_post_norm: Vec<f32>,
    /// A local layer: attends to the last `window` positions only, with the local RoPE base.
    local: bool,
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

/// Which layers are local: `attention.sliding_window_pattern` as one flag per layer, or as a
/// period `p` (layer `i` is local unless `i % p == p - 1`), 6 when absent; none without a window.
fn local_layers(hp: &HParams, n_layer: usize, window: usize) -> Result<Vec<bool>, ModelError> {
    if window == 0 {
        return Ok(vec![false; n_layer]);
    }
    let key = hp.key("attention.sliding_window_pattern");
    if let Some(Value::Array(a)) = hp.md.get(&key) {
        let flags: Option<Vec<bool>> = (0..a.len()).map(|i| a.get(i)?.as_bool()).collect();
        return match flags {
            Some(f) if f.len() == n_layer => Ok(f),
            _ => Err(ModelError::Hparams(format!(
                "`{key}` must hold {n_layer} bools"
            ))),
        };
    }
    let period = hp.usize_or("attention.sliding_window_pattern", 6)?;
    Ok((0..n_layer)
        .map(|i| period == 0 || i % period < period - 1)
        .collect())
}

impl<'a> Gemma3<'a> {
    pub fn load(file: &'a GgufFile) -> Result<Gemma3<'a>, ModelError> {
        let md = file.metadata();
        let hp = HParams { md, arch: "gemma3" };
        let n_embd = hp.usize("embedding_length")?;
        let n_layer = hp.usize("block_count")?;
        let n_ff = hp.usize("feed_forward_length")?;
        let n_head = hp.usize("attention.head_count")?;
        let n_head_kv = hp.usize_or("attention.head_count_kv", n_head)?;
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::Hparams(format!(
                "{n_head} query heads cannot share {n_head_kv} KV heads"
            )));
        }
        let head_dim = hp.usize_or("attention.key_length", n_embd / n_head)?;
        let v_dim = hp.usize_or("attention.value_length", head_dim)?;
        let n_rot = hp.usize_or("rope.dimension_count", head_dim)?;
        if head_dim == 0 || head_dim > MAX_HEAD_DIM || v_dim != head_dim {
            return Err(ModelError::Hparams(format!(
                "head dimensions {head_dim} (keys) and {v_dim} (values) are not supported"
            )));
        }
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::Hparams(format!(
                "RoPE over {n_rot} of {head_dim} dims"
            )));
        }
        let eps = hp.f32_or("attention.layer_norm_rms_epsilon", 1e-6)?;
        let window = hp.usize_or("attention.sliding_window", 0)?;
        let local = local_layers(&hp, n_layer, window)?;
        let rope = |base| Rope {
            style: RopeStyle::Neox,
            n_rot,
            base,
            freq_factors: None,
        };
        let mut rope_global = rope(hp.f32_or("rope.freq_base", 10000.0)?);
        let rope_local = rope(hp.f32_or("rope.freq_base_swa", 10000.0)?);
        // Linear RoPE scaling (Gemma 3 4B and up: 8) stretches the global layers' positions only
        // (llama.cpp's local layers keep `rope_freq_scale_train_swa`, 1). ggml multiplies by
        // 1 / factor where this divides by it: the same bits for a power of two.
        match md.str(&hp.key("rope.scaling.type")).unwrap_or("none") {
            "none" => {}
            "linear" => {
                let factor = hp.f32_or("rope.scaling.factor", 1.0)?;
                if factor > 0.0 && factor != 1.0 {
                    rope_global.freq_factors = Some(vec![factor; n_rot / 2]);
                }
            }
            other => {
                return Err(ModelError::Hparams(format!(
                    "RoPE scaling `{other}` is not supported (none, linear)"
                )))
            }
        }
        let softcap = Some(hp.f32_or("final_logit_softcapping", 0.0)?).filter(|&c| c != 0.0);
        // llama.cpp (after gemma_pytorch's config): 27B scales queries by 1/sqrt(n_embd/n_head),
        // the others by 1/sqrt(head_dim).
        let q_scale_dim = if n_layer == 62 {
            n_embd / n_head
        } else {
            head_dim
        };

        let mat = |name: &str, cols: usize, rows: Option<usize>| {
            let t = file.tensor(name).map_err(|_| ModelError::MissingTensor {
                tensor: name.into(),
            })?;
            Matrix::new(t, cols, rows)
        };
        let tok_embd = mat("token_embd.weight", n_embd, None)?;
        let n_vocab = tok_embd.rows;
        let q_dim = n_head * head_dim;
        let kv_dim = n_head_kv * head_dim;
        let mut layers = Vec::with_capacity(n_layer);
        for (i, &local) in local.iter().enumerate() {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(file, &p("attn_norm"), n_embd)?,
                wq: mat(&p("attn_q"), n_embd, Some(q_dim))?,
                wk: mat(&p("attn_k"), n_embd, Some(kv_dim))?,
                wv: mat(&p("attn_v"), n_embd, Some(kv_dim))?,
                q_norm: vector(file, &p("attn_q_norm"), head_dim)?,
                k_norm: vector(file, &p("attn_k_norm"), head_dim)?,
                wo: mat(&p("attn_output"), q_dim, Some(n_embd))?,
                attn_post_norm: vector(file, &p("post_attention_norm"), n_embd)?,
                ffn_norm: vector(file, &p("ffn_norm"), n_embd)?,
                gate: mat(&p("ffn_gate"), n_embd, Some(n_ff))?,
                up: mat(&p("ffn_up"), n_embd, Some(n_ff))?,
                down: mat(&p("ffn_down"), n_ff, Some(n_embd))?,
                ffn_post_norm: vector(file, &p("post_ffw_norm"), n_embd)?,
                local,
            });
        }
        let output = match file.tensor("output.weight") {
            Ok(_) => mat("output.weight", n_embd, Some(n_vocab))?,
            Err(_) => tok_embd,
        };
        Ok(Gemma3 {
            info: ModelInfo {
                arch: "gemma3".into(),
                n_vocab,
                n_ctx_train: hp.usize_or("context_length", 32768)?,
                n_embd,
                n_layer,
            },
            n_ff,
            eps,
            attn: AttnShape {
                n_head,
                n_head_kv,
                head_dim,
                scale: 1.0,
            },
            q_scale: 1.0 / (q_scale_dim as f32).sqrt(),
            window,
            rope_global,
            rope_local,
            embd_scale: (n_embd as f32).sqrt(),
            softcap,
            tok_embd,
            layers,
            output_norm: vector(file, "output_norm.weight", n_embd)?,
            output,
            tap: crate::Tap::from_env(),
        })
    }
}

/// RMSNorm of each of the `n` rows of `width` values in `x`, in place.
#[inline(always)]
fn norm_rows(x: &mut [f32], width: usize, n: usize, w: &[f32], eps: f32) {
    for row in x[..n * width].chunks_exact_mut(width) {
        rms_norm_inplace(row, w, eps);
    }
}

impl Model for Gemma3<'_> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self, n_ctx: usize, n_batch: usize) -> State {
        State::for_decoder(&self.info, &self.attn, self.n_ff, n_ctx, n_batch)
    }

    fn forward(
        &self,
        st: &mut State,
        tokens: &[u32],
        logits: Logits,
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError> {
        super::forward(self, st, tokens, logits, out, threads)
    }
}

impl super::ForwardBody for Gemma3<'_> {
    fn info(&self) -> &ModelInfo {
        &self.info
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
        let (d, n_ff, eps) = (self.info.n_embd, self.n_ff, self.eps);
        let a = &self.attn;
        let (hd, q_dim, kv_dim) = (a.head_dim, a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let s = &mut st.s;
        let tap = &self.tap;

        for (t, &id) in tokens.iter().enumerate() {
            let x = &mut s.x[t * d..(t + 1) * d];
            synapse_quant::dequantize_row(self.tok_embd.ty, self.tok_embd.row(id as usize), x)
                .map_err(|e| ModelError::Tensor {
                    tensor: "token_embd.weight".into(),
                    source: e,
                })?;
            scale_inplace(x, self.embd_scale);
        }
        tap.rows("inp_scaled", 0, st.pos, &s.x[..n * d], n);

        for (l, layer) in self.layers.iter().enumerate() {
            // Attention block.
            for t in 0..n {
                let x = &s.x[t * d..(t + 1) * d];
                rms_norm(x, &layer.attn_norm, eps, &mut s.h[t * d..(t + 1) * d]);
            }
            tap.rows("attn_norm", l, st.pos, &s.h[..n * d], n);
            mm_many(
                &[&layer.wq, &layer.wk, &layer.wv],
                &s.h,
                n,
                &mut s.acts,
                &mut [&mut s.q, &mut s.k, &mut s.v],
                threads,
            );
            norm_rows(&mut s.q, hd, n * a.n_head, &layer.q_norm, eps);
            norm_rows(&mut s.k, hd, n * a.n_head_kv, &layer.k_norm, eps);
            tap.rows("Qcur_normed", l, st.pos, &s.q[..n * q_dim], n);
            tap.rows("Kcur_normed", l, st.pos, &s.k[..n * kv_dim], n);
            let rope = if layer.local {
                &self.rope_local
            } else {
                &self.rope_global
            };
            for t in 0..n {
                let pos = st.pos + t;
                let (q, k) = (
                    &mut s.q[t * q_dim..(t + 1) * q_dim],
                    &mut s.k[t * kv_dim..(t + 1) * kv_dim],
                );
                rope.angles(pos, &mut s.rope);
                rope.apply(q, hd, &s.rope);
                rope.apply(k, hd, &s.rope);
                st.kv.store(l, pos, k, &s.v[t * kv_dim..(t + 1) * kv_dim]);
            }
            tap.rows("Qcur", l, st.pos, &s.q[..n * q_dim], n);
            tap.rows("Kcur", l, st.pos, &s.k[..n * kv_dim], n);
            tap.rows("Vcur", l, st.pos, &s.v[..n * kv_dim], n);
            scale_inplace(&mut s.q[..n * q_dim], self.q_scale);
            // Keys `first..=pos`: a local layer masks those `window` or more behind.
            crate::attention::attend_batch(
                a,
                &s.q[..n * q_dim],
                &st.kv,
                l,
                st.pos,
                layer.local.then_some(self.window),
                &mut s.att,
                threads,
            );
            tap.rows("kqv_out", l, st.pos, &s.att[..n * q_dim], n);
            mm(&layer.wo, &s.att, n, &mut s.acts, &mut s.o, threads);
            tap.rows("attn_out", l, st.pos, &s.o[..n * d], n);
            norm_rows(&mut s.o, d, n, &layer.attn_post_norm, eps);
            tap.rows("attn_post_norm", l, st.pos, &s.o[..n * d], n);
            add_inplace(&mut s.x[..n * d], &s.o[..n * d]);
            tap.rows("sa_out", l, st.pos, &s.x[..n * d], n);

            // Feed-forward block.
            for t in 0..n {
                let x = &s.x[t * d..(t + 1) * d];
                rms_norm(x, &layer.ffn_norm, eps, &mut s.h[t * d..(t + 1) * d]);
            }
            tap.rows("ffn_norm", l, st.pos, &s.h[..n * d], n);
            mm_many(
                &[&layer.gate, &layer.up],
                &s.h,
                n,
                &mut s.acts,
                &mut [&mut s.gate, &mut s.up],
                threads,
            );
            tap.rows("ffn_gate", l, st.pos, &s.gate[..n * n_ff], n);
            tap.rows("ffn_up", l, st.pos, &s.up[..n * n_ff], n);
            geglu(&mut s.gate[..n * n_ff], &s.up[..n * n_ff]);
            tap.rows("ffn_geglu", l, st.pos, &s.gate[..n * n_ff], n);
            mm(&layer.down, &s.gate, n, &mut s.acts, &mut s.o, threads);
            tap.rows("ffn_out", l, st.pos, &s.o[..n * d], n);
            norm_rows(&mut s.o, d, n, &layer.ffn_post_norm, eps);
            tap.rows("ffn_post_norm", l, st.pos, &s.o[..n * d], n);
            add_inplace(&mut s.x[..n * d], &s.o[..n * d]);
            tap.rows("l_out", l, st.pos, &s.x[..n * d], n);
        }
        st.pos += n;

        let rows = logits.rows(n);
        if rows > 0 {
            let first = n - rows;
            for t in 0..rows {
                let src = &s.x[(first + t) * d..(first + t + 1) * d];
                rms_norm(src, &self.output_norm, eps, &mut s.h[t * d..(t + 1) * d]);
            }
            let n_vocab = self.info.n_vocab;
            mm(&self.output, &s.h, rows, &mut s.acts, out, threads);
            if let Some(cap) = self.softcap {
                softcap_inplace(&mut out[..rows * n_vocab], cap);
            }
            let pos0 = st.pos - rows;
            tap.rows("result_norm", 0, pos0, &s.h[..rows * d], rows);
            tap.rows("result_output", 0, pos0, &out[..rows * n_vocab], rows);
        }
        Ok(())
    }
}

//! `llama`: Llama 2/3.x, SmolLM2, Mistral-style models.
//!
//! ```text
//! x = token_embd[token]
//! per layer:  x += Wo · attn(rope(Wq · norm(x)), rope(Wk · norm(x)), Wv · norm(x))
//!             x += Wdown · (silu(Wgate · norm(x)) * (Wup · norm(x)))
//! logits = Woutput · norm(x)          (Woutput = token_embd when the file has no output.weight)
//! ```
//! RMSNorm, adjacent-pair RoPE (with Llama 3's per-frequency factors from `rope_freqs.weight`, or
//! linear scaling), grouped-query attention over an F16 cache, SwiGLU.

use synapse_gguf::GgufFile;

use super::{attn_shape, mm, mm_many, vector, HParams, Logits, Model, ModelInfo, State};
use crate::attention::{attend_batch, AttnShape};
use crate::matmul::{Matrix, Threads};
use crate::ops::{add_inplace, rms_norm_rows, swiglu, Rope, RopeStyle};
use crate::ModelError;

struct Layer<'a> {
    attn_norm: Vec<f32>,
    wq: Matrix<'a>,
    wk: Matrix<'a>,
    wv: Matrix<'a>,
    wo: Matrix<'a>,
    ffn_norm: Vec<f32>,
    gate: Matrix<'a>,
    up: Matrix<'a>,
    down: Matrix<'a>,
}

pub struct Llama<'a> {
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

impl<'a> Llama<'a> {
    pub fn load(file: &'a GgufFile) -> Result<Llama<'a>, ModelError> {
        let md = file.metadata();
        let hp = HParams { md, arch: "llama" };
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
        let n_rot = hp.usize_or("rope.dimension_count", head_dim)?;
        if head_dim > crate::attention::MAX_HEAD_DIM {
            return Err(ModelError::Hparams(format!(
                "head dimension {head_dim} is too large"
            )));
        }
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::Hparams(format!(
                "RoPE over {n_rot} of {head_dim} dims"
            )));
        }
        let eps = hp.f32_or("attention.layer_norm_rms_epsilon", 1e-5)?;
        let base = hp.f32_or("rope.freq_base", 10000.0)?;
        let mut freq_factors = match file.tensor("rope_freqs.weight") {
            Ok(_) => Some(vector(file, "rope_freqs.weight", n_rot / 2)?),
            Err(_) => None,
        };
        match md.str(&hp.key("rope.scaling.type")).unwrap_or("none") {
            "none" => {}
            // Linear scaling divides every angle by the factor (ggml's freq_scale = 1 / factor).
            "linear" => {
                let factor = hp.f32_or("rope.scaling.factor", 1.0)?;
                if factor > 0.0 && factor != 1.0 {
                    let ff = freq_factors.get_or_insert_with(|| vec![1.0; n_rot / 2]);
                    ff.iter_mut().for_each(|f| *f *= factor);
                }
            }
            other => {
                return Err(ModelError::Hparams(format!(
                    "RoPE scaling `{other}` is not supported (none, linear)"
                )))
            }
        }

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
        for i in 0..n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(file, &p("attn_norm"), n_embd)?,
                wq: mat(&p("attn_q"), n_embd, Some(q_dim))?,
                wk: mat(&p("attn_k"), n_embd, Some(kv_dim))?,
                wv: mat(&p("attn_v"), n_embd, Some(kv_dim))?,
                wo: mat(&p("attn_output"), q_dim, Some(n_embd))?,
                ffn_norm: vector(file, &p("ffn_norm"), n_embd)?,
                gate: mat(&p("ffn_gate"), n_embd, Some(n_ff))?,
                up: mat(&p("ffn_up"), n_embd, Some(n_ff))?,
                down: mat(&p("ffn_down"), n_ff, Some(n_embd))?,
            });
        }
        let output = match file.tensor("output.weight") {
            Ok(_) => mat("output.weight", n_embd, Some(n_vocab))?,
            Err(_) => tok_embd,
        };
        Ok(Llama {
            info: ModelInfo {
                arch: "llama".into(),
                n_vocab,
                n_ctx_train: hp.usize_or("context_length", 2048)?,
                n_embd,
                n_layer,
            },
            n_ff,
            eps,
            attn: attn_shape(n_head, n_head_kv, head_dim),
            rope: Rope {
                style: RopeStyle::Adjacent,
                n_rot,
                base,
                freq_factors,
            },
            tok_embd,
            layers,
            output_norm: vector(file, "output_norm.weight", n_embd)?,
            output,
            tap: crate::Tap::from_env(),
        })
    }
}

impl Model for Llama<'_> {
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

impl super::ForwardBody for Llama<'_> {
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
        let d = self.info.n_embd;
        let a = &self.attn;
        let (q_dim, kv_dim) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let s = &mut st.s;

        for (t, &id) in tokens.iter().enumerate() {
            let row = self.tok_embd.row(id as usize);
            synapse_quant::dequantize_row(self.tok_embd.ty, row, &mut s.x[t * d..(t + 1) * d])
                .map_err(|e| ModelError::Tensor {
                    tensor: "token_embd.weight".into(),
                    source: e,
                })?;
        }

        for (l, layer) in self.layers.iter().enumerate() {
            // Attention block.
            rms_norm_rows(&s.x[..n * d], &layer.attn_norm, self.eps, &mut s.h, d);
            mm_many(
                &[&layer.wq, &layer.wk, &layer.wv],
                &s.h,
                n,
                &mut s.acts,
                &mut [&mut s.q, &mut s.k, &mut s.v],
                threads,
            );
            for t in 0..n {
                let pos = st.pos + t;
                self.rope.angles(pos, &mut s.rope);
                self.rope
                    .apply(&mut s.q[t * q_dim..(t + 1) * q_dim], a.head_dim, &s.rope);
                self.rope
                    .apply(&mut s.k[t * kv_dim..(t + 1) * kv_dim], a.head_dim, &s.rope);
                st.kv.store(
                    l,
                    pos,
                    &s.k[t * kv_dim..(t + 1) * kv_dim],
                    &s.v[t * kv_dim..(t + 1) * kv_dim],
                );
            }
            self.tap.rows("Qcur", l, st.pos, &s.q[..n * q_dim], n);
            self.tap.rows("Kcur", l, st.pos, &s.k[..n * kv_dim], n);
            attend_batch(
                a,
                &s.q[..n * q_dim],
                &st.kv,
                l,
                st.pos,
                None,
                &mut s.att,
                threads,
            );
            self.tap.rows("attn_norm", l, st.pos, &s.h[..n * d], n);
            self.tap.rows("kqv_out", l, st.pos, &s.att[..n * q_dim], n);
            mm(&layer.wo, &s.att, n, &mut s.acts, &mut s.o, threads);
            self.tap.rows("attn_out", l, st.pos, &s.o[..n * d], n);
            add_inplace(&mut s.x[..n * d], &s.o[..n * d]);

            // Feed-forward block.
            rms_norm_rows(&s.x[..n * d], &layer.ffn_norm, self.eps, &mut s.h, d);
            mm_many(
                &[&layer.gate, &layer.up],
                &s.h,
                n,
                &mut s.acts,
                &mut [&mut s.gate, &mut s.up],
                threads,
            );
            self.tap
                .rows("ffn_gate", l, st.pos, &s.gate[..n * self.n_ff], n);
            self.tap
                .rows("ffn_up", l, st.pos, &s.up[..n * self.n_ff], n);
            swiglu(&mut s.gate[..n * self.n_ff], &s.up[..n * self.n_ff]);
            self.tap
                .rows("ffn_swiglu", l, st.pos, &s.gate[..n * self.n_ff], n);
            mm(&layer.down, &s.gate, n, &mut s.acts, &mut s.o, threads);
            self.tap.rows("ffn_out", l, st.pos, &s.o[..n * d], n);
            add_inplace(&mut s.x[..n * d], &s.o[..n * d]);
            self.tap.rows("l_out", l, st.pos, &s.x[..n * d], n);
        }
        st.pos += n;

        let rows = logits.rows(n);
        if rows > 0 {
            let first = n - rows;
            rms_norm_rows(
                &s.x[first * d..n * d],
                &self.output_norm,
                self.eps,
                &mut s.h,
                d,
            );
            mm(&self.output, &s.h, rows, &mut s.acts, out, threads);
            self.tap
                .rows("result_norm", 0, st.pos - rows, &s.h[..rows * d], rows);
            self.tap.rows(
                "result_output",
                0,
                st.pos - rows,
                &out[..rows * self.info.n_vocab],
                rows,
            );
        }
        Ok(())
    }
}

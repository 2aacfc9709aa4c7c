//! A decoder of the llama family run on the GPU: the engine's [`DecoderView`] uploaded, and
//! the engine's [`Model`] trait implemented over it, so that the generation loop, the CLI and
//! the checks are the CPU path's. A pass is one command submission; only the logits come back.

use std::collections::HashMap;
use std::sync::Arc;

use synapse_engine::attention::AttnShape;
use synapse_engine::model::{check_forward, GateView, WeightView};
use synapse_engine::ops::{Rope, RopeStyle};
use synapse_engine::{Batch, Logits, Model, ModelError, ModelInfo, Seq, State, Threads};
use synapse_gguf::GgufFile;

use crate::buffer::F32Buffer;
use crate::matmul::Matrix;
use crate::ops::Op;
use crate::program::{Pass, Program};
use crate::{Gpu, GpuError};

impl From<GpuError> for ModelError {
    fn from(e: GpuError) -> ModelError {
        ModelError::Backend(format!("GPU: {e}"))
    }
}

/// The most values of a head the attention kernel holds.
const MAX_HEAD_DIM: usize = 512;

struct Layer {
    attn_norm: F32Buffer,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    bq: Option<F32Buffer>,
    bk: Option<F32Buffer>,
    bv: Option<F32Buffer>,
    q_norm: Option<F32Buffer>,
    k_norm: Option<F32Buffer>,
    ffn_norm: F32Buffer,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
    attn_post_norm: Option<F32Buffer>,
    ffn_post_norm: Option<F32Buffer>,
    /// Its RoPE among the decoder's `ropes`, if it rotates.
    rope: Option<usize>,
    /// Keys a query sees, itself included (0: all).
    window: usize,
}

/// A llama-family decoder with its weights on the GPU.
pub struct GpuDecoder<'a> {
    gpu: Arc<Gpu>,
    info: ModelInfo,
    eps: f32,
    attn: AttnShape,
    /// The distinct RoPEs of the layers (Gemma's local and global ones).
    ropes: Vec<Rope>,
    gate: GateView,
    n_ff: usize,
    embd_scale: Option<f32>,
    residual_scale: Option<f32>,
    q_scale: Option<f32>,
    logit_scale: Option<f32>,
    logit_softcap: Option<f32>,
    /// Looked up on the host: a pass sends the GPU its tokens' rows, decoded.
    tok_embd: WeightView<'a>,
    layers: Vec<Layer>,
    output_norm: F32Buffer,
    output: Arc<Matrix>,
    output_bias: Option<Vec<f32>>,
    /// The CPU's time to record and submit the last pass's layers, in nanoseconds: what
    /// the host adds to every token (`synapse-dev bench-gpu --model`).
    encode_ns: std::sync::atomic::AtomicU64,
}

fn refuse(what: String) -> ModelError {
    ModelError::Backend(format!("GPU: {what}"))
}

impl<'a> GpuDecoder<'a> {
    /// Upload `model` (loaded by the engine from `file`) to `gpu`. Architectures the engine
    /// describes no [`DecoderView`] for (Gemma, Qwen 3.5, OLMo 2, mixtures) are refused by
    /// name. The decoder borrows only the file (for its embedding rows): `model` may be dropped.
    ///
    /// [`DecoderView`]: synapse_engine::model::DecoderView
    pub fn load(
        gpu: Arc<Gpu>,
        file: &'a GgufFile,
        model: &dyn Model,
    ) -> Result<GpuDecoder<'a>, ModelError> {
        let info = model.info();
        let v = model.view().ok_or_else(|| {
            refuse(format!(
                "the `{}` architecture runs on the CPU only for now (the GPU runs llama, \
                 Qwen 2 and 3, Granite, Phi-3, SmolLM 3, Gemma 2 and 3, without experts)",
                info.arch
            ))
        })?;
        let a = v.attn;
        if a.head_dim % 2 != 0 || a.head_dim > MAX_HEAD_DIM {
            return Err(refuse(format!(
                "heads of {} values are not supported (even, at most {MAX_HEAD_DIM})",
                a.head_dim
            )));
        }
        let mut ropes: Vec<Rope> = Vec::new();
        let up = |w: &WeightView| gpu.upload_matrix(w.name, w.ty, w.rows, w.cols, w.bytes);
        let vector = |x: &[f32]| gpu.upload(x);
        let opt = |x: Option<&[f32]>| x.map(vector).transpose();
        let mut layers = Vec::with_capacity(v.layers.len());
        for l in &v.layers {
            layers.push(Layer {
                attn_norm: vector(l.attn_norm)?,
                wq: up(&l.wq)?,
                wk: up(&l.wk)?,
                wv: up(&l.wv)?,
                wo: up(&l.wo)?,
                bq: opt(l.bq)?,
                bk: opt(l.bk)?,
                bv: opt(l.bv)?,
                q_norm: opt(l.q_norm)?,
                k_norm: opt(l.k_norm)?,
                ffn_norm: vector(l.ffn_norm)?,
                gate: up(&l.gate)?,
                up: up(&l.up)?,
                down: up(&l.down)?,
                attn_post_norm: opt(l.attn_post_norm)?,
                ffn_post_norm: opt(l.ffn_post_norm)?,
                rope: l.rope.filter(|r| r.n_rot > 0).map(|r| {
                    ropes.iter().position(|x| x == r).unwrap_or_else(|| {
                        ropes.push(r.clone());
                        ropes.len() - 1
                    })
                }),
                window: l.window.unwrap_or(0),
            });
        }
        let n_ff = v.layers.first().map_or(0, |l| l.gate.rows);
        // The embedding's bytes as the file lends them, for as long as the file lives.
        let t = file.tensor(v.tok_embd.name)?;
        let tok_embd = WeightView {
            name: &t.info.name,
            bytes: &t.data[..v.tok_embd.bytes.len()],
            ..v.tok_embd
        };
        Ok(GpuDecoder {
            info: ModelInfo::new(
                &info.arch,
                v.n_vocab,
                info.n_ctx_train,
                v.n_embd,
                v.layers.len(),
            ),
            eps: v.eps,
            attn: a,
            ropes,
            gate: v.gate,
            n_ff,
            embd_scale: v.embd_scale,
            residual_scale: v.residual_scale,
            q_scale: v.q_scale,
            logit_scale: v.logit_scale,
            logit_softcap: v.logit_softcap,
            tok_embd,
            layers,
            output_norm: vector(v.output_norm)?,
            output: Arc::new(up(&v.output)?),
            output_bias: v.output_bias.map(<[f32]>::to_vec),
            encode_ns: Default::default(),
            gpu,
        })
    }

    /// The CPU's time to record and submit the last pass's layers (the embedding rows'
    /// upload included, the logits' readback not).
    pub fn last_encode_time(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.encode_ns.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The token rows of the embedding, decoded on the host (one row each).
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let (d, e) = (self.info.n_embd, &self.tok_embd);
        let row_bytes = e.bytes.len() / e.rows;
        let mut x = vec![0f32; tokens.len() * d];
        for (&tok, row) in tokens.iter().zip(x.chunks_exact_mut(d)) {
            let t = tok as usize;
            synapse_quant::dequantize_row(e.ty, &e.bytes[t * row_bytes..(t + 1) * row_bytes], row)
                .map_err(|err| refuse(format!("{}: {err}", e.name)))?;
        }
        if let Some(s) = self.embd_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        Ok(x)
    }
}

/// What a sequence keeps on the GPU: its KV cache, one buffer per layer, the RoPE table of
/// its context, and the pass's buffers for up to `n_batch` tokens.
struct GpuState {
    x: F32Buffer,
    h: F32Buffer,
    q: F32Buffer,
    k: F32Buffer,
    v: F32Buffer,
    att: F32Buffer,
    o: F32Buffer,
    g: F32Buffer,
    u: F32Buffer,
    last_x: F32Buffer,
    last_h: F32Buffer,
    logits: F32Buffer,
    /// Rows of logits one readback holds.
    logit_rows: usize,
    /// The angles of each of the decoder's RoPEs for every position of the context.
    ropes: Vec<F32Buffer>,
    cache_k: Vec<F32Buffer>,
    cache_v: Vec<F32Buffer>,
    /// The recorded passes, by (logits?, tokens): a decode step replays the last one's.
    programs: std::sync::Mutex<HashMap<(bool, usize), Option<Program>>>,
}

fn f(x: f32) -> u32 {
    x.to_bits()
}

impl<'a> GpuDecoder<'a> {
    fn state(&self, n_ctx: usize, n_batch: usize) -> Result<GpuState, GpuError> {
        let g = &self.gpu;
        let n = n_batch.min(n_ctx);
        let a = &self.attn;
        let (d, q_dim, kv_dim) = (
            self.info.n_embd,
            a.n_head * a.head_dim,
            a.n_head_kv * a.head_dim,
        );
        let n_vocab = self.info.n_vocab;
        let limit = (g.info().max_binding_bytes / 4) as usize;
        let logit_rows = (limit / n_vocab).clamp(1, 64).min(n);
        let table = |rope: &Rope| {
            let half = rope.n_rot / 2;
            let mut table = vec![0f32; n_ctx * half * 2];
            let mut cs = vec![(0f32, 0f32); half];
            for pos in 0..n_ctx {
                rope.angles(pos, &mut cs);
                for (i, (c, s)) in cs.iter().enumerate() {
                    table[(pos * half + i) * 2] = *c;
                    table[(pos * half + i) * 2 + 1] = *s;
                }
            }
            g.upload(&table)
        };
        let words = n_ctx * kv_dim / 2;
        Ok(GpuState {
            x: g.buffer(n * d)?,
            h: g.buffer(n * d)?,
            q: g.buffer(n * q_dim)?,
            k: g.buffer(n * kv_dim)?,
            v: g.buffer(n * kv_dim)?,
            att: g.buffer(n * q_dim)?,
            o: g.buffer(n * d)?,
            g: g.buffer(n * self.n_ff)?,
            u: g.buffer(n * self.n_ff)?,
            last_x: g.buffer(logit_rows * d)?,
            last_h: g.buffer(logit_rows * d)?,
            logits: g.buffer(logit_rows * n_vocab)?,
            logit_rows,
            ropes: self.ropes.iter().map(table).collect::<Result<_, _>>()?,
            cache_k: (0..self.layers.len())
                .map(|_| g.buffer(words))
                .collect::<Result<_, _>>()?,
            cache_v: (0..self.layers.len())
                .map(|_| g.buffer(words))
                .collect::<Result<_, _>>()?,
            programs: Default::default(),
        })
    }

    fn rms_norm(
        &self,
        pass: &mut Pass,
        x: &F32Buffer,
        w: &F32Buffer,
        y: Option<&F32Buffer>,
        rows: usize,
        width: usize,
    ) -> Result<(), GpuError> {
        let params = [width as u32, rows as u32, f(self.eps), 0];
        let groups = Gpu::row_groups(rows);
        match y {
            Some(y) => self.gpu.dispatch(
                pass,
                Op::RmsNorm,
                &[x.raw(), w.raw(), y.raw()],
                &params,
                groups,
            ),
            None => self.gpu.dispatch(
                pass,
                Op::RmsNormInPlace,
                &[x.raw(), w.raw()],
                &params,
                groups,
            ),
        }
    }

    fn elementwise(
        &self,
        pass: &mut Pass,
        op: Op,
        [x, y]: [&F32Buffer; 2],
        (n, width): (usize, usize),
        scale: f32,
    ) -> Result<(), GpuError> {
        let params = [n as u32, width as u32, f(scale), 0];
        self.gpu.dispatch(
            pass,
            op,
            &[x.raw(), y.raw()],
            &params,
            Gpu::elementwise_groups(n),
        )
    }

    fn rope(
        &self,
        pass: &mut Pass,
        x: &F32Buffer,
        (rope, table): (&Rope, &F32Buffer),
        (n, heads, pos0): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        let half = rope.n_rot / 2;
        let neox = u32::from(rope.style == RopeStyle::Neox);
        let params = [
            n as u32,
            heads as u32,
            self.attn.head_dim as u32,
            half as u32,
            pos0 as u32,
            neox,
            0,
            0,
        ];
        let groups = (half.div_ceil(64) as u32, heads as u32, n as u32);
        self.gpu
            .dispatch(pass, Op::Rope, &[x.raw(), table.raw()], &params, groups)
    }

    /// One layer over the `n` rows of `s.x` at positions `pos0..`.
    fn layer(
        &self,
        pass: &mut Pass,
        l: usize,
        s: &GpuState,
        pos0: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        let (g, layer, a) = (&self.gpu, &self.layers[l], &self.attn);
        let d = self.info.n_embd;
        let (q_dim, kv_dim) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        self.rms_norm(pass, &s.x, &layer.attn_norm, Some(&s.h), n, d)?;
        g.matmul_into(pass, &layer.wq, &s.h, &s.q, n)?;
        g.matmul_into(pass, &layer.wk, &s.h, &s.k, n)?;
        g.matmul_into(pass, &layer.wv, &s.h, &s.v, n)?;
        for (b, x, width) in [
            (&layer.bq, &s.q, q_dim),
            (&layer.bk, &s.k, kv_dim),
            (&layer.bv, &s.v, kv_dim),
        ] {
            if let Some(b) = b {
                self.elementwise(pass, Op::AddBias, [x, b], (n * width, width), 1.0)?;
            }
        }
        if let Some(w) = &layer.q_norm {
            self.rms_norm(pass, &s.q, w, None, n * a.n_head, a.head_dim)?;
        }
        if let Some(w) = &layer.k_norm {
            self.rms_norm(pass, &s.k, w, None, n * a.n_head_kv, a.head_dim)?;
        }
        if let Some(r) = layer.rope {
            let rope = (&self.ropes[r], &s.ropes[r]);
            self.rope(pass, &s.q, rope, (n, a.n_head, pos0))?;
            self.rope(pass, &s.k, rope, (n, a.n_head_kv, pos0))?;
        }
        if let Some(scale) = self.q_scale {
            self.elementwise(
                pass,
                Op::Scale,
                [&s.q, s.q_dummy()],
                (n * q_dim, q_dim),
                scale,
            )?;
        }
        let words = kv_dim / 2;
        g.dispatch(
            pass,
            Op::KvStore,
            &[s.k.raw(), s.v.raw(), s.cache_k[l].raw(), s.cache_v[l].raw()],
            &[n as u32, words as u32, pos0 as u32, 0],
            (words.div_ceil(64) as u32, n as u32, 1),
        )?;
        g.dispatch(
            pass,
            Op::Attention,
            &[
                s.q.raw(),
                s.cache_k[l].raw(),
                s.cache_v[l].raw(),
                s.att.raw(),
            ],
            &[
                a.n_head as u32,
                a.n_head_kv as u32,
                a.head_dim as u32,
                pos0 as u32,
                words as u32,
                layer.window as u32,
                f(a.scale),
                f(a.softcap.unwrap_or(0.0)),
            ],
            (a.n_head as u32, n as u32, 1),
        )?;
        let residual = self.residual_scale.unwrap_or(1.0);
        g.matmul_into(pass, &layer.wo, &s.att, &s.o, n)?;
        if let Some(w) = &layer.attn_post_norm {
            self.rms_norm(pass, &s.o, w, None, n, d)?;
        }
        self.elementwise(pass, Op::AddScaled, [&s.x, &s.o], (n * d, d), residual)?;
        self.rms_norm(pass, &s.x, &layer.ffn_norm, Some(&s.h), n, d)?;
        g.matmul_into(pass, &layer.gate, &s.h, &s.g, n)?;
        g.matmul_into(pass, &layer.up, &s.h, &s.u, n)?;
        let act = match self.gate {
            GateView::Silu => Op::Swiglu,
            GateView::Gelu => Op::Geglu,
        };
        self.elementwise(pass, act, [&s.g, &s.u], (n * self.n_ff, self.n_ff), 1.0)?;
        g.matmul_into(pass, &layer.down, &s.g, &s.o, n)?;
        if let Some(w) = &layer.ffn_post_norm {
            self.rms_norm(pass, &s.o, w, None, n, d)?;
        }
        self.elementwise(pass, Op::AddScaled, [&s.x, &s.o], (n * d, d), residual)
    }

    /// The logits of rows `first..first + rows` of `s.x` into `out`.
    fn logits(
        &self,
        s: &GpuState,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) -> Result<(), GpuError> {
        let (d, n_vocab) = (self.info.n_embd, self.info.n_vocab);
        for c0 in (0..rows).step_by(s.logit_rows) {
            let m = s.logit_rows.min(rows - c0);
            let mut enc = self.gpu.encoder();
            enc.copy_buffer_to_buffer(
                s.x.raw(),
                (4 * (first + c0) * d) as u64,
                s.last_x.raw(),
                0,
                (4 * m * d) as u64,
            );
            let mut pass = Pass::default();
            self.rms_norm(
                &mut pass,
                &s.last_x,
                &self.output_norm,
                Some(&s.last_h),
                m,
                d,
            )?;
            self.gpu
                .matmul_into(&mut pass, &self.output, &s.last_h, &s.logits, m)?;
            let mut programs = s.programs.lock().unwrap_or_else(|p| p.into_inner());
            self.gpu
                .record(&mut enc, &pass, programs.entry((true, m)).or_default());
            drop(programs);
            self.gpu.submit(enc);
            let y = self.gpu.read(&s.logits)?;
            out[c0 * n_vocab..(c0 + m) * n_vocab].copy_from_slice(&y[..m * n_vocab]);
        }
        let out = &mut out[..rows * n_vocab];
        if let Some(b) = &self.output_bias {
            for row in out.chunks_exact_mut(n_vocab) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        if let Some(cap) = self.logit_softcap {
            let inv = 1.0 / cap;
            out.iter_mut().for_each(|v| *v = (*v * inv).tanh() * cap);
        }
        if let Some(scale) = self.logit_scale {
            let inv = 1.0 / scale;
            out.iter_mut().for_each(|v| *v *= inv);
        }
        Ok(())
    }
}

impl GpuState {
    /// A buffer for an op's second binding that the op does not read.
    fn q_dummy(&self) -> &F32Buffer {
        &self.o
    }
}

impl Model for GpuDecoder<'_> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError> {
        // The engine's checks of the sizes first: a zero context or batch is its error.
        State::external(&self.info, n_ctx, n_batch, Box::new(()))?;
        let gs = self.state(n_ctx, n_batch)?;
        State::external(&self.info, n_ctx, n_batch, Box::new(gs))
    }

    fn forward(
        &self,
        st: &mut State,
        tokens: &[u32],
        logits: Logits,
        out: &mut [f32],
        _threads: &Threads,
    ) -> Result<(), ModelError> {
        check_forward(&self.info, st, tokens, logits, out)?;
        let (n, pos0) = (tokens.len(), st.pos);
        if n == 0 {
            return Ok(());
        }
        let x = self.embed(tokens)?;
        let s = st
            .external_mut::<GpuState>()
            .ok_or(ModelError::ForeignState)?;
        let t = std::time::Instant::now();
        self.gpu.write(&s.x, &x)?;
        let mut pass = Pass::default();
        for l in 0..self.layers.len() {
            self.layer(&mut pass, l, s, pos0, n)?;
        }
        let mut enc = self.gpu.encoder();
        let mut programs = s.programs.lock().unwrap_or_else(|p| p.into_inner());
        self.gpu
            .record(&mut enc, &pass, programs.entry((false, n)).or_default());
        drop(programs);
        self.gpu.submit(enc);
        let ns = t.elapsed().as_nanos() as u64;
        self.encode_ns
            .store(ns, std::sync::atomic::Ordering::Relaxed);
        let rows = logits.rows(n);
        if rows > 0 {
            self.logits(s, n - rows, rows, out)?;
        } else {
            self.gpu.finish()?;
        }
        st.pos += n;
        Ok(())
    }

    fn new_batch(&self, _n_tokens: usize) -> Result<Batch, ModelError> {
        Err(refuse(
            "passes over several sequences at once (serving) run on the CPU only for now".into(),
        ))
    }

    fn forward_batch(
        &self,
        _batch: &mut Batch,
        _seqs: &mut [Seq<'_>],
        _out: &mut [f32],
        _threads: &Threads,
    ) -> Result<(), ModelError> {
        Err(refuse(
            "passes over several sequences at once (serving) run on the CPU only for now".into(),
        ))
    }

    fn weight_memory(&self) -> Vec<&[u8]> {
        Vec::new()
    }
}

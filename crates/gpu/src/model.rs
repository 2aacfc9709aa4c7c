//! A decoder run on the GPU: the engine's [`DecoderView`] uploaded (`layers.rs`), and the
//! engine's [`Model`] trait implemented over it, so that the generation loop, the CLI and the
//! checks are the CPU path's. A pass is one command submission; only the logits come back.
//!
//! [`DecoderView`]: synapse_engine::model::DecoderView

use std::sync::Arc;

use synapse_engine::model::{check_forward, WeightView};
use synapse_engine::{Batch, Logits, Model, ModelError, ModelInfo, Seq, State, Threads};
use synapse_gguf::GgufFile;

use crate::buffer::F32Buffer;
use crate::layers::{Layer, Recorder};
use crate::matmul::Matrix;
use crate::program::Pass;
use crate::shape::Shape;
use crate::state::GpuState;
use crate::{Gpu, GpuError};

impl From<GpuError> for ModelError {
    fn from(e: GpuError) -> ModelError {
        ModelError::Backend(format!("GPU: {e}"))
    }
}

/// The most values of a head the attention kernel holds.
const MAX_HEAD_DIM: usize = 512;

/// A decoder with its weights on the GPU.
pub struct GpuDecoder<'a> {
    gpu: Arc<Gpu>,
    info: ModelInfo,
    sh: Shape,
    embd_scale: Option<f32>,
    logit_scale: Option<f32>,
    logit_softcap: Option<f32>,
    /// Looked up on the host: a pass sends the GPU its tokens' rows, decoded.
    tok_embd: WeightView<'a>,
    layers: Vec<Layer>,
    /// The delta nets' L2 norms' weights, where the model has them.
    l2_weights: Option<F32Buffer>,
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
    /// describes no [`DecoderView`] for (the mixtures of experts) are refused by name. The decoder borrows only the file (for its embedding rows): `model` may be dropped.
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
                "the `{}` architecture's mixtures of experts run on the CPU only for now (the \
                 GPU runs every dense architecture)",
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
        let mut sh = Shape {
            n_embd: v.n_embd,
            n_vocab: v.n_vocab,
            eps: v.eps,
            attn: a,
            ropes: Vec::new(),
            gate: v.gate,
            n_ff: v.layers.first().map_or(0, |l| l.gate.rows),
            q_scale: v.q_scale,
            q_temp: v.q_temp,
            rope_long: v.rope_long.map(|(s, l, n)| (s.clone(), l.clone(), n)),
            residual_scale: v.residual_scale,
            dn: None,
            n_attn_layers: 0,
            n_dn_layers: 0,
            gated: false,
        };
        let layers = v
            .layers
            .iter()
            .map(|l| Layer::upload(&gpu, l, &mut sh))
            .collect::<Result<Vec<_>, _>>()?;
        let l2_weights = match &sh.dn {
            Some(dn) => Some(gpu.upload(&vec![1.0 / (dn.head_dim as f32).sqrt(); dn.head_dim])?),
            None => None,
        };
        let up = |w: &WeightView| gpu.upload_matrix(w.name, w.ty, w.rows, w.cols, w.bytes);
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
            embd_scale: v.embd_scale,
            logit_scale: v.logit_scale,
            logit_softcap: v.logit_softcap,
            tok_embd,
            layers,
            l2_weights,
            output_norm: gpu.upload(v.output_norm)?,
            output: Arc::new(up(&v.output)?),
            output_bias: v.output_bias.map(<[f32]>::to_vec),
            encode_ns: Default::default(),
            sh,
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

impl GpuDecoder<'_> {
    /// The recorder of a pass over `s`.
    fn recorder<'r>(&'r self, s: &'r GpuState, pass: &'r mut Pass) -> Recorder<'r> {
        Recorder {
            gpu: &self.gpu,
            sh: &self.sh,
            s,
            l2_weights: self.l2_weights.as_ref(),
            pass,
        }
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
            let mut rec = self.recorder(s, &mut pass);
            rec.rms_norm(&s.last_x, &self.output_norm, Some(&s.last_h), m, d)?;
            self.gpu
                .matmul_into(&mut pass, &self.output, &s.last_h, &s.logits, m)?;
            let mut programs = s.programs.lock().unwrap_or_else(|p| p.into_inner());
            self.gpu
                .record(&mut enc, &pass, programs.entry((true, m)).or_default());
            drop(programs);
            let rows_out = &mut out[c0 * n_vocab..(c0 + m) * n_vocab];
            self.gpu.read_into(enc, &s.logits, &s.readback, rows_out)?;
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

impl Model for GpuDecoder<'_> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError> {
        // The engine's checks of the sizes first: a zero context or batch is its error.
        let recurrent = self.sh.n_dn_layers > 0;
        State::external(&self.info, n_ctx, n_batch, Box::new(()), recurrent)?;
        let gs = GpuState::new(&self.gpu, &self.sh, n_ctx, n_batch)?;
        State::external(&self.info, n_ctx, n_batch, Box::new(gs), recurrent)
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
        let mut rec = self.recorder(s, &mut pass);
        for layer in &self.layers {
            rec.layer(layer, pos0, n)?;
        }
        let mut enc = self.gpu.encoder();
        if pos0 == 0 {
            s.clear_recurrent(&mut enc);
        }
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

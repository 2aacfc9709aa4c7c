//! What a sequence keeps on the GPU: the KV cache of each attention layer, the convolution and
//! delta-rule states of each delta-net layer, the RoPE tables of its context, the buffers of a
//! pass of up to `n_batch` tokens, and its recorded passes.

use std::collections::HashMap;

use synapse_engine::ops::Rope;

use crate::buffer::F32Buffer;
use crate::program::Program;
use crate::shape::Shape;
use crate::{Gpu, GpuError};

pub(crate) struct GpuState {
    pub x: F32Buffer,
    pub h: F32Buffer,
    pub q: F32Buffer,
    pub k: F32Buffer,
    pub v: F32Buffer,
    pub att: F32Buffer,
    pub o: F32Buffer,
    pub g: F32Buffer,
    pub u: F32Buffer,
    /// A gated attention's queries with their gates.
    pub q_full: F32Buffer,
    /// The delta net's buffers: its input projection before and after the convolution, the
    /// output gate's projection, beta and g per value head, the rule's output.
    pub mixed: F32Buffer,
    pub conv: F32Buffer,
    pub z: F32Buffer,
    pub beta: F32Buffer,
    pub decay: F32Buffer,
    pub core: F32Buffer,
    pub last_x: F32Buffer,
    pub last_h: F32Buffer,
    pub logits: F32Buffer,
    /// Where the logits are read back through.
    pub readback: wgpu::Buffer,
    /// Rows of logits one readback holds.
    pub logit_rows: usize,
    /// The angles of each of the decoder's RoPEs for every position of the context.
    pub ropes: Vec<F32Buffer>,
    /// The queries' temperature factor of every position of the context, where the model has
    /// one.
    pub temps: Option<F32Buffer>,
    /// By attention layer.
    pub cache_k: Vec<F32Buffer>,
    pub cache_v: Vec<F32Buffer>,
    /// By delta-net layer: each channel's last inputs, each value head's hd x hd state.
    pub conv_state: Vec<F32Buffer>,
    pub ssm: Vec<F32Buffer>,
    /// The recorded passes, by (logits?, tokens): a decode step replays the last one's.
    pub programs: std::sync::Mutex<HashMap<(bool, usize), Option<Program>>>,
}

impl GpuState {
    pub fn new(g: &Gpu, sh: &Shape, n_ctx: usize, n_batch: usize) -> Result<GpuState, GpuError> {
        let n = n_batch.min(n_ctx);
        let (d, q_dim, kv_dim) = (sh.n_embd, sh.q_dim(), sh.kv_dim());
        let limit = (g.info().max_binding_bytes / 4) as usize;
        let logit_rows = (limit / sh.n_vocab).clamp(1, 64).min(n);
        let table = |rope: &Rope| {
            let rope = sh.rope_for(rope, n_ctx);
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
        let many = |count: usize, len: usize| -> Result<Vec<F32Buffer>, GpuError> {
            (0..count).map(|_| g.buffer(len)).collect()
        };
        let (conv_dim, value_dim, h_v, conv_len, ssm_len) = match &sh.dn {
            Some(dn) => (
                dn.conv_dim(),
                dn.value_dim(),
                dn.n_v_heads,
                dn.conv_dim() * (dn.d_conv - 1),
                dn.n_v_heads * dn.head_dim * dn.head_dim,
            ),
            None => (0, 0, 0, 0, 0),
        };
        Ok(GpuState {
            x: g.buffer(n * d)?,
            h: g.buffer(n * d)?,
            q: g.buffer(n * q_dim)?,
            k: g.buffer(n * kv_dim)?,
            v: g.buffer(n * kv_dim)?,
            att: g.buffer(n * q_dim)?,
            o: g.buffer(n * d)?,
            g: g.buffer(n * sh.n_ff)?,
            u: g.buffer(n * sh.n_ff)?,
            q_full: g.buffer(if sh.gated { 2 * n * q_dim } else { 0 })?,
            mixed: g.buffer(n * conv_dim)?,
            conv: g.buffer(n * conv_dim)?,
            z: g.buffer(n * value_dim)?,
            beta: g.buffer(n * h_v)?,
            decay: g.buffer(n * h_v)?,
            core: g.buffer(n * value_dim)?,
            last_x: g.buffer(logit_rows * d)?,
            last_h: g.buffer(logit_rows * d)?,
            logits: g.buffer(logit_rows * sh.n_vocab)?,
            readback: g.staging(logit_rows * sh.n_vocab),
            logit_rows,
            ropes: sh.ropes.iter().map(table).collect::<Result<_, _>>()?,
            temps: match sh.q_temp {
                Some(t) => Some(g.upload(&(0..n_ctx).map(|p| t.at(p)).collect::<Vec<_>>())?),
                None => None,
            },
            cache_k: many(sh.n_attn_layers, words)?,
            cache_v: many(sh.n_attn_layers, words)?,
            conv_state: many(sh.n_dn_layers, conv_len)?,
            ssm: many(sh.n_dn_layers, ssm_len)?,
            programs: Default::default(),
        })
    }

    /// Zero the delta-net states: a pass from position 0 starts them afresh.
    pub fn clear_recurrent(&self, encoder: &mut wgpu::CommandEncoder) {
        for b in self.conv_state.iter().chain(&self.ssm) {
            encoder.clear_buffer(b.raw(), 0, None);
        }
    }
}

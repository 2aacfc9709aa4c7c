//! A layer's weights on the GPU and the dispatches of its pass: the norms, the mixer (attention,
//! plain or gated, or a gated delta net), the feed-forward block and the residuals.

use synapse_engine::delta_net::DeltaNetShape;
use synapse_engine::model::{GateView, LayerView, MixerView, WeightView};
use synapse_engine::ops::{Rope, RopeStyle};

use crate::buffer::F32Buffer;
use crate::matmul::Matrix;
use crate::ops::Op;
use crate::program::Pass;
use crate::shape::Shape;
use crate::state::GpuState;
use crate::{Gpu, GpuError};

pub(crate) struct Attention {
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    bq: Option<F32Buffer>,
    bk: Option<F32Buffer>,
    bv: Option<F32Buffer>,
    q_norm: Option<F32Buffer>,
    k_norm: Option<F32Buffer>,
    gated: bool,
    /// Its RoPE among the shape's `ropes`, if it rotates.
    rope: Option<usize>,
    /// Keys a query sees, itself included (0: all).
    window: usize,
    /// Its KV cache among the state's.
    kv: usize,
}

pub(crate) struct DeltaNet {
    wqkv: Matrix,
    wgate: Matrix,
    wbeta: Matrix,
    walpha: Matrix,
    wout: Matrix,
    conv1d: F32Buffer,
    dt_bias: F32Buffer,
    a: F32Buffer,
    norm: F32Buffer,
    /// Its states among the state's.
    rs: usize,
}

pub(crate) enum Mixer {
    Attention(Attention),
    DeltaNet(DeltaNet),
}

pub(crate) struct Layer {
    /// Where a block has no norm before it (OLMo 2), it reads `x` itself.
    attn_norm: Option<F32Buffer>,
    mixer: Mixer,
    attn_post_norm: Option<F32Buffer>,
    ffn_norm: Option<F32Buffer>,
    gate: Matrix,
    up: Matrix,
    down: Matrix,
    ffn_post_norm: Option<F32Buffer>,
}

/// The most taps of the delta net's convolution the kernel holds.
pub(crate) const MAX_CONV_TAPS: usize = 8;

fn f(x: f32) -> u32 {
    x.to_bits()
}

impl Layer {
    /// Upload layer `l` of the view; its RoPE is added to `ropes` if new, its cache or state
    /// numbered by the counts of `sh` so far (which it advances).
    pub fn upload(gpu: &Gpu, l: &LayerView, sh: &mut Shape) -> Result<Layer, GpuError> {
        let up = |w: &WeightView| gpu.upload_matrix(w.name, w.ty, w.rows, w.cols, w.bytes);
        let vector = |x: &[f32]| gpu.upload(x);
        let opt = |x: Option<&[f32]>| x.map(vector).transpose();
        let mixer = match &l.mixer {
            MixerView::Attention(a) => {
                let rope = a.rope.filter(|r| r.n_rot > 0).map(|r| {
                    sh.ropes.iter().position(|x| x == r).unwrap_or_else(|| {
                        sh.ropes.push(r.clone());
                        sh.ropes.len() - 1
                    })
                });
                sh.gated |= a.gated;
                sh.n_attn_layers += 1;
                Mixer::Attention(Attention {
                    wq: up(&a.wq)?,
                    wk: up(&a.wk)?,
                    wv: up(&a.wv)?,
                    wo: up(&a.wo)?,
                    bq: opt(a.bq)?,
                    bk: opt(a.bk)?,
                    bv: opt(a.bv)?,
                    q_norm: opt(a.q_norm)?,
                    k_norm: opt(a.k_norm)?,
                    gated: a.gated,
                    rope,
                    window: a.window.unwrap_or(0),
                    kv: sh.n_attn_layers - 1,
                })
            }
            MixerView::DeltaNet(dn) => {
                if dn.shape.d_conv == 0 || dn.shape.d_conv > MAX_CONV_TAPS {
                    return Err(GpuError::Shape {
                        what: "a delta-net layer".into(),
                        detail: format!(
                            "a convolution of {} taps (the GPU's holds 1 to {MAX_CONV_TAPS})",
                            dn.shape.d_conv
                        ),
                    });
                }
                sh.dn = Some(dn.shape);
                sh.n_dn_layers += 1;
                Mixer::DeltaNet(DeltaNet {
                    wqkv: up(&dn.wqkv)?,
                    wgate: up(&dn.wgate)?,
                    wbeta: up(&dn.wbeta)?,
                    walpha: up(&dn.walpha)?,
                    wout: up(&dn.wout)?,
                    conv1d: vector(dn.conv1d)?,
                    dt_bias: vector(dn.dt_bias)?,
                    a: vector(dn.a)?,
                    norm: vector(dn.norm)?,
                    rs: sh.n_dn_layers - 1,
                })
            }
        };
        Ok(Layer {
            attn_norm: opt(l.attn_norm)?,
            mixer,
            attn_post_norm: opt(l.attn_post_norm)?,
            ffn_norm: opt(l.ffn_norm)?,
            gate: up(&l.gate)?,
            up: up(&l.up)?,
            down: up(&l.down)?,
            ffn_post_norm: opt(l.ffn_post_norm)?,
        })
    }
}

/// A layer's dispatches, added to a pass.
pub(crate) struct Recorder<'r> {
    pub gpu: &'r Gpu,
    pub sh: &'r Shape,
    pub s: &'r GpuState,
    /// `1 / sqrt(head_dim)` per value of a delta-net head: its L2 norm's weights.
    pub l2_weights: Option<&'r F32Buffer>,
    pub pass: &'r mut Pass,
}

impl Recorder<'_> {
    /// RMSNorm of `rows` rows of `width` of `x`, into `y` or in place, with `eps`; rows come in
    /// groups of `per` a `stride` apart (see `rms_norm.wgsl`).
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &mut self,
        x: &F32Buffer,
        w: &F32Buffer,
        y: Option<&F32Buffer>,
        (rows, width): (usize, usize),
        (per, stride): (usize, usize),
        eps: f32,
    ) -> Result<(), GpuError> {
        let params = [
            width as u32,
            rows as u32,
            f(eps),
            per as u32,
            stride as u32,
            0,
            0,
            0,
        ];
        let groups = Gpu::row_groups(rows);
        match y {
            Some(y) => self.gpu.dispatch(
                self.pass,
                Op::RmsNorm,
                &[x.raw(), w.raw(), y.raw()],
                &params,
                groups,
            ),
            None => self.gpu.dispatch(
                self.pass,
                Op::RmsNormInPlace,
                &[x.raw(), w.raw()],
                &params,
                groups,
            ),
        }
    }

    /// RMSNorm of plain rows with the model's eps.
    pub fn rms_norm(
        &mut self,
        x: &F32Buffer,
        w: &F32Buffer,
        y: Option<&F32Buffer>,
        rows: usize,
        width: usize,
    ) -> Result<(), GpuError> {
        self.norm(x, w, y, (rows, width), (1, width), self.sh.eps)
    }

    fn elementwise(
        &mut self,
        op: Op,
        [x, y]: [&F32Buffer; 2],
        (n, width): (usize, usize),
        scale: f32,
    ) -> Result<(), GpuError> {
        let params = [n as u32, width as u32, f(scale), 0];
        self.gpu.dispatch(
            self.pass,
            op,
            &[x.raw(), y.raw()],
            &params,
            Gpu::elementwise_groups(n),
        )
    }

    fn matmul(
        &mut self,
        m: &Matrix,
        x: &F32Buffer,
        y: &F32Buffer,
        n: usize,
    ) -> Result<(), GpuError> {
        self.gpu.matmul_into(self.pass, m, x, y, n)
    }

    fn rope(
        &mut self,
        x: &F32Buffer,
        (rope, table): (&Rope, &F32Buffer),
        (n, heads, pos0): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        let half = rope.n_rot / 2;
        let neox = u32::from(rope.style == RopeStyle::Neox);
        let params = [
            n as u32,
            heads as u32,
            self.sh.attn.head_dim as u32,
            half as u32,
            pos0 as u32,
            neox,
            0,
            0,
        ];
        let groups = (half.div_ceil(64) as u32, heads as u32, n as u32);
        self.gpu.dispatch(
            self.pass,
            Op::Rope,
            &[x.raw(), table.raw()],
            &params,
            groups,
        )
    }

    /// Layer `layer` over the `n` rows of `s.x` at positions `pos0..`.
    pub fn layer(&mut self, layer: &Layer, pos0: usize, n: usize) -> Result<(), GpuError> {
        let (s, d) = (self.s, self.sh.n_embd);
        let input = match &layer.attn_norm {
            Some(w) => {
                self.rms_norm(&s.x, w, Some(&s.h), n, d)?;
                &s.h
            }
            None => &s.x,
        };
        match &layer.mixer {
            Mixer::Attention(a) => self.attention(a, input, pos0, n)?,
            Mixer::DeltaNet(dn) => self.delta_net(dn, input, n)?,
        }
        let residual = self.sh.residual_scale.unwrap_or(1.0);
        if let Some(w) = &layer.attn_post_norm {
            self.rms_norm(&s.o, w, None, n, d)?;
        }
        self.elementwise(Op::AddScaled, [&s.x, &s.o], (n * d, d), residual)?;
        let input = match &layer.ffn_norm {
            Some(w) => {
                self.rms_norm(&s.x, w, Some(&s.h), n, d)?;
                &s.h
            }
            None => &s.x,
        };
        self.matmul(&layer.gate, input, &s.g, n)?;
        self.matmul(&layer.up, input, &s.u, n)?;
        let act = match self.sh.gate {
            GateView::Silu => Op::Swiglu,
            GateView::Gelu => Op::Geglu,
        };
        let n_ff = self.sh.n_ff;
        self.elementwise(act, [&s.g, &s.u], (n * n_ff, n_ff), 1.0)?;
        self.matmul(&layer.down, &s.g, &s.o, n)?;
        if let Some(w) = &layer.ffn_post_norm {
            self.rms_norm(&s.o, w, None, n, d)?;
        }
        self.elementwise(Op::AddScaled, [&s.x, &s.o], (n * d, d), residual)
    }

    /// Attention of the `n` rows of `h`, its output projection into `s.o`.
    fn attention(
        &mut self,
        w: &Attention,
        h: &F32Buffer,
        pos0: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        let (s, a) = (self.s, self.sh.attn);
        let (hd, q_dim, kv_dim) = (a.head_dim, self.sh.q_dim(), self.sh.kv_dim());
        if w.gated {
            self.matmul(&w.wq, h, &s.q_full, n)?;
            self.elementwise(Op::TakeQuery, [&s.q, &s.q_full], (n * q_dim, hd), 1.0)?;
        } else {
            self.matmul(&w.wq, h, &s.q, n)?;
        }
        self.matmul(&w.wk, h, &s.k, n)?;
        self.matmul(&w.wv, h, &s.v, n)?;
        for (b, x, width) in [
            (&w.bq, &s.q, q_dim),
            (&w.bk, &s.k, kv_dim),
            (&w.bv, &s.v, kv_dim),
        ] {
            if let Some(b) = b {
                self.elementwise(Op::AddBias, [x, b], (n * width, width), 1.0)?;
            }
        }
        // Per head, or over the whole vector where the weights are that long (OLMo 2).
        for (norm, x, dim) in [(&w.q_norm, &s.q, q_dim), (&w.k_norm, &s.k, kv_dim)] {
            if let Some(norm) = norm {
                let width = if norm.len() == dim { dim } else { hd };
                self.rms_norm(x, norm, None, n * dim / width, width)?;
            }
        }
        if let Some(r) = w.rope {
            let rope = (&self.sh.ropes[r], &s.ropes[r]);
            self.rope(&s.q, rope, (n, a.n_head, pos0))?;
            self.rope(&s.k, rope, (n, a.n_head_kv, pos0))?;
        }
        if let Some(scale) = self.sh.q_scale {
            // The op reads no second buffer; any does.
            self.elementwise(Op::Scale, [&s.q, &s.o], (n * q_dim, q_dim), scale)?;
        }
        if let Some(temps) = &s.temps {
            let params = [(n * q_dim) as u32, q_dim as u32, 0, pos0 as u32];
            self.gpu.dispatch(
                self.pass,
                Op::ScaleRows,
                &[s.q.raw(), temps.raw()],
                &params,
                Gpu::elementwise_groups(n * q_dim),
            )?;
        }
        let words = kv_dim / 2;
        let (ck, cv) = (&s.cache_k[w.kv], &s.cache_v[w.kv]);
        self.gpu.dispatch(
            self.pass,
            Op::KvStore,
            &[s.k.raw(), s.v.raw(), ck.raw(), cv.raw()],
            &[n as u32, words as u32, pos0 as u32, 0],
            (words.div_ceil(64) as u32, n as u32, 1),
        )?;
        self.gpu.dispatch(
            self.pass,
            Op::Attention,
            &[s.q.raw(), ck.raw(), cv.raw(), s.att.raw()],
            &[
                a.n_head as u32,
                a.n_head_kv as u32,
                hd as u32,
                pos0 as u32,
                words as u32,
                w.window as u32,
                f(a.scale),
                f(a.softcap.unwrap_or(0.0)),
            ],
            (a.n_head as u32, n as u32, 1),
        )?;
        if w.gated {
            self.elementwise(Op::SigmoidGate, [&s.att, &s.q_full], (n * q_dim, hd), 1.0)?;
        }
        self.matmul(&w.wo, &s.att, &s.o, n)
    }

    /// A gated delta net over the `n` rows of `h`, carrying its states over the tokens in
    /// order, its output projection into `s.o`.
    fn delta_net(&mut self, w: &DeltaNet, h: &F32Buffer, n: usize) -> Result<(), GpuError> {
        let s = self.s;
        let Some(dn) = self.sh.dn else {
            return Ok(());
        };
        let DeltaNetShape {
            n_k_heads: h_k,
            n_v_heads: h_v,
            head_dim: hd,
            d_conv,
        } = dn;
        let (conv_dim, key_dim, value_dim) = (dn.conv_dim(), dn.key_dim(), dn.value_dim());
        self.matmul(&w.wqkv, h, &s.mixed, n)?;
        self.matmul(&w.wgate, h, &s.z, n)?;
        self.matmul(&w.wbeta, h, &s.beta, n)?;
        self.matmul(&w.walpha, h, &s.decay, n)?;
        let params = [
            n as u32,
            h_v as u32,
            h_k as u32,
            hd as u32,
            conv_dim as u32,
            d_conv as u32,
            0,
            0,
        ];
        self.gpu.dispatch(
            self.pass,
            Op::DnGates,
            &[s.beta.raw(), s.decay.raw(), w.dt_bias.raw(), w.a.raw()],
            &params,
            ((n * h_v).div_ceil(64) as u32, 1, 1),
        )?;
        self.gpu.dispatch(
            self.pass,
            Op::Conv,
            &[
                s.mixed.raw(),
                w.conv1d.raw(),
                s.conv_state[w.rs].raw(),
                s.conv.raw(),
            ],
            &params,
            (conv_dim.div_ceil(64) as u32, 1, 1),
        )?;
        // L2 norms of the query and key heads: an RMSNorm with eps / head_dim and weights
        // 1 / sqrt(head_dim), as the engine computes it.
        if let Some(l2) = self.l2_weights {
            let heads = 2 * key_dim / hd;
            let eps = self.sh.eps / hd as f32;
            self.norm(&s.conv, l2, None, (n * heads, hd), (heads, conv_dim), eps)?;
        }
        self.gpu.dispatch(
            self.pass,
            Op::DeltaRule,
            &[
                s.conv.raw(),
                s.decay.raw(),
                s.beta.raw(),
                s.ssm[w.rs].raw(),
                s.core.raw(),
            ],
            &params,
            (hd.div_ceil(64) as u32, h_v as u32, 1),
        )?;
        // norm(o) per head, times silu(z): into z, the output projection's input.
        self.rms_norm(&s.core, &w.norm, None, n * h_v, hd)?;
        self.elementwise(Op::Swiglu, [&s.z, &s.core], (n * value_dim, value_dim), 1.0)?;
        self.matmul(&w.wout, &s.z, &s.o, n)
    }
}

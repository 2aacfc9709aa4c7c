//! What every head kernel shares: the attention's shape, one head's job and working rows, and
//! the rows a head reads (with how far ahead they are asked for).

#[cfg(target_arch = "x86_64")]
pub(crate) use crate::kv::LayerRows;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplies `q . k` before the softmax (`1 / sqrt(head_dim)` unless the model says).
    pub scale: f32,
    /// Gemma 2's logit soft-capping: each scaled score `s` becomes `cap * tanh(s)` (with
    /// `scale` already divided by `cap`, as ggml's flash attention divides it).
    pub softcap: Option<f32>,
}

/// The soft-cap of `s` on a head's scores, in place (libm's `tanhf`, as ggml's op).
#[inline]
pub(crate) fn cap_scores(s: &AttnShape, scores: &mut [f32]) {
    if let Some(cap) = s.softcap {
        scores.iter_mut().for_each(|x| *x = cap * x.tanh());
    }
}

impl AttnShape {
    /// The KV head query head `h` reads (grouped-query attention: `n_head / n_head_kv` query
    /// heads a KV head).
    pub(crate) fn kv_head(&self, h: usize) -> usize {
        h / (self.n_head / self.n_head_kv)
    }
}

/// Largest head dimension [`super::attend`] supports (Gemma's 256 with room to spare).
pub const MAX_HEAD_DIM: usize = 512;

/// One head of one token for `attend_heads`: its query (`head_dim` values), its KV head's keys
/// and values from the first position it sees (position `j` at `j * head_dim..`), how many
/// positions it sees, and its output (`head_dim` values).
pub(crate) struct HeadJob<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) keys: &'a [half::f16],
    pub(crate) values: &'a [half::f16],
    pub(crate) n_pos: usize,
    pub(crate) out: &'a mut [f32],
    /// Its KV head, and the cache position of its first position (for the x86-64 path's
    /// staged rows).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) kv_head: usize,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) first: usize,
    /// Its head's attention sink, where the layer has them ([`LayerAttn::sinks`]).
    pub(crate) sink: Option<f32>,
}

/// What sets one layer's attention apart from another's of the same shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayerAttn<'a> {
    /// Keys a query sees, itself included (a sliding window), where not all.
    pub window: Option<usize>,
    /// One logit per query head that joins the softmax without a value (gpt-oss's
    /// `attn_sinks`): it takes a share of the weight from every position.
    pub sinks: Option<&'a [f32]>,
}

impl LayerAttn<'_> {
    /// Every position, no sinks.
    pub const FULL: LayerAttn<'static> = LayerAttn {
        window: None,
        sinks: None,
    };

    /// The last `window` positions where there is one, no sinks.
    pub fn window(window: Option<usize>) -> LayerAttn<'static> {
        LayerAttn {
            window,
            sinks: None,
        }
    }
}

/// The end of a head's online softmax, as ggml's flash attention ends it: where the head has a
/// sink `s`, it joins the running maximum `M` (of the head's scores) and sum `S` as one more
/// position without a value: `ms = e^(M - s)` rescales the accumulator and `S = S * ms + 1`
/// (a fused multiply-add in ggml's C) when `s > M`, else `S = S + e^(s - M)`. Returns the
/// accumulator's factor `ms` (1 without a sink: an exact product) and the output's `1 / S` (0
/// for a sum of 0, as ggml). The output is `(acc * ms) * inv`, two roundings, as ggml's two
/// `ggml_vec_scale_f32`.
#[inline]
pub(crate) fn finish(job: &HeadJob, sc: &HeadScratch, sum: f32) -> (f32, f32) {
    let (ms, sum) = match job.sink {
        None => (1.0, sum),
        Some(s) => {
            let m = sc.scores[..job.n_pos]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            if s > m {
                let ms = (m - s).exp();
                (ms, sum.mul_add(ms, 1.0))
            } else {
                (1.0, sum.mul_add(1.0, (s - m).exp()))
            }
        }
    };
    (ms, if sum == 0.0 { 0.0 } else { 1.0 / sum })
}

/// One head's working rows; F16 values are held as f32 (exactly), and rounding to F16 is a trip
/// through `h16`. Made once per thread and reused for every head it computes.
pub(crate) struct HeadScratch {
    /// The scores `scale * q . k` of every position, computed before the online softmax (they
    /// do not depend on it), so that the dot products are independent of one another.
    pub(crate) scores: Vec<f32>,
    /// The x86-64 fast path's (`avx512`): each position's exponential, it rounded to F16 (as
    /// f32 and as F16 bits), and whether the running maximum grows there (a bit a position).
    #[cfg(target_arch = "x86_64")]
    pub(crate) ex: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    pub(crate) ex16: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    pub(crate) ex16h: Vec<u16>,
    #[cfg(target_arch = "x86_64")]
    pub(crate) grow: Vec<u16>,
    /// Scores of whole blocks of staged positions.
    #[cfg(target_arch = "x86_64")]
    pub(crate) blk: Vec<f32>,
    pub(crate) h16: [half::f16; MAX_HEAD_DIM],
    pub(crate) qf: [f32; MAX_HEAD_DIM],
    pub(crate) acc: [f32; MAX_HEAD_DIM],
    pub(crate) row: [f32; MAX_HEAD_DIM],
}

impl HeadScratch {
    /// Room for a head that sees `n` positions in the fast path's rows (padded to 16).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn reserve(&mut self, n: usize) {
        let padded = n.div_ceil(16) * 16;
        if self.scores.len() < padded || self.ex.len() < padded {
            self.scores.resize(padded, 0.0);
            self.ex.resize(padded, 0.0);
            self.ex16.resize(padded, 0.0);
            self.ex16h.resize(padded, 0);
        }
        self.grow.clear();
        self.grow.resize(padded / 16, 0);
    }

    pub(crate) fn new() -> HeadScratch {
        HeadScratch {
            scores: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            ex: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            ex16: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            ex16h: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            grow: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            blk: Vec::new(),
            h16: [half::f16::ZERO; MAX_HEAD_DIM],
            qf: [0.0; MAX_HEAD_DIM],
            acc: [0.0; MAX_HEAD_DIM],
            row: [0.0; MAX_HEAD_DIM],
        }
    }
}

/// How far ahead the passes over the cache's rows ask for them, in bytes of a head's rows: a
/// decode step reads them from memory, and one position's work is a few nanoseconds against a
/// hundred or more for a miss, so the requests go far enough ahead to cover it: 16 KiB, 128
/// rows of SmolLM2's 64-value heads, faster than 16 rows and as fast as more (measurements:
/// docs/perf-log.md, "The KV cache and attention"). Measured when the cache kept every KV
/// head's row of a position together; with each KV head's rows consecutive the hardware
/// prefetchers follow them too.
#[cfg(target_arch = "x86_64")]
pub(crate) const AHEAD_BYTES: usize = 16 << 10;

/// Ask the caches for the `n` values of the row [`AHEAD_BYTES`] of rows past row `j` of
/// `rows` (rows `stride` values apart; at least sixteen rows on). A hint: it reads nothing and
/// never faults, past the rows' end too.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(rows: &[T], j: usize, stride: usize, n: usize) {
    let bytes = n * size_of::<T>();
    let ahead = (AHEAD_BYTES / bytes.max(1)).max(16);
    let p = rows
        .as_ptr()
        .wrapping_add((j + ahead) * stride)
        .cast::<u8>();
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing into the program and never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(line).cast(),
            )
        };
    }
}

/// A head's key or value rows (position `j` at `j * head_dim..`): the cache's, or staged as f32
/// for a batch.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    F16(&'a [half::f16]),
    F32(&'a [f32]),
}

#[cfg(target_arch = "x86_64")]
impl Rows<'_> {
    /// Whether these are the rows `other` are (from the same first row).
    #[inline(always)]
    pub(crate) fn same(self, other: Rows) -> bool {
        match (self, other) {
            (Rows::F16(a), Rows::F16(b)) => std::ptr::eq(a.as_ptr(), b.as_ptr()),
            (Rows::F32(a), Rows::F32(b)) => std::ptr::eq(a.as_ptr(), b.as_ptr()),
            _ => false,
        }
    }

    /// [`prefetch_ahead`] of these rows, past row `j`.
    #[inline(always)]
    pub(crate) fn prefetch(self, j: usize, stride: usize, n: usize) {
        match self {
            Rows::F16(r) => prefetch_ahead(r, j, stride, n),
            Rows::F32(r) => prefetch_ahead(r, j, stride, n),
        }
    }
}

//! Causal grouped-query attention of one token over the positions in the KV cache.
//!
//! A token attends to positions `0..n_pos` in the same order whether it came alone (decode) or in
//! a batch (prefill): the batch's keys and values are stored first, then each token reads its own
//! causal prefix. So a token's result does not depend on its batch (G1).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
use crate::kv::LayerRows;

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
    fn kv_head(&self, h: usize) -> usize {
        h / (self.n_head / self.n_head_kv)
    }
}

/// Largest head dimension [`attend`] supports (Gemma's 256 with room to spare).
pub const MAX_HEAD_DIM: usize = 512;

/// Values of a head that ggml-cpu's F16 vector kernels (`ggml_vec_mad_f16`, `ggml_vec_scale_f16`)
/// process in native F16 arithmetic when built with AVX512-FP16 (`GGML_F16_STEP`, 128); the rest
/// of a head (its last `head_dim % 128` values) goes through their scalar tail, in f32.
const F16_STEP: usize = 128;

/// Whether `s` lies exactly halfway between two adjacent F16 values (F16 subnormals included).
#[inline(always)]
fn is_f16_tie(s: f32) -> bool {
    let bits = s.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127;
    if exp < -25 {
        return false; // below half the smallest F16 subnormal (or an f32 subnormal)
    }
    // The halfway bit: 13 places below an F16 normal's last one, lower for F16 subnormals.
    let half_bit = if exp >= -14 { 12 } else { -2 - exp } as u32;
    let m = (bits & 0x7f_ffff) | 0x80_0000;
    m & ((2 << half_bit) - 1) == 1 << half_bit
}

/// `a * b + c` for F16 values held in f32, as an f32 whose rounding to F16 is that of the exact
/// result: AVX512-FP16's `vfmadd...ph`, which rounds once. The product is exact in f32; the sum's
/// rounding error (TwoSum) matters only when the f32 sum is an F16 tie, and then moves it one f32
/// step towards the exact result.
#[inline(always)]
fn fma_for_f16(a: f32, b: f32, c: f32) -> f32 {
    let p = a * b;
    let s = p + c;
    let pb = s - p;
    let e = (p - (s - pb)) + (c - pb);
    if e != 0.0 && is_f16_tie(s) {
        let away = (e > 0.0) == (s > 0.0);
        return f32::from_bits(if away {
            s.to_bits() + 1
        } else {
            s.to_bits() - 1
        });
    }
    s
}

/// `q . k` of F16 values (held in f32) in the order of ggml's AVX-512 `ggml_vec_dot_f16`, which
/// accumulates in f32 on AVX512-FP16 builds too: four 16-lane accumulators over 64-value steps,
/// fused multiply-adds, the accumulators added pairwise, the lanes reduced by halves, the tail
/// in f64.
#[inline(always)]
fn dot_f16(q: &[f32], k: &[f32]) -> f32 {
    let n = q.len();
    let np = n & !63;
    let mut sum = crate::ops::ggml_lanes_64(np, |e| (q[e], k[e])) as f64;
    for e in np..n {
        sum += (q[e] * k[e]) as f64;
    }
    sum as f32
}

/// Causal attention of one token over `n_pos` cached positions (`keys`, `values`:
/// `(n_head_kv, n_pos, head_dim)`, the cache's layout), as ggml-cpu's flash attention computes
/// it on the reference build (x86-64 with AVX512-FP16): an online softmax with an F16
/// accumulator, except that the first `head_dim / 128 * 128` values of each head are rescaled
/// and accumulated in native F16 arithmetic: the softmax weight rounded to F16, then one fused
/// F16 multiply-add (`fma_for_f16`), and an F16 product for the rescale. Heads narrower than 128
/// (SmolLM2's 64) never reach that path; Gemma's 256 do, and with f32
/// arithmetic there the KL divergence to llama.cpp on Gemma 3 is ~5e-3 instead of ~0.
#[inline(always)]
pub fn attend(
    s: &AttnShape,
    q: &[f32],
    keys: &[half::f16],
    values: &[half::f16],
    n_pos: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let mut scratch = HeadScratch::new();
    for (h, o) in out[..s.n_head * hd].chunks_exact_mut(hd).enumerate() {
        attend_head::<Scalar>(s, h, q, keys, values, n_pos * hd, n_pos, o, &mut scratch);
    }
}

/// [`attend`] for `n` tokens at positions `pos0..pos0 + n` (`q` and `out` are
/// `(n, n_head * head_dim)`), each over the cached positions `first..=pos` of layer `layer`,
/// where `first` is 0, or `pos + 1 - window` for a sliding window; heads and tokens are spread
/// over the threads. Every head of every token is computed by the same function on the same
/// inputs whatever the batch or the thread count (G1, D1).
#[allow(clippy::too_many_arguments)]
pub fn attend_batch(
    s: &AttnShape,
    q: &[f32],
    kv: &crate::kv::KvCache,
    layer: usize,
    pos0: usize,
    window: Option<usize>,
    out: &mut [f32],
    threads: &crate::Threads,
) {
    let (hd, q_dim) = (s.head_dim, s.n_head * s.head_dim);
    let n = q.len() / q_dim;
    #[cfg(target_arch = "x86_64")]
    let fast = Fast::for_width(hd);
    #[cfg(target_arch = "x86_64")]
    let mut stage = STAGE.take();
    #[cfg(target_arch = "x86_64")]
    let staged = if fast != Fast::No && n > 1 && n * (s.n_head / s.n_head_kv) >= STAGE_FROM {
        // The keys (and values) of every position some token of the batch sees.
        let first = first_seen(window, pos0);
        let rows = kv.layer_rows(layer, first, pos0 + n);
        // SAFETY: the CPU has the features of the path (`Fast::for_width` checked them).
        Some(unsafe {
            match fast {
                Fast::Avx512 => Staged::Avx512(avx512::Staged::new(s, rows, first, &mut stage)),
                _ => Staged::Avx2(avx2::Staged::new(s, rows, first, &mut stage)),
            }
        })
    } else {
        None
    };
    let heads = Heads {
        s,
        q,
        kv,
        layer,
        pos0,
        window,
        rows: None,
        #[cfg(target_arch = "x86_64")]
        fast,
        #[cfg(target_arch = "x86_64")]
        staged,
    };
    // Head by head, token by token within a head, each thread a run of that order of equal
    // cost (the positions its heads see): a thread's heads then read few KV heads' rows, and
    // the heads of a call share one KV head's rows (each row read once for all of them).
    crate::matmul::parallel_piece_runs_mut(
        threads,
        &mut out[..n * q_dim],
        hd,
        INTERLEAVE,
        |k| {
            let (h, t) = (k / n, k % n);
            let pos = pos0 + t;
            let first = first_seen(window, pos);
            crate::matmul::Piece {
                index: t * s.n_head + h,
                cost: pos + 1 - first,
                key: s.kv_head(h),
            }
        },
        |pieces| heads.run(pieces),
    );
    #[cfg(target_arch = "x86_64")]
    STAGE.set(stage);
}

/// [`attend`] for `n` single tokens of different sequences (the decode steps of a batched
/// pass): row `t` of `q` and `out` is the token at position `rows[t].1` of the sequence whose
/// cache is `rows[t].0`, over its positions `first..=pos` of layer `layer` (`first` as in
/// [`attend_batch`]). One hand-off to the
/// threads for all of them; each head is computed as [`attend_batch`] computes it alone.
pub fn attend_rows(
    s: &AttnShape,
    q: &[f32],
    rows: &[(&crate::kv::KvCache, usize)],
    layer: usize,
    window: Option<usize>,
    out: &mut [f32],
    threads: &crate::Threads,
) {
    let (hd, q_dim) = (s.head_dim, s.n_head * s.head_dim);
    let n = rows.len();
    let Some(&(kv, _)) = rows.first() else { return };
    let heads = Heads {
        s,
        q,
        kv,
        layer,
        pos0: 0,
        window,
        rows: Some(rows),
        #[cfg(target_arch = "x86_64")]
        fast: Fast::for_width(hd),
        #[cfg(target_arch = "x86_64")]
        staged: None,
    };
    // Token by token, the heads of a token together: a call's heads share one sequence's KV
    // head (the key), whose rows they then read once.
    crate::matmul::parallel_piece_runs_mut(
        threads,
        &mut out[..n * q_dim],
        hd,
        INTERLEAVE,
        |k| {
            let (t, h) = (k / s.n_head, k % s.n_head);
            let pos = rows[t].1;
            crate::matmul::Piece {
                index: k,
                cost: pos + 1 - first_seen(window, pos),
                key: t * s.n_head_kv + s.kv_head(h),
            }
        },
        |pieces| heads.run(pieces),
    );
}

/// The first cached position a token at `pos` attends to: 0, or `pos + 1 - window` for a
/// sliding window.
fn first_seen(window: Option<usize>, pos: usize) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// Which x86-64 fast path ([`avx512::heads`], [`avx2::heads`]) takes heads of a width on this
/// CPU, if any (the others take [`HeadOps`]'s).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fast {
    No,
    Avx512,
    Avx2,
}

#[cfg(target_arch = "x86_64")]
impl Fast {
    fn for_width(head_dim: usize) -> Fast {
        if synapse_quant::cpu().avx512f() {
            if avx512::takes(head_dim) {
                return Fast::Avx512;
            }
        } else if synapse_quant::cpu().avx2() && avx2::takes(head_dim) {
            return Fast::Avx2;
        }
        Fast::No
    }
}

/// A layer's keys and values laid out for a fast path, once per batch.
#[cfg(target_arch = "x86_64")]
enum Staged<'a> {
    Avx512(avx512::Staged<'a>),
    Avx2(avx2::Staged<'a>),
}

/// Queries a KV head serves in a batch (tokens x the query heads of its group) from which
/// [`attend_batch`] stages the layer's keys and values for the fast paths: below, and for
/// single tokens, restaging them costs more than it saves. (The buffer keeps its largest size
/// for the thread's life: two f32 copies of one layer's keys and values, about a KV cache
/// layer's size times two.)
#[cfg(target_arch = "x86_64")]
const STAGE_FROM: usize = 16;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The calling thread's buffer for [`Staged`], kept from call to call.
    static STAGE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

thread_local! {
    /// Each thread's [`HeadScratch`]es, kept from call to call: made afresh for every call of
    /// [`attend_batch`] (a layer's attention, in decode), their rows zeroed and their vectors
    /// grown again cost about two microseconds a call. They keep the size of the longest context
    /// a thread has seen, about 56 bytes a position.
    static SCRATCH: std::cell::RefCell<Option<Box<[HeadScratch; INTERLEAVE]>>> =
        const { std::cell::RefCell::new(None) };
}

/// Heads computed side by side by one thread ([`attend_heads`]): each head's positions form one
/// long chain of dependent steps (the accumulator is rounded to F16 after each), so one head
/// alone leaves the core waiting on latencies; a few interleaved fill them. Which heads go
/// together changes nothing in any head's arithmetic.
const INTERLEAVE: usize = 4;

/// The operands of [`attend_batch`].
struct Heads<'a> {
    s: &'a AttnShape,
    q: &'a [f32],
    kv: &'a crate::kv::KvCache,
    layer: usize,
    pos0: usize,
    window: Option<usize>,
    /// For tokens of different sequences ([`attend_rows`]): each token's cache and position,
    /// instead of `kv` and `pos0 + t`.
    rows: Option<&'a [(&'a crate::kv::KvCache, usize)]>,
    /// Which fast path takes these heads.
    #[cfg(target_arch = "x86_64")]
    fast: Fast,
    /// The layer's keys and values laid out for the fast path, for batches.
    #[cfg(target_arch = "x86_64")]
    staged: Option<Staged<'a>>,
}

impl Heads<'_> {
    /// A thread's call: `pieces` with its scratch, on the best path the CPU has.
    fn run(&self, pieces: &mut [(usize, &mut [f32])]) {
        SCRATCH.with_borrow_mut(|scratch| {
            let scratch = scratch
                .get_or_insert_with(|| Box::new(std::array::from_fn(|_| HeadScratch::new())));
            #[cfg(target_arch = "x86_64")]
            if synapse_quant::cpu().avx512f() {
                // SAFETY: the CPU has AVX-512 F, AVX2, FMA and F16C (just checked).
                return unsafe { self.some_v4(pieces, scratch) };
            }
            #[cfg(target_arch = "x86_64")]
            if synapse_quant::cpu().avx2() {
                // SAFETY: the CPU has AVX2, FMA and F16C (just checked).
                return unsafe { self.some_v3(pieces, scratch) };
            }
            self.some::<Scalar>(pieces, scratch);
        })
    }

    /// Pieces `u` (head `u % n_head` of token `u / n_head`), side by side.
    #[inline(always)]
    fn some<O: HeadOps>(
        &self,
        pieces: &mut [(usize, &mut [f32])],
        scratch: &mut [HeadScratch; INTERLEAVE],
    ) {
        match pieces.len() {
            1 => self.group::<O, 1>(pieces, scratch),
            2 => self.group::<O, 2>(pieces, scratch),
            3 => self.group::<O, 3>(pieces, scratch),
            4 => self.group::<O, 4>(pieces, scratch),
            n => unreachable!("{n} pieces at once, more than INTERLEAVE"),
        }
    }

    #[inline(always)]
    fn group<O: HeadOps, const N: usize>(
        &self,
        pieces: &mut [(usize, &mut [f32])],
        scratch: &mut [HeadScratch; INTERLEAVE],
    ) {
        let mut pieces = pieces.iter_mut();
        let jobs: [HeadJob; N] = std::array::from_fn(|_| {
            let (u, out) = pieces.next().expect("N pieces");
            self.job(*u, out)
        });
        attend_heads::<O, N>(self.s, jobs, scratch);
    }

    /// Piece `u`: head `u % n_head` of token `u / n_head`, into `out`.
    #[inline(always)]
    fn job<'o>(&'o self, u: usize, out: &'o mut [f32]) -> HeadJob<'o> {
        let s = self.s;
        let (hd, q_dim) = (s.head_dim, s.n_head * s.head_dim);
        let (t, h) = (u / s.n_head, u % s.n_head);
        let (kv, pos) = match self.rows {
            Some(rows) => rows[t],
            None => (self.kv, self.pos0 + t),
        };
        let first = first_seen(self.window, pos);
        let kv_head = s.kv_head(h);
        HeadJob {
            q: &self.q[t * q_dim + h * hd..][..hd],
            keys: &kv.keys(self.layer, kv_head, pos + 1)[first * hd..],
            values: &kv.values(self.layer, kv_head, pos + 1)[first * hd..],
            n_pos: pos + 1 - first,
            out,
            kv_head,
            first,
        }
    }

    /// The jobs of `pieces`, for the fast paths.
    #[cfg(target_arch = "x86_64")]
    fn jobs<'o>(&'o self, pieces: &'o mut [(usize, &mut [f32])]) -> Vec<HeadJob<'o>> {
        pieces
            .iter_mut()
            .map(|(u, out)| self.job(*u, out))
            .collect()
    }

    /// [`Heads::some`] compiled for x86-64-v3, with [`V3`]'s F16 conversions and F16
    /// multiply-adds (the fused multiply-adds become instructions instead of calls to libm's
    /// `fmaf`, the same correctly rounded result), or the AVX2 fast path (`avx2::heads`) for
    /// the widths it takes. Same bits.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn some_v3(
        &self,
        pieces: &mut [(usize, &mut [f32])],
        scratch: &mut [HeadScratch; INTERLEAVE],
    ) {
        if self.fast != Fast::Avx2 {
            return self.some::<V3>(pieces, scratch);
        }
        let staged = match &self.staged {
            Some(Staged::Avx2(st)) => Some(st),
            _ => None,
        };
        // SAFETY: this function's features.
        unsafe { avx2::heads(self.s, &mut self.jobs(pieces), scratch, staged) }
    }

    /// [`Heads::some`] with [`V4`]'s AVX-512 passes. Same bits.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn some_v4(
        &self,
        pieces: &mut [(usize, &mut [f32])],
        scratch: &mut [HeadScratch; INTERLEAVE],
    ) {
        if self.fast != Fast::Avx512 {
            return self.some::<V4>(pieces, scratch);
        }
        let staged = match &self.staged {
            Some(Staged::Avx512(st)) => Some(st),
            _ => None,
        };
        // SAFETY: this function's features.
        unsafe { avx512::heads(self.s, &mut self.jobs(pieces), scratch, staged) }
    }
}

/// One head of one token for [`attend_heads`]: its query (`head_dim` values), its KV head's keys
/// and values from the first position it sees (position `j` at `j * head_dim..`), how many
/// positions it sees, and its output (`head_dim` values).
struct HeadJob<'a> {
    q: &'a [f32],
    keys: &'a [half::f16],
    values: &'a [half::f16],
    n_pos: usize,
    out: &'a mut [f32],
    /// Its KV head, and the cache position of its first position (for the x86-64 path's
    /// staged rows).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    kv_head: usize,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    first: usize,
}

/// One head's working rows; F16 values are held as f32 (exactly), and rounding to F16 is a trip
/// through `h16`. Made once per thread and reused for every head it computes.
struct HeadScratch {
    /// The scores `scale * q . k` of every position, computed before the online softmax (they
    /// do not depend on it), so that the dot products are independent of one another.
    scores: Vec<f32>,
    /// The x86-64 fast path's (`avx512`): each position's exponential, it rounded to F16 (as
    /// f32 and as F16 bits), and whether the running maximum grows there (a bit a position).
    #[cfg(target_arch = "x86_64")]
    ex: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    ex16: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    ex16h: Vec<u16>,
    #[cfg(target_arch = "x86_64")]
    grow: Vec<u16>,
    /// Scores of whole blocks of staged positions.
    #[cfg(target_arch = "x86_64")]
    blk: Vec<f32>,
    h16: [half::f16; MAX_HEAD_DIM],
    qf: [f32; MAX_HEAD_DIM],
    acc: [f32; MAX_HEAD_DIM],
    row: [f32; MAX_HEAD_DIM],
}

impl HeadScratch {
    /// Room for a head that sees `n` positions in the fast path's rows (padded to 16).
    #[cfg(target_arch = "x86_64")]
    fn reserve(&mut self, n: usize) {
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

    fn new() -> HeadScratch {
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

/// Head `h` of [`attend`]: `out` is that head's `head_dim` values. KV head `g`'s rows start
/// at `g * head` of `keys` and `values`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_head<O: HeadOps>(
    s: &AttnShape,
    h: usize,
    q: &[f32],
    keys: &[half::f16],
    values: &[half::f16],
    head: usize,
    n_pos: usize,
    out: &mut [f32],
    scratch: &mut HeadScratch,
) {
    let hd = s.head_dim;
    let kv_head = s.kv_head(h);
    let off = kv_head * head;
    let job = HeadJob {
        q: &q[h * hd..(h + 1) * hd],
        keys: &keys[off..],
        values: &values[off..],
        n_pos,
        out,
        kv_head,
        first: 0,
    };
    attend_heads::<O, 1>(s, [job], std::slice::from_mut(scratch));
}

/// `N` heads side by side (`scratch` holds at least `N`), position by position while every head
/// has one, then each head's last positions alone. Each head takes the same steps as alone.
#[inline(always)]
fn attend_heads<O: HeadOps, const N: usize>(
    s: &AttnShape,
    mut jobs: [HeadJob; N],
    scratch: &mut [HeadScratch],
) {
    let hd = s.head_dim;
    let simd = hd / F16_STEP * F16_STEP;
    // `attend_heads::<O, N>` runs only where `O`'s instructions exist (`Scalar` anywhere, `V3`
    // and `V4` from `Heads::some_v3` and `some_v4`): what every `O::` call below needs.
    for (job, sc) in jobs.iter().zip(scratch.iter_mut()) {
        if sc.scores.len() < job.n_pos {
            sc.scores.resize(job.n_pos, 0.0);
        }
        let (qf, acc, h16) = (&mut sc.qf[..hd], &mut sc.acc[..hd], &mut sc.h16[..hd]);
        acc.fill(0.0);
        qf.copy_from_slice(job.q);
        // SAFETY: see above.
        unsafe { O::round_f16(qf, h16) };
        for (j, score) in sc.scores[..job.n_pos].iter_mut().enumerate() {
            let k = &job.keys[j * hd..][..hd];
            // SAFETY: see above.
            *score = unsafe { O::dot_h(qf, k) } * s.scale;
        }
        cap_scores(s, &mut sc.scores[..job.n_pos]);
    }
    let mut m = [f32::NEG_INFINITY; N];
    let mut sum = [0.0f32; N];
    let common = jobs.iter().map(|j| j.n_pos).min().unwrap_or(0);
    for j in 0..common {
        for i in 0..N {
            let v = &jobs[i].values[j * hd..][..hd];
            step::<O>(&mut scratch[i], j, v, simd, &mut m[i], &mut sum[i]);
        }
    }
    for (i, job) in jobs.iter_mut().enumerate() {
        for j in common..job.n_pos {
            let v = &job.values[j * hd..][..hd];
            step::<O>(&mut scratch[i], j, v, simd, &mut m[i], &mut sum[i]);
        }
        let inv = if sum[i] == 0.0 { 0.0 } else { 1.0 / sum[i] };
        for (o, a) in job.out.iter_mut().zip(&scratch[i].acc[..hd]) {
            *o = a * inv;
        }
    }
}

/// Position `j` (value row `v`) of a head's online softmax: the running maximum `m` and sum.
#[inline(always)]
fn step<O: HeadOps>(
    sc: &mut HeadScratch,
    j: usize,
    v: &[half::f16],
    simd: usize,
    m: &mut f32,
    sum: &mut f32,
) {
    use half::f16;
    let hd = v.len();
    let (acc, row, h16) = (&mut sc.acc[..hd], &mut sc.row[..hd], &mut sc.h16[..hd]);
    let score = sc.scores[j];
    let (mut ms, mut vs) = (1.0f32, 1.0f32);
    if score > *m {
        let m_old = *m;
        *m = score;
        ms = (m_old - score).exp();
        // SAFETY: as in `attend_heads`, the only caller.
        unsafe { O::rescale(acc, simd, f16::from_f32(ms).to_f32(), ms, h16) };
    } else {
        vs = (score - *m).exp();
    }
    // SAFETY: as above.
    unsafe { O::accumulate(acc, v, simd, f16::from_f32(vs).to_f32(), vs, row, h16) };
    // ggml's C is compiled with contraction: this is one fused multiply-add there.
    *sum = sum.mul_add(ms, vs);
}

/// The per-position vector work of [`attend_heads`]: F16 rows widened to f32, F16 rounding, and
/// the F16 multiply-add of a value row. [`Scalar`] is the definition; [`V3`] gives the same bits
/// with F16C and AVX2 (the conversions round to nearest even, as `half` does).
trait HeadOps {
    /// `dst = src` as f32.
    ///
    /// # Safety
    /// The CPU must have what the implementation uses (nothing for [`Scalar`]; AVX2, FMA and
    /// F16C for [`V3`]); the same for every method.
    unsafe fn widen(src: &[half::f16], dst: &mut [f32]);
    /// Every value of `x` rounded to F16 (`h16` is scratch of the same length).
    ///
    /// # Safety
    /// As [`HeadOps::widen`].
    unsafe fn round_f16(x: &mut [f32], h16: &mut [half::f16]);
    /// `acc[i] = fma_for_f16(row[i], vs16, acc[i])`.
    ///
    /// # Safety
    /// As [`HeadOps::widen`].
    unsafe fn mad_f16(acc: &mut [f32], row: &[f32], vs16: f32);
    /// [`dot_f16`].
    ///
    /// # Safety
    /// As [`HeadOps::widen`].
    unsafe fn dot(q: &[f32], k: &[f32]) -> f32;
    /// [`HeadOps::dot`] of `q` and the F16 row `k` (widening is exact: the same value).
    ///
    /// # Safety
    /// As [`HeadOps::widen`].
    #[inline(always)]
    unsafe fn dot_h(q: &[f32], k: &[half::f16]) -> f32 {
        let mut row = [0.0f32; MAX_HEAD_DIM];
        let row = &mut row[..k.len()];
        // SAFETY: the caller's.
        unsafe {
            Self::widen(k, row);
            Self::dot(q, row)
        }
    }
    /// The rescale of the accumulator when the running maximum grows: its first `simd` values
    /// times `ms16` (F16 values both: the product is exact in f32), the rest times `ms`, then
    /// every value rounded to F16 (`h16` is scratch).
    ///
    /// # Safety
    /// As [`HeadOps::widen`].
    #[inline(always)]
    unsafe fn rescale(acc: &mut [f32], simd: usize, ms16: f32, ms: f32, h16: &mut [half::f16]) {
        acc[..simd].iter_mut().for_each(|a| *a *= ms16);
        acc[simd..].iter_mut().for_each(|a| *a *= ms);
        // SAFETY: the caller's.
        unsafe { Self::round_f16(acc, h16) };
    }
    /// One position's value row `v` into the accumulator: its first `simd` values by
    /// [`HeadOps::mad_f16`] with `vs16`, the rest by an f32 multiply-add with `vs`, then every
    /// value rounded to F16 (`row` and `h16` are scratch as long as `acc`).
    ///
    /// # Safety
    /// As [`HeadOps::widen`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate(
        acc: &mut [f32],
        v: &[half::f16],
        simd: usize,
        vs16: f32,
        vs: f32,
        row: &mut [f32],
        h16: &mut [half::f16],
    ) {
        // SAFETY: the caller's.
        unsafe {
            Self::widen(v, row);
            Self::mad_f16(&mut acc[..simd], &row[..simd], vs16);
        }
        for (a, &x) in acc[simd..].iter_mut().zip(&row[simd..]) {
            *a = x.mul_add(vs, *a);
        }
        // SAFETY: the caller's.
        unsafe { Self::round_f16(acc, h16) };
    }
}

/// [`HeadOps`] in portable code.
struct Scalar;

impl HeadOps for Scalar {
    #[inline(always)]
    unsafe fn widen(src: &[half::f16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    unsafe fn round_f16(x: &mut [f32], h16: &mut [half::f16]) {
        use half::slice::HalfFloatSliceExt;
        h16.convert_from_f32_slice(x);
        h16.convert_to_f32_slice(x);
    }
    #[inline(always)]
    unsafe fn mad_f16(acc: &mut [f32], row: &[f32], vs16: f32) {
        for (a, &x) in acc.iter_mut().zip(row) {
            *a = fma_for_f16(x, vs16, *a);
        }
    }
    #[inline(always)]
    unsafe fn dot(q: &[f32], k: &[f32]) -> f32 {
        dot_f16(q, k)
    }
}

/// [`HeadOps`] with AVX2, FMA and F16C, eight values at a time (the tails as [`Scalar`]).
#[cfg(target_arch = "x86_64")]
struct V3;

#[cfg(target_arch = "x86_64")]
impl HeadOps for V3 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(q: &[f32], k: &[f32]) -> f32 {
        // SAFETY: values e..e + 8 of `k` (the caller of `v3_dot` asks for e + 8 <= k.len()).
        v3_dot(
            q,
            k.len(),
            |e| unsafe { std::arch::x86_64::_mm256_loadu_ps(k.as_ptr().add(e)) },
            |e| k[e],
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_h(q: &[f32], k: &[half::f16]) -> f32 {
        use std::arch::x86_64::*;
        // Each key value widened in the register that uses it.
        // SAFETY: values e..e + 8 of `k`, as above.
        let load = |e: usize| unsafe { _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(e).cast())) };
        v3_dot(q, k.len(), load, |e| k[e].to_f32())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: values i..i + 8 of both (i + 8 <= n).
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for i in i..n {
            dst[i] = src[i].to_f32();
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn round_f16(x: &mut [f32], _h16: &mut [half::f16]) {
        use std::arch::x86_64::*;
        let n = x.len();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: values i..i + 8 (i + 8 <= n).
            unsafe {
                let p = x.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, round_f16_ymm(_mm256_loadu_ps(p)));
            }
            i += 8;
        }
        for v in &mut x[i..] {
            *v = half::f16::from_f32(*v).to_f32();
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mad_f16(acc: &mut [f32], row: &[f32], vs16: f32) {
        use std::arch::x86_64::*;
        let n = acc.len().min(row.len());
        let b = _mm256_set1_ps(vs16);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: values i..i + 8 of both (i + 8 <= n).
            unsafe {
                let pa = acc.as_mut_ptr().add(i);
                let (a, c) = (_mm256_loadu_ps(row.as_ptr().add(i)), _mm256_loadu_ps(pa));
                _mm256_storeu_ps(pa, fma_for_f16_ymm(a, b, c));
            }
            i += 8;
        }
        for (a, &x) in acc[i..n].iter_mut().zip(&row[i..n]) {
            *a = fma_for_f16(x, vs16, *a);
        }
    }
}

/// Every lane of `x` rounded to F16 (to nearest, ties to even) and widened back.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_f16_ymm(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// Nonzero in the lanes of `s` that may lie halfway between two F16 values: the halfway
/// pattern of an F16 normal in the low thirteen bits, or a magnitude below the smallest F16
/// normal (2^-14), whose halfway bit is lower (zero among them). Few sums are:
/// [`fma_for_f16_ymm`] and the AVX2 value pass take the exact path only for registers with such
/// a lane.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn may_be_f16_tie_ymm(s: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // Both tests at once on 16-bit halves: the high half keeps the exponent (below 0x3880
    // under 2^-14), the low half the low thirteen bits less the halfway pattern (zero for
    // it, never negative); `0x3880 > high` and `1 > low` in one signed 16-bit compare.
    let u = _mm256_and_si256(
        _mm256_xor_si256(_mm256_castps_si256(s), _mm256_set1_epi32(0x1000)),
        _mm256_set1_epi32(0x7f80_1fff),
    );
    _mm256_cmpgt_epi16(_mm256_set1_epi32(0x3880_0001), u)
}

/// [`fma_for_f16`] lane by lane, eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fma_for_f16_ymm(
    a: std::arch::x86_64::__m256,
    b: std::arch::x86_64::__m256,
    c: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // `a * b` is exact in f32 (F16 operands): the fused multiply-add is the sum `p + c`.
    let s = _mm256_fmadd_ps(a, b, c);
    let maybe = may_be_f16_tie_ymm(s);
    if _mm256_testz_si256(maybe, maybe) != 0 {
        return s;
    }
    let one = _mm256_set1_epi32(1);
    // The sum's rounding error (TwoSum).
    let p = _mm256_mul_ps(a, b);
    let pb = _mm256_sub_ps(s, p);
    let e = _mm256_add_ps(_mm256_sub_ps(p, _mm256_sub_ps(s, pb)), _mm256_sub_ps(c, pb));
    // is_f16_tie(s): the halfway bit of an F16 at s's exponent set, none below.
    let bits = _mm256_castps_si256(s);
    let exp = _mm256_sub_epi32(
        _mm256_and_si256(_mm256_srli_epi32::<23>(bits), _mm256_set1_epi32(0xff)),
        _mm256_set1_epi32(127),
    );
    let half_bit = _mm256_max_epi32(
        _mm256_set1_epi32(12),
        _mm256_sub_epi32(_mm256_set1_epi32(-2), exp),
    );
    let mant = _mm256_or_si256(
        _mm256_and_si256(bits, _mm256_set1_epi32(0x7f_ffff)),
        _mm256_set1_epi32(0x80_0000),
    );
    let below = _mm256_sub_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(2), half_bit), one);
    let tie = _mm256_and_si256(
        _mm256_cmpeq_epi32(
            _mm256_and_si256(mant, below),
            _mm256_sllv_epi32(one, half_bit),
        ),
        _mm256_cmpgt_epi32(exp, _mm256_set1_epi32(-26)),
    );
    let err = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_NEQ_UQ>(e, _mm256_setzero_ps()));
    let fix = _mm256_and_si256(tie, err);
    // One f32 step towards the exact sum: +1 on the bits (away from zero) when e and
    // s share a sign, -1 when their signs differ.
    let differ = _mm256_cmpgt_epi32(
        _mm256_setzero_si256(),
        _mm256_xor_si256(_mm256_castps_si256(e), bits),
    );
    let step = _mm256_or_si256(_mm256_andnot_si256(differ, one), differ);
    let fixed = _mm256_add_epi32(bits, _mm256_and_si256(fix, step));
    _mm256_castsi256_ps(fixed)
}

/// [`HeadOps`] with AVX-512 F: the per-position work sixteen values at a time in one pass over
/// the accumulator (rescale or multiply-add, then the rounding to F16), and the key's dot product
/// in ggml's four 16-lane accumulators. The rest, and tails of fewer than sixteen values, as
/// [`Scalar`] (through [`V3`]). Same bits.
#[cfg(target_arch = "x86_64")]
struct V4;

/// Every lane of `x` rounded to F16 (to nearest, ties to even) and widened back.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn round_f16_zmm(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    _mm512_cvtph_ps(_mm512_cvtps_ph::<
        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
    >(x))
}

/// [`fma_for_f16`] lane by lane (as [`V3::mad_f16`] does eight lanes), without its test for
/// ties: the sum rounded to odd. `a * b` is exact in f32 (F16 operands), so the sum rounded down
/// and up are the same f32 when it is exact and adjacent f32s when not; of those, the one with
/// an odd last bit is the sum rounded to odd, and a sum rounded to odd with at least two more
/// bits than F16 (f32 has thirteen) rounds to F16 as the exact sum does. Two multiply-adds, a
/// test and a blend: no branch, no rarely taken path to keep registers for.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn fma_for_f16_zmm(
    a: std::arch::x86_64::__m512,
    b: std::arch::x86_64::__m512,
    c: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let down = _mm512_fmadd_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(a, b, c);
    let up = _mm512_fmadd_round_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(a, b, c);
    let odd = _mm512_test_epi32_mask(_mm512_castps_si512(down), _mm512_set1_epi32(1));
    _mm512_mask_blend_ps(odd, up, down)
}

#[cfg(target_arch = "x86_64")]
impl HeadOps for V4 {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn widen(src: &[half::f16], dst: &mut [f32]) {
        // SAFETY: AVX-512 F implies what V3 needs (this function's features).
        unsafe { V3::widen(src, dst) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn round_f16(x: &mut [f32], h16: &mut [half::f16]) {
        // SAFETY: as above.
        unsafe { V3::round_f16(x, h16) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn mad_f16(acc: &mut [f32], row: &[f32], vs16: f32) {
        // SAFETY: as above.
        unsafe { V3::mad_f16(acc, row, vs16) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn dot(q: &[f32], k: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { V3::dot(q, k) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn dot_h(q: &[f32], k: &[half::f16]) -> f32 {
        use std::arch::x86_64::*;
        let n = q.len().min(k.len());
        let np = n & !63;
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in (0..np).step_by(64) {
            for (j, acc) in acc.iter_mut().enumerate() {
                let e = i + 16 * j;
                // SAFETY: values e..e + 16 of both (e + 16 <= np <= n).
                *acc = unsafe {
                    let kf = _mm512_cvtph_ps(_mm256_loadu_si256(k.as_ptr().add(e).cast()));
                    _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(e)), kf, *acc)
                };
            }
        }
        let mut sum = avx512::reduce_lanes(acc) as f64;
        for e in np..n {
            sum += (q[e] * k[e].to_f32()) as f64;
        }
        sum as f32
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn rescale(acc: &mut [f32], simd: usize, ms16: f32, ms: f32, _h16: &mut [half::f16]) {
        use std::arch::x86_64::*;
        let n = acc.len();
        let mut i = 0;
        while i + 16 <= n {
            // `simd` is a multiple of 128: no 16 values straddle it.
            let f = _mm512_set1_ps(if i < simd { ms16 } else { ms });
            // SAFETY: values i..i + 16 (i + 16 <= n).
            unsafe {
                let p = acc.as_mut_ptr().add(i);
                _mm512_storeu_ps(p, round_f16_zmm(_mm512_mul_ps(_mm512_loadu_ps(p), f)));
            }
            i += 16;
        }
        for (j, a) in acc.iter_mut().enumerate().skip(i) {
            *a = half::f16::from_f32(*a * if j < simd { ms16 } else { ms }).to_f32();
        }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn accumulate(
        acc: &mut [f32],
        v: &[half::f16],
        simd: usize,
        vs16: f32,
        vs: f32,
        _row: &mut [f32],
        _h16: &mut [half::f16],
    ) {
        use std::arch::x86_64::*;
        let n = acc.len().min(v.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: values i..i + 16 of both (i + 16 <= n).
            unsafe {
                let p = acc.as_mut_ptr().add(i);
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(i).cast()));
                let a = _mm512_loadu_ps(p);
                // `simd` is a multiple of 128: no 16 values straddle it.
                let r = if i < simd {
                    fma_for_f16_zmm(x, _mm512_set1_ps(vs16), a)
                } else {
                    _mm512_fmadd_ps(x, _mm512_set1_ps(vs), a)
                };
                _mm512_storeu_ps(p, round_f16_zmm(r));
            }
            i += 16;
        }
        for j in i..n {
            let x = v[j].to_f32();
            let r = if j < simd {
                fma_for_f16(x, vs16, acc[j])
            } else {
                x.mul_add(vs, acc[j])
            };
            acc[j] = half::f16::from_f32(r).to_f32();
        }
    }
}

/// [`dot_f16`] of `q` and a key of `n` values, eight at a time from `load(e)` (values `e..e +
/// 8`, asked for only with `e + 8 <= n`), the tail from `value(e)`: [`V3`]'s `dot` and
/// `dot_h`, which differ only in how the key is read.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn v3_dot(
    q: &[f32],
    n: usize,
    load: impl Fn(usize) -> std::arch::x86_64::__m256,
    value: impl Fn(usize) -> f32,
) -> f32 {
    use std::arch::x86_64::*;
    let n = q.len().min(n);
    let np = n & !63;
    // acc[2j + h]: lanes 8h..8h + 8 of dot_f16's accumulator j.
    let mut acc = [_mm256_setzero_ps(); 8];
    for i in (0..np).step_by(64) {
        for (u, acc) in acc.iter_mut().enumerate() {
            let e = i + 8 * u;
            // SAFETY: values e..e + 8 of `q` (e + 8 <= np <= n).
            *acc = _mm256_fmadd_ps(unsafe { _mm256_loadu_ps(q.as_ptr().add(e)) }, load(e), *acc);
        }
    }
    // (acc0 + acc2) + (acc1 + acc3), lane by lane.
    let half = |h: usize| {
        _mm256_add_ps(
            _mm256_add_ps(acc[h], acc[4 + h]),
            _mm256_add_ps(acc[2 + h], acc[6 + h]),
        )
    };
    let mut v = [0.0f32; 16];
    // SAFETY: 16 writable floats.
    unsafe {
        _mm256_storeu_ps(v.as_mut_ptr(), half(0));
        _mm256_storeu_ps(v.as_mut_ptr().add(8), half(1));
    }
    let mut sum = crate::ops::reduce_add_16(v) as f64;
    for (e, &q) in q.iter().enumerate().take(n).skip(np) {
        sum += (q * value(e)) as f64;
    }
    sum as f32
}

/// How far ahead the passes over the cache's rows ask for them, in bytes of a head's rows: a
/// decode step reads them from memory, and one position's work is a few nanoseconds against a
/// hundred or more for a miss, so the requests go far enough ahead to cover it: 16 KiB, 128
/// rows of SmolLM2's 64-value heads (its tg32 at depth 2048, against 16 rows ahead, in one
/// process: 0.87-0.96x the time at one thread, 0.92x at two; 256 or 512 rows no better;
/// Llama-3.2-1B's and Gemma 3's unchanged, their attention a smaller share of a token there).
/// Measured when the cache kept every KV head's row of a position together; with each KV
/// head's rows consecutive the hardware prefetchers follow them too.
#[cfg(target_arch = "x86_64")]
const AHEAD_BYTES: usize = 16 << 10;

/// Ask the caches for the `n` values of the row [`AHEAD_BYTES`] of rows past row `j` of
/// `rows` (rows `stride` values apart; at least sixteen rows on). A hint: it reads nothing and
/// never faults, past the rows' end too.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead<T>(rows: &[T], j: usize, stride: usize, n: usize) {
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
enum Rows<'a> {
    F16(&'a [half::f16]),
    F32(&'a [f32]),
}

#[cfg(target_arch = "x86_64")]
impl Rows<'_> {
    /// Whether these are the rows `other` are (from the same first row).
    #[inline(always)]
    fn same(self, other: Rows) -> bool {
        match (self, other) {
            (Rows::F16(a), Rows::F16(b)) => std::ptr::eq(a.as_ptr(), b.as_ptr()),
            (Rows::F32(a), Rows::F32(b)) => std::ptr::eq(a.as_ptr(), b.as_ptr()),
            _ => false,
        }
    }

    /// [`prefetch_ahead`] of these rows, past row `j`.
    #[inline(always)]
    fn prefetch(self, j: usize, stride: usize, n: usize) {
        match self {
            Rows::F16(r) => prefetch_ahead(r, j, stride, n),
            Rows::F32(r) => prefetch_ahead(r, j, stride, n),
        }
    }
}

/// Whether a vector `expf` (`exp`: sixteen lanes in place) gives `f32::exp`'s bits (libm's
/// `expf`) on the f32s `first, first + step, ..` up to `last`, and on the boundaries of the
/// special cases (compared as bits, NaNs as NaN).
#[cfg(target_arch = "x86_64")]
pub(crate) fn exp_agrees(exp: impl Fn(&mut [f32; 16]), first: u32, last: u32, step: u32) -> bool {
    let mut xs: Vec<f32> = [
        0x42b1_7217u32,
        0xc2cf_f1b4,
        0xc2b0_0000,
        0x42b0_0000,
        0xc2ae_ac50,
    ]
    .iter()
    .flat_map(|&b| (b - 4..=b + 4).map(f32::from_bits))
    .flat_map(|x| [x, -x])
    .chain([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ])
    .collect();
    let agree = |xs: &[f32]| {
        xs.chunks(16).all(|c| {
            let mut y = [0.0f32; 16];
            y[..c.len()].copy_from_slice(c);
            exp(&mut y);
            c.iter().zip(y).all(|(x, y)| {
                let e = x.exp();
                e.to_bits() == y.to_bits() || (e.is_nan() && y.is_nan())
            })
        })
    };
    if !agree(&xs) {
        return false;
    }
    let mut b = first as u64;
    while b <= last as u64 {
        xs.clear();
        xs.extend(
            (0..4096u64)
                .map(|i| b + i * step as u64)
                .take_while(|&b| b <= last as u64)
                .map(|b| f32::from_bits(b as u32)),
        );
        if !agree(&xs) {
            return false;
        }
        b += 4096 * step as u64;
    }
    true
}

#[cfg(test)]
mod tests;

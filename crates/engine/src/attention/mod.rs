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
mod exp;
mod f16;
mod heads;

use f16::*;
pub(crate) use heads::cap_scores;
use heads::{finish, HeadJob, HeadScratch};
pub use heads::{AttnShape, LayerAttn, MAX_HEAD_DIM};

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
    la: LayerAttn<'_>,
    out: &mut [f32],
    threads: &crate::Threads,
) {
    let (hd, q_dim) = (s.head_dim, s.n_head * s.head_dim);
    let n = q.len() / q_dim;
    let window = la.window;
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
        la,
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
    la: LayerAttn<'_>,
    out: &mut [f32],
    threads: &crate::Threads,
) {
    let (hd, q_dim) = (s.head_dim, s.n_head * s.head_dim);
    let n = rows.len();
    let window = la.window;
    let Some(&(kv, _)) = rows.first() else { return };
    let heads = Heads {
        s,
        q,
        kv,
        layer,
        pos0: 0,
        la,
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
    la: LayerAttn<'a>,
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
        let first = first_seen(self.la.window, pos);
        let kv_head = s.kv_head(h);
        HeadJob {
            q: &self.q[t * q_dim + h * hd..][..hd],
            keys: &kv.keys(self.layer, kv_head, pos + 1)[first * hd..],
            values: &kv.values(self.layer, kv_head, pos + 1)[first * hd..],
            n_pos: pos + 1 - first,
            out,
            kv_head,
            first,
            sink: self.la.sinks.map(|x| x[h]),
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
        sink: None,
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
        let (ms, inv) = finish(job, &scratch[i], sum[i]);
        for (o, a) in job.out.iter_mut().zip(&scratch[i].acc[..hd]) {
            *o = (a * ms) * inv;
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

/// [`HeadOps`] with AVX-512 F: the per-position work sixteen values at a time in one pass over
/// the accumulator (rescale or multiply-add, then the rounding to F16), and the key's dot product
/// in ggml's four 16-lane accumulators. The rest, and tails of fewer than sixteen values, as
/// [`Scalar`] (through [`V3`]). Same bits.
#[cfg(target_arch = "x86_64")]
struct V4;

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

#[cfg(test)]
mod tests;

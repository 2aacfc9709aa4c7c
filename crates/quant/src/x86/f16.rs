//! F16 weights against F16 activations in the order of ggml's AVX-512 `ggml_vec_dot_f16`
//! ([`crate::reference::dot::vec_dot_f16_f16`]): four 16-lane f32 accumulators over 64-value
//! steps, one fused multiply-add per value, then `(a0 + a2) + (a1 + a3)`, the 16 lanes reduced
//! by halves, and the `n % 64` values left over summed in f64. F32 weights against F32
//! activations (`ggml_vec_dot_f32`, [`crate::reference::dot::vec_dot_f32_f32`]) run the same
//! 64-value part and differ only in the leftovers ([`Elem::tail`]): the same kernels, generic
//! over the element type.
//!
//! F16 to f32 is exact (`vcvtph2ps`), and every kernel here runs, for each output, exactly the
//! reference's float operations in its order; only how many outputs share a loop differs:
//!
//! - [`dot_512`]: AVX-512, `R` rows at once (one token), each with its own four accumulators.
//! - [`dot_avx2`]: AVX2, each 16-lane accumulator held as two 8-lane halves.
//! - [`gemm_512`], [`gemm_avx2`]: tiles for batches, rows x tokens, one register of an
//!   output's accumulators at a time (a quarter of them in 512-bit registers, an eighth in
//!   256-bit ones), the tokens and the rows widened to f32 once per call ([`gemm_by`]).
//! - [`packed_kernel`]: F16 matrices packed at load time on AVX-512 CPUs, sixteen rows in the
//!   lanes of each of the reference's chains ([`pack_rows`]), one token and batches (the
//!   tiles keep F32 matrices and the rows of an F16 matrix past its last group of sixteen).

use std::arch::x86_64::*;

use half::f16;

use crate::x86::avx2::hsum;
use crate::x86::{prefetch_lines_by, prefetch_now, Ahead, PREFETCH_BOTH};
use crate::QuantError;

/// An element type these kernels take, weights and activations alike: F16 (widened exactly
/// with `vcvtph2ps`) or F32.
pub trait Elem: crate::DotBlock<Act = Self> {
    /// Sixteen values from `p` as f32.
    ///
    /// # Safety
    /// `p..p + 16` must be readable; the CPU must have AVX-512 F and F16C.
    unsafe fn load16(p: *const Self) -> __m512;
    /// Eight values from `p` as f32.
    ///
    /// # Safety
    /// `p..p + 8` must be readable; the CPU must have AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> __m256;
    /// The reference's sum of the `n % 64` values past `np`, onto `sum` (the 64-value part).
    fn tail(sum: f32, x: &[Self], y: &[Self], np: usize) -> f32;
}

impl Elem for f16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller's bounds and CPU.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller's bounds and CPU.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// One by one in f64, each product in f32 (exact: two F16 values' product fits f32).
    #[inline]
    fn tail(sum: f32, x: &[f16], y: &[f16], np: usize) -> f32 {
        let mut s = sum as f64;
        for (a, b) in x[np..].iter().zip(&y[np..]) {
            s += (a.to_f32() * b.to_f32()) as f64;
        }
        s as f32
    }
}

impl Elem for f32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's bounds and CPU.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's bounds and CPU.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline]
    fn tail(sum: f32, x: &[f32], y: &[f32], np: usize) -> f32 {
        crate::reference::dot::tail_f32(sum, &x[np..], &y[np..])
    }
}

/// `reduce_add_16` of four 16-lane accumulators combined as `(a0 + a2) + (a1 + a3)`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn reduce4(acc: [__m512; 4]) -> f32 {
    let v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    // Lanes l and l + 8 first, then `hsum`'s tree over the eight sums: the reference's order.
    hsum(_mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    ))
}

/// `R` rows (each at least `y.len()` long) with one activation row, AVX-512.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub fn dot_512<E: Elem, const R: usize>(x: [&[E]; R], y: &[E]) -> [f32; R] {
    let n = y.len();
    let x = x.map(|r| &r[..n]);
    let np = n & !63;
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    let mut i = 0;
    while i < np {
        // Each row's bytes ahead of this step's 64 values, as the loop goes (past a row's end,
        // the next rows'): a burst before each group of rows read less of the bandwidth. Both
        // distances on every CPU: the rows move together, and the second-level request reaches
        // the rows after them (measurements: docs/perf-log.md, "Prefetch: asked for as the loop
        // goes" and "Prefetch distances").
        for r in x {
            prefetch_lines_by(
                r.as_ptr().wrapping_add(i).cast(),
                0..size_of::<E>(),
                PREFETCH_BOTH,
            );
        }
        // SAFETY: i + 64 <= np <= n, the length of `y` and of every row.
        unsafe {
            let yv: [__m512; 4] = std::array::from_fn(|j| E::load16(y.as_ptr().add(i + 16 * j)));
            for (acc, x) in acc.iter_mut().zip(&x) {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(E::load16(x.as_ptr().add(i + 16 * j)), yv[j], *a);
                }
            }
        }
        i += 64;
    }
    std::array::from_fn(|r| E::tail(reduce4(acc[r]), x[r], y, np))
}

/// One row with one activation row, AVX2: lanes 0..8 and 8..16 of each of the reference's
/// accumulators in two registers.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_avx2<E: Elem>(x: &[E], y: &[E]) -> f32 {
    let n = y.len();
    let x = &x[..n];
    let np = n & !63;
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < np {
        prefetch_lines_by(
            x.as_ptr().wrapping_add(i).cast(),
            0..size_of::<E>(),
            PREFETCH_BOTH,
        );
        for (h, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8 h + 8 <= i + 64 <= n, the length of both rows.
            unsafe {
                let at = i + 8 * h;
                *a = _mm256_fmadd_ps(
                    E::load8(x.as_ptr().add(at)),
                    E::load8(y.as_ptr().add(at)),
                    *a,
                );
            }
        }
        i += 64;
    }
    // acc[2j] is lanes 0..8 of the reference's accumulator j, acc[2j + 1] its lanes 8..16.
    let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    E::tail(hsum(_mm256_add_ps(lo, hi)), x, y, np)
}

/// A register of f32 lanes for the batch kernels, and how the reference's 64 scalar chains
/// (the lanes of its four 16-lane accumulators) lie over registers of it: `CHAINS` registers an
/// output, register `c` taking values `LANES c..LANES (c + 1)` of every 64-value step.
///
/// The methods are `inline(always)` and take no features of their own: they are inlined into
/// the entries' `target_feature` functions, whose features they need.
trait Lanes: Copy {
    const LANES: usize;
    const CHAINS: usize;
    /// # Safety
    /// The CPU must have this width's features.
    unsafe fn zero() -> Self;
    /// # Safety
    /// `p..p + LANES` must be readable; the CPU must have this width's features.
    unsafe fn load(p: *const f32) -> Self;
    /// `LANES` values of `E` from `p`, as f32.
    ///
    /// # Safety
    /// As [`Lanes::load`].
    unsafe fn widen<E: Elem>(p: *const E) -> Self;
    /// # Safety
    /// `p..p + LANES` must be writable; the CPU must have this width's features.
    unsafe fn store(p: *mut f32, v: Self);
    /// # Safety
    /// The CPU must have this width's features.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// One output's `CHAINS` registers summed in the reference's order.
    ///
    /// # Safety
    /// `acc` holds `CHAINS` registers; the CPU must have this width's features.
    unsafe fn reduce(acc: &[Self]) -> f32;
}

impl Lanes for __m512 {
    const LANES: usize = 16;
    const CHAINS: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's CPU.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn widen<E: Elem>(p: *const E) -> Self {
        // SAFETY: the caller's.
        unsafe { E::load16(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the caller's.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller's CPU.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn reduce(acc: &[Self]) -> f32 {
        // SAFETY: the caller's.
        unsafe { reduce4([acc[0], acc[1], acc[2], acc[3]]) }
    }
}

impl Lanes for __m256 {
    const LANES: usize = 8;
    const CHAINS: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's CPU.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn widen<E: Elem>(p: *const E) -> Self {
        // SAFETY: the caller's.
        unsafe { E::load8(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the caller's.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller's CPU.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn reduce(acc: &[Self]) -> f32 {
        // Register 2j is lanes 0..8 of the reference's accumulator j, 2j + 1 its lanes 8..16:
        // `dot_avx2`'s sum.
        // SAFETY: the caller's CPU.
        unsafe {
            let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
            let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
            hsum(_mm256_add_ps(lo, hi))
        }
    }
}

/// Chain `c` of rows `r0..r0 + R` of `w` times tokens `t0..t0 + T` of `a` (copies laid out by
/// chain, a row or token every `kp` values: the rows in their own type by [`order_by_chain`],
/// widened here as they load, the tokens widened by [`widen_by_chain`]) over the 64-value
/// steps of `ks` (values `ks.start..ks.end`, both multiples of 64), carried in
/// `acc[(r * T + t) * W::CHAINS + c]` from the steps before to the next. The reference's chains
/// are separate sums, so a pass takes one register an output: four rows by six tokens (ten
/// loads for 24 multiply-adds) in 512-bit registers, three by four in 256-bit ones.
///
/// # Safety
/// The CPU must have `W`'s features; the rows and tokens must exist, and `ks.end <= kp - 16`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `r` and `t` index every accumulator of the tile
unsafe fn tile<W: Lanes, E: Elem, const R: usize, const T: usize>(
    w: &[E],
    a: &[f32],
    kp: usize,
    (r0, t0): (usize, usize),
    (ks, c): (std::ops::Range<usize>, usize),
    acc: &mut [W],
) {
    let np = kp - 16;
    // Chain `c` of a copy: its `np / CHAINS` values, step by step.
    let at = c * np / W::CHAINS;
    let mut x = [w.as_ptr(); R];
    for r in 0..R {
        x[r] = w[(r0 + r) * kp..][..np].as_ptr().wrapping_add(at);
    }
    let mut y = [a.as_ptr(); T];
    for t in 0..T {
        y[t] = a[(t0 + t) * kp..][..np].as_ptr().wrapping_add(at);
    }
    let acc = &mut acc[..R * T * W::CHAINS];
    // SAFETY: the caller's CPU.
    let mut v = [[unsafe { W::zero() }; T]; R];
    if ks.start > 0 {
        for r in 0..R {
            for t in 0..T {
                v[r][t] = acc[(r * T + t) * W::CHAINS + c];
            }
        }
    }
    let mut i = ks.start;
    while i < ks.end {
        let off = i / 64 * W::LANES;
        // SAFETY: the caller's CPU; step i / 64 of the chain, LANES values: at + off + LANES
        // <= np (i + 64 <= ks.end <= np), inside every row and token (sliced above).
        unsafe {
            let mut xv = [W::zero(); R];
            for r in 0..R {
                xv[r] = W::widen(x[r].add(off));
            }
            for t in 0..T {
                let yv = W::load(y[t].add(off));
                for r in 0..R {
                    v[r][t] = W::fma(xv[r], yv, v[r][t]);
                }
            }
        }
        i += 64;
    }
    for r in 0..R {
        for t in 0..T {
            acc[(r * T + t) * W::CHAINS + c] = v[r][t];
        }
    }
}

/// Rows `rs` by tokens `t0..t0 + T`: `R` rows a tile, then one at a time; the steps of `k` in
/// chunks, each chain of a chunk over every row tile while the tokens' part of it stays in the
/// first-level cache, every output's accumulators carried from chunk to chunk in order (so each
/// sums exactly as the row kernel does); then the reduction and the tail of each output into
/// `out` (`(n_tok, rows)`). The tiles read the rows from `wf`, the block `rs` laid out by chain
/// (row `r` at `(r - rs.start) * kp`), and the tokens from `a`, widened and laid out alike
/// (token `t` at `t * kp`); the tails from `w` and `y16`.
///
/// # Safety
/// As for [`tile`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_by<W: Lanes, E: Elem, const R: usize, const T: usize>(
    w: &[E],
    wf: &[E],
    a: &[f32],
    y16: &[E],
    (k, kp): (usize, usize),
    t0: usize,
    rs: std::ops::Range<usize>,
    accs: &mut Vec<W>,
    out: &mut [f32],
) {
    // Values per chunk: a chain's part of six tokens is 12 KiB of f32 in 512-bit registers
    // (four chains), of four tokens 8 KiB in 256-bit ones (eight chains).
    let chunk = 512 * W::CHAINS;
    let rows = w.len() / k;
    let np = k & !63;
    let per = T * W::CHAINS;
    // Every accumulator is written by its first chunk's pass before it is read (rows shorter
    // than a step have none: their sums are zero).
    if accs.len() < rs.len() * per || np == 0 {
        accs.clear();
        // SAFETY: the caller's CPU.
        accs.resize(rs.len() * per, unsafe { W::zero() });
    }
    for k0 in (0..np).step_by(chunk) {
        let ks = k0..(k0 + chunk).min(np);
        for c in 0..W::CHAINS {
            let mut r0 = rs.start;
            // SAFETY: the caller's CPU; every tile's rows are in `rs` (below `rows`), its tokens
            // exist, `ks.end <= np = kp - 16`, and its accumulators lie in `accs`.
            unsafe {
                while rs.end - r0 >= R {
                    let i = r0 - rs.start;
                    tile::<W, E, R, T>(wf, a, kp, (i, t0), (ks.clone(), c), &mut accs[i * per..]);
                    r0 += R;
                }
                // Rows left: two at a time before one (a row alone by T tokens takes T + 1
                // loads for T multiply-adds).
                while R > 2 && rs.end - r0 >= 2 {
                    let i = r0 - rs.start;
                    tile::<W, E, 2, T>(wf, a, kp, (i, t0), (ks.clone(), c), &mut accs[i * per..]);
                    r0 += 2;
                }
                while r0 < rs.end {
                    let i = r0 - rs.start;
                    tile::<W, E, 1, T>(wf, a, kp, (i, t0), (ks.clone(), c), &mut accs[i * per..]);
                    r0 += 1;
                }
            }
        }
    }
    for r in rs.clone() {
        let xr = &w[r * k..][..k];
        for t in 0..T {
            let yt = &y16[(t0 + t) * k..][..k];
            let at = (r - rs.start) * per + t * W::CHAINS;
            // SAFETY: the caller's CPU; CHAINS registers from `at`.
            let sum = unsafe { W::reduce(&accs[at..at + W::CHAINS]) };
            out[(t0 + t) * rows + r] = E::tail(sum, xr, yt, np);
        }
    }
}

/// Every row of `w` (`k` values each) times every token of `y` (`k` values each), into `out`
/// (`(n_tok, rows)`). The tokens are widened to f32 (exactly) once per call into `a`, laid out
/// by chain ([`widen_by_chain`]), and each block of about 32 rows once into `wf`, laid out
/// alike but left in their type ([`order_by_chain`]: the tiles widen F16 as they load it, in
/// `vcvtph2ps`, which on a Zen 4 took no multiply-add's place); then, for `T`
/// tokens at a time, chunk by chunk of the values and chain by chain, passes of `R` rows by
/// `T` tokens ([`tile`]). The loop order only: every output sums its chains in the reference's
/// order.
///
/// Tiles that held all four of an output's accumulators (two rows by three tokens: five loads
/// and two widenings for six multiply-adds) ran slower than these. A pass runs much faster from
/// the first-level cache than from the second: the blocking is what keeps it in the first
/// (measurements: docs/perf-log.md, "F16 and BF16 kernels").
///
/// # Safety
/// The CPU must have `W`'s features; `w.len()` and `y.len()` must be multiples of `k > 0` and
/// `out` `(y.len() / k) * (w.len() / k)` long.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_by<W: Lanes, E: Elem, const R: usize, const T: usize>(
    w: &[E],
    y: &[E],
    k: usize,
    out: &mut [f32],
    a: &mut Vec<f32>,
    wf: &mut Vec<f32>,
) {
    let rows = w.len() / k;
    let n_tok = y.len() / k;
    // About 32 rows (256 KiB of f32 at 2048 values a row; 16 and 64 measured no better), a
    // whole number of tiles: with three-row tiles, blocks of 32 left two rows of every block
    // to slower tiles.
    let block = 32 / R * R;
    let np = k & !63;
    // Rows of the copies a line longer than the 64-value steps they hold, so that rows of
    // 2048 or 8192 values do not all start on the same first-level cache set (no difference
    // measured on one CPU: docs/perf-log.md, "F16 and BF16 kernels"; [`tile`] relies on the
    // 16).
    let kp = np + 16;
    a.resize(n_tok * kp, 0.0);
    for (t, at) in a.chunks_exact_mut(kp).enumerate() {
        // SAFETY: the caller's CPU.
        unsafe { widen_by_chain::<W, E>(&y[t * k..][..np], &mut at[..np]) };
    }
    let a = &*a;
    let mut accs = Vec::new();
    for r0 in (0..rows).step_by(block) {
        let rs = r0..(r0 + block).min(rows);
        // The block's weights laid out by chain once, for every token, in their own type (the
        // tiles widen F16 as they load it: half the bytes to move, no widening pass).
        let words = rs.len() * kp * size_of::<E>() / size_of::<f32>();
        wf.resize(words, 0.0);
        let wfe: &mut [E] = bytemuck::cast_slice_mut(&mut wf[..words]);
        for (r, at) in rs.clone().zip(wfe.chunks_exact_mut(kp)) {
            order_by_chain::<W, E>(&w[r * k..][..np], &mut at[..np]);
        }
        let wf = &*wfe;
        let mut t0 = 0;
        macro_rules! pass {
            ($t:expr) => {
                rows_by::<W, E, R, { $t }>(w, wf, a, y, (k, kp), t0, rs.clone(), &mut accs, out)
            };
        }
        // SAFETY: the caller's CPU; tokens t0..t0 + T exist (loop conditions).
        unsafe {
            while n_tok - t0 >= T {
                pass!(T);
                t0 += T;
            }
            match n_tok - t0 {
                5 => pass!(5),
                4 => pass!(4),
                3 => pass!(3),
                2 => pass!(2),
                1 => pass!(1),
                _ => {}
            }
        }
    }
}

thread_local! {
    /// The tokens of a batch kernel's call as f32, and a block of its rows in their own type
    /// (in f32 words).
    static COPIES: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The 64-value steps of `x` as f32 into `out` (as long, a multiple of 64), by chain: the
/// values `LANES c..LANES (c + 1)` of every step (those the reference's chain `c` takes) one
/// after another, step by step, at `c * out.len() / CHAINS`.
///
/// # Safety
/// The CPU must have `W`'s features.
#[inline(always)]
unsafe fn widen_by_chain<W: Lanes, E: Elem>(x: &[E], out: &mut [f32]) {
    let n = x.len().min(out.len()) & !63;
    for s in 0..n / 64 {
        for c in 0..W::CHAINS {
            // SAFETY: 64 s + LANES c + LANES <= n, and c n / CHAINS + LANES s + LANES <= n.
            unsafe {
                let v = W::widen(x.as_ptr().add(64 * s + W::LANES * c));
                W::store(out.as_mut_ptr().add(c * n / W::CHAINS + W::LANES * s), v);
            }
        }
    }
}

/// The 64-value steps of `x` into `out` (as long, a multiple of 64) by chain, as
/// [`widen_by_chain`] lays them out, unconverted.
#[inline(always)]
fn order_by_chain<W: Lanes, E: Elem>(x: &[E], out: &mut [E]) {
    let n = x.len().min(out.len()) & !63;
    for (s, step) in x[..n].chunks_exact(64).enumerate() {
        for (c, chain) in step.chunks_exact(W::LANES).enumerate() {
            out[c * n / W::CHAINS + W::LANES * s..][..W::LANES].copy_from_slice(chain);
        }
    }
}

/// [`gemm_by`] in 512-bit registers.
///
/// # Safety
/// As [`gemm_by`], with AVX-512 F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn gemm_512_unchecked<E: Elem>(w: &[E], y: &[E], k: usize, out: &mut [f32]) {
    COPIES.with_borrow_mut(|(a, wf)| {
        // SAFETY: the caller's.
        unsafe { gemm_by::<__m512, E, 4, 6>(w, y, k, out, a, wf) }
    });
}

/// [`gemm_by`] in 256-bit registers (sixteen of them: three rows by four tokens).
///
/// # Safety
/// As [`gemm_by`], with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2_unchecked<E: Elem>(w: &[E], y: &[E], k: usize, out: &mut [f32]) {
    COPIES.with_borrow_mut(|(a, wf)| {
        // SAFETY: the caller's.
        unsafe { gemm_by::<__m256, E, 3, 4>(w, y, k, out, a, wf) }
    });
}

tiled_entry! {
    /// The AVX-512 F16/F32 tile entry ([`crate::GemmFn`]).
    gemm_512<E: Elem>: E => gemm_512_unchecked::<E>
}

tiled_entry! {
    /// The AVX2 F16/F32 tile entry ([`crate::GemmFn`]).
    gemm_avx2<E: Elem>: E => gemm_avx2_unchecked::<E>
}

/// F32 to F16, rounding to nearest even, eight at a time (`vcvtps2ph`): ggml's conversion of
/// activations for F16 weights, and the reference's (`half`'s), bit for bit on finite values.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_f16(x: &[f32], y: &mut [f16]) {
    let n = x.len().min(y.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, inside both slices.
        unsafe {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(y.as_mut_ptr().add(i).cast(), h);
        }
        i += 8;
    }
    for (o, v) in y[i..n].iter_mut().zip(&x[i..n]) {
        *o = f16::from_f32(*v);
    }
}

// ---------------------------------------------------------------------------------------------
// F16 matrices packed at load time, sixteen rows in the lanes (AVX-512). The reference's 64
// chains of an output are separate sums, chain `l` over the values `64 i + l` in order of `i`;
// a register holds chain `l` of sixteen rows, so a batch step multiplies one register of
// weights by one token's value broadcast (three groups of rows by eight tokens: three loads and
// eight broadcasts for 24 multiply-adds, where the tiles of values in the lanes take ten
// full-width loads, which an AMD Zen 5 issues once a cycle). A group of sixteen rows of `k`
// values is laid out as the `np = 64 s` values of its chains, then the `k - np` left over:
//
// - for `m` in 0..16, for step `i` in 0..s, for `q` in 0..4: chain `m + 16 q`'s value of step
//   `i`, sixteen rows (32 bytes): the four chains that [`reduce_add_16`]'s first adds pair
//   (`(a0 + a2) + (a1 + a3)`, lanes `m` of the reference's four accumulators) side by side, so
//   that one token reads the group as one stream;
// - then each row's `k - np` values, row by row.
//
// [`reduce_add_16`]: crate::reference::dot::reduce_add_16

/// Rows of a packed group.
const GROUP: usize = 16;

/// Where chain `m + 16 q`'s step `i` lies in a packed group of `s` steps, in registers of
/// sixteen rows (its values at `16 *` that): the layout above.
#[inline(always)]
fn chain_at(s: usize, m: usize, i: usize, q: usize) -> usize {
    (m * s + i) * 4 + q
}

/// Sixteen registers of sixteen f32 transposed: lane `c` of register `r` to lane `r` of
/// register `c`.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
pub(super) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // (Loops, not `from_fn`: a closure would not share the callers' features.)
    // SAFETY: the caller's CPU.
    unsafe {
        // Per 128-bit lane `q`: rows 2k, 2k + 1 of columns 4q, 4q + 1 (`a[2k]`), 4q + 2, 4q + 3.
        let mut a = [_mm512_setzero_ps(); 16];
        for k in 0..8 {
            a[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
            a[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
        }
        // `b[4m + s]`, lane `q`: column 4q + s of rows 4m..4m + 4.
        let mut b = [_mm512_setzero_ps(); 16];
        for m in 0..4 {
            for h in 0..2 {
                let x = _mm512_castps_pd(a[4 * m + h]);
                let y = _mm512_castps_pd(a[4 * m + 2 + h]);
                b[4 * m + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
                b[4 * m + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
            }
        }
        let mut out = [_mm512_setzero_ps(); 16];
        for s in 0..4 {
            let c1 = _mm512_shuffle_f32x4::<0x44>(b[s], b[4 + s]);
            let c2 = _mm512_shuffle_f32x4::<0xEE>(b[s], b[4 + s]);
            let c3 = _mm512_shuffle_f32x4::<0x44>(b[8 + s], b[12 + s]);
            let c4 = _mm512_shuffle_f32x4::<0xEE>(b[8 + s], b[12 + s]);
            out[s] = _mm512_shuffle_f32x4::<0x88>(c1, c3);
            out[4 + s] = _mm512_shuffle_f32x4::<0xDD>(c1, c3);
            out[8 + s] = _mm512_shuffle_f32x4::<0x88>(c2, c4);
            out[12 + s] = _mm512_shuffle_f32x4::<0xDD>(c2, c4);
        }
        out
    }
}

/// Sixteen rows' 64 bytes from byte `at` of each (row `r` at `rows[r * stride..]`), transposed
/// as 32-bit words ([`transpose16`]): register `j` holds word `j` of every row, a row a lane.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
pub(super) unsafe fn load_transposed16(rows: &[u8], stride: usize, at: usize) -> [__m512; 16] {
    // SAFETY: the caller's CPU.
    let mut v = [unsafe { _mm512_setzero_ps() }; 16];
    for (r, v) in v.iter_mut().enumerate() {
        // SAFETY: the caller's CPU; 64 bytes of row r, bounds-checked by the slice.
        *v = unsafe { _mm512_loadu_ps(rows[r * stride + at..][..64].as_ptr().cast()) };
    }
    // SAFETY: the caller's CPU.
    unsafe { transpose16(v) }
}

/// The tokens of a batch laid out for the packed float kernels' passes ([`gemm_packed`] and
/// `crate::x86::bf16`'s), into `yp` (`block_len` words a block of [`PASS_TOKENS`] tokens, zeros
/// past the last token): sixteen tokens at a time, for each step `i < s` and part `j < J`,
/// `load(t, i, j)` gives token `t`'s sixteen 32-bit words of that part; transposed
/// ([`transpose16`]), word `c` of the sixteen tokens goes to `at(c, i, j)` of two blocks, the
/// first eight tokens' and the last eight's.
///
/// # Safety
/// The CPU must have AVX-512 F, and `load`'s reads and `at(c, i, j) + 8 <= block_len` hold.
#[inline(always)]
pub(super) unsafe fn lay_out_tokens<W: bytemuck::Pod, const J: usize>(
    yp: &mut Vec<W>,
    (n_tok, s, block_len): (usize, usize, usize),
    load: impl Fn(usize, usize, usize) -> __m512,
    at: impl Fn(usize, usize, usize) -> usize,
) {
    const { assert!(size_of::<W>() == 4 && 2 * PASS_TOKENS == 16) };
    const PT: usize = PASS_TOKENS;
    yp.clear();
    yp.resize(n_tok.div_ceil(2 * PT) * 2 * block_len, W::zeroed());
    for (b, block) in yp.chunks_exact_mut((2 * block_len).max(1)).enumerate() {
        let tokens = b * 2 * PT..((b + 1) * 2 * PT).min(n_tok);
        let (lo, hi) = block.split_at_mut(block_len);
        for i in 0..s {
            for j in 0..J {
                // SAFETY: (the block) the caller's CPU; eight words at `at(..)` of each half.
                unsafe {
                    let mut v = [_mm512_setzero_ps(); 16];
                    for (v, t) in v.iter_mut().zip(tokens.clone()) {
                        *v = load(t, i, j);
                    }
                    for (c, v) in transpose16(v).into_iter().enumerate() {
                        let at = at(c, i, j);
                        let v = _mm512_castps_pd(v);
                        let (v0, v1) = (_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd::<1>(v));
                        _mm256_storeu_pd(lo[at..][..PT].as_mut_ptr().cast(), v0);
                        _mm256_storeu_pd(hi[at..][..PT].as_mut_ptr().cast(), v1);
                    }
                }
            }
        }
    }
}

/// Sixteen rows' chains summed in the reference's order, lane by lane, from the sixteen
/// `(a0 + a2) + (a1 + a3)` sums of its four 16-lane accumulators (`v[m]`: lanes `m`): then
/// [`crate::reference::dot::reduce_add_16`]'s halves, quarters and pairs.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
pub(super) unsafe fn reduce_pairs(mut v: [__m512; 16]) -> __m512 {
    // SAFETY: the caller's CPU.
    unsafe {
        for i in 0..8 {
            v[i] = _mm512_add_ps(v[i], v[i + 8]);
        }
        for i in 0..4 {
            v[i] = _mm512_add_ps(v[i], v[i + 4]);
        }
        _mm512_add_ps(_mm512_add_ps(v[0], v[2]), _mm512_add_ps(v[1], v[3]))
    }
}

/// Pack the first `groups` groups of sixteen rows of an F16 matrix (`w`: its rows,
/// `row_bytes` each) in the layout above, into new anonymous memory (as
/// `packed::layout::pack_groups`: huge pages asked for, pieces over the cores, `release` given
/// each piece's rows once packed).
pub(crate) fn pack_rows(
    w: &[u8],
    row_bytes: usize,
    groups: usize,
    release: &(dyn Fn(&[u8]) + Sync),
) -> std::io::Result<crate::pages::Pages> {
    let k = row_bytes / 2;
    let s = k / 64;
    let np = 64 * s;
    let group_bytes = GROUP * row_bytes;
    let pack_group = |g: usize, out: &mut [u8]| {
        let rows: &[u16] = bytemuck::cast_slice(&w[g * group_bytes..(g + 1) * group_bytes]);
        let out: &mut [u16] = bytemuck::cast_slice_mut(out);
        // Sixteen rows' values of a column each: columns c and c + 1 of every row gathered as
        // one word a row, split into the two columns' halves.
        let (chains, tails) = out.split_at_mut(GROUP * np);
        // SAFETY: `pack_rows` is handed out only on AVX-512 CPUs (as the format's kernel).
        unsafe { gather_columns(rows, k, s, chains) };
        if k > np {
            for (r, d) in tails.chunks_exact_mut(k - np).enumerate() {
                d.copy_from_slice(&rows[r * k + np..(r + 1) * k]);
            }
        }
    };
    crate::packed::layout::pack_row_groups(w, row_bytes, groups, release, &pack_group)
}

/// The chains of a group (`rows`: sixteen rows of `k` values, as bits) into `chains` in the
/// packed layout: for chain `m + 16 q` at step `i`, its sixteen rows at `((m s + i) 4 + q)
/// 16`. Each half step's 32 columns of the sixteen rows loaded and transposed as 32-bit words
/// ([`transpose16`]: word `j`, columns `2j` and `2j + 1` of every row), then split into the
/// two columns' halves. (Gathering each word pair from the sixteen rows instead made an F16
/// file's load much slower: docs/perf-log.md, "F16 and BF16 kernels".)
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn gather_columns(rows: &[u16], k: usize, s: usize, chains: &mut [u16]) {
    assert!(rows.len() >= GROUP * k && chains.len() >= GROUP * 64 * s && 64 * s <= k);
    let dst = |m: usize, i: usize, q: usize| chain_at(s, m, i, q) * GROUP;
    let bytes: &[u8] = bytemuck::cast_slice(rows);
    for i in 0..s {
        for h in 0..2 {
            let c0 = 64 * i + 32 * h;
            // SAFETY: this function's features; columns c0..c0 + 32 <= 64 s <= k of each row.
            let words = unsafe { load_transposed16(bytes, 2 * k, 2 * c0) };
            for (j, w) in words.iter().enumerate() {
                // Columns c0 + 2j and c0 + 2j + 1: chain m = (32 h + 2 j) % 16 of part q.
                let (q, m) = (2 * h + j / 8, 2 * (j % 8));
                let w = _mm512_castps_si512(*w);
                let lo = _mm512_cvtepi32_epi16(w);
                let hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(w));
                // SAFETY: sixteen u16 at each destination, inside `chains`.
                unsafe {
                    _mm256_storeu_si256(chains[dst(m, i, q)..][..GROUP].as_mut_ptr().cast(), lo);
                    _mm256_storeu_si256(
                        chains[dst(m + 1, i, q)..][..GROUP].as_mut_ptr().cast(),
                        hi,
                    );
                }
            }
        }
    }
}

/// The packed kernels' copies: the call's tokens as f32 (one token: its values in the order
/// they are read), and for a batch the tokens in blocks of sixteen chain by chain and a pass's
/// sums.
type PackedCopies = (Vec<f32>, Vec<f32>, Vec<__m512>);

thread_local! {
    static PACKED_COPIES: std::cell::RefCell<PackedCopies> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Groups of sixteen packed rows (`p`, `k` values a row) times one token (`y`: its `np`
/// values as f32, in the order of the group's chains ([`chain_at`]); `y16`: as given, for the tails), into `out` (sixteen a group): each group and
/// the token read as one stream each, four of the group's chains at a time.
///
/// # Safety
/// The CPU must have AVX-512 F and F16C; `p` holds whole groups, `y` `np` values and `y16`
/// `k`, `out` sixteen a group.
#[inline(always)]
unsafe fn gemv_packed(p: &[f16], k: usize, (y, y16): (&[f32], &[f16]), out: &mut [f32]) {
    let s = k / 64;
    let np = 64 * s;
    for (g, out) in p.chunks_exact(GROUP * k).zip(out.chunks_exact_mut(GROUP)) {
        // SAFETY: the caller's CPU.
        let mut v = [unsafe { _mm512_setzero_ps() }; 16];
        for (m, v) in v.iter_mut().enumerate() {
            // SAFETY: the caller's CPU.
            let mut acc = [unsafe { _mm512_setzero_ps() }; 4];
            // Chains m, m + 16, m + 32 and m + 48, step by step, and their token values.
            let x = &g[chain_at(s, m, 0, 0) * GROUP..][..4 * s * GROUP];
            let ym = &y[chain_at(s, m, 0, 0)..][..4 * s];
            for i in 0..s {
                let xi = &x[i * 4 * GROUP..][..4 * GROUP];
                // This step's two lines, their bytes ahead (past the group: the next one's),
                // where this CPU's kernels stream better so ([`Ahead::Stream`]).
                prefetch_lines_by(xi.as_ptr().cast(), 0..2, Ahead::Stream.plan());
                for (q, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the caller's CPU; sixteen values of `xi`, chain m + 16 q's value
                    // of step i in `y` (below np).
                    unsafe {
                        let w =
                            _mm512_cvtph_ps(_mm256_loadu_si256(xi[q * GROUP..].as_ptr().cast()));
                        *a = _mm512_fmadd_ps(w, _mm512_set1_ps(ym[4 * i + q]), *a);
                    }
                }
            }
            // SAFETY: the caller's CPU.
            *v = unsafe {
                _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]))
            };
        }
        let mut sums = [0f32; 16];
        // SAFETY: the caller's CPU; sixteen f32.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), reduce_pairs(v)) };
        let tails = &g[GROUP * np..];
        let tail = k - np;
        for (r, (o, sum)) in out.iter_mut().zip(sums).enumerate() {
            *o = tail_f16(sum, &tails[r * tail..][..tail], &y16[np..k]);
        }
    }
}

/// The reference's sum of the values left past the 64-value steps, `x` against `y`, onto
/// `sum`: [`Elem::tail`] for F16 (none left: `sum` itself).
#[inline(always)]
fn tail_f16(sum: f32, x: &[f16], y: &[f16]) -> f32 {
    if x.is_empty() {
        return sum;
    }
    <f16 as Elem>::tail(sum, x, y, 0)
}

/// Chain `m + 16 q` of `G` groups of sixteen packed rows times `T` tokens, summed over its `s`
/// steps, into `c[g * T + t]`: `x[g]` is group `g` from the chain's step 0 on (step `i` at
/// `64 i` values further, [`chain_at`]), widened as it is read; `y` the chain's value of step
/// `i` for token `t` at `PASS_TOKENS i + t`.
///
/// # Safety
/// The CPU must have AVX-512 F and F16C.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `g` and `t` index the accumulators and the operands
unsafe fn chain_pass<const G: usize, const T: usize>(
    x: [&[f16]; G],
    y: &[f32],
    s: usize,
    c: &mut [__m512],
) {
    if s == 0 {
        return;
    }
    for x in x {
        assert!(x.len() >= 64 * (s - 1) + GROUP);
    }
    assert!(T <= PASS_TOKENS && y.len() >= PASS_TOKENS * (s - 1) + T && c.len() >= G * T);
    // SAFETY: the caller's CPU; step `i < s` reads sixteen values of `x[g]` from `64 i` and
    // value `PASS_TOKENS i + t` of `y`, inside both (asserted above).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); T]; G];
        for i in 0..s {
            let mut xv = [_mm512_setzero_ps(); G];
            for g in 0..G {
                xv[g] = _mm512_cvtph_ps(_mm256_loadu_si256(x[g].as_ptr().add(64 * i).cast()));
            }
            for t in 0..T {
                let yv = _mm512_set1_ps(*y.as_ptr().add(i * PASS_TOKENS + t));
                for g in 0..G {
                    acc[g][t] = _mm512_fmadd_ps(xv[g], yv, acc[g][t]);
                }
            }
        }
        for g in 0..G {
            for t in 0..T {
                c[g * T + t] = acc[g][t];
            }
        }
    }
}

/// `chain_pass::<G, T>` (the calling module's) for `$n_g` groups (1..=3) and `$nt` tokens
/// (1..=8), group `g`'s rows from `$x(g)` (slices of `$elem`), then `($y, $s, $c)`: the
/// dispatch of the F16 and BF16 batch passes, whose chain passes differ only in their types.
macro_rules! chain_passes {
    ($elem:ty, $n_g:expr, $nt:expr, $x:expr, $args:tt) => {
        match $n_g {
            1 => chain_passes!(@g 1, $elem, $nt, $x, $args),
            2 => chain_passes!(@g 2, $elem, $nt, $x, $args),
            _ => chain_passes!(@g 3, $elem, $nt, $x, $args),
        }
    };
    (@g $g:literal, $elem:ty, $nt:expr, $x:expr, ($y:expr, $s:expr, $c:expr)) => {{
        let x: [&[$elem]; $g] = std::array::from_fn($x);
        match $nt {
            1 => chain_pass::<$g, 1>(x, $y, $s, $c),
            2 => chain_pass::<$g, 2>(x, $y, $s, $c),
            3 => chain_pass::<$g, 3>(x, $y, $s, $c),
            4 => chain_pass::<$g, 4>(x, $y, $s, $c),
            5 => chain_pass::<$g, 5>(x, $y, $s, $c),
            6 => chain_pass::<$g, 6>(x, $y, $s, $c),
            7 => chain_pass::<$g, 7>(x, $y, $s, $c),
            8 => chain_pass::<$g, 8>(x, $y, $s, $c),
            _ => unreachable!("a pass takes 1..=8 tokens"),
        }
    }};
}
pub(super) use chain_passes;

/// Groups a batch pass takes, and tokens.
const PASS_GROUPS: usize = 3;
const PASS_TOKENS: usize = 8;
/// Outputs of a pass (sixteen rows each).
const PASS_OUT: usize = PASS_GROUPS * PASS_TOKENS;

/// Groups of sixteen packed rows (`p`, `k` values a row) times the `n_tok` tokens of `y`
/// (`k` values each), into `out` (`(n_tok, rows)`): the tokens widened and laid out chain by
/// chain once a call (in blocks of [`PASS_TOKENS`], transposed sixteen at a time,
/// [`transpose16`]); then for each block of up to [`PASS_GROUPS`] groups, lane by lane (the
/// region of a lane's four chains in each group, read where it is packed: from memory once,
/// then from cache), passes of [`PASS_TOKENS`] tokens over the four chains ([`chain_pass`])
/// and their first adds; last each output's halves, quarters and pairs ([`reduce_pairs`]) and
/// its tail. (Passes over all 64 chains token block by token block read a block's rows once a
/// token block, from the second-level cache or, for rows of 8192 values, beyond it, and ran
/// slower there than with rows of 2048: docs/perf-log.md, "F16 and BF16 kernels".)
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2, FMA and F16C; `p` holds whole groups, `y` `n_tok k`
/// values, `out` `n_tok` outputs a row.
#[inline(always)]
unsafe fn gemm_packed(
    p: &[f16],
    k: usize,
    y: &[f16],
    n_tok: usize,
    out: &mut [f32],
    (yp, sums): (&mut Vec<f32>, &mut Vec<__m512>),
) {
    let s = k / 64;
    let np = 64 * s;
    let groups = p.len() / (GROUP * k);
    let rows = GROUP * groups;
    // SAFETY: (the whole body) this function's caller's CPU; the reads below stay inside the
    // slices (sliced to their lengths first).
    unsafe {
        let zero = _mm512_setzero_ps();
        // Each block of PASS_TOKENS tokens: chain `l`'s value of step `i` for token `t` at
        // `(l s + i) PASS_TOKENS + t`.
        const PT: usize = PASS_TOKENS;
        let block_len = 64 * s * PT;
        lay_out_tokens::<f32, 4>(
            yp,
            (n_tok, s, block_len),
            |t, i, j| <f16 as Elem>::load16(y[t * k + 64 * i + 16 * j..][..16].as_ptr()),
            |c, i, j| ((16 * j + c) * s + i) * PT,
        );
        // The four chains of a lane's first adds, then the sixteen sums of each output
        // (`(g, t)` of a block at `g n_tok + t`).
        sums.resize(4 * PASS_OUT + 16 * PASS_GROUPS * n_tok, zero);
        let (c4, v) = sums.split_at_mut(4 * PASS_OUT);
        // A region: a group's four chains of one lane `m` (their `s` steps side by side).
        let region = 4 * s * GROUP;
        let passes = 4 * n_tok.div_ceil(PT);
        for g0 in (0..groups).step_by(PASS_GROUPS) {
            let n_g = (groups - g0).min(PASS_GROUPS);
            let block = &p[g0 * GROUP * k..(g0 + n_g) * GROUP * k];
            for m in 0..if s > 0 { 16 } else { 0 } {
                // The block's regions two lanes on (the next block's first two), requested a
                // share a pass: every pass of lane m reads its region again, from cache, and
                // the rows stream in once.
                let (ahead, g_ahead) = match m + 2 {
                    a if a < 16 => (a, g0),
                    a => (a - 16, g0 + n_g),
                };
                let lines = 2 * region / 64;
                let per_pass = lines.div_ceil(passes);
                let mut requested = 0;
                for t0 in (0..n_tok).step_by(PT) {
                    let nt = (n_tok - t0).min(PT);
                    let yb = &yp[t0 / PT * block_len..][..block_len];
                    for q in 0..4 {
                        for g in g_ahead..(g_ahead + PASS_GROUPS).min(groups) {
                            let at = &p[(g * k + chain_at(s, ahead, 0, 0)) * GROUP..][..region];
                            prefetch_now(
                                at.as_ptr().cast(),
                                requested..(requested + per_pass).min(lines),
                            );
                        }
                        requested = (requested + per_pass).min(lines);
                        let yl = &yb[(m + 16 * q) * s * PT..];
                        let c = &mut c4[q * PASS_OUT..][..PASS_OUT];
                        let x = |g: usize| &block[(g * k + chain_at(s, m, 0, q)) * GROUP..];
                        chain_passes!(f16, n_g, nt, x, (yl, s, c));
                    }
                    // `(a0 + a2) + (a1 + a3)`: chains m, m + 32, m + 16 and m + 48.
                    for g in 0..n_g {
                        for t in 0..nt {
                            let c = |q: usize| c4[q * PASS_OUT + g * nt + t];
                            v[16 * (g * n_tok + t0 + t) + m] =
                                _mm512_add_ps(_mm512_add_ps(c(0), c(2)), _mm512_add_ps(c(1), c(3)));
                        }
                    }
                }
            }
            for g in 0..n_g {
                let tails = &block[g * GROUP * k + GROUP * np..][..GROUP * (k - np)];
                for t in 0..n_tok {
                    let vs: [__m512; 16] = if s > 0 {
                        v[16 * (g * n_tok + t)..][..16].try_into().unwrap()
                    } else {
                        [zero; 16]
                    };
                    let mut row_sums = [0f32; 16];
                    _mm512_storeu_ps(row_sums.as_mut_ptr(), reduce_pairs(vs));
                    let yt = &y[t * k + np..][..k - np];
                    for (r, sum) in row_sums.into_iter().enumerate() {
                        let x = &tails[r * (k - np)..][..k - np];
                        out[t * rows + (g0 + g) * GROUP + r] = tail_f16(sum, x, yt);
                    }
                }
            }
        }
    }
}

/// The packed F16 kernel (`packed::layout::PackedFn`): `p` whole groups of `k = per_row`
/// values a row, `a` the `n_tok` tokens' F16 activations, `out` `(n_tok, rows)`.
pub(crate) fn packed_kernel(
    p: &[u8],
    per_row: usize,
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let k = per_row;
    // A packed "block": one column of a group's sixteen rows.
    let f16 = crate::GgmlType::F16;
    let (x, y) =
        crate::packed::layout::operands::<[f16; GROUP], f16>(f16, f16, p, k, a, n_tok, out)?;
    let x: &[f16] = x.as_flattened();
    PACKED_COPIES.with_borrow_mut(|(yf, yp, sums)| {
        if n_tok == 1 {
            // The token's values in the order the group's chains are read (a row of 8192 values
            // read in column order missed the first-level cache, and `ffn_down` streamed slower
            // than the other matrices: docs/perf-log.md, "F16 and BF16 kernels").
            let s = k / 64;
            yf.clear();
            yf.resize(64 * s, 0.0);
            for (c, v) in y[..64 * s].iter().enumerate() {
                let (l, i) = (c % 64, c / 64);
                yf[chain_at(s, l % 16, i, l / 16)] = v.to_f32();
            }
            // SAFETY: the kernel table hands this format out only for `Isa::Avx512Vnni` (AVX-512
            // with AVX2, FMA and F16C); the sizes agree (checked above).
            unsafe { gemv_entry(x, k, (yf, y), out) };
        } else {
            // SAFETY: as above.
            unsafe { gemm_entry(x, k, y, n_tok, out, (yp, sums)) };
        }
    });
    Ok(())
}

/// [`gemv_packed`] compiled for its features. (The bodies as `target_feature` functions of
/// their own, without these entries, measured slower: docs/perf-log.md, "F16 and BF16
/// kernels".)
///
/// # Safety
/// As [`gemv_packed`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn gemv_entry(p: &[f16], k: usize, y: (&[f32], &[f16]), out: &mut [f32]) {
    // SAFETY: the caller's.
    unsafe { gemv_packed(p, k, y, out) }
}

/// [`gemm_packed`] compiled for its features.
///
/// # Safety
/// As [`gemm_packed`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn gemm_entry(
    p: &[f16],
    k: usize,
    y: &[f16],
    n_tok: usize,
    out: &mut [f32],
    copies: (&mut Vec<f32>, &mut Vec<__m512>),
) {
    // SAFETY: the caller's.
    unsafe { gemm_packed(p, k, y, n_tok, out, copies) }
}

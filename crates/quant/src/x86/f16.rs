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
//! - [`gemm_512`]: AVX-512 tiles for batches, rows x tokens, the tokens converted to f32 once
//!   per call and shared by every row.

use std::arch::x86_64::*;

use half::f16;

use super::avx2::hsum;
use super::prefetch_lines;
use crate::QuantError;

/// An element type these kernels take, weights and activations alike: F16 (widened exactly
/// with `vcvtph2ps`) or F32.
pub trait Elem: crate::DotBlock<Act = Self> {
    /// The value as f32 (exact).
    fn widen(self) -> f32;
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
    fn widen(self) -> f32 {
        self.to_f32()
    }

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
    fn widen(self) -> f32 {
        self
    }

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
        // the next rows'): a burst before each group of rows held F16 at 67% of the bandwidth.
        for r in x {
            prefetch_lines(r.as_ptr().wrapping_add(i).cast(), 0..size_of::<E>());
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
        prefetch_lines(x.as_ptr().wrapping_add(i).cast(), 0..size_of::<E>());
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

thread_local! {
    /// The tokens of a [`gemm_512`] call as f32.
    static TOKENS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The accumulators of one output: the reference's four 16-lane sums.
type Acc = [__m512; 4];

/// Rows `r0..r0 + R` of `w` (`k` values each) times tokens `t0..t0 + T` of `a` (f32, `k` each)
/// over the 64-value steps of `ks` (values `ks.start..ks.end`, both multiples of 64), carrying
/// each output's accumulators in `acc` (`acc[r * T + t]`) from the steps before to the next.
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2, FMA and F16C; the rows and tokens must exist, and
/// `ks.end <= k`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `j`, `r` and `t` index every accumulator of the tile
unsafe fn tile<E: Elem, const R: usize, const T: usize>(
    w: &[E],
    a: &[f32],
    k: usize,
    (r0, t0): (usize, usize),
    ks: std::ops::Range<usize>,
    acc: &mut [Acc],
) {
    let x: [&[E]; R] = std::array::from_fn(|r| &w[(r0 + r) * k..][..ks.end]);
    let y: [&[f32]; T] = std::array::from_fn(|t| &a[(t0 + t) * k..][..ks.end]);
    let acc = &mut acc[..R * T];
    let mut v: [[Acc; T]; R] = std::array::from_fn(|r| std::array::from_fn(|t| acc[r * T + t]));
    let mut i = ks.start;
    while i < ks.end {
        for j in 0..4 {
            let at = i + 16 * j;
            // SAFETY: at + 16 <= ks.end, inside every row and token (sliced above).
            unsafe {
                let yv: [__m512; T] =
                    std::array::from_fn(|t| _mm512_loadu_ps(y[t].as_ptr().add(at)));
                for r in 0..R {
                    let xv = E::load16(x[r].as_ptr().add(at));
                    for t in 0..T {
                        v[r][t][j] = _mm512_fmadd_ps(xv, yv[t], v[r][t][j]);
                    }
                }
            }
        }
        i += 64;
    }
    for r in 0..R {
        for t in 0..T {
            acc[r * T + t] = v[r][t];
        }
    }
}

/// Rows `rs` by tokens `t0..t0 + T`: `R` rows a tile, then one at a time; the steps of `k` in
/// chunks that keep the tokens' part in the first-level cache, every output's accumulators
/// carried from chunk to chunk in order (so each sums exactly as the row kernel does); then the
/// reduction and the tail of each output into `out` (`(n_tok, rows)`).
///
/// # Safety
/// As for [`tile`].
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_by<E: Elem, const R: usize, const T: usize>(
    w: &[E],
    a: &[f32],
    y16: &[E],
    k: usize,
    t0: usize,
    rs: std::ops::Range<usize>,
    accs: &mut Vec<Acc>,
    out: &mut [f32],
) {
    /// Values per chunk: three tokens' 24 KiB of f32.
    const CHUNK: usize = 2048;
    let rows = w.len() / k;
    let np = k & !63;
    accs.clear();
    accs.resize(rs.len() * T, [_mm512_setzero_ps(); 4]);
    for k0 in (0..np).step_by(CHUNK) {
        let ks = k0..(k0 + CHUNK).min(np);
        let mut r0 = rs.start;
        // SAFETY: the caller's CPU; every tile's rows are in `rs` (below `rows`), its tokens
        // exist, `ks.end <= np <= k`, and its accumulators lie in `accs`.
        unsafe {
            while rs.end - r0 >= R {
                let at = (r0 - rs.start) * T;
                tile::<E, R, T>(w, a, k, (r0, t0), ks.clone(), &mut accs[at..]);
                r0 += R;
            }
            while r0 < rs.end {
                let at = (r0 - rs.start) * T;
                tile::<E, 1, T>(w, a, k, (r0, t0), ks.clone(), &mut accs[at..]);
                r0 += 1;
            }
        }
    }
    for r in rs.clone() {
        let xr = &w[r * k..][..k];
        for t in 0..T {
            let yt = &y16[(t0 + t) * k..][..k];
            let acc = accs[(r - rs.start) * T + t];
            out[(t0 + t) * rows + r] = E::tail(reduce4(acc), xr, yt, np);
        }
    }
}

/// Every row of `w` (`k` values each) times every token of `y` (`k` F16 values each), into `out`
/// (`(n_tok, rows)`): tiles of two rows by three tokens (24 accumulators), the tokens left over
/// by two or one; the tokens widened to f32 (exactly) once per call, shared by every row.
/// Rows go in blocks of 36, whose chunk of weights stays in cache while every token goes by
/// (the loop order only: no effect on any value).
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2, FMA and F16C; `w.len()` and `y.len()` must be
/// multiples of `k > 0` and `out` `(y.len() / k) * (w.len() / k)` long.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn gemm_512_unchecked<E: Elem>(w: &[E], y: &[E], k: usize, out: &mut [f32]) {
    let rows = w.len() / k;
    let n_tok = y.len() / k;
    // 36 rows (a multiple of every tile's 2, 3 and 4): 144 KiB of F16 a 2048-value chunk.
    let block = 36;
    TOKENS.with_borrow_mut(|a| {
        if a.len() < y.len() {
            a.resize(y.len(), 0.0);
        }
        let a = &mut a[..y.len()];
        let mut i = 0;
        while i + 16 <= y.len() {
            // SAFETY: i + 16 <= y.len() = a.len().
            unsafe { _mm512_storeu_ps(a.as_mut_ptr().add(i), E::load16(y.as_ptr().add(i))) };
            i += 16;
        }
        for (o, v) in a[i..].iter_mut().zip(&y[i..]) {
            *o = v.widen();
        }
        let a = &*a;
        let mut accs = Vec::new();
        for r0 in (0..rows).step_by(block) {
            let rs = r0..(r0 + block).min(rows);
            let mut t0 = 0;
            // SAFETY: the caller's CPU; tokens t0..t0 + T exist (loop conditions).
            unsafe {
                while n_tok - t0 >= 3 {
                    rows_by::<E, 2, 3>(w, a, y, k, t0, rs.clone(), &mut accs, out);
                    t0 += 3;
                }
                if n_tok - t0 == 2 {
                    rows_by::<E, 3, 2>(w, a, y, k, t0, rs.clone(), &mut accs, out);
                } else if n_tok - t0 == 1 {
                    rows_by::<E, 4, 1>(w, a, y, k, t0, rs.clone(), &mut accs, out);
                }
            }
        }
    });
}

/// The AVX-512 F16 tile entry ([`crate::GemmFn`]).
pub fn gemm_512<E: Elem>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (x, y, per_row) = crate::codec::gemm_operands::<E>(w, row_bytes, a, n_tok, out)?;
    // SAFETY: `gemm_kernels` hands this entry out only after `has_avx512` found the features;
    // the operands' sizes agree (checked above).
    unsafe { gemm_512_unchecked(x, y, per_row, out) };
    Ok(())
}

/// Whether this CPU has what [`dot_512`] and [`gemm_512`] use: AVX-512 F, AVX2, FMA,
/// F16C (and `SYNAPSE_ISA` allows the AVX-512 tier).
pub fn has_avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        super::tier_allowed("avx512vnni")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
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

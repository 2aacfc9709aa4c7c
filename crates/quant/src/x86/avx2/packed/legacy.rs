//! The AVX2 kernels of the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL).

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::packed::layout::{
    packed_format, IQ4NLPacked, MXFP4Packed, Q4_0Packed, Q4_1Packed, Q5_0Packed, Q5_1Packed,
    Q8_0Packed, ROWS,
};
use crate::x86::avx2::packed::{bcast4, halves_d, hsum8, ld8_f16, store_rows8};
use crate::x86::packed_common::{token_passes, Act32, Pack32, Tok32, LANES32_TILE_WEIGHTS, TOKS32};
use crate::x86::prefetch_ahead;
use crate::GgmlType;

// ---------------------------------------------------------------------------------------------
// The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): lane `l` of a block holds
// values `4l..4l + 4` of eight rows, as in
// [`crate::x86::avx512::packed`]. `vpmaddubsw` multiplies unsigned bytes by signed ones and
// saturates its pairs at `i16`, so the 4- and 5-bit formats go in as stored (their offset taken
// back through the token's lane sums, as there), and the 8-bit ones (Q8_0, and IQ4_NL's
// levels) as ggml's AVX2 kernels take them: the weights' magnitudes times the token's values
// with the weights' signs (no pair then reaches `i16`'s bounds: the tokens' values, from
// `quantize_row_q8_0`'s rounding of `x / (amax / 127)`, stay within +-127).

/// Whether [`Pack32::lane8`] of `P` holds bytes that can reach 255 (values plus 128), taken
/// with the weights' signs instead of as unsigned bytes.
const fn signed<P: Pack32>() -> bool {
    P::OFFSET >= 128
}

/// Whether a format's lanes start at the token's bias (`-OFFSET * sum`): not for [`signed`]
/// formats, nor where the offset is 0 (Q4_1 and Q5_1, whose bias is all zeros: adding it, a
/// broadcast and an add a lane, had cost them a fifth of their passes' time; measurements:
/// docs/perf-log.md, "Q4_1 and Q5_1: lanes without the zero bias").
const fn biased<P: Pack32>() -> bool {
    !signed::<P>() && P::OFFSET != 0
}

/// Four values `a` of a token against lane `w` (from [`Pack32::lane8`]; `x`: it as signed
/// bytes, for [`signed`] formats) as `vpmaddubsw` pairs.
#[inline(always)]
fn pairs<P: Pack32>(w: __m256i, x: __m256i, a: __m256i) -> __m256i {
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        if signed::<P>() {
            _mm256_maddubs_epi16(w, _mm256_sign_epi8(a, x))
        } else {
            _mm256_maddubs_epi16(w, a)
        }
    }
}

/// [`pairs`] for one token's pass, `m` the token's magnitudes (`|a|`, shared by both halves):
/// for [`Pack32::LEVELS`] formats the level with the token's sign against them, the same
/// products with one `vpsignb` fewer a half than the level's magnitude against the token with
/// the level's sign.
#[inline(always)]
fn pairs_one<P: Pack32>(w: __m256i, x: __m256i, a: __m256i, m: __m256i) -> __m256i {
    const { assert!(!P::LEVELS || (signed::<P>() && P::OFFSET == 128)) };
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        if P::LEVELS {
            _mm256_maddubs_epi16(m, _mm256_sign_epi8(x, a))
        } else {
            pairs::<P>(w, x, a)
        }
    }
}

/// Lane `l` of rows `8h..8h + 8` of `g` for [`pairs`]: the bytes `vpmaddubsw` takes unsigned,
/// and the weights as signed bytes.
#[inline(always)]
unsafe fn lane<P: Pack32>(g: &P, l: usize, h: usize) -> (__m256i, __m256i) {
    // SAFETY: the caller's: AVX2.
    unsafe {
        let w = g.lane8(l, h);
        if signed::<P>() {
            let x = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
            (_mm256_abs_epi8(x), x)
        } else {
            (w, w)
        }
    }
}

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`, `toks[t]`), into `out[(t0 + t) *
/// stride + r0..][..16]`, in `vec_dot` order: each lane's exact sum fused into its own float
/// by `d_x * d_y`, the eight added at the end as ggml adds its lanes, and the mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn tokens32<P: Pack32, const T: usize>(
    g: &[P],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let ones = _mm256_set1_epi16(1);
    for hr in 0..2 {
        let mut acc = [[_mm256_setzero_ps(); 8]; T];
        let mut mins = [_mm256_setzero_ps(); T];
        for (b, g) in g.iter().enumerate() {
            if hr == 0 {
                prefetch_ahead(g);
            }
            // SAFETY: a row of `d`.
            let dx = unsafe { ld8_f16(g.d(), hr) };
            let tk: [&Tok32; T] = std::array::from_fn(|t| &toks[t][b]);
            let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs().as_ptr());
            let d: [__m256; T] =
                std::array::from_fn(|t| _mm256_mul_ps(dx, _mm256_set1_ps(tk[t].d)));
            if P::MIN {
                // SAFETY: a row of `m`.
                let mx = unsafe { ld8_f16(g.m(), hr) };
                for t in 0..T {
                    mins[t] = _mm256_fmadd_ps(mx, _mm256_set1_ps(tk[t].s), mins[t]);
                }
            }
            for l in 0..8 {
                // SAFETY: this function's features.
                let (w, x) = unsafe { lane(g, l, hr) };
                for t in 0..T {
                    // SAFETY: values 4l..4l + 4 of the token's 32.
                    let a = unsafe { bcast4(y[t].add(4 * l)) };
                    let mut s = _mm256_madd_epi16(pairs::<P>(w, x, a), ones);
                    if biased::<P>() {
                        s = _mm256_add_epi32(s, _mm256_set1_epi32(tk[t].bias[l]));
                    }
                    acc[t][l] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(s), acc[t][l]);
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: this function's features.
            let mut v = unsafe { hsum8(a) };
            if P::MIN {
                v = _mm256_add_ps(v, mins[t]);
            }
            store_rows8(out, (stride, r0, t0), t, hr, v);
        }
    }
}

/// [`tokens32`] in the order of llama.cpp's repacked gemv (Q4_0, IQ4_NL): each block's exact
/// integer total fused into one running float a (row, token) by `d_x * d_y`. Q4_0's pairs
/// (at most `2 * 15 * 128`) are gathered over the block's eight lanes in `i16` before one
/// `vpmaddwd`; IQ4_NL's, up to `2 * 127 * 127`, are widened lane by lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn tokens32_rows8<P: Pack32, const T: usize>(
    g: &[P],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let ones = _mm256_set1_epi16(1);
    for hr in 0..2 {
        let mut acc = [_mm256_setzero_ps(); T];
        for (b, g) in g.iter().enumerate() {
            if hr == 0 {
                prefetch_ahead(g);
            }
            // SAFETY: a row of `d`.
            let dx = unsafe { ld8_f16(g.d(), hr) };
            let tk: [&Tok32; T] = std::array::from_fn(|t| &toks[t][b]);
            let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs().as_ptr());
            let mut sum = [_mm256_setzero_si256(); T];
            for l in 0..8 {
                // SAFETY: this function's features.
                let (w, x) = unsafe { lane(g, l, hr) };
                for t in 0..T {
                    // SAFETY: values 4l..4l + 4 of the token's 32.
                    let a = unsafe { bcast4(y[t].add(4 * l)) };
                    let p = pairs::<P>(w, x, a);
                    sum[t] = if signed::<P>() {
                        _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, ones))
                    } else {
                        _mm256_add_epi16(sum[t], p)
                    };
                }
            }
            for t in 0..T {
                let total = if signed::<P>() {
                    sum[t]
                } else {
                    let bias = _mm256_set1_epi32(tk[t].total);
                    _mm256_add_epi32(_mm256_madd_epi16(sum[t], ones), bias)
                };
                let d = _mm256_mul_ps(dx, _mm256_set1_ps(tk[t].d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), d, acc[t]);
            }
        }
        for (t, &a) in acc.iter().enumerate() {
            store_rows8(out, (stride, r0, t0), t, hr, a);
        }
    }
}

/// [`tokens32`] for one token (decode), both halves of the sixteen rows in one sweep over the
/// group, as [`q4_k_one`]: each of the token's words broadcast once for the sixteen rows. The
/// same operations on the same integers, row by row, as the pass of one token. One sweep read
/// more of the memory than two halves, here and in the repacked order ([`tokens32_rows8_one`])
/// (measurements: docs/perf-log.md, "AVX2 one-token passes: one sweep over both halves").
///
/// [`q4_k_one`]: crate::x86::avx2::packed::kquants
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tokens32_one<P: Pack32, const T: usize>(
    g: &[P],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let (ys, toks) = (ys[0], toks[0]);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 8]; 2];
    let mut mins = [_mm256_setzero_ps(); 2];
    for (b, g) in g.iter().enumerate() {
        prefetch_ahead(g);
        let tk = &toks[b];
        let y = ys[b].qs().as_ptr();
        // SAFETY: this function's features.
        let d = unsafe { halves_d(g.d(), tk.d) };
        if P::MIN {
            for (hr, mins) in mins.iter_mut().enumerate() {
                // SAFETY: a row of `m`.
                let mx = unsafe { ld8_f16(g.m(), hr) };
                *mins = _mm256_fmadd_ps(mx, _mm256_set1_ps(tk.s), *mins);
            }
        }
        for l in 0..8 {
            // SAFETY: values 4l..4l + 4 of the token's 32.
            let a = unsafe { bcast4(y.add(4 * l)) };
            let m = _mm256_abs_epi8(a);
            for (hr, acc) in acc.iter_mut().enumerate() {
                // SAFETY: this function's features.
                let (w, x) = unsafe { lane(g, l, hr) };
                let mut s = _mm256_madd_epi16(pairs_one::<P>(w, x, a, m), ones);
                if biased::<P>() {
                    s = _mm256_add_epi32(s, _mm256_set1_epi32(tk.bias[l]));
                }
                acc[l] = _mm256_fmadd_ps(d[hr], _mm256_cvtepi32_ps(s), acc[l]);
            }
        }
    }
    for (hr, a) in acc.iter().enumerate() {
        // SAFETY: this function's features.
        let mut v = unsafe { hsum8(a) };
        if P::MIN {
            v = _mm256_add_ps(v, mins[hr]);
        }
        store_rows8(out, at, 0, hr, v);
    }
}

/// [`tokens32_rows8`] for one token, both halves in one sweep, as [`tokens32_one`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tokens32_rows8_one<P: Pack32, const T: usize>(
    g: &[P],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let (ys, toks) = (ys[0], toks[0]);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 2];
    for (b, g) in g.iter().enumerate() {
        prefetch_ahead(g);
        let tk = &toks[b];
        let y = ys[b].qs().as_ptr();
        let mut sum = [_mm256_setzero_si256(); 2];
        for l in 0..8 {
            // SAFETY: values 4l..4l + 4 of the token's 32.
            let a = unsafe { bcast4(y.add(4 * l)) };
            let m = _mm256_abs_epi8(a);
            for (hr, sum) in sum.iter_mut().enumerate() {
                // SAFETY: this function's features.
                let (w, x) = unsafe { lane(g, l, hr) };
                let p = pairs_one::<P>(w, x, a, m);
                *sum = if signed::<P>() {
                    _mm256_add_epi32(*sum, _mm256_madd_epi16(p, ones))
                } else {
                    _mm256_add_epi16(*sum, p)
                };
            }
        }
        for (hr, acc) in acc.iter_mut().enumerate() {
            // SAFETY: a row of `d`.
            let dx = unsafe { ld8_f16(g.d(), hr) };
            let total = if signed::<P>() {
                sum[hr]
            } else {
                let bias = _mm256_set1_epi32(tk.total);
                _mm256_add_epi32(_mm256_madd_epi16(sum[hr], ones), bias)
            };
            let d = _mm256_mul_ps(dx, _mm256_set1_ps(tk.d));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), d, *acc);
        }
    }
    for (hr, &a) in acc.iter().enumerate() {
        store_rows8(out, at, 0, hr, a);
    }
}

/// Tokens a pass of [`tokens32`] and of [`tokens32_rows8`]. Six for `tokens32`, at or near the
/// fastest of two to eight for each format, and faster than two in the files' prefill
/// (measurements: docs/perf-log.md, "AVX2 packed: tokens a pass").
const TOKENS32: usize = 6;
const TOKENS32_ROWS8: usize = 8;

/// Packed 32-value groups times every token, as [`q4_k`]: in `vec_dot` order, or in the order
/// of llama.cpp's repacked gemv (`REPACKED`, Q4_0 and IQ4_NL).
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx2::packed::kquants
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes32<P: Pack32, const REPACKED: bool>(
    p: &[P],
    per_row: usize,
    a: &[P::A],
    out: &mut [f32],
) {
    // The 4- and 5-bit formats: Q4_0's offset 8 keeps every i16 sum of `tokens32_rows8` in
    // range (the 5-bit ones are never repacked).
    debug_assert!(signed::<P>() || P::OFFSET <= 16);
    let stride = p.len() / per_row * ROWS;
    let n_tok = a.len() / per_row;
    // The AVX-512 kernels' token table (their unpacked lanes are not used here). The signed
    // formats take no offset (see [`pairs`]).
    TOKS32.with_borrow_mut(|(toks, _)| {
        toks.clear();
        toks.extend(a.iter().map(|y| {
            // SAFETY: 32 readable bytes; this function's features.
            let sums = unsafe {
                let q = _mm256_loadu_si256(y.qs().as_ptr().cast());
                let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
                _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
            };
            // SAFETY: this function's features.
            unsafe { Tok32::new(y, sums, if signed::<P>() { 0 } else { P::OFFSET }) }
        }));
        for (gi, g) in p.chunks_exact(per_row).enumerate() {
            macro_rules! pass {
                ($n:expr, $t0:expr) => {{
                    let ys = std::array::from_fn(|t| &a[($t0 + t) * per_row..][..per_row]);
                    let tks = std::array::from_fn(|t| &toks[($t0 + t) * per_row..][..per_row]);
                    let at = (stride, ROWS * gi, $t0);
                    let one = n_tok == 1;
                    match (REPACKED, one) {
                        (true, true) => tokens32_rows8_one::<P, 1>(g, [ys[0]], [tks[0]], out, at),
                        (false, true) => tokens32_one::<P, 1>(g, [ys[0]], [tks[0]], out, at),
                        (true, false) => tokens32_rows8::<P, { $n }>(g, ys, tks, out, at),
                        (false, false) => tokens32::<P, { $n }>(g, ys, tks, out, at),
                    }
                }};
            }
            if REPACKED {
                token_passes!(n_tok, pass, TOKENS32_ROWS8, [1 2 3 4 5 6 7]);
            } else {
                token_passes!(n_tok, pass, TOKENS32, [1 2 3 4 5]);
            }
        }
    });
}

packed_format!(Q5_0: Q5_0Packed, BlockQ8_0, GgmlType::Q5_0, GgmlType::Q8_0 => lanes32::<Q5_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_1: Q4_1Packed, BlockQ8_1, GgmlType::Q4_1, GgmlType::Q8_1 => lanes32::<Q4_1Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q5_1: Q5_1Packed, BlockQ8_1, GgmlType::Q5_1, GgmlType::Q8_1 => lanes32::<Q5_1Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q8_0: Q8_0Packed, BlockQ8_0, GgmlType::Q8_0, GgmlType::Q8_0 => lanes32::<Q8_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0_ROWS8: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, true>, LANES32_TILE_WEIGHTS);
packed_format!(IQ4_NL_ROWS8: IQ4NLPacked, BlockQ8_0, GgmlType::IQ4_NL, GgmlType::Q8_0 => lanes32::<IQ4NLPacked, true>, LANES32_TILE_WEIGHTS);
packed_format!(MXFP4_ROWS8: MXFP4Packed, BlockQ8_0, GgmlType::MXFP4, GgmlType::Q8_0 => lanes32::<MXFP4Packed, true>, LANES32_TILE_WEIGHTS);

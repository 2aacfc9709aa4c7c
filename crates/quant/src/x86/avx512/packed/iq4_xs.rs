//! The AVX-512 kernels of IQ4_XS.

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::blocks::*;
use crate::packed::layout::{packed_format, IQ4XSPacked, ROWS};
use crate::x86::avx512::packed::{bcast4, dpwssd, dpwssd_by, fuse_lanes, ld_f16, store_tokens};
use crate::x86::packed_common::{group_passes, ld};
use crate::x86::{prefetch_part, prefetch_part_as, Ahead};
use crate::GgmlType;

// ---------------------------------------------------------------------------------------------
// IQ4_XS in `vec_dot` order: the eight lanes of the K-quants, each value its level times its
// 32-value sub-block's scale less 32, fused by `d_x * d_y`. The levels are signed, and the
// integer sums are the same however they are formed. For batches the values are widened: each
// level times its scale as an i16 (|w| <= 32 * 127), against the token's values as i16 pairs
// with `vpdpwssd`, the widening shared by eight tokens. For a few tokens `vpmaddubsw` pairs
// each level's magnitude (at most 127) with the token's value negated where the level is
// negative (levels 0..8 of the table are the negative ones: bit 3 of the index clear), as
// ggml's AVX2 kernel does with `vpsignb`: Q8_K values lie in -127..=127, so the negation is
// exact and so is every pair's i16 sum (at most 2 * 127 * 127).

/// The level indices of values `32j + 4k..+4` of a group's sixteen rows, one byte a value: the
/// low nibbles of word `4j + k` (`k < 4`) or the high nibbles of word `4j + k - 4`.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[inline(always)]
unsafe fn iq4_xs_index(g: &IQ4XSPacked, j: usize, k: usize) -> __m512i {
    // SAFETY: the caller's features; a row of `qs`.
    unsafe {
        let raw = ld(&g.qs[4 * j + k % 4]);
        let idx = if k < 4 {
            raw
        } else {
            _mm512_srli_epi32::<4>(raw)
        };
        _mm512_and_si512(idx, _mm512_set1_epi8(0x0F))
    }
}

/// A group's sub-block scales less 32, `(scale, scale)` as i16 pairs one register a sub-block,
/// and its rows' `d`.
///
/// # Safety
/// The CPU must have AVX-512 F and BW, AVX2 and F16C.
#[inline(always)]
unsafe fn iq4_xs_scales(g: &IQ4XSPacked) -> ([__m512i; 8], __m512) {
    // SAFETY: the caller's features; rows of `scales_l`, `scales_h` and `d`.
    unsafe {
        let sl = ld(&g.scales_l);
        let sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256(g.scales_h.as_ptr().cast()));
        let (m0f, m03) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(0x03));
        let mut scale = [_mm512_setzero_si512(); 8];
        for (j, scale) in scale.iter_mut().enumerate() {
            let low = _mm512_and_si512(_mm512_srlv_epi32(sl, _mm512_set1_epi32(4 * j as i32)), m0f);
            let high =
                _mm512_and_si512(_mm512_srlv_epi32(sh, _mm512_set1_epi32(2 * j as i32)), m03);
            let ls = _mm512_sub_epi32(
                _mm512_or_si512(low, _mm512_slli_epi32::<4>(high)),
                _mm512_set1_epi32(32),
            );
            *scale = _mm512_or_si512(
                _mm512_and_si512(ls, _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32::<16>(ls),
            );
        }
        (scale, ld_f16(&g.d))
    }
}

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`; `y16[t][b]`: the token's block as
/// i16 pairs, word `2m` holding values `4m` and `4m + 2`, word `2m + 1` values `4m + 1` and
/// `4m + 3`), into `out[(t0 + t) * stride + r0..][..16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `k` and `t` index several arrays in step
fn iq4_xs_tokens<const T: usize>(
    g: &[IQ4XSPacked],
    ys: [&[BlockQ8K]; T],
    y16: [&[[u32; 128]]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the 16 levels' bytes; this function's features.
    let table = unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast())) };
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    for (b, g) in g.iter().enumerate() {
        // SAFETY: this function's features.
        let (scale, dx) = unsafe { iq4_xs_scales(g) };
        let d: [__m512; T] = std::array::from_fn(|t| _mm512_mul_ps(dx, _mm512_set1_ps(ys[t][b].d)));
        let y: [*const u32; T] = std::array::from_fn(|t| y16[t][b].as_ptr());
        for k in 0..8 {
            prefetch_part(g, k, 8);
            // Two chains a token up to eight tokens a pass (even and odd levels, added at the
            // end): one chain of sixteen dependent `vpdpwssd` (5 cycles each) for four tokens'
            // work left the multipliers waiting (measurements: docs/perf-log.md, "AVX-512 packed
            // K-quants and IQ4_XS"). Passes of sixteen tokens (one chain each) ran slower still
            // (see `iq4_xs`).
            let mut lane = [_mm512_setzero_si512(); T];
            let mut lane1 = [_mm512_setzero_si512(); T];
            for j in 0..8 {
                // SAFETY: this function's features.
                let kv = _mm512_shuffle_epi8(table, unsafe { iq4_xs_index(g, j, k) });
                // Levels 0, 2 and 1, 3 of each word as i16, times the scale.
                let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(kv));
                let odd = _mm512_srai_epi16::<8>(kv);
                let (we, wo) = (
                    _mm512_mullo_epi16(even, scale[j]),
                    _mm512_mullo_epi16(odd, scale[j]),
                );
                let m = 8 * j + k;
                for t in 0..T {
                    // SAFETY: words 2m, 2m + 1 of the token's block; this function's features.
                    unsafe {
                        lane[t] = dpwssd_by::<T, _>(lane[t], we, y[t].add(2 * m));
                        let odd = if T > 8 { &mut lane[t] } else { &mut lane1[t] };
                        *odd = dpwssd_by::<T, _>(*odd, wo, y[t].add(2 * m + 1));
                    }
                }
            }
            fuse_lanes(&mut acc, k, &d, &lane, &lane1);
        }
    }
    store_tokens(out, (stride, r0, t0), &acc);
}

/// [`iq4_xs_tokens`] for a few tokens (one, in decode): each level's magnitude with
/// `vpmaddubsw` against the token's values, negated where the level is negative, then
/// `vpdpwssd` by the scale. The same integers as widening the levels, with less work on each
/// weight register and more on each token: the kernel of passes of one to three tokens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `k` and `t` index several arrays in step
fn iq4_xs_few<const T: usize>(
    g: &[IQ4XSPacked],
    ys: [&[BlockQ8K]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // The levels' magnitudes. SAFETY: the 16 levels' bytes; this function's features.
    let table = unsafe {
        _mm512_abs_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(
            KVALUES_IQ4NL.as_ptr().cast(),
        )))
    };
    let bit3 = _mm512_set1_epi8(0x08);
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    for (b, g) in g.iter().enumerate() {
        // SAFETY: this function's features.
        let (scale, dx) = unsafe { iq4_xs_scales(g) };
        let d: [__m512; T] = std::array::from_fn(|t| _mm512_mul_ps(dx, _mm512_set1_ps(ys[t][b].d)));
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs.as_ptr());
        for k in 0..8 {
            prefetch_part_as(Ahead::Deep, g, k, 8);
            // Two chains a token (even and odd sub-blocks, added at the end): one chain of
            // eight dependent `vpdpwssd` (5 cycles each) would leave the multipliers waiting.
            let mut lane = [_mm512_setzero_si512(); T];
            let mut lane1 = [_mm512_setzero_si512(); T];
            for j in 0..8 {
                // SAFETY: this function's features.
                let idx = unsafe { iq4_xs_index(g, j, k) };
                let mag = _mm512_shuffle_epi8(table, idx);
                let negative = _mm512_testn_epi8_mask(idx, bit3);
                let m = 8 * j + k;
                for t in 0..T {
                    let chain = if j % 2 == 0 {
                        &mut lane[t]
                    } else {
                        &mut lane1[t]
                    };
                    // SAFETY: values 4m..4m + 4 of the token's 256; this function's features.
                    *chain = unsafe {
                        let a = bcast4(y[t].add(4 * m));
                        let a = _mm512_mask_sub_epi8(a, negative, zero, a);
                        dpwssd(*chain, _mm512_maddubs_epi16(mag, a), scale[j])
                    };
                }
            }
            fuse_lanes(&mut acc, k, &d, &lane, &lane1);
        }
    }
    store_tokens(out, (stride, r0, t0), &acc);
}

thread_local! {
    static Y16: RefCell<Vec<[u32; 128]>> = const { RefCell::new(Vec::new()) };
}

/// Packed IQ4_XS groups times every token, as [`q4_k`].
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx512::packed::kquants
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_xs(p: &[IQ4XSPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    if a.len() < 4 * per_row {
        group_passes!(p, per_row, a, out, iq4_xs_few, 4, [1 2 3], ());
        return;
    }
    Y16.with_borrow_mut(|y16| {
        y16.clear();
        y16.extend(a.iter().map(|y| {
            let mut v = [0u32; 128];
            for (m, w) in v.chunks_exact_mut(2).enumerate() {
                let q = |i: usize| y.qs[4 * m + i] as i16 as u16 as u32;
                w[0] = q(0) | q(2) << 16;
                w[1] = q(1) | q(3) << 16;
            }
            v
        }));
        // Passes of eight tokens, faster in the IQ4_XS file's prefill than passes of four, six or
        // sixteen (measurements: docs/perf-log.md, "AVX-512 packed K-quants and IQ4_XS"). Likely
        // why (not checked with counters): eight tokens' widened blocks, 4 KiB a token at 2048
        // columns, fit a Zen 5's 48 KiB first-level cache; sixteen do not.
        group_passes!(p, per_row, a, out, iq4_xs_tokens, 8, [1 2 3 4 5 6 7], (y16))
    });
}

// IQ4_XS widens every token's values to i16 once a call (`iq4_xs`): calls of 256 rows where a
// row has 2048 columns spread that over more rows. With 8192 columns the widened tokens alone
// are 1 MiB, and 256 rows a call ran slower there than 64: the same number of weights a call,
// not rows (measurements: docs/perf-log.md, "Batch calls' sizes").
packed_format!(
    IQ4_XS: IQ4XSPacked, BlockQ8K, GgmlType::IQ4_XS, GgmlType::Q8_K => iq4_xs, 256 * 2048
);

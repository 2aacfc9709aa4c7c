//! The AVX2 kernels of IQ4_XS.

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::blocks::*;
use crate::packed::layout::{packed_format, IQ4XSPacked, ROWS};
use crate::x86::avx2::packed::{bcast4, fuse_halves, ld8_f16, store_halves, store_tokens8};
use crate::x86::packed_common::{group_passes, ld8, pass_entries, token_passes, unpacked_passes};
use crate::x86::{prefetch_part_as, Ahead};
use crate::GgmlType;

// ---------------------------------------------------------------------------------------------
// IQ4_XS in `vec_dot` order, as ggml's AVX2 kernel takes it: the eight lanes of the K-quants,
// each value's level magnitude against the token's value with the level's sign (`vpsignb`
// both), paired by `vpmaddubsw` (each pair sum at most 2 * 127 * 127: Q8_K values lie in
// -127..=127), then `vpmaddwd` by the sub-block's scale less 32; fused by `d_x * d_y`.

/// Rows `8hr..8hr + 8` of an IQ4_XS block's levels of values `32j + 4k..+4` (level indices in
/// the low nibbles of word `4j + k` for `k < 4`, the high nibbles of word `4j + k - 4`
/// otherwise): the levels and their magnitudes, one byte a value.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn iq4_xs_levels(g: &IQ4XSPacked, hr: usize, j: usize, k: usize) -> [__m256i; 2] {
    // SAFETY: the caller's features; the 16 levels' bytes; a row of `qs`.
    unsafe {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        let raw = ld8(&g.qs[4 * j + k % 4], hr);
        let idx = if k < 4 {
            raw
        } else {
            _mm256_srli_epi32::<4>(raw)
        };
        let level = _mm256_shuffle_epi8(table, _mm256_and_si256(idx, _mm256_set1_epi8(0x0F)));
        [level, _mm256_sign_epi8(level, level)]
    }
}

/// Every block of a group's [`iq4_xs_levels`] into `vb` (entry `hr * blocks + b`, registers
/// `2(8k + j)` and `2(8k + j) + 1`), once for all of a batch's token passes, which otherwise
/// each looked them up again.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs_unpack(g: &[IQ4XSPacked], vb: &mut Vec<[__m256i; 128]>) {
    vb.clear();
    for hr in 0..2 {
        for g in g {
            let mut v = [_mm256_setzero_si256(); 128];
            for k in 0..8 {
                for j in 0..8 {
                    // SAFETY: this function's features.
                    let levels = unsafe { iq4_xs_levels(g, hr, j, k) };
                    v[2 * (8 * k + j)..][..2].copy_from_slice(&levels);
                }
            }
            vb.push(v);
        }
    }
}

/// Rows `8hr..8hr + 8` of an IQ4_XS block's sub-block scales less 32, `(scale, scale)` as
/// i16 pairs, one register a sub-block, and the rows' `d`.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn iq4_xs_scales8(g: &IQ4XSPacked, hr: usize) -> ([__m256i; 8], __m256) {
    // SAFETY: the caller's features; rows of `scales_l`, `scales_h` and `d`.
    unsafe {
        let (m0f, m03) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(0x03));
        let (sl, sh, dx) = (
            ld8(&g.scales_l, hr),
            _mm256_cvtepu16_epi32(_mm_loadu_si128(g.scales_h.as_ptr().add(8 * hr).cast())),
            ld8_f16(&g.d, hr),
        );
        let mut scale = [_mm256_setzero_si256(); 8];
        for (j, scale) in scale.iter_mut().enumerate() {
            let low = _mm256_and_si256(_mm256_srlv_epi32(sl, _mm256_set1_epi32(4 * j as i32)), m0f);
            let high =
                _mm256_and_si256(_mm256_srlv_epi32(sh, _mm256_set1_epi32(2 * j as i32)), m03);
            let ls = _mm256_sub_epi32(
                _mm256_or_si256(low, _mm256_slli_epi32::<4>(high)),
                _mm256_set1_epi32(32),
            );
            *scale = _mm256_or_si256(
                _mm256_and_si256(ls, _mm256_set1_epi32(0xFFFF)),
                _mm256_slli_epi32::<16>(ls),
            );
        }
        (scale, dx)
    }
}

/// Sixteen rows (`g`, and with `UNPACKED` their levels already looked up in `vb` by
/// [`iq4_xs_unpack`]) times tokens `t0..t0 + T` (`ys[t]`), into `out[(t0 + t) * stride +
/// r0..][..16]`, eight rows at a time. The same operations on the same integers either way.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `k` and `t` index several arrays in step
unsafe fn iq4_xs_pass<const T: usize, const UNPACKED: bool>(
    (g, vb): (&[IQ4XSPacked], &[[__m256i; 128]]),
    ys: [&[BlockQ8K]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX2, FMA, F16C); rows of the group's arrays, four values
    // of a token's 256 (the whole body).
    unsafe {
        let blocks = g.len();
        for hr in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 8]; T];
            for (b, g) in g.iter().enumerate() {
                let (scale, dx) = iq4_xs_scales8(g, hr);
                let mut d = [_mm256_setzero_ps(); T];
                let mut y = [std::ptr::null::<i8>(); T];
                for t in 0..T {
                    d[t] = _mm256_mul_ps(dx, _mm256_set1_ps(ys[t][b].d));
                    y[t] = ys[t][b].qs.as_ptr();
                }
                for k in 0..8 {
                    if hr == 0 && !UNPACKED {
                        prefetch_part_as(Ahead::Deep, g, k, 8);
                    }
                    let mut lane = [_mm256_setzero_si256(); T];
                    for j in 0..8 {
                        let [level, magnitude] = if UNPACKED {
                            let at = &vb[hr * blocks + b][2 * (8 * k + j)..];
                            [at[0], at[1]]
                        } else {
                            iq4_xs_levels(g, hr, j, k)
                        };
                        for t in 0..T {
                            let a = bcast4(y[t].add(32 * j + 4 * k));
                            let p = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, level));
                            lane[t] = _mm256_add_epi32(lane[t], _mm256_madd_epi16(p, scale[j]));
                        }
                    }
                    for t in 0..T {
                        acc[t][k] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(lane[t]), acc[t][k]);
                    }
                }
            }
            store_tokens8(out, (stride, r0, t0), hr, &acc);
        }
    }
}

/// [`iq4_xs_tokens`] for one token (decode), both halves of the sixteen rows in one sweep
/// over the group, as [`q4_k_one`], and lanes `k` and `k + 4` together (the two nibbles of
/// one word). The token's value goes in as its magnitude, shared by the sixteen rows, against
/// the level with the token's sign, where the batch pass takes the level's magnitude against
/// the token with the level's sign: the same products, one `vpsignb` fewer a word. The same
/// integers, row by row, as the pass of one token. The one sweep, the nibble pairs and the
/// token's magnitude each read more of the memory (measurements: docs/perf-log.md, "AVX2
/// one-token passes: one sweep over both halves").
///
/// [`q4_k_one`]: crate::x86::avx2::packed::kquants
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `hr` indexes several arrays in step
fn iq4_xs_one<const T: usize>(
    g: &[IQ4XSPacked],
    ys: [&[BlockQ8K]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let ys = ys[0];
    // SAFETY: this function's features (AVX2, FMA, F16C); rows of the group's arrays, four
    // values of the token's 256 (the whole body).
    unsafe {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        let m0f = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); 8]; 2];
        for (b, g) in g.iter().enumerate() {
            let y = ys[b].qs.as_ptr();
            let mut scale = [[_mm256_setzero_si256(); 8]; 2];
            let mut d = [_mm256_setzero_ps(); 2];
            for hr in 0..2 {
                let dx;
                (scale[hr], dx) = iq4_xs_scales8(g, hr);
                d[hr] = _mm256_mul_ps(dx, _mm256_set1_ps(ys[b].d));
            }
            // Lanes k and k + 4 together: the low and high nibbles of the same words.
            for k in 0..4 {
                prefetch_part_as(Ahead::Deep, g, 2 * k, 8);
                prefetch_part_as(Ahead::Deep, g, 2 * k + 1, 8);
                let mut lane = [[_mm256_setzero_si256(); 2]; 2];
                for j in 0..8 {
                    let a = [
                        bcast4(y.add(32 * j + 4 * k)),
                        bcast4(y.add(32 * j + 4 * k + 16)),
                    ];
                    // The token's magnitudes once for both halves, each level with the token's
                    // sign: the same products as `|level| * (a with the level's sign)`.
                    let magnitude = [_mm256_abs_epi8(a[0]), _mm256_abs_epi8(a[1])];
                    for hr in 0..2 {
                        let raw = ld8(&g.qs[4 * j + k], hr);
                        let idx = [
                            _mm256_and_si256(raw, m0f),
                            _mm256_and_si256(_mm256_srli_epi32::<4>(raw), m0f),
                        ];
                        for e in 0..2 {
                            let level = _mm256_shuffle_epi8(table, idx[e]);
                            let p =
                                _mm256_maddubs_epi16(magnitude[e], _mm256_sign_epi8(level, a[e]));
                            lane[e][hr] =
                                _mm256_add_epi32(lane[e][hr], _mm256_madd_epi16(p, scale[hr][j]));
                        }
                    }
                }
                for (e, lane) in lane.into_iter().enumerate() {
                    fuse_halves(&mut acc, k + 4 * e, &d, lane);
                }
            }
        }
        store_halves(out, at, &acc);
    }
}

pass_entries!(
    "avx2,fma,f16c",
    iq4_xs_pass: iq4_xs_tokens, iq4_xs_tokens_unpacked, IQ4XSPacked, [__m256i; 128],
    (ys: [&[BlockQ8K]; T])
);

thread_local! {
    /// Each thread's group of IQ4_XS levels ([`iq4_xs_unpack`]), reused from call to call.
    static IQ4XS_LEVELS: RefCell<Vec<[__m256i; 128]>> = const { RefCell::new(Vec::new()) };
}

/// Packed IQ4_XS groups times every token, as [`q4_k`], eight tokens a pass (faster than four,
/// about as fast as twelve, and faster than the AVX2 tiles this replaces; measurements:
/// docs/perf-log.md, "AVX2 packed: tokens a pass"). More than a pass of tokens, and each
/// group's levels are looked up once for all its passes.
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx2::packed::kquants
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs(p: &[IQ4XSPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    if a.len() == per_row {
        group_passes!(p, per_row, a, out, iq4_xs_one, 1, [], ());
        return;
    }
    if a.len() <= 8 * per_row {
        group_passes!(p, per_row, a, out, iq4_xs_tokens, 8, [1 2 3 4 5 6 7], ());
        return;
    }
    IQ4XS_LEVELS.with_borrow_mut(|vb| {
        unpacked_passes!(
            p, per_row, a, out,
            iq4_xs_unpack, vb, iq4_xs_tokens_unpacked,
            8, [1 2 3 4 5 6 7], ()
        )
    });
}

packed_format!(IQ4_XS: IQ4XSPacked, BlockQ8K, GgmlType::IQ4_XS, GgmlType::Q8_K => iq4_xs);

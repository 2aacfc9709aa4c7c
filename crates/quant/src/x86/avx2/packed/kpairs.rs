//! The AVX2 kernels of Q6_K and Q3_K, on their paired layouts ([`Q6KPairs`], [`Q3KPairs`]).

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::blocks::*;
use crate::packed::layout::{packed_format, Q3KPairs, Q6KPairs, ROWS};
use crate::x86::avx2::packed::{
    bcast4, fuse_halves, halves_d, ld8_f16, mullo_epi8, store_halves, store_tokens8, word_shuffle,
    UNPACKED_VALUES,
};
use crate::x86::packed_common::{
    group_passes, ld8, pass_entries, q3_k_acts, q6_k_acts, token_passes, unpacked_passes, Q3KAct,
    Q3KActs, Q6KAct, Q3K_ACTS, Q6K_ACTS,
};
use crate::x86::{prefetch_part_as, Ahead, Vnni256};
use crate::GgmlType;

// ---------------------------------------------------------------------------------------------
// Q6_K in `vec_dot` order: eight i32 lanes a block (lane `k` takes values whose index mod 32 is
// in `4k..4k + 4`, each 4-value sum times its group's scale, and the `-32` offset through the
// token's group sums), each fused into its own float by `d_y * d_x`, the eight added at the
// end as `avx2::hsum` adds ggml's lanes: [`crate::x86::avx512::packed`]'s Q6_K, eight rows a
// register.

/// Rows `8hr..8hr + 8` of triple `τ` of a group unpacked to one byte a value (q unsigned,
/// 0..64), as [`crate::x86::avx512::packed`]'s `q6_k_triple`: the low six bits of its three words,
/// and the fourth word's values from their top two bits.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q6_k_triple(g: &Q6KPairs, hr: usize, tau: usize) -> [__m256i; 4] {
    // SAFETY: the caller's features; rows of `q`.
    unsafe {
        let (a, b, c) = (
            ld8(&g.q[3 * tau], hr),
            ld8(&g.q[3 * tau + 1], hr),
            ld8(&g.q[3 * tau + 2], hr),
        );
        let m3f = _mm256_set1_epi8(0x3F);
        let tops = _mm256_or_si256(
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<6>(a), _mm256_set1_epi8(0x03)),
                _mm256_and_si256(_mm256_srli_epi32::<4>(b), _mm256_set1_epi8(0x0C)),
            ),
            _mm256_and_si256(_mm256_srli_epi32::<2>(c), _mm256_set1_epi8(0x30)),
        );
        [
            _mm256_and_si256(a, m3f),
            _mm256_and_si256(b, m3f),
            _mm256_and_si256(c, m3f),
            tops,
        ]
    }
}

/// Every block of a group unpacked by [`q6_k_triple`] into `vb` (entry `hr * blocks + b`,
/// register `4τ + w`), once for all of a batch's token passes, which otherwise each unpacked
/// it again.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_unpack(g: &[Q6KPairs], vb: &mut Vec<[__m256i; 64]>) {
    vb.clear();
    for hr in 0..2 {
        for g in g {
            let mut v = [_mm256_setzero_si256(); 64];
            for tau in 0..16 {
                // SAFETY: this function's features.
                let values = unsafe { q6_k_triple(g, hr, tau) };
                v[4 * tau..][..4].copy_from_slice(&values);
            }
            vb.push(v);
        }
    }
}

/// Rows `8hr..8hr + 8` of a Q6_K block's scales for the paired products: `(scale[4p + q],
/// scale[4p + q + 2])` as i16 pairs, entry `2p + q`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q6_k_scales8(g: &Q6KPairs, hr: usize) -> [__m256i; 8] {
    // SAFETY: the caller's features; rows of `sc`.
    unsafe {
        let z = 0x80;
        // Scale bytes `q` and `q + 2` of a word into the high bytes of the two i16 halves.
        let pair_bytes = [word_shuffle([z, 0, z, 2]), word_shuffle([z, 1, z, 3])];
        let mut scale = [_mm256_setzero_si256(); 8];
        for p in 0..4 {
            let sc = ld8(&g.sc[p], hr);
            for q in 0..2 {
                scale[2 * p + q] = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sc, pair_bytes[q]));
            }
        }
        scale
    }
}

/// Sixteen rows (`g`, and with `UNPACKED` their values already unpacked in `vb` by
/// [`q6_k_unpack`]) times tokens `t0..t0 + T` (`ys[t]`, reordered by `q6_k_acts`), into
/// `out[(t0 + t) * stride + r0..][..16]`, eight rows at a time: [`crate::x86::avx512::packed`]'s
/// paired products (two `vpmaddubsw` added as words, one `vpmaddwd` by two groups' scales),
/// the same integers in each of `vec_dot`'s lanes.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
unsafe fn q6_k_pass<const T: usize, const UNPACKED: bool>(
    (g, vb): (&[Q6KPairs], &[[__m256i; 64]]),
    ys: [&[Q6KAct]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX2, FMA, F16C); rows of the group's arrays, four bytes
    // of a token's 256 values and two of its sixteen sums (the whole body).
    unsafe {
        let z = 0x80;
        // Scale bytes 0, 1 and 2, 3 of a word into the high bytes of the two i16 halves.
        let offset_bytes = [word_shuffle([z, 0, z, 1]), word_shuffle([z, 2, z, 3])];
        let blocks = g.len();
        for hr in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 8]; T];
            for (b, g) in g.iter().enumerate() {
                let sc = [
                    ld8(&g.sc[0], hr),
                    ld8(&g.sc[1], hr),
                    ld8(&g.sc[2], hr),
                    ld8(&g.sc[3], hr),
                ];
                let dx = ld8_f16(&g.d, hr);
                let scale = q6_k_scales8(g, hr);
                let mut d = [_mm256_setzero_ps(); T];
                let mut y = [std::ptr::null::<i8>(); T];
                for t in 0..T {
                    d[t] = _mm256_mul_ps(_mm256_set1_ps(ys[t][b].d), dx);
                    y[t] = ys[t][b].qs.as_ptr();
                }
                for l in 0..8 {
                    if hr == 0 && !UNPACKED {
                        prefetch_part_as(Ahead::Deep, g, l, 8);
                    }
                    // The offset: 16 (scale[2l], scale[2l + 1]) against -2 (bsum[2l],
                    // bsum[2l + 1]).
                    let offset =
                        _mm256_srai_epi16::<4>(_mm256_shuffle_epi8(sc[l / 2], offset_bytes[l % 2]));
                    let mut lane = [_mm256_setzero_si256(); T];
                    for t in 0..T {
                        let nb = bcast4(ys[t][b].nb.as_ptr().add(2 * l));
                        lane[t] = _mm256_madd_epi16(offset, nb);
                    }
                    for h in 0..2 {
                        let v = if UNPACKED {
                            let at = &vb[hr * blocks + b][4 * (2 * l + h)..];
                            [at[0], at[1], at[2], at[3]]
                        } else {
                            q6_k_triple(g, hr, 2 * l + h)
                        };
                        for pp in 0..2 {
                            let p = 2 * h + pp;
                            let s = scale[2 * p + l / 4];
                            for t in 0..T {
                                let at = y[t].add(64 * p + 8 * l);
                                let both = _mm256_add_epi16(
                                    _mm256_maddubs_epi16(v[2 * pp], bcast4(at)),
                                    _mm256_maddubs_epi16(v[2 * pp + 1], bcast4(at.add(4))),
                                );
                                lane[t] = _mm256_add_epi32(lane[t], _mm256_madd_epi16(both, s));
                            }
                        }
                    }
                    for t in 0..T {
                        acc[t][l] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(lane[t]), acc[t][l]);
                    }
                }
            }
            store_tokens8(out, (stride, r0, t0), hr, &acc);
        }
    }
}

pass_entries!(
    "avx2,fma,f16c",
    q6_k_pass: q6_k_tokens, q6_k_tokens_unpacked, Q6KPairs, [__m256i; 64],
    (ys: [&[Q6KAct]; T])
);

/// [`q6_k_tokens`] for one token (decode), both halves of the sixteen rows in one sweep over
/// the group, as [`q4_k_one`]: each pair of the token's values broadcast once for the sixteen
/// rows. The same operations on the same integers, row by row, as the pass of one token; the
/// two halves' sixteen float lanes live in memory between sub-blocks (sixteen registers). One
/// sweep runs faster, hot and from memory, than two halves (measurements: docs/perf-log.md,
/// "AVX2 one-token passes: one sweep over both halves").
///
/// [`q4_k_one`]: crate::x86::avx2::packed::kquants
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `hr` indexes several arrays in step
fn q6_k_one<const T: usize>(
    g: &[Q6KPairs],
    ys: [&[Q6KAct]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let ys = ys[0];
    // SAFETY: this function's features (AVX2, FMA, F16C); rows of the group's arrays, four
    // bytes of the token's 256 values and two of its sixteen sums (the whole body).
    unsafe {
        let z = 0x80;
        let offset_bytes = [word_shuffle([z, 0, z, 1]), word_shuffle([z, 2, z, 3])];
        let mut acc = [[_mm256_setzero_ps(); 8]; 2];
        for (b, g) in g.iter().enumerate() {
            let y = ys[b].qs.as_ptr();
            let scale = [q6_k_scales8(g, 0), q6_k_scales8(g, 1)];
            let d = halves_d(&g.d, ys[b].d);
            for l in 0..8 {
                prefetch_part_as(Ahead::Deep, g, l, 8);
                let nb = bcast4(ys[b].nb.as_ptr().add(2 * l));
                let mut lane = [_mm256_setzero_si256(); 2];
                for hr in 0..2 {
                    let sc = ld8(&g.sc[l / 2], hr);
                    let offset =
                        _mm256_srai_epi16::<4>(_mm256_shuffle_epi8(sc, offset_bytes[l % 2]));
                    lane[hr] = _mm256_madd_epi16(offset, nb);
                }
                for h in 0..2 {
                    let v = [q6_k_triple(g, 0, 2 * l + h), q6_k_triple(g, 1, 2 * l + h)];
                    for pp in 0..2 {
                        let p = 2 * h + pp;
                        let at = y.add(64 * p + 8 * l);
                        let (a0, a1) = (bcast4(at), bcast4(at.add(4)));
                        for hr in 0..2 {
                            let both = _mm256_add_epi16(
                                _mm256_maddubs_epi16(v[hr][2 * pp], a0),
                                _mm256_maddubs_epi16(v[hr][2 * pp + 1], a1),
                            );
                            let s = scale[hr][2 * p + l / 4];
                            lane[hr] = _mm256_add_epi32(lane[hr], _mm256_madd_epi16(both, s));
                        }
                    }
                }
                fuse_halves(&mut acc, l, &d, lane);
            }
        }
        store_halves(out, at, &acc);
    }
}

/// Packed Q6_K groups times every token, as [`q4_k`], the tokens' blocks first reordered for
/// the paired products (`q6_k_acts`), eight tokens a pass, the fastest of two to twelve
/// (measurements, the paired products' too: docs/perf-log.md, "AVX2 packed: tokens a pass").
/// More than a pass of tokens, and each group is unpacked once for all its passes.
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx2::packed::kquants
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(p: &[Q6KPairs], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let n_tok = a.len() / per_row;
    Q6K_ACTS.with_borrow_mut(|ya| {
        // SAFETY: this function's features.
        unsafe { q6_k_acts(a, ya) };
        let a = &ya[..];
        if n_tok == 1 {
            group_passes!(p, per_row, a, out, q6_k_one, 1, [], ());
            return;
        }
        if n_tok <= 8 {
            group_passes!(p, per_row, a, out, q6_k_tokens, 8, [1 2 3 4 5 6 7], ());
            return;
        }
        UNPACKED_VALUES.with_borrow_mut(|vb| {
            unpacked_passes!(
                p, per_row, a, out,
                q6_k_unpack, vb, q6_k_tokens_unpacked,
                8, [1 2 3 4 5 6 7], ()
            )
        });
    });
}

packed_format!(Q6_K: Q6KPairs, BlockQ8K, GgmlType::Q6_K, GgmlType::Q8_K => q6_k);

// ---------------------------------------------------------------------------------------------
// Q3_K in `vec_dot` order: [`crate::x86::avx512::packed`]'s Q3_K, in its paired layout
// ([`Q3KPairs`]), eight rows a register: for each lane and pair of groups two `vpmaddubsw` of
// `u = q + 4` added as words, plus the token's `-4 * Σ y` of both groups' four values, then
// one `vpmaddwd` by the two scales (less 32) into the lane's i32: the integers of ggml's AVX2
// kernel, which subtracts the products with the missing high bits' 4 instead.

/// Rows `8hr..8hr + 8` of lane `l` of a group: the three words its eight words of values are
/// unpacked from ([`q3_k_pair`]).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q3_k_words(g: &Q3KPairs, hr: usize, l: usize) -> [__m256i; 3] {
    // SAFETY: the caller's features; rows of `q`.
    unsafe {
        [
            ld8(&g.q[3 * l], hr),
            ld8(&g.q[3 * l + 1], hr),
            ld8(&g.q[3 * l + 2], hr),
        ]
    }
}

/// Words `2p` and `2p + 1` of a lane's octet unpacked to one byte a value (`u`, 0..8) from its
/// three words `[a, b, c]` ([`q3_k_words`]), as [`crate::x86::avx512::packed`]'s `q3_k_octet`: pairs
/// 0, 1 and 2 from the low six bits of `a`, `b` and `c`; pair 3 from their top bits.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q3_k_pair([a, b, c]: [__m256i; 3], p: usize) -> [__m256i; 2] {
    // SAFETY: the caller's features.
    unsafe {
        let m07 = _mm256_set1_epi8(0x07);
        let low = |w: __m256i| {
            [
                _mm256_and_si256(w, m07),
                _mm256_and_si256(_mm256_srli_epi32::<3>(w), m07),
            ]
        };
        match p {
            0 => low(a),
            1 => low(b),
            2 => low(c),
            // u6: bits 0-1 from a's top pair, bit 2 from b's bit 6; u7: bit 0 from b's bit 7,
            // bits 1-2 from c's top pair.
            _ => [
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32::<6>(a), _mm256_set1_epi8(0x03)),
                    _mm256_and_si256(_mm256_srli_epi32::<4>(b), _mm256_set1_epi8(0x04)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32::<7>(b), _mm256_set1_epi8(0x01)),
                    _mm256_and_si256(_mm256_srli_epi32::<5>(c), _mm256_set1_epi8(0x06)),
                ),
            ],
        }
    }
}

/// Rows `8hr..8hr + 8` of lane `l` of a group unpacked to one byte a value (`u`, 0..8): entry
/// `2p + e` the word `e` of pair `p` ([`q3_k_pair`]).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q3_k_octet(g: &Q3KPairs, hr: usize, l: usize) -> [__m256i; 8] {
    // SAFETY: the caller's features; rows of `q`.
    unsafe {
        let w = q3_k_words(g, hr, l);
        let mut u = [_mm256_setzero_si256(); 8];
        for p in 0..4 {
            u[2 * p..][..2].copy_from_slice(&q3_k_pair(w, p));
        }
        u
    }
}

/// Byte `i` of `by[q]` for rows `8hr..8hr + 8`: the scale of group `4q + i`, less 32 (low four
/// bits from bytes 0..8, high two from bytes 8..12), from a group's scale words `sc`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q3_k_scale_bytes(
    sc: &[[u32; ROWS]; 3],
    hr: usize,
    (m03, m0f, m20): (__m256i, __m256i, __m256i),
) -> [__m256i; 4] {
    // SAFETY: the caller's features; rows of `sc`.
    unsafe {
        let (s0, s1, s2) = (ld8(&sc[0], hr), ld8(&sc[1], hr), ld8(&sc[2], hr));
        let low = [
            _mm256_and_si256(s0, m0f),
            _mm256_and_si256(s1, m0f),
            _mm256_and_si256(_mm256_srli_epi32::<4>(s0), m0f),
            _mm256_and_si256(_mm256_srli_epi32::<4>(s1), m0f),
        ];
        let high = [
            s2,
            _mm256_srli_epi32::<2>(s2),
            _mm256_srli_epi32::<4>(s2),
            _mm256_srli_epi32::<6>(s2),
        ];
        let mut by = [_mm256_setzero_si256(); 4];
        for q in 0..4 {
            let hi = _mm256_slli_epi32::<4>(_mm256_and_si256(high[q], m03));
            by[q] = _mm256_sub_epi8(_mm256_or_si256(low[q], hi), m20);
        }
        by
    }
}

/// Rows `8hr..8hr + 8` of a block's sixteen scales (less 32) as i16 pairs for `vpmaddwd`:
/// entry `2p + q` holds `(scale[4p + q], scale[4p + q + 2])`, the two groups of lane words
/// `2p` and `2p + 1` for lanes `4q..4q + 4`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q3_k_scales8(g: &Q3KPairs, hr: usize) -> [__m256i; 8] {
    // SAFETY: the caller's features; rows of `sc`.
    unsafe {
        let z = 0x80;
        // Scale bytes `q` and `q + 2` of a word into the high bytes of the two i16 halves.
        let pair_bytes = [word_shuffle([z, 0, z, 2]), word_shuffle([z, 1, z, 3])];
        let masks = (
            _mm256_set1_epi8(0x03),
            _mm256_set1_epi8(0x0F),
            _mm256_set1_epi8(0x20),
        );
        let by = q3_k_scale_bytes(&g.sc, hr, masks);
        let mut scale = [_mm256_setzero_si256(); 8];
        for p in 0..4 {
            for q in 0..2 {
                scale[2 * p + q] =
                    _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(by[p], pair_bytes[q]));
            }
        }
        scale
    }
}

/// Every block of a group unpacked by [`q3_k_octet`] into `vb` (entry `hr * blocks + b`,
/// register `8l + w`), once for all of a batch's token passes, which otherwise each unpacked
/// it again.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q3_k_unpack(g: &[Q3KPairs], vb: &mut Vec<[__m256i; 64]>) {
    vb.clear();
    for hr in 0..2 {
        for g in g {
            let mut v = [_mm256_setzero_si256(); 64];
            for l in 0..8 {
                // SAFETY: this function's features.
                let u = unsafe { q3_k_octet(g, hr, l) };
                v[8 * l..][..8].copy_from_slice(&u);
            }
            vb.push(v);
        }
    }
}

/// Sixteen rows (`g`, and with `UNPACKED` their values already unpacked in `vb` by
/// [`q3_k_unpack`]) times tokens `t0..t0 + T` (`ys[t]`, made by `q3_k_acts`), into
/// `out[(t0 + t) * stride + r0..][..16]`, eight rows at a time. The same operations on the
/// same integers either way.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
unsafe fn q3_k_pass<const T: usize, const UNPACKED: bool>(
    (g, vb): (&[Q3KPairs], &[[__m256i; 64]]),
    ys: [&[Q3KAct]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX2, FMA, F16C); rows of the group's arrays, four bytes
    // of a token's 256 values and one of its 32 offsets (the whole body).
    unsafe {
        let blocks = g.len();
        for hr in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 8]; T];
            for (b, g) in g.iter().enumerate() {
                let dx = ld8_f16(&g.d, hr);
                let scale = q3_k_scales8(g, hr);
                let mut d = [_mm256_setzero_ps(); T];
                let mut y = [std::ptr::null::<i8>(); T];
                let mut off = [std::ptr::null::<u32>(); T];
                for t in 0..T {
                    d[t] = _mm256_mul_ps(_mm256_set1_ps(ys[t][b].d), dx);
                    y[t] = ys[t][b].qs.as_ptr();
                    off[t] = ys[t][b].off.as_ptr();
                }
                for l in 0..8 {
                    let u = if UNPACKED {
                        let mut u = [_mm256_setzero_si256(); 8];
                        u.copy_from_slice(&vb[hr * blocks + b][8 * l..][..8]);
                        u
                    } else {
                        if hr == 0 {
                            prefetch_part_as(Ahead::Deep, g, l, 8);
                        }
                        q3_k_octet(g, hr, l)
                    };
                    let mut lane = [_mm256_setzero_si256(); T];
                    for p in 0..4 {
                        let s = scale[2 * p + l / 4];
                        for t in 0..T {
                            let at = y[t].add(64 * p + 8 * l);
                            let both = _mm256_add_epi16(
                                _mm256_add_epi16(
                                    _mm256_maddubs_epi16(u[2 * p], bcast4(at)),
                                    _mm256_maddubs_epi16(u[2 * p + 1], bcast4(at.add(4))),
                                ),
                                bcast4(off[t].add(8 * p + l)),
                            );
                            lane[t] = _mm256_add_epi32(lane[t], _mm256_madd_epi16(both, s));
                        }
                    }
                    for t in 0..T {
                        acc[t][l] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(lane[t]), acc[t][l]);
                    }
                }
            }
            store_tokens8(out, (stride, r0, t0), hr, &acc);
        }
    }
}

pass_entries!(
    "avx2,fma,f16c",
    q3_k_pass: q3_k_tokens, q3_k_tokens_unpacked, Q3KPairs, [__m256i; 64],
    (ys: [&[Q3KAct]; T])
);

/// [`q3_k_tokens`] for one token (decode), both halves of the sixteen rows in one sweep over
/// the group, as [`q4_k_one`]: each of the token's values and offsets broadcast once for the
/// sixteen rows, each lane's words unpacked pair by pair from its three words a half (a whole
/// octet a half would not fit the sixteen registers). The same operations on the same integers,
/// row by row, as the pass of one token. One sweep runs faster than two halves, yet it is still
/// bound by its vector instructions, about eleven for each eight-row word of values
/// (measurements: docs/perf-log.md, "AVX2 one-token passes: one sweep over both halves").
///
/// [`q4_k_one`]: crate::x86::avx2::packed::kquants
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `hr` indexes several arrays in step
fn q3_k_one<const T: usize>(
    g: &[Q3KPairs],
    ys: [&[Q3KAct]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let ys = ys[0];
    // SAFETY: this function's features (AVX2, FMA, F16C); rows of the group's arrays, four
    // bytes of the token's 256 values and one of its 32 offsets (the whole body).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 8]; 2];
        for (b, g) in g.iter().enumerate() {
            let (y, off) = (ys[b].qs.as_ptr(), ys[b].off.as_ptr());
            let scale = [q3_k_scales8(g, 0), q3_k_scales8(g, 1)];
            let d = halves_d(&g.d, ys[b].d);
            for l in 0..8 {
                prefetch_part_as(Ahead::Deep, g, l, 8);
                let w = [q3_k_words(g, 0, l), q3_k_words(g, 1, l)];
                let mut lane = [_mm256_setzero_si256(); 2];
                for p in 0..4 {
                    let at = y.add(64 * p + 8 * l);
                    let (a0, a1) = (bcast4(at), bcast4(at.add(4)));
                    let o = bcast4(off.add(8 * p + l));
                    for hr in 0..2 {
                        let u = q3_k_pair(w[hr], p);
                        let both = _mm256_add_epi16(
                            _mm256_add_epi16(
                                _mm256_maddubs_epi16(u[0], a0),
                                _mm256_maddubs_epi16(u[1], a1),
                            ),
                            o,
                        );
                        let s = scale[hr][2 * p + l / 4];
                        lane[hr] = _mm256_add_epi32(lane[hr], _mm256_madd_epi16(both, s));
                    }
                }
                fuse_halves(&mut acc, l, &d, lane);
            }
        }
        store_halves(out, at, &acc);
    }
}

/// A Q3_K block's rows `8hr..8hr + 8` folded for AVX-VNNI batches ([`q3_k_fold`]): entry
/// `8l + w` holds lane `l`'s word `w` with each value's group scale folded in, `-q * scale` as
/// a signed byte (-128..=124), and entry `64 + l` each row's `128 * Σ` of lane `l`'s 32 folded
/// bytes, eight rows a register: the form [`crate::x86::avx512::packed`]'s Q3_K batches had before
/// they took the token as the signed side, which lets EVEX fold its broadcast (VEX has no
/// broadcast operand to fold, so the form stays here).
type Q3KFolded = [__m256i; 72];

thread_local! {
    /// Each thread's group of Q3_K blocks folded by [`q3_k_fold`].
    static Q3K_FOLDED: RefCell<Vec<Q3KFolded>> = const { RefCell::new(Vec::new()) };
}

/// `$name`: [`q3_k`]'s batches with the AVX-VNNI tier's `vpdpbusd` (`$dpbusd`, compiled for
/// `$features`), through `$fold` and `$folded`: once with AVX-VNNI's VEX form, once with
/// AVX-512 VNNI's EVEX form of the same instruction ([`crate::x86::Vnni256`]).
macro_rules! q3_k_vnni {
    ($name:ident, $fold:ident, $folded:ident, $features:literal, $dpbusd:path) => {
        /// Every block of a group folded into `vb` (entry `hr * blocks + b`), once for all of a
        /// batch's passes.
        #[inline]
        #[target_feature(enable = $features)]
        fn $fold(g: &[Q3KPairs], vb: &mut Vec<Q3KFolded>) {
            vb.clear();
            let masks = (
                _mm256_set1_epi8(0x03),
                _mm256_set1_epi8(0x0F),
                _mm256_set1_epi8(0x20),
            );
            let (four, ones) = (_mm256_set1_epi8(4), _mm256_set1_epi8(1));
            for hr in 0..2 {
                for g in g {
                    // SAFETY: this function's features.
                    let by = unsafe { q3_k_scale_bytes(&g.sc, hr, masks) };
                    let mut v = [_mm256_setzero_si256(); 72];
                    for l in 0..8 {
                        // SAFETY: this function's features.
                        let u = unsafe { q3_k_octet(g, hr, l) };
                        let q = (l / 4) as u8;
                        // SAFETY: this function's features.
                        let spread = unsafe { word_shuffle([q, q, q + 2, q + 2]) };
                        let mut sum = _mm256_setzero_si256();
                        for (w, u) in u.into_iter().enumerate() {
                            // Bytes 0, 1: group 4p + q; bytes 2, 3: group 4p + 2 + q.
                            let sc = _mm256_shuffle_epi8(by[w / 2], spread);
                            // -q s = (4 - u) s, which fits a signed byte.
                            // SAFETY: this function's features.
                            let folded = unsafe { mullo_epi8(_mm256_sub_epi8(four, u), sc) };
                            v[8 * l + w] = folded;
                            sum = $dpbusd(sum, ones, folded);
                        }
                        v[64 + l] = _mm256_slli_epi32::<7>(sum);
                    }
                    vb.push(v);
                }
            }
        }

        /// Sixteen rows folded by [`q3_k_fold`] (`vb`) times tokens `t0..t0 + T` (`ys[t]`:
        /// values plus 128, as unsigned bytes, in the paired order), into `out[(t0 + t) *
        /// stride + r0..][..16]`, eight rows at a time: lane `l` is `128 Σ w - Σ (y + 128) w`
        /// over its eight words, one `vpdpbusd` each, then fused as [`q3_k_pass`] fuses it (the
        /// same integers).
        #[inline]
        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
        fn $folded<const T: usize>(
            (g, vb): (&[Q3KPairs], &[Q3KFolded]),
            ys: [&[Q3KAct]; T],
            out: &mut [f32],
            (stride, r0, t0): (usize, usize, usize),
        ) {
            let blocks = g.len();
            for hr in 0..2 {
                let mut acc = [[_mm256_setzero_ps(); 8]; T];
                for (b, g) in g.iter().enumerate() {
                    // SAFETY: a row of `d`.
                    let dx = unsafe { ld8_f16(&g.d, hr) };
                    let v = &vb[hr * blocks + b];
                    let mut d = [_mm256_setzero_ps(); T];
                    let mut f = [std::ptr::null::<i8>(); T];
                    for t in 0..T {
                        d[t] = _mm256_mul_ps(_mm256_set1_ps(ys[t][b].d), dx);
                        f[t] = ys[t][b].qs.as_ptr();
                    }
                    for l in 0..8 {
                        let mut dot = [_mm256_setzero_si256(); T];
                        for w in 0..8 {
                            let at = 64 * (w / 2) + 8 * l + 4 * (w % 2);
                            for t in 0..T {
                                // SAFETY: four bytes of the token's 256.
                                let y = unsafe { bcast4(f[t].add(at)) };
                                dot[t] = $dpbusd(dot[t], y, v[8 * l + w]);
                            }
                        }
                        for t in 0..T {
                            let lane = _mm256_sub_epi32(v[64 + l], dot[t]);
                            acc[t][l] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(lane), acc[t][l]);
                        }
                    }
                }
                store_tokens8(out, (stride, r0, t0), hr, &acc);
            }
        }

        /// [`q3_k`]'s batches on AVX-VNNI: `a` holds each token's values plus 128.
        ///
        /// # Safety
        /// As [`q4_k`], and the CPU must have AVX-VNNI.
        ///
        /// [`q4_k`]: crate::x86::avx2::packed::kquants
        #[target_feature(enable = $features)]
        unsafe fn $name(p: &[Q3KPairs], per_row: usize, a: &[Q3KAct], out: &mut [f32]) {
            Q3K_FOLDED.with_borrow_mut(|vb| {
                unpacked_passes!(
                    p, per_row, a, out,
                    $fold, vb, $folded,
                    8, [1 2 3 4 5 6 7], ()
                )
            });
        }
    };
}

q3_k_vnni!(
    q3_k_vnni,
    q3_k_fold,
    q3_k_folded,
    "avxvnni,avx2,fma,f16c",
    _mm256_dpbusd_avx_epi32
);
q3_k_vnni!(
    q3_k_vnni_evex,
    q3_k_fold_evex,
    q3_k_folded_evex,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    _mm256_dpbusd_epi32
);

/// Packed Q3_K groups times every token, as [`q4_k`], the tokens' blocks first made into
/// [`Q3KAct`]s, eight tokens a pass; more than a pass, and each group is unpacked once for
/// all its passes (on AVX-VNNI, with the scales folded into the values, [`q3_k_fold`]).
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx2::packed::kquants
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k(p: &[Q3KPairs], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let vnni = crate::cpu().vnni256().filter(|_| a.len() > 8 * per_row);
    Q3K_ACTS.with_borrow_mut(|ya| {
        let form = if vnni.is_some() {
            Q3KActs::Flipped
        } else {
            Q3KActs::Offsets
        };
        // SAFETY: this function's features.
        unsafe { q3_k_acts(a, ya, form) };
        let a = &ya[..];
        match vnni {
            // SAFETY: the CPU has the form's features (`vnni256`), besides this function's.
            Some(Vnni256::Vex) => return unsafe { q3_k_vnni(p, per_row, a, out) },
            // SAFETY: as above.
            Some(Vnni256::Evex) => return unsafe { q3_k_vnni_evex(p, per_row, a, out) },
            None => {}
        }
        if a.len() == per_row {
            group_passes!(p, per_row, a, out, q3_k_one, 1, [], ());
            return;
        }
        if a.len() <= 8 * per_row {
            group_passes!(p, per_row, a, out, q3_k_tokens, 8, [1 2 3 4 5 6 7], ());
            return;
        }
        UNPACKED_VALUES.with_borrow_mut(|vb| {
            unpacked_passes!(
                p, per_row, a, out,
                q3_k_unpack, vb, q3_k_tokens_unpacked,
                8, [1 2 3 4 5 6 7], ()
            )
        });
    });
}

packed_format!(Q3_K: Q3KPairs, BlockQ8K, GgmlType::Q3_K, GgmlType::Q8_K => q3_k);

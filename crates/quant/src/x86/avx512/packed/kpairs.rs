//! The AVX-512 kernels of Q6_K and Q3_K, on their paired layouts ([`Q6KPairs`], [`Q3KPairs`]).

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::blocks::*;
use crate::packed::layout::{packed_format, Q3KPairs, Q6KPairs, ROWS};
use crate::x86::avx512::packed::{
    bcast4, dpwssd, dpwssd_by, fuse_lanes, ld_f16, mullo_epi8, store_tokens, word_shuffle,
    UNPACKED_VALUES,
};
use crate::x86::packed_common::{
    group_passes, ld, nibble_or, pass_entries, q3_k_acts, q6_k_acts, token_passes, unpacked_passes,
    Q3KAct, Q3KActs, Q6KAct, Q3K_ACTS, Q6K_ACTS,
};
use crate::x86::{prefetch_part, prefetch_part_as, Ahead};
use crate::GgmlType;

// ---------------------------------------------------------------------------------------------
// Q6_K in `vec_dot` order: lane `l` takes values whose index mod 32 is in `4l..4l + 4`, with q
// unsigned (0..64), each times its 16-value group's scale, less `32 * (bsum[2l] * scale[2l] +
// bsum[2l + 1] * scale[2l + 1])`. The integer lane sums are the same however they are formed:
// here two groups' four-value sums (each fits an i16: |sum| <= 4 * 63 * 128) as the halves of
// a word, one `vpdpwssd` by both scales, from a layout packed for it ([`Q6KPairs`]).

/// Triple `τ` of a group's sixteen rows unpacked to one byte a value (q unsigned, 0..64): the
/// low six bits of its three words, and the fourth word's values from their top two bits.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
unsafe fn q6_k_triple(g: &Q6KPairs, tau: usize) -> [__m512i; 4] {
    // SAFETY: the caller's features; rows of `q`.
    unsafe {
        let (m03, m30, m3f) = (
            _mm512_set1_epi8(0x03),
            _mm512_set1_epi8(0x30),
            _mm512_set1_epi8(0x3F),
        );
        let (a, b, c) = (
            ld(&g.q[3 * tau]),
            ld(&g.q[3 * tau + 1]),
            ld(&g.q[3 * tau + 2]),
        );
        // Bits 0-1 from a's top pair, the rest from b >> 4 (whose bits 2-3 are b's top pair).
        let ab = _mm512_ternarylogic_epi32::<0xE4>(
            _mm512_srli_epi32::<6>(a),
            _mm512_srli_epi32::<4>(b),
            m03,
        );
        let c45 = _mm512_and_si512(_mm512_srli_epi32::<2>(c), m30);
        [
            _mm512_and_si512(a, m3f),
            _mm512_and_si512(b, m3f),
            _mm512_and_si512(c, m3f),
            nibble_or(ab, c45),
        ]
    }
}

/// Every block of a group unpacked by [`q6_k_triple`] into `vb` (entry `4τ + w`), once for
/// all of a batch's token passes, which otherwise each unpacked it again.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q6_k_unpack(g: &[Q6KPairs], vb: &mut Vec<[__m512i; 64]>) {
    vb.clear();
    for g in g {
        let mut v = [_mm512_setzero_si512(); 64];
        for tau in 0..16 {
            // SAFETY: this function's features.
            let values = unsafe { q6_k_triple(g, tau) };
            v[4 * tau..][..4].copy_from_slice(&values);
        }
        vb.push(v);
    }
}

/// Sixteen rows (`g`, and with `UNPACKED` their values already unpacked in `vb`, one entry a
/// block) times tokens `t0..t0 + T` (`ys[t]`), into `out[(t0 + t) * stride + r0..][..16]`,
/// in `vec_dot`'s eight lanes: lane `l` starts at its `-32` offset, `16 (scale[2l],
/// scale[2l + 1])` against the token's `-2 (bsum[2l], bsum[2l + 1])` by `vpdpwssd`; then each
/// pair `p` of its groups adds two `vpmaddubsw` as words (the two groups' four-value sums, each
/// at most 4 * 63 * 128 in magnitude, as a word's halves) and one `vpdpwssd` by the two
/// scales: three multiplies for 128 products, where ggml's order takes four. The same integers
/// in each lane as `vec_dot`, fused by `d_y * d_x` into its float lane.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
unsafe fn q6_k_pass<const T: usize, const UNPACKED: bool>(
    (g, vb): (&[Q6KPairs], &[[__m512i; 64]]),
    ys: [&[Q6KAct]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX-512 F/BW/VL, VNNI, AVX2, FMA, F16C); rows of the
    // group's arrays, four bytes of a token's 256 values and two of its sixteen sums (the
    // whole body).
    unsafe {
        let z = 0x80;
        // Scale bytes 0, 1 and 2, 3 of a word into the high bytes of the two i16 halves.
        let offset_bytes = [word_shuffle([z, 0, z, 1]), word_shuffle([z, 2, z, 3])];
        // Scale bytes `q` and `q + 2` of a word, the same way.
        let pair_bytes = [word_shuffle([z, 0, z, 2]), word_shuffle([z, 1, z, 3])];
        let mut acc = [[_mm512_setzero_ps(); 8]; T];
        for (b, g) in g.iter().enumerate() {
            let sc = [ld(&g.sc[0]), ld(&g.sc[1]), ld(&g.sc[2]), ld(&g.sc[3])];
            let dx = ld_f16(&g.d);
            // (scale[4p + q], scale[4p + q + 2]) as i16 pairs, entry 2p + q. Loops, not
            // `from_fn`: a closure would not share the caller's features.
            let mut scale = [_mm512_setzero_si512(); 8];
            for p in 0..4 {
                for q in 0..2 {
                    scale[2 * p + q] =
                        _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(sc[p], pair_bytes[q]));
                }
            }
            let mut d = [_mm512_setzero_ps(); T];
            let mut y = [std::ptr::null::<i8>(); T];
            for t in 0..T {
                d[t] = _mm512_mul_ps(_mm512_set1_ps(ys[t][b].d), dx);
                y[t] = ys[t][b].qs.as_ptr();
            }
            for l in 0..8 {
                if !UNPACKED {
                    prefetch_part_as(Ahead::Deep, g, l, 8);
                }
                // 16 (scale[2l], scale[2l + 1]) (`>> 4` of the scale in a half's high byte).
                let offset =
                    _mm512_srai_epi16::<4>(_mm512_shuffle_epi8(sc[l / 2], offset_bytes[l % 2]));
                let mut lane = [_mm512_setzero_si512(); T];
                for t in 0..T {
                    let nb = ys[t][b].nb.as_ptr().add(2 * l);
                    lane[t] = dpwssd_by::<T, _>(_mm512_setzero_si512(), offset, nb);
                }
                // With one token, two chains (h = 0 and 1), added at the end: one chain of
                // dependent `vpdpwssd` would leave the multipliers waiting. (Several tokens
                // have chains enough.)
                let mut lane1 = [_mm512_setzero_si512(); T];
                for h in 0..2 {
                    let v = if UNPACKED {
                        let at = &vb[b][4 * (2 * l + h)..];
                        [at[0], at[1], at[2], at[3]]
                    } else {
                        q6_k_triple(g, 2 * l + h)
                    };
                    for pp in 0..2 {
                        let p = 2 * h + pp;
                        let s = scale[2 * p + l / 4];
                        for t in 0..T {
                            let chain = if T > 1 || h == 0 {
                                &mut lane[t]
                            } else {
                                &mut lane1[t]
                            };
                            let at = y[t].add(64 * p + 8 * l);
                            let both = _mm512_add_epi16(
                                _mm512_maddubs_epi16(v[2 * pp], bcast4(at)),
                                _mm512_maddubs_epi16(v[2 * pp + 1], bcast4(at.add(4))),
                            );
                            *chain = dpwssd(*chain, both, s);
                        }
                    }
                }
                fuse_lanes(&mut acc, l, &d, &lane, &lane1);
            }
        }
        store_tokens(out, (stride, r0, t0), &acc);
    }
}

pass_entries!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    q6_k_pass: q6_k_tokens, q6_k_tokens_unpacked, Q6KPairs, [__m512i; 64],
    (ys: [&[Q6KAct]; T])
);

/// Packed Q6_K groups times every token, as [`q4_k`], the tokens' blocks first reordered for
/// the paired products ([`q6_k_acts`]): up to two passes of eight tokens that unpack as they
/// go, more from each group unpacked once (at two passes, unpacking again is the faster on an
/// Intel core: docs/perf-log.md, "Small batches").
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx512::packed::kquants
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k(p: &[Q6KPairs], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let n_tok = a.len() / per_row;
    Q6K_ACTS.with_borrow_mut(|ya| {
        // SAFETY: this function's features.
        unsafe { q6_k_acts(a, ya) };
        let a = &ya[..];
        if n_tok <= 16 {
            group_passes!(p, per_row, a, out, q6_k_tokens, 8, [1 2 3 4 5 6 7], ());
        } else {
            UNPACKED_VALUES.with_borrow_mut(|vb| {
                unpacked_passes!(
                    p, per_row, a, out,
                    q6_k_unpack, vb, q6_k_tokens_unpacked,
                    8, [1 2 3 4 5 6 7], ()
                )
            });
        }
    });
}

packed_format!(Q6_K: Q6KPairs, BlockQ8K, GgmlType::Q6_K, GgmlType::Q8_K => q6_k);

// ---------------------------------------------------------------------------------------------
// Q3_K in `vec_dot` order: the eight lanes of the other K-quants, each value `q` (-4..=3: the
// two low bits and the high bit, less 4) times its 16-value group's scale less 32. A few
// tokens take two groups' four-value sums as a word's halves and scale both by one
// `vpdpwssd`, as Q6_K does ([`Q3KPairs`]); a batch folds the scales into the values once
// ([`q3_k_unpack`]: the product fits a byte) and takes one `vpdpbusd` for 64 products. The
// AVX2 kernels read the same layout.

/// `for $l in 0..8 { $body }`, with the eight copies written out when a pass has one token
/// (`$t == 1`): as a loop, the compiler kept a one-token pass's eight float lanes on the stack,
/// indexed by `l`, and worked out each lane's shuffle masks and prefetch lines at run time.
/// Only Q3_K's pass takes it (decode, where that pass runs, read more of the memory so).
/// Written out, the Q6_K, Q5_K and IQ4_XS passes ran faster hot but streamed less of the
/// memory over cold copies, or decoded slower at two threads, on the Zen 4 (measurements:
/// docs/perf-log.md, "AVX-512 packed K-quants and IQ4_XS"): they keep the
/// loop. Several tokens' accumulators do not fit the registers anyway, and eight copies of
/// their bodies would crowd the instruction cache.
macro_rules! lanes8 {
    ($t:expr, $l:ident => $body:block) => {
        if $t == 1 {
            lanes8!(@each $l => $body; 0 1 2 3 4 5 6 7);
        } else {
            for $l in 0..8usize $body
        }
    };
    (@each $l:ident => $body:block; $($n:literal)*) => {
        $({
            let $l: usize = $n;
            $body
        })*
    };
}

/// Lane `l` of a group's sixteen rows unpacked to one byte a value (`u`, 0..8): entry `2p + e`
/// the word `e` of pair `p` (see [`Q3KPairs`]).
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[inline(always)]
unsafe fn q3_k_octet(g: &Q3KPairs, l: usize) -> [__m512i; 8] {
    // SAFETY: the caller's features; rows of `q`.
    unsafe {
        let (m01, m03, m07) = (
            _mm512_set1_epi8(0x01),
            _mm512_set1_epi8(0x03),
            _mm512_set1_epi8(0x07),
        );
        let (a, b, c) = (ld(&g.q[3 * l]), ld(&g.q[3 * l + 1]), ld(&g.q[3 * l + 2]));
        // Bits 0-1 from a's top pair, bit 2 from b's bit 6 (b >> 4); bit 0 from b's bit 7, bits
        // 1-2 from c's top pair (c >> 5). (`0xE4`: the third operand's bits choose the first.)
        let u6 = _mm512_ternarylogic_epi32::<0xE4>(
            _mm512_srli_epi32::<6>(a),
            _mm512_srli_epi32::<4>(b),
            m03,
        );
        let u7 = _mm512_ternarylogic_epi32::<0xE4>(
            _mm512_srli_epi32::<7>(b),
            _mm512_srli_epi32::<5>(c),
            m01,
        );
        let raw = [
            a,
            _mm512_srli_epi32::<3>(a),
            b,
            _mm512_srli_epi32::<3>(b),
            c,
            _mm512_srli_epi32::<3>(c),
            u6,
            u7,
        ];
        // Each byte's low three bits. A loop, not `map`: a closure would not share the
        // callers' features.
        let mut u = [_mm512_setzero_si512(); 8];
        for (u, raw) in u.iter_mut().zip(raw) {
            *u = _mm512_and_si512(raw, m07);
        }
        u
    }
}

/// A Q3_K block of sixteen rows unpacked for batches ([`q3_k_unpack`]): entry `8l + w` holds
/// lane `l`'s word `w` ([`q3_k_octet`]) of every row with each value's group scale folded in,
/// `w = -q * scale` (within -128..=124: `q` is -4..=3, the scale -32..=31) plus 128, as an
/// unsigned byte.
type Q3KUnpacked = [__m512i; 64];

/// Every block of a group unpacked into `vb` once for all of a batch's token passes, each
/// value times its group's scale (see [`Q3KUnpacked`]). A pass then takes one `vpdpbusd` for
/// 64 products, the folded values plus 128 as the unsigned bytes and the token's values as the
/// signed ones, broadcast from memory inside the instruction; the offset comes back through
/// the token's lane sums ([`Q3KActs::LaneSums`]). The same integers: `Σ y q s = 128 Σ y -
/// Σ (w + 128) y` with `w = -q s`. (The tokens as the unsigned side, plus 128, and the offset
/// from the rows' sums, as before, took a `vpbroadcastd` a product: the broadcast folds only
/// into the signed operand. Tilebench `Q3_K 512 2048 64`: see docs/perf-log.md, 2026-12-03.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q3_k_unpack(g: &[Q3KPairs], vb: &mut Vec<Q3KUnpacked>) {
    vb.clear();
    let masks = (
        _mm512_set1_epi8(0x03),
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(0x20),
    );
    let (four, flip) = (_mm512_set1_epi8(4), _mm512_set1_epi8(-128));
    for g in g {
        // SAFETY: rows of `sc`; this function's features.
        let by = unsafe { q3_k_scale_bytes(&g.sc, masks) };
        let mut v = [_mm512_setzero_si512(); 64];
        for l in 0..8 {
            // SAFETY: this function's features.
            let u = unsafe { q3_k_octet(g, l) };
            let q = (l / 4) as u8;
            // SAFETY: this function's features.
            let spread = unsafe { word_shuffle([q, q, q + 2, q + 2]) };
            for (w, u) in u.into_iter().enumerate() {
                // Bytes 0, 1: group 4p + q; bytes 2, 3: group 4p + 2 + q.
                let sc = _mm512_shuffle_epi8(by[w / 2], spread);
                // -q s = (4 - u) s, plus 128 (the flip of the top bit).
                // SAFETY: this function's features.
                let folded = unsafe { mullo_epi8(_mm512_sub_epi8(four, u), sc) };
                v[8 * l + w] = _mm512_xor_si512(folded, flip);
            }
        }
        vb.push(v);
    }
}

/// Byte `i` of `by[q]` (each row's word): the scale of group `4q + i`, less 32 (ggml's
/// `q3k_scale` four at a time: low four bits from bytes 0..8, high two from bytes 8..12), from a
/// group's scale words `sc`.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[inline(always)]
unsafe fn q3_k_scale_bytes(
    sc: &[[u32; ROWS]; 3],
    (m03, m0f, m20): (__m512i, __m512i, __m512i),
) -> [__m512i; 4] {
    // SAFETY: the caller's features; rows of `sc`.
    unsafe {
        let (s0, s1, s2) = (ld(&sc[0]), ld(&sc[1]), ld(&sc[2]));
        let low = [
            _mm512_and_si512(s0, m0f),
            _mm512_and_si512(s1, m0f),
            _mm512_and_si512(_mm512_srli_epi32::<4>(s0), m0f),
            _mm512_and_si512(_mm512_srli_epi32::<4>(s1), m0f),
        ];
        let high = [
            s2,
            _mm512_srli_epi32::<2>(s2),
            _mm512_srli_epi32::<4>(s2),
            _mm512_srli_epi32::<6>(s2),
        ];
        let mut by = [_mm512_setzero_si512(); 4];
        for q in 0..4 {
            let hi = _mm512_slli_epi32::<4>(_mm512_and_si512(high[q], m03));
            by[q] = _mm512_sub_epi8(_mm512_or_si512(low[q], hi), m20);
        }
        by
    }
}

/// Sixteen rows (`g`, and with `UNPACKED` their scaled values unpacked in `vb` by
/// [`q3_k_unpack`], one entry a block) times tokens `t0..t0 + T` (`ys[t]`, made by
/// [`q3_k_acts`] for the kind of pass), into `out[(t0 + t) * stride + r0..][..16]`, in
/// `vec_dot`'s eight lanes: lane `l` sums, for each pair `p` of its groups, two `vpmaddubsw`
/// of the values `u` added as words, less the token's `4 * Σ y` of each group's four values,
/// (`Σ (u - 4) y` of both groups as a word's halves, at most 4 * 4 * 128 + 4 * 7 * 128 in
/// magnitude), by one `vpdpwssd` by the two scales. The same integers in each lane as
/// `vec_dot`, fused by `d_y * d_x` into its float lane.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
unsafe fn q3_k_pass<const T: usize, const UNPACKED: bool>(
    (g, vb): (&[Q3KPairs], &[Q3KUnpacked]),
    ys: [&[Q3KAct]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX-512 F/BW/VL, VNNI, AVX2, FMA, F16C); rows of the
    // group's arrays, four bytes of a token's 256 values and one of its 32 offsets (the whole
    // body).
    unsafe {
        let z = 0x80;
        // Scale bytes `q` and `q + 2` of a word into the high bytes of the two i16 halves.
        let pair_bytes = [word_shuffle([z, 0, z, 2]), word_shuffle([z, 1, z, 3])];
        let masks = (
            _mm512_set1_epi8(0x03),
            _mm512_set1_epi8(0x0F),
            _mm512_set1_epi8(0x20),
        );
        let mut acc = [[_mm512_setzero_ps(); 8]; T];
        for (b, g) in g.iter().enumerate() {
            let dx = ld_f16(&g.d);
            let mut d = [_mm512_setzero_ps(); T];
            let mut y = [std::ptr::null::<i8>(); T];
            let mut off = [std::ptr::null::<u32>(); T];
            for t in 0..T {
                d[t] = _mm512_mul_ps(_mm512_set1_ps(ys[t][b].d), dx);
                y[t] = ys[t][b].qs.as_ptr();
                off[t] = ys[t][b].off.as_ptr();
            }
            if UNPACKED {
                // Lane l: 128 Σ y less Σ (w + 128) y over its eight words, one `vpdpbusd`
                // each, the sum started at the token's -128 Σ y and negated at the end.
                let v = &vb[b];
                for l in 0..8 {
                    let mut dot = [_mm512_setzero_si512(); T];
                    for t in 0..T {
                        dot[t] = bcast4(off[t].add(l));
                    }
                    for w in 0..8 {
                        let at = 64 * (w / 2) + 8 * l + 4 * (w % 2);
                        for t in 0..T {
                            dot[t] =
                                _mm512_dpbusd_epi32(dot[t], v[8 * l + w], bcast4(y[t].add(at)));
                        }
                    }
                    let mut lane = [_mm512_setzero_si512(); T];
                    for t in 0..T {
                        lane[t] = _mm512_sub_epi32(_mm512_setzero_si512(), dot[t]);
                    }
                    fuse_lanes(&mut acc, l, &d, &lane, &[_mm512_setzero_si512(); T]);
                }
                continue;
            }
            let by = q3_k_scale_bytes(&g.sc, masks);
            // (scale[4p + q], scale[4p + q + 2]) as i16 pairs, entry 2p + q. Loops, not
            // `from_fn`: a closure would not share the caller's features.
            let mut scale = [_mm512_setzero_si512(); 8];
            for p in 0..4 {
                for q in 0..2 {
                    scale[2 * p + q] =
                        _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(by[p], pair_bytes[q]));
                }
            }
            lanes8!(T, l => {
                if UNPACKED {
                    prefetch_part(g, l, 8);
                } else {
                    prefetch_part_as(Ahead::Deep, g, l, 8);
                }
                let u = q3_k_octet(g, l);
                // With one token, two chains (pairs 0, 1 and 2, 3), added at the end.
                let mut lane = [_mm512_setzero_si512(); T];
                let mut lane1 = [_mm512_setzero_si512(); T];
                for p in 0..4 {
                    let s = scale[2 * p + l / 4];
                    for t in 0..T {
                        let chain = if T > 1 || p < 2 {
                            &mut lane[t]
                        } else {
                            &mut lane1[t]
                        };
                        let at = y[t].add(64 * p + 8 * l);
                        let both = _mm512_add_epi16(
                            _mm512_add_epi16(
                                _mm512_maddubs_epi16(u[2 * p], bcast4(at)),
                                _mm512_maddubs_epi16(u[2 * p + 1], bcast4(at.add(4))),
                            ),
                            bcast4(off[t].add(8 * p + l)),
                        );
                        *chain = dpwssd(*chain, both, s);
                    }
                }
                fuse_lanes(&mut acc, l, &d, &lane, &lane1);
            });
        }
        store_tokens(out, (stride, r0, t0), &acc);
    }
}

pass_entries!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    q3_k_pass: q3_k_tokens, q3_k_tokens_unpacked, Q3KPairs, Q3KUnpacked,
    (ys: [&[Q3KAct]; T])
);

thread_local! {
    /// Each thread's group of Q3_K blocks unpacked by [`q3_k_unpack`].
    static Q3K_UNPACKED: RefCell<Vec<Q3KUnpacked>> = const { RefCell::new(Vec::new()) };
}

/// Packed Q3_K groups times every token, as [`q4_k`], eight tokens a pass; more than a pass,
/// and each group is unpacked once for all its passes.
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx512::packed::kquants
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q3_k(p: &[Q3KPairs], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let n_tok = a.len() / per_row;
    let unpacked = n_tok > 8;
    let form = if unpacked {
        Q3KActs::LaneSums
    } else {
        Q3KActs::Offsets
    };
    Q3K_ACTS.with_borrow_mut(|ya| {
        // SAFETY: this function's features.
        unsafe { q3_k_acts(a, ya, form) };
        let a = &ya[..];
        if !unpacked {
            group_passes!(p, per_row, a, out, q3_k_tokens, 8, [1 2 3 4 5 6 7], ());
            return;
        }
        Q3K_UNPACKED.with_borrow_mut(|vb| {
            unpacked_passes!(
                p, per_row, a, out,
                q3_k_unpack, vb, q3_k_tokens_unpacked,
                8, [1 2 3 4 5 6 7], ()
            )
        });
    });
}

// Q3_K's batch calls cover 256 x 2048 weights: each call prepares every token's block (values
// interleaved, lane sums), which took much of the lane sums' gain back in calls of 64 rows
// (measurements: docs/perf-log.md, "Batch calls' sizes").
packed_format!(Q3_K: Q3KPairs, BlockQ8K, GgmlType::Q3_K, GgmlType::Q8_K => q3_k, 256 * 2048);

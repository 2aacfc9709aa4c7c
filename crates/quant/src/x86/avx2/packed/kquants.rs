//! The AVX2 kernels of Q4_K and Q2_K (in the repacked order) and of Q5_K.

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::packed::layout::{packed_format, Q2KPacked, Q4KPacked, Q5KPacked, ROWS};
use crate::x86::avx2::packed::{
    bcast4, fuse_halves, hsum8, ld8_f16, store_rows8, word_shuffle, UNPACKED_VALUES,
};
use crate::x86::packed_common::{
    group_passes, ld8, pair_sums, pass_entries, token_passes, unpacked_passes, PAIR_SUMS,
};
use crate::x86::{prefetch_part, Vnni256};
use crate::GgmlType;

/// The 6-bit scales and mins of rows `8h..8h + 8` of a packed Q4_K block (`sc`: its scale
/// words), a byte each: bytes `j` of the four words are the scale of sub-block `j`, the min of
/// sub-block `j`, the scale of sub-block `4 + j` and the min of sub-block `4 + j` (ggml's
/// `get_scale_min_k4`, four at a time).
#[inline(always)]
unsafe fn k_scale_bytes(sc: &[[u32; ROWS]; 3], h: usize) -> [__m256i; 4] {
    // SAFETY: AVX2 (the callers' features); rows of `sc`.
    unsafe {
        let (s0, s1, s2) = (ld8(&sc[0], h), ld8(&sc[1], h), ld8(&sc[2], h));
        let (m3f, m0f, m30) = (
            _mm256_set1_epi32(0x3F3F_3F3F),
            _mm256_set1_epi32(0x0F0F_0F0F),
            _mm256_set1_epi32(0x3030_3030),
        );
        [
            _mm256_and_si256(s0, m3f),
            _mm256_and_si256(s1, m3f),
            _mm256_or_si256(
                _mm256_and_si256(s2, m0f),
                _mm256_and_si256(_mm256_srli_epi32::<2>(s0), m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(s2), m0f),
                _mm256_and_si256(_mm256_srli_epi32::<2>(s1), m30),
            ),
        ]
    }
}

/// The `vpshufb` controls of the Q4_K and Q5_K kernels: byte `i` of a word in both i16 halves
/// (a sub-block's scale, for `vpmaddwd`), and bytes 0, 1 (2, 3) as the low and high i16 (the
/// mins of two sub-blocks).
#[inline(always)]
unsafe fn k_controls() -> ([__m256i; 4], [__m256i; 2]) {
    let z = 0x80;
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        (
            [0u8, 1, 2, 3].map(|i| word_shuffle([i, z, i, z])),
            [word_shuffle([0, z, 1, z]), word_shuffle([2, z, 3, z])],
        )
    }
}

/// The mins of a Q4_K or Q5_K block's eight sub-blocks as four i16 pairs a row, from the min
/// bytes of [`k_scale_bytes`] (`mn_lo`, `mn_hi`) and [`k_controls`]' `pair`.
#[inline(always)]
unsafe fn k_min_pairs(mn_lo: __m256i, mn_hi: __m256i, pair: &[__m256i; 2]) -> [__m256i; 4] {
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        [
            _mm256_shuffle_epi8(mn_lo, pair[0]),
            _mm256_shuffle_epi8(mn_lo, pair[1]),
            _mm256_shuffle_epi8(mn_hi, pair[0]),
            _mm256_shuffle_epi8(mn_hi, pair[1]),
        ]
    }
}

/// The min term of that block for one token (`ps`: its eight sub-block sums): `Σ_j min_j *
/// ps[j]`, exact, a row a lane.
#[inline(always)]
unsafe fn k_min_term(mn: &[__m256i; 4], ps: &[i16; 8]) -> __m256i {
    // SAFETY: AVX2 (the callers' features); i16 elements 2j, 2j + 1 of `ps`.
    unsafe {
        let mut m = _mm256_setzero_si256();
        for (j, &mn) in mn.iter().enumerate() {
            m = _mm256_add_epi32(m, _mm256_madd_epi16(mn, bcast4(ps.as_ptr().add(2 * j))));
        }
        m
    }
}

/// How the Q4_K kernel sums a sub-block's products and scales them: [`Maddubs`] (AVX2) or
/// [`Dpbusd`] (AVX-VNNI). Both give the same exact integers.
trait SubBlockDot {
    /// `acc` plus the products of four values `w` (unsigned) and `a` (signed) of each row.
    fn add(acc: __m256i, w: __m256i, a: __m256i) -> __m256i;
    /// A sub-block's sum `acc` times its scale, as i32 lanes; `pairs`: the scale in both i16
    /// halves of each lane.
    fn scaled(acc: __m256i, pairs: __m256i) -> __m256i;
}

/// `vpmaddubsw` pairs gathered in the i16 halves (eight of at most `2 * 15 * 128` stay in
/// range), then one `vpmaddwd` by the scale.
struct Maddubs;

impl SubBlockDot for Maddubs {
    #[inline(always)]
    fn add(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 (the callers' features).
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)) }
    }
    #[inline(always)]
    fn scaled(acc: __m256i, pairs: __m256i) -> __m256i {
        // SAFETY: AVX2 (the callers' features).
        unsafe { _mm256_madd_epi16(acc, pairs) }
    }
}

/// `vpdpbusd` into i32 lanes, then a 32-bit multiply by the scale (the low i16 of `pairs`).
struct Dpbusd;

impl SubBlockDot for Dpbusd {
    #[inline(always)]
    fn add(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX-VNNI (the callers' features).
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, a) }
    }
    #[inline(always)]
    fn scaled(acc: __m256i, pairs: __m256i) -> __m256i {
        // SAFETY: AVX2 (the callers' features).
        unsafe {
            let scale = _mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF));
            _mm256_mullo_epi32(acc, scale)
        }
    }
}

/// [`Dpbusd`] with AVX-512 VNNI's EVEX form of `vpdpbusd` (with AVX-512 VL), for a CPU
/// without AVX-VNNI ([`crate::x86::Vnni256::Evex`]).
struct DpbusdEvex;

impl SubBlockDot for DpbusdEvex {
    #[inline(always)]
    fn add(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI and VL (the callers' features).
        unsafe { _mm256_dpbusd_epi32(acc, w, a) }
    }
    #[inline(always)]
    fn scaled(acc: __m256i, pairs: __m256i) -> __m256i {
        Dpbusd::scaled(acc, pairs)
    }
}

/// `$name::<T>`: sixteen rows (`g`, block by block) times tokens `t0..t0 + T` (`ys[t]`: token
/// `t0 + t`'s blocks; `pair_sums[t][b]`: its sub-block sums), into `out[(t0 + t) * stride +
/// r0..][..16]`, eight rows at a time, compiled for `$features` with `$dot`'s sums.
macro_rules! q4_k_tokens {
    ($name:ident, $features:literal, $dot:ty) => {
        #[inline]
        #[target_feature(enable = $features)]
        fn $name<const T: usize>(
            g: &[Q4KPacked],
            ys: [&[BlockQ8K]; T],
            pair_sums: [&[[i16; 8]]; T],
            out: &mut [f32],
            (stride, r0, t0): (usize, usize, usize),
        ) {
            let m4 = _mm256_set1_epi8(0x0F);
            // SAFETY: AVX2 (this function's features).
            let (scale, pair) = unsafe { k_controls() };
            for h in 0..2 {
                let mut main = [_mm256_setzero_ps(); T];
                let mut mins = [_mm256_setzero_ps(); T];
                for (b, g) in g.iter().enumerate() {
                    let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs.as_ptr());
                    // SAFETY: this function's features.
                    let [sc_lo, mn_lo, sc_hi, mn_hi] = unsafe { k_scale_bytes(&g.sc, h) };
                    let mut tot = [_mm256_setzero_si256(); T];
                    // Sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles) side by side.
                    for j in 0..4 {
                        if h == 0 {
                            prefetch_part(g, j, 4);
                        }
                        let mut lo = [_mm256_setzero_si256(); T];
                        let mut hi = [_mm256_setzero_si256(); T];
                        for k in 0..8 {
                            // SAFETY: a row of `qs`.
                            let raw = unsafe { ld8(&g.qs[8 * j + k], h) };
                            let (wlo, whi) = (
                                _mm256_and_si256(raw, m4),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
                            );
                            for t in 0..T {
                                // SAFETY: values 64j + 4k..+4 and 64j + 32 + 4k..+4 of a 256-value
                                // block.
                                let (alo, ahi) = unsafe {
                                    (
                                        bcast4(y[t].add(64 * j + 4 * k)),
                                        bcast4(y[t].add(64 * j + 32 + 4 * k)),
                                    )
                                };
                                lo[t] = <$dot>::add(lo[t], wlo, alo);
                                hi[t] = <$dot>::add(hi[t], whi, ahi);
                            }
                        }
                        let (s, i) = (if j < 2 { sc_lo } else { sc_hi }, 2 * j % 4);
                        let (slo, shi) = (
                            _mm256_shuffle_epi8(s, scale[i]),
                            _mm256_shuffle_epi8(s, scale[i + 1]),
                        );
                        for t in 0..T {
                            let both = _mm256_add_epi32(
                                <$dot>::scaled(lo[t], slo),
                                <$dot>::scaled(hi[t], shi),
                            );
                            tot[t] = _mm256_add_epi32(tot[t], both);
                        }
                    }
                    // SAFETY: rows of `d`, `dmin`; this function's features.
                    let (dx, dminx, mn) = unsafe {
                        (
                            ld8_f16(&g.d, h),
                            ld8_f16(&g.dmin, h),
                            k_min_pairs(mn_lo, mn_hi, &pair),
                        )
                    };
                    for t in 0..T {
                        // SAFETY: this function's features.
                        let m = unsafe { k_min_term(&mn, &pair_sums[t][b]) };
                        let yd = _mm256_set1_ps(ys[t][b].d);
                        main[t] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(tot[t]),
                            _mm256_mul_ps(dx, yd),
                            main[t],
                        );
                        mins[t] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(m),
                            _mm256_mul_ps(dminx, yd),
                            mins[t],
                        );
                    }
                }
                for t in 0..T {
                    store_rows8(out, (stride, r0, t0), t, h, _mm256_sub_ps(main[t], mins[t]));
                }
            }
        }
    };
}

q4_k_tokens!(q4_k_tokens, "avx2,fma,f16c", Maddubs);
q4_k_tokens!(q4_k_tokens_vnni, "avxvnni,avx2,fma,f16c", Dpbusd);
q4_k_tokens!(
    q4_k_tokens_vnni_evex,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    DpbusdEvex
);

/// [`q4_k_tokens`] for one token (decode), both halves of the sixteen rows in one sweep over
/// the group: each of the token's values broadcast once for the sixteen rows instead of once a
/// half, and the loop's work on the token and its control shared. The same operations on the
/// same integers, row by row, as the pass of one token, in every tier that takes this file's
/// kernels: the AVX-VNNI tier's pass of one token with `vpdpbusd`, half by half, was slower
/// hot and from memory, and at the AVX2 tier the sweep sped decode up (measurements:
/// docs/perf-log.md, "AVX2 one-token passes: one sweep over both halves").
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_one<const T: usize>(
    g: &[Q4KPacked],
    ys: [&[BlockQ8K]; T],
    pair_sums: [&[[i16; 8]]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let (ys, pair_sums) = (ys[0], pair_sums[0]);
    let m4 = _mm256_set1_epi8(0x0F);
    // SAFETY: AVX2 (this function's features).
    let (scale, pair) = unsafe { k_controls() };
    let mut main = [_mm256_setzero_ps(); 2];
    let mut mins = [_mm256_setzero_ps(); 2];
    for (b, g) in g.iter().enumerate() {
        let y = ys[b].qs.as_ptr();
        // SAFETY: this function's features.
        let [sc0, sc1] = [0, 1].map(|h| unsafe { k_scale_bytes(&g.sc, h) });
        let mut tot = [_mm256_setzero_si256(); 2];
        for j in 0..4 {
            prefetch_part(g, j, 4);
            let mut lo = [_mm256_setzero_si256(); 2];
            let mut hi = [_mm256_setzero_si256(); 2];
            for k in 0..8 {
                // SAFETY: values 64j + 4k..+4 and 64j + 32 + 4k..+4 of a 256-value block.
                let (alo, ahi) = unsafe {
                    (
                        bcast4(y.add(64 * j + 4 * k)),
                        bcast4(y.add(64 * j + 32 + 4 * k)),
                    )
                };
                for h in 0..2 {
                    // SAFETY: a row of `qs`.
                    let raw = unsafe { ld8(&g.qs[8 * j + k], h) };
                    let (wlo, whi) = (
                        _mm256_and_si256(raw, m4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
                    );
                    lo[h] = Maddubs::add(lo[h], wlo, alo);
                    hi[h] = Maddubs::add(hi[h], whi, ahi);
                }
            }
            let i = 2 * j % 4;
            for (h, sc) in [&sc0, &sc1].into_iter().enumerate() {
                let s = if j < 2 { sc[0] } else { sc[2] };
                let (slo, shi) = (
                    _mm256_shuffle_epi8(s, scale[i]),
                    _mm256_shuffle_epi8(s, scale[i + 1]),
                );
                let both =
                    _mm256_add_epi32(Maddubs::scaled(lo[h], slo), Maddubs::scaled(hi[h], shi));
                tot[h] = _mm256_add_epi32(tot[h], both);
            }
        }
        let yd = _mm256_set1_ps(ys[b].d);
        for (h, sc) in [&sc0, &sc1].into_iter().enumerate() {
            // SAFETY: rows of `d`, `dmin`; this function's features.
            let (dx, dminx, m) = unsafe {
                let mn = k_min_pairs(sc[1], sc[3], &pair);
                (
                    ld8_f16(&g.d, h),
                    ld8_f16(&g.dmin, h),
                    k_min_term(&mn, &pair_sums[b]),
                )
            };
            main[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[h]), _mm256_mul_ps(dx, yd), main[h]);
            mins[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dminx, yd), mins[h]);
        }
    }
    for h in 0..2 {
        store_rows8(out, at, 0, h, _mm256_sub_ps(main[h], mins[h]));
    }
}

/// Packed Q4_K groups (`per_row` blocks each) times every token of `a`, into `out`
/// (`(n_tok, 16 * groups)`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `a` holds `n_tok * per_row` blocks and `out` `n_tok *
/// 16 * (p.len() / per_row)` floats.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(p: &[Q4KPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    PAIR_SUMS.with_borrow_mut(|ps| {
        pair_sums(a, ps);
        if a.len() == per_row {
            return group_passes!(p, per_row, a, out, q4_k_one, 1, [], (ps));
        }
        match crate::cpu().vnni256() {
            // SAFETY: the CPU has the form's features (`vnni256`), besides this function's.
            Some(Vnni256::Vex) => unsafe { q4_k_vnni(p, per_row, a, ps, out) },
            // SAFETY: as above.
            Some(Vnni256::Evex) => unsafe { q4_k_vnni_evex(p, per_row, a, ps, out) },
            None => group_passes!(p, per_row, a, out, q4_k_tokens, 6, [1 2 3 4 5], (ps)),
        }
    });
}

/// `$name`: [`q4_k`] with the AVX-VNNI tier's `vpdpbusd` (Intel client cores since Alder
/// Lake), through `$tokens` compiled for `$features`: AVX-VNNI's VEX form, or AVX-512 VNNI's
/// EVEX one ([`crate::x86::Vnni256`]).
macro_rules! q4_k_vnni {
    ($name:ident, $tokens:ident, $features:literal) => {
        /// # Safety
        /// As [`q4_k`], and the CPU must have the features this function is compiled for.
        #[target_feature(enable = $features)]
        unsafe fn $name(
            p: &[Q4KPacked],
            per_row: usize,
            a: &[BlockQ8K],
            ps: &[[i16; 8]],
            out: &mut [f32],
        ) {
            group_passes!(p, per_row, a, out, $tokens, 6, [1 2 3 4 5], (ps))
        }
    };
}

q4_k_vnni!(q4_k_vnni, q4_k_tokens_vnni, "avxvnni,avx2,fma,f16c");
q4_k_vnni!(
    q4_k_vnni_evex,
    q4_k_tokens_vnni_evex,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);

packed_format!(Q4_K_ROWS8: Q4KPacked, BlockQ8K, GgmlType::Q4_K, GgmlType::Q8_K => q4_k);

// ---------------------------------------------------------------------------------------------
// Q2_K in the repacked order: [`crate::x86::avx512::packed`]'s Q2_K eight rows a register. Per block
// and row, one exact integer total of the values times their 16-value group's scale
// (`vpmaddubsw` of the 2-bit values with the token's, the four words of a group gathered in
// i16 halves, at most 4 * 2 * 3 * 128, then `vpmaddwd` by the scale) and one of the group mins
// times the token's group sums, each fused into its own running float, as the row kernels do.

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`), into `out[(t0 + t) * stride +
/// r0..][..16]`, eight rows at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `t` indexes several arrays in step
fn q2_k_tokens<const T: usize>(
    g: &[Q2KPacked],
    ys: [&[BlockQ8K]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let z = 0x80;
    // SAFETY: this function's features.
    let (byte, pair) = unsafe {
        (
            // Byte `i` of a word into both i16 halves of its lane.
            [
                word_shuffle([0, z, 0, z]),
                word_shuffle([1, z, 1, z]),
                word_shuffle([2, z, 2, z]),
                word_shuffle([3, z, 3, z]),
            ],
            // Bytes 0, 1 (2, 3) of a word as an i16 pair.
            [word_shuffle([0, z, 1, z]), word_shuffle([2, z, 3, z])],
        )
    };
    let (m03, m0f) = (_mm256_set1_epi8(0x03), _mm256_set1_epi32(0x000F_000F));
    for hr in 0..2 {
        let mut main = [_mm256_setzero_ps(); T];
        let mut mins = [_mm256_setzero_ps(); T];
        for (b, g) in g.iter().enumerate() {
            // SAFETY: rows of `sc`, `d` and `dmin`; this function's features.
            let (sc, dx, dminx) = unsafe {
                (
                    [
                        ld8(&g.sc[0], hr),
                        ld8(&g.sc[1], hr),
                        ld8(&g.sc[2], hr),
                        ld8(&g.sc[3], hr),
                    ],
                    ld8_f16(&g.d, hr),
                    ld8_f16(&g.dmin, hr),
                )
            };
            let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs.as_ptr());
            let mut tot = [_mm256_setzero_si256(); T];
            for h in 0..2 {
                if hr == 0 {
                    prefetch_part(g, h, 2);
                }
                for sh in 0..4 {
                    for half in 0..2 {
                        // Group 8h + 2sh + half: words k = 4 half..4 half + 4.
                        let mut part = [_mm256_setzero_si256(); T];
                        for k in 4 * half..4 * half + 4 {
                            // SAFETY: a row of `qs`.
                            let qs = unsafe { ld8(&g.qs[8 * h + k], hr) };
                            let w = _mm256_and_si256(
                                _mm256_srlv_epi32(qs, _mm256_set1_epi32(2 * sh as i32)),
                                m03,
                            );
                            for t in 0..T {
                                // SAFETY: values 128h + 32sh + 4k..+4 of the token's 256.
                                let a = unsafe { bcast4(y[t].add(128 * h + 32 * sh + 4 * k)) };
                                part[t] = _mm256_add_epi16(part[t], _mm256_maddubs_epi16(w, a));
                            }
                        }
                        let group = 8 * h + 2 * sh + half;
                        let scale = _mm256_and_si256(
                            _mm256_shuffle_epi8(sc[group / 4], byte[group % 4]),
                            m0f,
                        );
                        for t in 0..T {
                            tot[t] = _mm256_add_epi32(tot[t], _mm256_madd_epi16(part[t], scale));
                        }
                    }
                }
            }
            // The mins of groups 2p and 2p + 1 as an i16 pair.
            let mut mn = [_mm256_setzero_si256(); 8];
            for (p, mn) in mn.iter_mut().enumerate() {
                let w = _mm256_shuffle_epi8(sc[p / 2], pair[p % 2]);
                *mn = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m0f);
            }
            for t in 0..T {
                let bs = ys[t][b].bsums.as_ptr();
                let mut m = _mm256_setzero_si256();
                for (p, &mn) in mn.iter().enumerate() {
                    // SAFETY: i16 elements 2p, 2p + 1 of the bsums.
                    let s = unsafe { bcast4(bs.add(2 * p)) };
                    m = _mm256_add_epi32(m, _mm256_madd_epi16(mn, s));
                }
                let yd = _mm256_set1_ps(ys[t][b].d);
                main[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[t]), _mm256_mul_ps(dx, yd), main[t]);
                mins[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dminx, yd), mins[t]);
            }
        }
        for t in 0..T {
            store_rows8(
                out,
                (stride, r0, t0),
                t,
                hr,
                _mm256_sub_ps(main[t], mins[t]),
            );
        }
    }
}

/// [`q2_k_tokens`] for one token (decode), both halves of the sixteen rows in one sweep over
/// the group, as [`q4_k_one`]. The same operations on the same integers, row by row, as the
/// pass of one token; one sweep reads more of the memory than two halves (measurements:
/// docs/perf-log.md, "AVX2 one-token passes: one sweep over both halves").
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `hr` indexes several arrays in step
fn q2_k_one<const T: usize>(
    g: &[Q2KPacked],
    ys: [&[BlockQ8K]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let ys = ys[0];
    let z = 0x80;
    // SAFETY: this function's features (AVX2, FMA, F16C); rows of the group's arrays, four
    // values of the token's 256 and two of its sixteen sums (the whole body).
    unsafe {
        let byte = [
            word_shuffle([0, z, 0, z]),
            word_shuffle([1, z, 1, z]),
            word_shuffle([2, z, 2, z]),
            word_shuffle([3, z, 3, z]),
        ];
        let pair = [word_shuffle([0, z, 1, z]), word_shuffle([2, z, 3, z])];
        let (m03, m0f) = (_mm256_set1_epi8(0x03), _mm256_set1_epi32(0x000F_000F));
        let mut main = [_mm256_setzero_ps(); 2];
        let mut mins = [_mm256_setzero_ps(); 2];
        for (b, g) in g.iter().enumerate() {
            let y = ys[b].qs.as_ptr();
            let mut sc = [[_mm256_setzero_si256(); 4]; 2];
            for hr in 0..2 {
                for (i, sc) in sc[hr].iter_mut().enumerate() {
                    *sc = ld8(&g.sc[i], hr);
                }
            }
            let mut tot = [_mm256_setzero_si256(); 2];
            for h in 0..2 {
                prefetch_part(g, h, 2);
                for sh in 0..4 {
                    for half in 0..2 {
                        // Group 8h + 2sh + half: words k = 4 half..4 half + 4.
                        let mut part = [_mm256_setzero_si256(); 2];
                        for k in 4 * half..4 * half + 4 {
                            let a = bcast4(y.add(128 * h + 32 * sh + 4 * k));
                            for hr in 0..2 {
                                let qs = ld8(&g.qs[8 * h + k], hr);
                                let w = _mm256_and_si256(
                                    _mm256_srlv_epi32(qs, _mm256_set1_epi32(2 * sh as i32)),
                                    m03,
                                );
                                part[hr] = _mm256_add_epi16(part[hr], _mm256_maddubs_epi16(w, a));
                            }
                        }
                        let group = 8 * h + 2 * sh + half;
                        for hr in 0..2 {
                            let scale = _mm256_and_si256(
                                _mm256_shuffle_epi8(sc[hr][group / 4], byte[group % 4]),
                                m0f,
                            );
                            tot[hr] = _mm256_add_epi32(tot[hr], _mm256_madd_epi16(part[hr], scale));
                        }
                    }
                }
            }
            let bs = ys[b].bsums.as_ptr();
            let yd = _mm256_set1_ps(ys[b].d);
            for hr in 0..2 {
                let (dx, dminx) = (ld8_f16(&g.d, hr), ld8_f16(&g.dmin, hr));
                // The mins of groups 2p and 2p + 1 as an i16 pair.
                let mut m = _mm256_setzero_si256();
                for p in 0..8 {
                    let w = _mm256_shuffle_epi8(sc[hr][p / 2], pair[p % 2]);
                    let mn = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m0f);
                    m = _mm256_add_epi32(m, _mm256_madd_epi16(mn, bcast4(bs.add(2 * p))));
                }
                main[hr] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[hr]), _mm256_mul_ps(dx, yd), main[hr]);
                mins[hr] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dminx, yd), mins[hr]);
            }
        }
        for hr in 0..2 {
            store_rows8(out, at, 0, hr, _mm256_sub_ps(main[hr], mins[hr]));
        }
    }
}

/// Packed Q2_K groups (repacked order) times every token, as [`q4_k`].
///
/// # Safety
/// As [`q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k(p: &[Q2KPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    if a.len() == per_row {
        return group_passes!(p, per_row, a, out, q2_k_one, 1, [], ());
    }
    group_passes!(p, per_row, a, out, q2_k_tokens, 6, [1 2 3 4 5], ());
}

packed_format!(Q2_K_ROWS8: Q2KPacked, BlockQ8K, GgmlType::Q2_K, GgmlType::Q8_K => q2_k);

// ---------------------------------------------------------------------------------------------
// Q5_K in `vec_dot` order: the main term in eight lanes (lane `k` takes values whose index mod
// 32 is in `4k..4k + 4`, each times its sub-block's scale), fused by `d_y * d_x`; the min term
// one integer a block, fused into one running float by `-d_y * dmin_x`, added at the end:
// [`crate::x86::avx512::packed`]'s Q5_K, eight rows a register.

/// Bit `b` of each byte of `v` moved to bit 4 (the other bits cleared).
#[inline(always)]
unsafe fn bit_to_4(v: __m256i, b: u32) -> __m256i {
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        let moved = if b <= 4 {
            _mm256_sllv_epi32(v, _mm256_set1_epi32(4 - b as i32))
        } else {
            _mm256_srlv_epi32(v, _mm256_set1_epi32(b as i32 - 4))
        };
        _mm256_and_si256(moved, _mm256_set1_epi32(0x1010_1010))
    }
}

/// Rows `8hr..8hr + 8` of a Q5_K block's values `v[h]` = values `64p + 32h + 4k..+4` (one byte a
/// value, 0..32): the nibbles with their fifth bits, ready for `vpmaddubsw`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn q5_k_values(g: &Q5KPacked, hr: usize, k: usize, p: usize) -> [__m256i; 2] {
    // SAFETY: the caller's features; rows of `qs` and `qh`.
    unsafe {
        let m0f = _mm256_set1_epi8(0x0F);
        let (qs, qh) = (ld8(&g.qs[8 * p + k], hr), ld8(&g.qh[k], hr));
        [
            _mm256_or_si256(_mm256_and_si256(qs, m0f), bit_to_4(qh, 2 * p as u32)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(qs), m0f),
                bit_to_4(qh, 2 * p as u32 + 1),
            ),
        ]
    }
}

/// Every block of a group unpacked by [`q5_k_values`] into `vb` (entry `hr * blocks + b`,
/// register `8k + 2p + h`), once for all of a batch's token passes, which otherwise each
/// unpacked it again.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_k_unpack(g: &[Q5KPacked], vb: &mut Vec<[__m256i; 64]>) {
    vb.clear();
    for hr in 0..2 {
        for g in g {
            let mut v = [_mm256_setzero_si256(); 64];
            for k in 0..8 {
                for p in 0..4 {
                    // SAFETY: this function's features.
                    let [lo, hi] = unsafe { q5_k_values(g, hr, k, p) };
                    v[8 * k + 2 * p] = lo;
                    v[8 * k + 2 * p + 1] = hi;
                }
            }
            vb.push(v);
        }
    }
}

/// Rows `8hr..8hr + 8` of a Q5_K block's heads: `(scale, scale)` as i16 pairs one register a
/// sub-block, the mins as [`k_min_pairs`], `d` and `dmin` (`scale`, `pair`: [`k_controls`]).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn q5_k_heads(
    g: &Q5KPacked,
    hr: usize,
    (scale, pair): &([__m256i; 4], [__m256i; 2]),
) -> ([__m256i; 8], [__m256i; 4], __m256, __m256) {
    // SAFETY: the caller's features; rows of `sc`, `d` and `dmin`.
    unsafe {
        let [sc_lo, mn_lo, sc_hi, mn_hi] = k_scale_bytes(&g.sc, hr);
        // Loops, not `from_fn`: a closure would not share the caller's features.
        let mut scales = [_mm256_setzero_si256(); 8];
        for (j, s) in scales.iter_mut().enumerate() {
            *s = _mm256_shuffle_epi8(if j < 4 { sc_lo } else { sc_hi }, scale[j % 4]);
        }
        (
            scales,
            k_min_pairs(mn_lo, mn_hi, pair),
            ld8_f16(&g.d, hr),
            ld8_f16(&g.dmin, hr),
        )
    }
}

/// Sixteen rows (`g`, and with `UNPACKED` their values already unpacked in `vb` by
/// [`q5_k_unpack`]) times tokens `t0..t0 + T` (`ys[t]`, `pair_sums[t]`), into `out[(t0 + t) *
/// stride + r0..][..16]`, eight rows at a time. The same operations on the same integers either
/// way.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `k` and `t` index several arrays in step
unsafe fn q5_k_pass<const T: usize, const UNPACKED: bool>(
    (g, vb): (&[Q5KPacked], &[[__m256i; 64]]),
    ys: [&[BlockQ8K]; T],
    pair_sums: [&[[i16; 8]]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX2, FMA, F16C); rows of the group's arrays, four values
    // of a token's 256, its sub-block sums (the whole body).
    unsafe {
        let controls = k_controls();
        let blocks = g.len();
        for hr in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 8]; T];
            let mut mins = [_mm256_setzero_ps(); T];
            for (b, g) in g.iter().enumerate() {
                let (scales, mn, dx, dminx) = q5_k_heads(g, hr, &controls);
                let mut y = [std::ptr::null::<i8>(); T];
                let mut d = [_mm256_setzero_ps(); T];
                for t in 0..T {
                    y[t] = ys[t][b].qs.as_ptr();
                    d[t] = _mm256_mul_ps(_mm256_set1_ps(ys[t][b].d), dx);
                    let m = k_min_term(&mn, &pair_sums[t][b]);
                    let a = _mm256_mul_ps(_mm256_set1_ps(-ys[t][b].d), dminx);
                    mins[t] = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(m), mins[t]);
                }
                for k in 0..8 {
                    if hr == 0 && !UNPACKED {
                        prefetch_part(g, k, 8);
                    }
                    let mut lane = [_mm256_setzero_si256(); T];
                    for p in 0..4 {
                        let v = if UNPACKED {
                            let at = &vb[hr * blocks + b][8 * k + 2 * p..];
                            [at[0], at[1]]
                        } else {
                            q5_k_values(g, hr, k, p)
                        };
                        // v[h]: values 64p + 32h + 4k..+4, sub-block 2p + h.
                        for (h, v) in v.into_iter().enumerate() {
                            let j = 2 * p + h;
                            for t in 0..T {
                                let a = bcast4(y[t].add(32 * j + 4 * k));
                                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(v, a), scales[j]);
                                lane[t] = _mm256_add_epi32(lane[t], s);
                            }
                        }
                    }
                    for t in 0..T {
                        acc[t][k] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(lane[t]), acc[t][k]);
                    }
                }
            }
            for (t, a) in acc.iter().enumerate() {
                let v = _mm256_add_ps(hsum8(a), mins[t]);
                store_rows8(out, (stride, r0, t0), t, hr, v);
            }
        }
    }
}

/// [`q5_k_tokens`] for one token (decode), both halves of the sixteen rows in one sweep over
/// the group, as [`q4_k_one`]: each of the token's words broadcast once for the sixteen rows.
/// The same operations on the same integers, row by row, as the pass of one token; one sweep
/// reads more of the memory than two halves (measurements: docs/perf-log.md, "AVX2 one-token
/// passes: one sweep over both halves").
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `hr` indexes several arrays in step
fn q5_k_one<const T: usize>(
    g: &[Q5KPacked],
    ys: [&[BlockQ8K]; T],
    pair_sums: [&[[i16; 8]]; T],
    out: &mut [f32],
    at: (usize, usize, usize),
) {
    const { assert!(T == 1, "a pass of one token") };
    let (ys, pair_sums) = (ys[0], pair_sums[0]);
    // SAFETY: this function's features (AVX2, FMA, F16C); rows of the group's arrays, four
    // values of the token's 256, its sub-block sums (the whole body).
    unsafe {
        let controls = k_controls();
        let mut acc = [[_mm256_setzero_ps(); 8]; 2];
        let mut mins = [_mm256_setzero_ps(); 2];
        for (b, g) in g.iter().enumerate() {
            let y = ys[b].qs.as_ptr();
            let mut scales = [[_mm256_setzero_si256(); 8]; 2];
            let mut d = [_mm256_setzero_ps(); 2];
            for hr in 0..2 {
                let (mn, dx, dminx);
                (scales[hr], mn, dx, dminx) = q5_k_heads(g, hr, &controls);
                d[hr] = _mm256_mul_ps(_mm256_set1_ps(ys[b].d), dx);
                let m = k_min_term(&mn, &pair_sums[b]);
                let a = _mm256_mul_ps(_mm256_set1_ps(-ys[b].d), dminx);
                mins[hr] = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(m), mins[hr]);
            }
            for k in 0..8 {
                prefetch_part(g, k, 8);
                let mut lane = [_mm256_setzero_si256(); 2];
                for p in 0..4 {
                    let v = [q5_k_values(g, 0, k, p), q5_k_values(g, 1, k, p)];
                    for h in 0..2 {
                        // Values 64p + 32h + 4k..+4, sub-block 2p + h.
                        let j = 2 * p + h;
                        let a = bcast4(y.add(32 * j + 4 * k));
                        for hr in 0..2 {
                            let s =
                                _mm256_madd_epi16(_mm256_maddubs_epi16(v[hr][h], a), scales[hr][j]);
                            lane[hr] = _mm256_add_epi32(lane[hr], s);
                        }
                    }
                }
                fuse_halves(&mut acc, k, &d, lane);
            }
        }
        for hr in 0..2 {
            let v = _mm256_add_ps(hsum8(&acc[hr]), mins[hr]);
            store_rows8(out, at, 0, hr, v);
        }
    }
}

pass_entries!(
    "avx2,fma,f16c",
    q5_k_pass: q5_k_tokens, q5_k_tokens_unpacked, Q5KPacked, [__m256i; 64],
    (ys: [&[BlockQ8K]; T], pair_sums: [&[[i16; 8]]; T])
);

/// Packed Q5_K groups times every token, as [`q4_k`], four tokens a pass (as fast as eight, and
/// faster than the AVX2 tiles this replaces; measurements: docs/perf-log.md, "AVX2 packed:
/// tokens a pass"). More than a pass of tokens, and each group is unpacked once for all its
/// passes.
///
/// # Safety
/// As [`q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k(p: &[Q5KPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    PAIR_SUMS.with_borrow_mut(|ps| {
        pair_sums(a, ps);
        let n_tok = a.len() / per_row;
        if n_tok == 1 {
            group_passes!(p, per_row, a, out, q5_k_one, 1, [], (ps));
            return;
        }
        if n_tok <= 4 {
            group_passes!(p, per_row, a, out, q5_k_tokens, 4, [1 2 3], (ps));
            return;
        }
        UNPACKED_VALUES.with_borrow_mut(|vb| {
            unpacked_passes!(
                p, per_row, a, out,
                q5_k_unpack, vb, q5_k_tokens_unpacked,
                4, [1 2 3], (ps)
            )
        });
    });
}

packed_format!(Q5_K: Q5KPacked, BlockQ8K, GgmlType::Q5_K, GgmlType::Q8_K => q5_k);

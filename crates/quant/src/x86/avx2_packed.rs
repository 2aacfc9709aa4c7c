//! AVX2 kernels on the packed weights of [`super::avx512_packed`] (the same layout, the same
//! bytes), for CPUs without AVX-512 VNNI: AMD Zen 2 and 3, Intel client cores. There a packed
//! matrix's sixteen rows are two registers of eight i32 lanes, one row a lane, and the products
//! of four values of a row with four of a token are `vpmaddubsw` (u8 x i8, pairs added into
//! i16) into a row's two i16 halves of its lane, instead of one `vpdpbusd`.
//!
//! The formats: Q4_K, Q2_K, Q4_0 and IQ4_NL in llama.cpp's repacked order; Q3_K, Q5_K, Q6_K,
//! IQ4_XS, Q4_1, Q5_0, Q5_1 and Q8_0 in `vec_dot` order (Q8_0 since its passes caught up,
//! see [`format`]). Q2_K in `vec_dot` order (matrices whose row count is not a multiple of
//! eight) stays unpacked, as on AVX-512.
//!
//! The 4-bit values of Q4_K let the i16 halves gather a whole 32-value sub-block before
//! widening: eight `vpmaddubsw` of at most `2 * 15 * 128` each stay within `i16`. Then one
//! `vpmaddwd` by the sub-block's scale (both halves) gives the scaled i32 sum, exact as in
//! every other Q4_K kernel. The integer totals of each block and row are those of the row
//! kernels, and the float side (one fused multiply-add for the values and one for the mins, a
//! block at a time) is theirs, so each output has the row kernel's bits (tested).
//!
//! Where the CPU has AVX-VNNI (Intel client cores since Alder Lake), Q4_K's sums are
//! `vpdpbusd` into i32 lanes instead, scaled by a 32-bit multiply: 90 -> 100 GMAC/s in the
//! tilebench below (`SYNAPSE_ISA=avxvnni`), 44.5 -> 45.3 for one token (`Q4_K 2048 2048 1
//! repacked`).
//!
//! Eight rows (one register) are done at a time; for Q4_K six tokens a pass: every unpacked
//! weight register serves six tokens. AVX2 has sixteen vector registers, so some of a pass's sums
//! live in memory; six measured best (tilebench, `Q4_K 512 2048 64 repacked` at
//! `SYNAPSE_ISA=avx2`: 71, 78, 85, 87, 89 and 76 GMAC/s at 2, 3, 4, 5, 6 and 8 tokens a pass,
//! against 37 for the AVX2 tiles this replaces).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::packed_common::{
    group_passes, ld8, pair_sums, pass_entries, q3_k_acts, q6_k_acts, token_passes,
    unpacked_passes, word_shuffle_bytes, Act32, Pack32, Q3KAct, Q3KActs, Q6KAct, Tok32,
    LANES32_TILE_WEIGHTS, PAIR_SUMS, Q3K_ACTS, Q6K_ACTS, TOKS32,
};
use super::{prefetch_ahead, prefetch_part, prefetch_part_as, Ahead, Vnni256};
use crate::blocks::*;
use crate::packed::layout::{
    packed_format, IQ4NLPacked, IQ4XSPacked, PackedFormat, Q2KPacked, Q3KPairs, Q4KPacked,
    Q4_0Packed, Q4_1Packed, Q5KPacked, Q5_0Packed, Q5_1Packed, Q6KPairs, Q8_0Packed, ROWS,
};
use crate::GgmlType;

/// Whether this CPU runs these kernels: AVX2, FMA and F16C, and `SYNAPSE_ISA` allows the AVX2
/// tier.
pub(crate) fn available() -> bool {
    static HAVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAVE.get_or_init(|| {
        super::tier_allowed("avx2")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// Rows `8h..8h + 8` of sixteen f16 (bits), as floats.
#[inline(always)]
unsafe fn ld8_f16(p: &[u16; ROWS], h: usize) -> __m256 {
    // SAFETY: 16 readable bytes (h < 2); F16C (the callers' features).
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.as_ptr().add(8 * h).cast())) }
}

/// The low byte of each byte's product `a * b` (signed or unsigned alike), from two 16-bit
/// multiplies: [`super::avx512_packed`]'s `mullo_epi8` in 256 bits.
#[inline(always)]
unsafe fn mullo_epi8(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        let even = _mm256_mullo_epi16(a, b);
        let odd = _mm256_mullo_epi16(_mm256_srli_epi16::<8>(a), _mm256_srli_epi16::<8>(b));
        _mm256_or_si256(
            _mm256_and_si256(even, _mm256_set1_epi16(0x00FF)),
            _mm256_slli_epi16::<8>(odd),
        )
    }
}

/// Four bytes at `p` as one i32 in every lane.
#[inline(always)]
unsafe fn bcast4<T>(p: *const T) -> __m256i {
    // SAFETY: the caller's: 4 readable bytes at `p`.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// [`word_shuffle_bytes`] in both lanes of a register.
#[inline(always)]
unsafe fn word_shuffle(sel: [u8; 4]) -> __m256i {
    let c = word_shuffle_bytes(sel);
    // SAFETY: 16 readable bytes; AVX2 (the callers' features).
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(c.as_ptr().cast())) }
}

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
/// without AVX-VNNI ([`super::Vnni256::Evex`]).
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
/// kernels: the AVX-VNNI tier's pass of one token with `vpdpbusd`, half by half, read 66-67
/// GMAC/s hot and 67.8% of a plain read cold where this one reads 99-102 and 93.9%. On a Zen 5
/// (`SYNAPSE_ISA=avx2`): hot, a 1024 x 2048 matrix 69-70 -> 103-106 GMAC/s (tilebench, two
/// runs each); cold copies of an 8192 x 2048 matrix against a plain read of the same bytes
/// 72.3% -> 100.1% (`TILEBENCH_COLD=1024 TILEBENCH_SUSTAINED=0,1`, the two forms alternated);
/// the 1B-shaped Q4_K_M file's decode 0.839-0.850x the time at one thread, 0.879-0.882x at two
/// (`synapse bench --ab`, two runs each).
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
        match super::vnni256() {
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
/// EVEX one ([`super::Vnni256`]).
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

// ---------------------------------------------------------------------------------------------
// Q6_K in `vec_dot` order: eight i32 lanes a block (lane `k` takes values whose index mod 32 is
// in `4k..4k + 4`, each 4-value sum times its group's scale, and the `-32` offset through the
// token's group sums), each fused into its own float by `d_y * d_x`, the eight added at the
// end as `avx2::hsum` adds ggml's lanes: [`super::avx512_packed`]'s Q6_K, eight rows a
// register.

/// Eight rows' results `v` (rows `8h..8h + 8` of the group) for token `t0 + t` into
/// `out[(t0 + t) * stride + r0 + 8h..][..8]` (the `(stride, r0, t0)` of a pass).
#[inline(always)]
fn store_rows8(
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
    t: usize,
    h: usize,
    v: __m256,
) {
    let o = &mut out[(t0 + t) * stride + r0 + 8 * h..][..8];
    // SAFETY: 8 writable floats; AVX (the callers' features).
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
}

/// Each token's eight float lanes added as ggml adds them ([`hsum8`]), into rows `8h..8h + 8`
/// of its group in `out` ([`store_rows8`]).
#[inline(always)]
fn store_tokens8<const T: usize>(
    out: &mut [f32],
    at: (usize, usize, usize),
    h: usize,
    acc: &[[__m256; 8]; T],
) {
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: AVX (the callers' features).
        store_rows8(out, at, t, h, unsafe { hsum8(a) });
    }
}

/// A one-token pass's lane `l` of both eight-row halves: each half's exact integer sums
/// (`lane[hr]`) fused into its float lane by `d[hr]`, as `vec_dot` fuses a lane a block.
#[inline(always)]
fn fuse_halves(acc: &mut [[__m256; 8]; 2], l: usize, d: &[__m256; 2], lane: [__m256i; 2]) {
    for (hr, (acc, lane)) in acc.iter_mut().zip(lane).enumerate() {
        // SAFETY: AVX2 and FMA (the callers' features).
        acc[l] = unsafe { _mm256_fmadd_ps(d[hr], _mm256_cvtepi32_ps(lane), acc[l]) };
    }
}

/// A one-token pass's block scales of both eight-row halves: the rows' `d` times the token's
/// `yd`.
///
/// # Safety
/// The CPU must have AVX and F16C.
#[inline(always)]
unsafe fn halves_d(d: &[u16; ROWS], yd: f32) -> [__m256; 2] {
    // SAFETY: the caller's features; rows of `d`. (A loop, not a closure, which would not
    // share the caller's features.)
    unsafe {
        let mut both = [_mm256_setzero_ps(); 2];
        for (hr, both) in both.iter_mut().enumerate() {
            *both = _mm256_mul_ps(ld8_f16(d, hr), _mm256_set1_ps(yd));
        }
        both
    }
}

/// A one-token pass's float lanes of both halves, each half's eight added as ggml adds its
/// lanes ([`hsum8`]), into `out`.
#[inline(always)]
fn store_halves(out: &mut [f32], at: (usize, usize, usize), acc: &[[__m256; 8]; 2]) {
    for (hr, &acc) in acc.iter().enumerate() {
        store_tokens8(out, at, hr, &[acc]);
    }
}

/// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as `avx2::hsum` adds ggml's lanes.
#[inline(always)]
unsafe fn hsum8(a: &[__m256; 8]) -> __m256 {
    // SAFETY: AVX (the callers' features).
    unsafe {
        let even = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
        let odd = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
        _mm256_add_ps(even, odd)
    }
}

/// Rows `8hr..8hr + 8` of triple `τ` of a group unpacked to one byte a value (q unsigned,
/// 0..64), as [`super::avx512_packed`]'s `q6_k_triple`: the low six bits of its three words,
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
/// `out[(t0 + t) * stride + r0..][..16]`, eight rows at a time: [`super::avx512_packed`]'s
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
/// two halves' sixteen float lanes live in memory between sub-blocks (sixteen registers). On a
/// Zen 5 (`SYNAPSE_ISA=avx2`): hot, a 1024 x 2048 matrix 55.9-56.5 -> 67.3-68.5 GMAC/s
/// (tilebench, two runs each); cold copies of an 8192 x 2048 matrix against a plain read of
/// the same bytes 83.0% -> 100.6% (`TILEBENCH_COLD=1024 TILEBENCH_SUSTAINED=0,1`); decode of
/// the pure Q6_K file in 0.817x the time at one thread, the 1B-shaped Q4_K_M file's (its
/// output and some `ffn_down` and `attn_v` matrices in Q6_K) 0.905-0.923x at one thread and
/// 0.956-0.966x at two (`synapse bench --ab`).
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
/// the paired products (`q6_k_acts`), eight tokens a pass (tilebench, `Q6_K 512 2048 64` at
/// `SYNAPSE_ISA=avx2`, best of five, in `vec_dot`'s pairing: 39, 45, 49, 51, 57 and 55 GMAC/s
/// at 2, 3, 4, 6, 8 and 12 tokens a pass, against 35 for the AVX2 tiles it replaced; the
/// paired products, builds alternated on a Zen 5: `2048 2048 64` 76-88 -> 92-112, one token
/// `512 2048 1` 47 -> 56).
/// More than a pass of tokens, and each group is unpacked once for all its passes.
///
/// # Safety
/// As [`q4_k`].
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
/// integers, row by row, as the pass of one token. Cold copies of an 8192 x 2048 matrix against
/// a plain read of the same bytes, on a Zen 5 at `SYNAPSE_ISA=avx2`: half by half 59.4% ->
/// one sweep 69.8% (`TILEBENCH_COLD=1024 TILEBENCH_SUSTAINED=0,1`; decode of the IQ4_XS file at
/// that tier 1.149x the tok/s, `bench/alternate.sh`, three pairs); then, builds alternated in
/// another hour, 60-61% -> 67-68% with the nibble pairs and the token's magnitude (hot, `IQ4_XS
/// 1024 2048 1`: 46.6-48.1 -> 53.0-53.6 GMAC/s; the nibble pairs alone 50.0-50.3), decode of
/// the IQ4_XS file 1.099x (five pairs, 1.05-1.11x).
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

/// Packed IQ4_XS groups times every token, as [`q4_k`], eight tokens a pass (tilebench, `IQ4_XS
/// 512 2048 64` at `SYNAPSE_ISA=avx2`: 44.7, 49.9 and 51.0 GMAC/s at 4, 8 and 12 tokens a pass,
/// against 32.4 for the AVX2 tiles this replaces; one token 26.8 against the row kernel's 17.9).
/// More than a pass of tokens, and each group's levels are looked up once for all its passes.
///
/// # Safety
/// As [`q4_k`].
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

// ---------------------------------------------------------------------------------------------
// Q3_K in `vec_dot` order: [`super::avx512_packed`]'s Q3_K, in its paired layout
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
/// three words `[a, b, c]` ([`q3_k_words`]), as [`super::avx512_packed`]'s `q3_k_octet`: pairs
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
/// row by row, as the pass of one token. On a Zen 5 (`SYNAPSE_ISA=avx2`): hot, a 1024 x 2048
/// matrix 61.5 -> 71.9 GMAC/s (tilebench); cold copies of an 8192 x 2048 matrix against a plain
/// read of the same bytes 61.0% -> 72.0% (`TILEBENCH_COLD=1024 TILEBENCH_SUSTAINED=0,1`): still
/// bound by its vector instructions, about eleven for each eight-row word of values; decode of
/// the pure Q3_K_M file 1.20x the tokens a second at one thread (`bench/alternate.sh`, six
/// pairs, 1.19-1.28x).
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
/// bytes, eight rows a register: the form [`super::avx512_packed`]'s Q3_K batches had before
/// they took the token as the signed side, which lets EVEX fold its broadcast (VEX has no
/// broadcast operand to fold, so the form stays here).
type Q3KFolded = [__m256i; 72];

thread_local! {
    /// Each thread's group of Q3_K blocks folded by [`q3_k_fold`].
    static Q3K_FOLDED: RefCell<Vec<Q3KFolded>> = const { RefCell::new(Vec::new()) };
}

/// `$name`: [`q3_k`]'s batches with the AVX-VNNI tier's `vpdpbusd` (`$dpbusd`, compiled for
/// `$features`), through `$fold` and `$folded`: once with AVX-VNNI's VEX form, once with
/// AVX-512 VNNI's EVEX form of the same instruction ([`super::Vnni256`]).
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
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k(p: &[Q3KPairs], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let vnni = super::vnni256().filter(|_| a.len() > 8 * per_row);
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

// ---------------------------------------------------------------------------------------------
// Q2_K in the repacked order: [`super::avx512_packed`]'s Q2_K eight rows a register. Per block
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
/// pass of one token. Cold copies of an 8192 x 2048 matrix against a plain read of the same
/// bytes, on a Zen 5 at `SYNAPSE_ISA=avx2`: 45.9% -> 52.7% (`TILEBENCH_COLD=1024
/// TILEBENCH_SUSTAINED=0,1`); the Q2_K file's decode at that tier 1.065x the tok/s
/// (`bench/alternate.sh`, three pairs).
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

// ---------------------------------------------------------------------------------------------
// Q5_K in `vec_dot` order: the main term in eight lanes (lane `k` takes values whose index mod
// 32 is in `4k..4k + 4`, each times its sub-block's scale), fused by `d_y * d_x`; the min term
// one integer a block, fused into one running float by `-d_y * dmin_x`, added at the end:
// [`super::avx512_packed`]'s Q5_K, eight rows a register.

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
/// The same operations on the same integers, row by row, as the pass of one token. Cold copies
/// of an 8192 x 2048 matrix against a plain read of the same bytes, on a Zen 5 at
/// `SYNAPSE_ISA=avx2`: 63.6% -> 85.2% (`TILEBENCH_COLD=1024 TILEBENCH_SUSTAINED=0,1`); decode
/// of the Q5_K_M file at that tier 1.290x the tok/s (`bench/alternate.sh`, three pairs).
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

thread_local! {
    /// Each thread's group of blocks unpacked to one byte a value ([`q5_k_unpack`],
    /// [`q6_k_unpack`]), reused from call to call.
    static UNPACKED_VALUES: RefCell<Vec<[__m256i; 64]>> = const { RefCell::new(Vec::new()) };
}

/// Packed Q5_K groups times every token, as [`q4_k`], four tokens a pass (tilebench, `Q5_K 512
/// 2048 64` at `SYNAPSE_ISA=avx2`, best of five: 53.6 GMAC/s at four tokens a pass, 53.4 at
/// eight, against 32 for the AVX2 tiles this replaces). More than a pass of tokens, and each
/// group is unpacked once for all its passes.
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

// ---------------------------------------------------------------------------------------------
// The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): lane `l` of a block holds
// values `4l..4l + 4` of eight rows, as in
// [`super::avx512_packed`]. `vpmaddubsw` multiplies unsigned bytes by signed ones and
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
/// broadcast and an add a lane, had cost them a fifth of their passes' time). On a Zen 5 at
/// `SYNAPSE_ISA=avx2`, tilebench hot, with the zeros added -> without: one token of a 1024 x
/// 2048 matrix Q4_1 44.6-53.2 -> 68.4-71.2 GMAC/s, Q5_1 37.0 -> 47.0; 64 tokens of 512 x 2048
/// Q4_1 52.1 -> 62.9, Q5_1 36.2 -> 54.5; cold one-token copies of 8192 x 2048 against a plain
/// read, Q4_1 71-72% -> 90-91%, Q5_1 66% -> 81%. SmolLM2-135M Q4_1 at one thread
/// (`bench/alternate.sh`, four pairs): decode 1.157x, prefill 1.218x; the Q5_1 file's decode
/// 1.214x.
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
/// same operations on the same integers, row by row, as the pass of one token. Cold copies of
/// an 8192 x 2048 matrix against a plain read of the same bytes, on a Zen 5 at
/// `SYNAPSE_ISA=avx2` (`TILEBENCH_COLD=1024 TILEBENCH_SUSTAINED=0,1`, half by half -> both):
/// Q4_1 69.9% -> 78.7%, Q5_0 63.9% -> 73.1%, Q5_1 67.1% -> 74.3%; in the repacked order
/// ([`tokens32_rows8_one`]) Q4_0 84.1% -> 96.7%, IQ4_NL 56.1% -> 64.9%. Decode at that tier,
/// builds alternated (`bench/alternate.sh`, three pairs, one thread): the pure Q4_0 file
/// 1.219x the tok/s, Q4_1 1.114x, SmolLM2-135M Q4_1 1.036x.
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

/// Tokens a pass of [`tokens32`] and of [`tokens32_rows8`]. Six for `tokens32` (tilebench
/// `512 2048 64` at `SYNAPSE_ISA=avx2` on a Zen 5, GMAC/s at two / four / six / eight tokens a
/// pass: Q8_0 54-56 / 68-69 / 70-72 / 72, Q4_1 63-71 / 70-73 / 72-73 / 71, Q5_0 49 / 52 / 54 /
/// 53, Q5_1 57 / 60 / 60-61 / 46-62); the files' prefill with six instead of two
/// (`bench/alternate.sh`, three pairs): Q5_0 1.103x, SmolLM2-135M Q4_1 1.023x.
const TOKENS32: usize = 6;
const TOKENS32_ROWS8: usize = 8;

/// Packed 32-value groups times every token, as [`q4_k`]: in `vec_dot` order, or in the order
/// of llama.cpp's repacked gemv (`REPACKED`, Q4_0 and IQ4_NL).
///
/// # Safety
/// As [`q4_k`].
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

packed_format!(Q4_K_ROWS8: Q4KPacked, BlockQ8K, GgmlType::Q4_K, GgmlType::Q8_K => q4_k);
packed_format!(Q2_K_ROWS8: Q2KPacked, BlockQ8K, GgmlType::Q2_K, GgmlType::Q8_K => q2_k);
packed_format!(Q3_K: Q3KPairs, BlockQ8K, GgmlType::Q3_K, GgmlType::Q8_K => q3_k);
packed_format!(Q5_K: Q5KPacked, BlockQ8K, GgmlType::Q5_K, GgmlType::Q8_K => q5_k);
packed_format!(Q6_K: Q6KPairs, BlockQ8K, GgmlType::Q6_K, GgmlType::Q8_K => q6_k);
packed_format!(IQ4_XS: IQ4XSPacked, BlockQ8K, GgmlType::IQ4_XS, GgmlType::Q8_K => iq4_xs);
packed_format!(Q5_0: Q5_0Packed, BlockQ8_0, GgmlType::Q5_0, GgmlType::Q8_0 => lanes32::<Q5_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_1: Q4_1Packed, BlockQ8_1, GgmlType::Q4_1, GgmlType::Q8_1 => lanes32::<Q4_1Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q5_1: Q5_1Packed, BlockQ8_1, GgmlType::Q5_1, GgmlType::Q8_1 => lanes32::<Q5_1Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q8_0: Q8_0Packed, BlockQ8_0, GgmlType::Q8_0, GgmlType::Q8_0 => lanes32::<Q8_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0_ROWS8: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, true>, LANES32_TILE_WEIGHTS);
packed_format!(IQ4_NL_ROWS8: IQ4NLPacked, BlockQ8_0, GgmlType::IQ4_NL, GgmlType::Q8_0 => lanes32::<IQ4NLPacked, true>, LANES32_TILE_WEIGHTS);

/// The AVX2 packed format of a weight matrix of type `ty` (`repacked`: in llama.cpp's
/// repacked order), if there is one. Q8_0 was left unpacked while its packed kernels, half by
/// half and two tokens a pass, were no faster than the tiles and the row kernels; with the
/// one-token pass sweeping both halves ([`tokens32_one`]) and six tokens a pass, on a Zen 5
/// (tilebench): one token of `1024 2048` 56 GMAC/s against the row kernel's 33.5 (the tiles'
/// 44.5), cold copies of `8192 2048` at 93% of a plain read; 64 tokens of `512 2048` 70-72
/// against the tiles' 63-64. The Q8_0 file at that tier (`bench/alternate.sh`, three pairs):
/// decode 1.339x, prefill 1.146x.
pub(crate) fn format(ty: GgmlType, repacked: bool) -> Option<&'static PackedFormat> {
    match (ty, repacked) {
        (GgmlType::Q4_K, true) => Some(&Q4_K_ROWS8),
        (GgmlType::Q2_K, true) => Some(&Q2_K_ROWS8),
        (GgmlType::Q3_K, _) => Some(&Q3_K),
        (GgmlType::Q5_K, _) => Some(&Q5_K),
        (GgmlType::Q6_K, _) => Some(&Q6_K),
        (GgmlType::IQ4_XS, _) => Some(&IQ4_XS),
        (GgmlType::Q5_0, _) => Some(&Q5_0),
        (GgmlType::Q4_0, false) => Some(&Q4_0),
        (GgmlType::Q4_0, true) => Some(&Q4_0_ROWS8),
        (GgmlType::IQ4_NL, true) => Some(&IQ4_NL_ROWS8),
        (GgmlType::Q4_1, _) => Some(&Q4_1),
        (GgmlType::Q5_1, _) => Some(&Q5_1),
        (GgmlType::Q8_0, _) => Some(&Q8_0),
        _ => None,
    }
}

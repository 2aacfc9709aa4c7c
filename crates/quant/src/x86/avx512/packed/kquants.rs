//! The AVX-512 kernels of Q4_K and Q2_K (in the repacked order) and of Q5_K.

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::packed::layout::{packed_format, Q2KPacked, Q4KPacked, Q5KPacked, ROWS};
use crate::x86::avx512::packed::{
    bcast4, dpwssd, dpwssd_by, fuse_lanes, hsum8, ld_f16, mullo_epi8, store_rows, word_shuffle,
    UNPACKED_VALUES,
};
use crate::x86::packed_common::{
    group_passes, ld, nibble_or, pair_sums, pass_entries, token_passes, unpacked_passes, PAIR_SUMS,
};
use crate::x86::{prefetch_part, prefetch_part_as, Ahead};
use crate::GgmlType;

// ---------------------------------------------------------------------------------------------
// Q4_K in the repacked order.

/// The eight sub-block scales (i32 lanes) and the four pairs of mins (sub-blocks `2j`, `2j +
/// 1` as the low and high i16) of a packed Q4_K or Q5_K block (`sc`: its scale words),
/// unpacked in the lanes.
#[inline(always)]
unsafe fn k_scales(sc: &[[u32; ROWS]; 3]) -> ([__m512i; 8], [__m512i; 4]) {
    // SAFETY: AVX-512 F/BW (the callers' features); rows of `sc`.
    unsafe {
        let (s0, s1, s2) = (ld(&sc[0]), ld(&sc[1]), ld(&sc[2]));
        let (m3f, m0f, m30) = (
            _mm512_set1_epi32(0x3F3F_3F3F),
            _mm512_set1_epi32(0x0F0F_0F0F),
            _mm512_set1_epi32(0x3030_3030),
        );
        // Bytes j of these are the scale and the min of sub-blocks j (`lo`) and 4 + j (`hi`):
        // ggml's `get_scale_min_k4`, four at a time.
        let sc_lo = _mm512_and_si512(s0, m3f);
        let mn_lo = _mm512_and_si512(s1, m3f);
        let sc_hi = _mm512_or_si512(
            _mm512_and_si512(s2, m0f),
            _mm512_and_si512(_mm512_srli_epi32::<2>(s0), m30),
        );
        let mn_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(s2), m0f),
            _mm512_and_si512(_mm512_srli_epi32::<2>(s1), m30),
        );
        let z = 0x80;
        let byte = [
            word_shuffle([0, z, z, z]),
            word_shuffle([1, z, z, z]),
            word_shuffle([2, z, z, z]),
            word_shuffle([3, z, z, z]),
        ];
        let sc = std::array::from_fn(|j| {
            _mm512_shuffle_epi8(if j < 4 { sc_lo } else { sc_hi }, byte[j % 4])
        });
        let (p01, p23) = (word_shuffle([0, z, 1, z]), word_shuffle([2, z, 3, z]));
        let mins = [
            _mm512_shuffle_epi8(mn_lo, p01),
            _mm512_shuffle_epi8(mn_lo, p23),
            _mm512_shuffle_epi8(mn_hi, p01),
            _mm512_shuffle_epi8(mn_hi, p23),
        ];
        (sc, mins)
    }
}

/// A Q4_K block's sixteen rows' values `64j + 4k..+4` and `64j + 32 + 4k..+4` (the low and
/// high nibbles of word `8j + k`), one byte a value.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[inline(always)]
unsafe fn q4_k_values(g: &Q4KPacked, j: usize, k: usize) -> [__m512i; 2] {
    // SAFETY: the caller's features; a row of `qs`.
    unsafe {
        let (raw, m4) = (ld(&g.qs[8 * j + k]), _mm512_set1_epi8(0x0F));
        [
            _mm512_and_si512(raw, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4),
        ]
    }
}

/// Every block of a group unpacked by [`q4_k_values`] into `vb` (entry `2(8j + k) + i`), once
/// for all of a batch's token passes, which otherwise each unpacked it again.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_k_unpack(g: &[Q4KPacked], vb: &mut Vec<[__m512i; 64]>) {
    vb.clear();
    for g in g {
        let mut v = [_mm512_setzero_si512(); 64];
        for j in 0..4 {
            for k in 0..8 {
                // SAFETY: this function's features.
                let values = unsafe { q4_k_values(g, j, k) };
                v[2 * (8 * j + k)..][..2].copy_from_slice(&values);
            }
        }
        vb.push(v);
    }
}

/// Rows wider than this many values have [`q4_k_pass`] ask, one token at a time, for the next
/// block's token values (its Q8_K block and pair sums) while it works on a block. The pass
/// streams its weights with the hardware prefetchers alone on AMD's cores before Zen 5
/// ([`Ahead::Stream`]), and the token's values are read again by every group of sixteen rows:
/// across a wide row a group is 16 x 144 bytes a block (129 KiB at 14336 columns), enough
/// streamed weights between two uses to push the token's lines out of the first level. Rows
/// wider than 8192 read more of the memory with these requests, rows of 8192 and narrower the
/// same or less (measurements: docs/perf-log.md, "Q4_K: the next token block asked for in wide
/// rows"). Only the speed depends on them.
const WIDE_ROW: usize = 8192;

/// Sixteen rows (`g`, and with `UNPACKED` their values already unpacked in `vb`, one entry a
/// block) times tokens `t0..t0 + T` (`ys[t]`, `pair_sums[t]`), into `out[(t0 + t) * stride +
/// r0..][..16]`. The same operations on the same integers either way.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `k` and `t` index several arrays in step
unsafe fn q4_k_pass<const T: usize, const UNPACKED: bool>(
    (g, vb): (&[Q4KPacked], &[[__m512i; 64]]),
    ys: [&[BlockQ8K]; T],
    pair_sums: [&[[i16; 8]]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX-512 F/BW/VL, VNNI, AVX2, FMA, F16C); rows of the
    // group's arrays, values of a token's 256, i16 elements of its sums (the whole body).
    unsafe {
        let mut main = [_mm512_setzero_ps(); T];
        let mut mins = [_mm512_setzero_ps(); T];
        let wide = T == 1 && !UNPACKED && ys[0].len() * QK_K > WIDE_ROW;
        for (b, g) in g.iter().enumerate() {
            let mut y = [std::ptr::null::<i8>(); T];
            for t in 0..T {
                y[t] = ys[t][b].qs.as_ptr();
            }
            if wide {
                if let (Some(next), Some(sums)) = (ys[0].get(b + 1), pair_sums[0].get(b + 1)) {
                    crate::x86::prefetch_value(next);
                    crate::x86::prefetch_value(sums);
                }
            }
            let (sc, mn) = k_scales(&g.sc);
            let mut tot = [_mm512_setzero_si512(); T];
            // Sub-blocks 2j and 2j + 1 side by side: one load of the nibbles for both, and two
            // chains of `vpdpbusd` a token.
            for j in 0..4 {
                if !UNPACKED {
                    prefetch_part_as(Ahead::Stream, g, j, 4);
                }
                let mut lo = [_mm512_setzero_si512(); T];
                let mut hi = [_mm512_setzero_si512(); T];
                for k in 0..8 {
                    let [wlo, whi] = if UNPACKED {
                        let at = &vb[b][2 * (8 * j + k)..];
                        [at[0], at[1]]
                    } else {
                        q4_k_values(g, j, k)
                    };
                    for t in 0..T {
                        // Values 64j + 4k..+4 and 64j + 32 + 4k..+4 of a 256-value block.
                        let alo = bcast4(y[t].add(64 * j + 4 * k));
                        let ahi = bcast4(y[t].add(64 * j + 32 + 4 * k));
                        lo[t] = _mm512_dpbusd_epi32(lo[t], wlo, alo);
                        hi[t] = _mm512_dpbusd_epi32(hi[t], whi, ahi);
                    }
                }
                for t in 0..T {
                    let both = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo[t], sc[2 * j]),
                        _mm512_mullo_epi32(hi[t], sc[2 * j + 1]),
                    );
                    tot[t] = _mm512_add_epi32(tot[t], both);
                }
            }
            let (dx, dminx) = (ld_f16(&g.d), ld_f16(&g.dmin));
            for t in 0..T {
                let ps = &pair_sums[t][b];
                let mut m = _mm512_setzero_si512();
                for (j, &mn) in mn.iter().enumerate() {
                    m = dpwssd_by::<T, _>(m, mn, ps.as_ptr().add(2 * j));
                }
                let yd = _mm512_set1_ps(ys[t][b].d);
                main[t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[t]), _mm512_mul_ps(dx, yd), main[t]);
                mins[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dminx, yd), mins[t]);
            }
        }
        for t in 0..T {
            store_rows(out, (stride, r0, t0), t, _mm512_sub_ps(main[t], mins[t]));
        }
    }
}

pass_entries!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    q4_k_pass: q4_k_tokens, q4_k_tokens_unpacked, Q4KPacked, [__m512i; 64],
    (ys: [&[BlockQ8K]; T], pair_sums: [&[[i16; 8]]; T])
);

/// Packed Q4_K groups (`per_row` blocks each) times every token of `a`, into `out`
/// (`(n_tok, 16 * groups)`), eight tokens a pass, each unpacking the nibbles as it goes; more
/// than four passes, and each group is unpacked once for all of them. Storing and reloading
/// the unpacked group (4 KiB a block) cost more than unpacking again up to four passes on an
/// Intel core, and gained 2% at eight on a Zen 5 (docs/perf-log.md, "Small batches").
///
/// # Safety
/// The CPU must have AVX-512 F/BW/DQ/VL, AVX-512 VNNI, AVX2, FMA and F16C; `a` holds `n_tok *
/// per_row` blocks and `out` `n_tok * 16 * (p.len() / per_row)` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k(p: &[Q4KPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    PAIR_SUMS.with_borrow_mut(|ps| {
        pair_sums(a, ps);
        let n_tok = a.len() / per_row;
        if n_tok <= 32 {
            group_passes!(p, per_row, a, out, q4_k_tokens, 8, [1 2 3 4 5 6 7], (ps));
            return;
        }
        UNPACKED_VALUES.with_borrow_mut(|vb| {
            unpacked_passes!(
                p, per_row, a, out,
                q4_k_unpack, vb, q4_k_tokens_unpacked,
                8, [1 2 3 4 5 6 7], (ps)
            )
        });
    });
}

packed_format!(Q4_K_ROWS8: Q4KPacked, BlockQ8K, GgmlType::Q4_K, GgmlType::Q8_K => q4_k);

// ---------------------------------------------------------------------------------------------
// Q2_K in the repacked order: per block and row, one exact integer total of the values times
// their 16-value group's scale, and one of the group mins times the token's group sums, each
// fused into its own running float (`reference::dot::vec_dot_q2_k_q8_k_rows8`).

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`), into `out[(t0 + t) * stride +
/// r0..][..16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            [
                word_shuffle([0, z, z, z]),
                word_shuffle([1, z, z, z]),
                word_shuffle([2, z, z, z]),
                word_shuffle([3, z, z, z]),
            ],
            [word_shuffle([0, z, 1, z]), word_shuffle([2, z, 3, z])],
        )
    };
    let (m03, m0f) = (_mm512_set1_epi8(0x03), _mm512_set1_epi32(0x000F_000F));
    let mut main = [_mm512_setzero_ps(); T];
    let mut mins = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        prefetch_part_as(Ahead::Deep, g, 0, 1);
        // SAFETY: rows of `sc`.
        let sc = unsafe { [ld(&g.sc[0]), ld(&g.sc[1]), ld(&g.sc[2]), ld(&g.sc[3])] };
        // Group `g`'s scale as an i32 (an i16 pair with a zero high half).
        let scale: [__m512i; 16] = std::array::from_fn(|group| {
            _mm512_and_si512(_mm512_shuffle_epi8(sc[group / 4], byte[group % 4]), m0f)
        });
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs.as_ptr());
        let mut tot = [_mm512_setzero_si512(); T];
        let mut tot1 = [_mm512_setzero_si512(); T];
        for h in 0..2 {
            for sh in 0..4 {
                // Groups 8h + 2sh (k < 4) and 8h + 2sh + 1 (k >= 4).
                let mut part = [[_mm512_setzero_si512(); T]; 2];
                for k in 0..8 {
                    // SAFETY: a row of `qs`.
                    let qs = unsafe { ld(&g.qs[8 * h + k]) };
                    let w = _mm512_and_si512(
                        _mm512_srlv_epi32(qs, _mm512_set1_epi32(2 * sh as i32)),
                        m03,
                    );
                    for t in 0..T {
                        // SAFETY: values 128h + 32sh + 4k..+4 of the token's 256.
                        let a = unsafe { bcast4(y[t].add(128 * h + 32 * sh + 4 * k)) };
                        part[k / 4][t] = _mm512_dpbusd_epi32(part[k / 4][t], w, a);
                    }
                }
                let group = 8 * h + 2 * sh;
                for t in 0..T {
                    // Each group's sum fits an i16 (16 * 3 * 128): scaled by `vpdpwssd`.
                    // SAFETY: this function's features.
                    unsafe {
                        tot[t] = dpwssd(tot[t], part[0][t], scale[group]);
                        tot1[t] = dpwssd(tot1[t], part[1][t], scale[group + 1]);
                    }
                }
            }
        }
        for t in 0..T {
            tot[t] = _mm512_add_epi32(tot[t], tot1[t]);
        }
        // SAFETY: this function's features.
        unsafe { q2_k_fuse(g, (&ys, b), &tot, (&mut main, &mut mins), (pair, m0f)) };
    }
    for t in 0..T {
        store_rows(out, (stride, r0, t0), t, _mm512_sub_ps(main[t], mins[t]));
    }
}

/// A block's part of each token's two running floats: its values' exact total `tot[t]` fused
/// by `d_x * d_y` into `main[t]`, the group mins times the token's group sums by `dmin_x * d_y`
/// into `mins[t]` (`reference::dot::vec_dot_q2_k_q8_k_rows8`'s operations); `pair`, `m0f`:
/// the byte-pair shuffles and the nibble mask of the kernels.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI, and F16C.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `t` indexes several arrays in step
unsafe fn q2_k_fuse<const T: usize>(
    g: &Q2KPacked,
    (ys, b): (&[&[BlockQ8K]; T], usize),
    tot: &[__m512i; T],
    (main, mins): (&mut [__m512; T], &mut [__m512; T]),
    (pair, m0f): ([__m512i; 2], __m512i),
) {
    // SAFETY: the caller's features; rows of `sc`, `d`, `dmin`, and i16 elements 2p, 2p + 1 of
    // each token's bsums.
    unsafe {
        let (sc, dx, dminx) = (
            [ld(&g.sc[0]), ld(&g.sc[1]), ld(&g.sc[2]), ld(&g.sc[3])],
            ld_f16(&g.d),
            ld_f16(&g.dmin),
        );
        // The mins of groups 2p and 2p + 1 as an i16 pair.
        let mut min = [_mm512_setzero_si512(); 8];
        for (p, min) in min.iter_mut().enumerate() {
            let w = _mm512_shuffle_epi8(sc[p / 2], pair[p % 2]);
            *min = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m0f);
        }
        for t in 0..T {
            let bs = ys[t][b].bsums.as_ptr();
            let mut m = _mm512_setzero_si512();
            for (p, &mn) in min.iter().enumerate() {
                m = dpwssd_by::<T, _>(m, mn, bs.add(2 * p));
            }
            let yd = _mm512_set1_ps(ys[t][b].d);
            main[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[t]), _mm512_mul_ps(dx, yd), main[t]);
            mins[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dminx, yd), mins[t]);
        }
    }
}

/// Every block of a group with each 2-bit value times its group's 4-bit scale (at most 45, an
/// unsigned byte) into `vb`, entry `32h + 8sh + k` the values `128h + 32sh + 4k..+4` of the
/// sixteen rows, once for all of a batch's token passes: a pass then sums a block's values
/// with one `vpdpbusd` for 64 products and no scale multiply ([`q2_k_folded`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q2_k_fold(g: &[Q2KPacked], vb: &mut Vec<[__m512i; 64]>) {
    vb.clear();
    let (m03, m0f) = (_mm512_set1_epi8(0x03), _mm512_set1_epi8(0x0F));
    for g in g {
        let mut v = [_mm512_setzero_si512(); 64];
        for h in 0..2 {
            for sh in 0..4 {
                for half in 0..2 {
                    // Group 8h + 2sh + half (words k = 4 half..4 half + 4): its scale in every
                    // byte of each row's lane.
                    let group = 8 * h + 2 * sh + half;
                    // SAFETY: a row of `sc`; this function's features.
                    let sc = unsafe {
                        let pick = word_shuffle([(group % 4) as u8; 4]);
                        _mm512_and_si512(_mm512_shuffle_epi8(ld(&g.sc[group / 4]), pick), m0f)
                    };
                    for k in 4 * half..4 * half + 4 {
                        // SAFETY: a row of `qs`; this function's features.
                        v[32 * h + 8 * sh + k] = unsafe {
                            let qs = ld(&g.qs[8 * h + k]);
                            let q = _mm512_and_si512(
                                _mm512_srlv_epi32(qs, _mm512_set1_epi32(2 * sh as i32)),
                                m03,
                            );
                            mullo_epi8(q, sc)
                        };
                    }
                }
            }
        }
        vb.push(v);
    }
}

/// [`q2_k_tokens`] from a group folded by [`q2_k_fold`] (`vb`, one entry a block): each block's
/// total one `vpdpbusd` a word, the min term and the float side as there (the same integers).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `t` indexes several arrays in step
fn q2_k_folded<const T: usize>(
    (g, vb): (&[Q2KPacked], &[[__m512i; 64]]),
    ys: [&[BlockQ8K]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let z = 0x80;
    // SAFETY: this function's features.
    let pair = unsafe { [word_shuffle([0, z, 1, z]), word_shuffle([2, z, 3, z])] };
    let m0f = _mm512_set1_epi32(0x000F_000F);
    let mut main = [_mm512_setzero_ps(); T];
    let mut mins = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        let v = &vb[b];
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs.as_ptr());
        let mut tot = [_mm512_setzero_si512(); T];
        for (e, &w) in v.iter().enumerate() {
            let (h, sh, k) = (e / 32, e / 8 % 4, e % 8);
            for t in 0..T {
                // SAFETY: values 128h + 32sh + 4k..+4 of the token's 256.
                let a = unsafe { bcast4(y[t].add(128 * h + 32 * sh + 4 * k)) };
                tot[t] = _mm512_dpbusd_epi32(tot[t], w, a);
            }
        }
        // SAFETY: this function's features.
        unsafe { q2_k_fuse(g, (&ys, b), &tot, (&mut main, &mut mins), (pair, m0f)) };
    }
    for t in 0..T {
        store_rows(out, (stride, r0, t0), t, _mm512_sub_ps(main[t], mins[t]));
    }
}

/// Packed Q2_K groups (repacked order) times every token, as [`q4_k`]; more than a pass of
/// tokens, and each group is folded once for all its passes ([`q2_k_fold`]).
///
/// # Safety
/// As [`q4_k`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_k(p: &[Q2KPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    if a.len() <= 8 * per_row {
        group_passes!(p, per_row, a, out, q2_k_tokens, 8, [1 2 3 4 5 6 7], ());
        return;
    }
    UNPACKED_VALUES.with_borrow_mut(|vb| {
        unpacked_passes!(
            p, per_row, a, out,
            q2_k_fold, vb, q2_k_folded,
            8, [1 2 3 4 5 6 7], ()
        )
    });
}

packed_format!(Q2_K_ROWS8: Q2KPacked, BlockQ8K, GgmlType::Q2_K, GgmlType::Q8_K => q2_k);

// ---------------------------------------------------------------------------------------------
// Q5_K in `vec_dot` order: the main term in eight lanes (lane `l` takes values whose index mod
// 32 is in `4l..4l + 4`, each times its sub-block's scale), fused by `d_y * d_x`; the min
// term one integer a block, fused into one running float by `-d_y * dmin_x`, added at the end.

/// Bit `b` of each byte of `v` moved to bit 4 (the other bits cleared).
#[inline(always)]
unsafe fn bit_to_4(v: __m512i, b: u32) -> __m512i {
    // SAFETY: the caller's features.
    unsafe {
        let moved = if b <= 4 {
            _mm512_sllv_epi32(v, _mm512_set1_epi32(4 - b as i32))
        } else {
            _mm512_srlv_epi32(v, _mm512_set1_epi32(b as i32 - 4))
        };
        _mm512_and_si512(moved, _mm512_set1_epi32(0x1010_1010))
    }
}

/// A Q5_K block's sixteen rows' values `64p + 32h + 4k..+4`, `h` = 0 and 1 (one byte a value,
/// 0..32): the nibbles with their fifth bits, ready for `vpmaddubsw`.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
unsafe fn q5_k_values(g: &Q5KPacked, k: usize, p: usize) -> [__m512i; 2] {
    // SAFETY: the caller's features; rows of `qs` and `qh`.
    unsafe {
        let (qs, qh) = (ld(&g.qs[8 * p + k]), ld(&g.qh[k]));
        [
            nibble_or(qs, bit_to_4(qh, 2 * p as u32)),
            nibble_or(_mm512_srli_epi32::<4>(qs), bit_to_4(qh, 2 * p as u32 + 1)),
        ]
    }
}

/// Every block of a group unpacked by [`q5_k_values`] into `vb` (entry `8k + 2p + h`), once for
/// all of a batch's token passes (which otherwise each unpacked it again: a third of their
/// operations).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q5_k_unpack(g: &[Q5KPacked], vb: &mut Vec<[__m512i; 64]>) {
    vb.clear();
    for g in g {
        let mut v = [_mm512_setzero_si512(); 64];
        for k in 0..8 {
            for p in 0..4 {
                // SAFETY: this function's features.
                let [lo, hi] = unsafe { q5_k_values(g, k, p) };
                v[8 * k + 2 * p] = lo;
                v[8 * k + 2 * p + 1] = hi;
            }
        }
        vb.push(v);
    }
}

/// Sixteen rows (`g`, and with `UNPACKED` its values already unpacked in `vb`, one entry a
/// block) times tokens `t0..t0 + T` (`ys[t]`, `pair_sums[t]`), into `out[(t0 + t) * stride +
/// r0..][..16]`. The same operations on the same integers either way, and in either form of
/// the scaling (as [`q6_k_pass`]'s; each four values' sum fits an i16: |sum| <= 4 * 31 * 128):
/// `vpmaddubsw` + `vpdpwssd` by `(scale, scale)`, or, `PAIRED`, `vpdpbusd` for each of two
/// sub-blocks, their sums as the halves of a word, one `vpdpwssd` by both scales.
///
/// [`q6_k_pass`]: crate::x86::avx512::packed::kpairs
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `k` and `t` index several arrays in step
unsafe fn q5_k_pass<const T: usize, const UNPACKED: bool, const PAIRED: bool>(
    (g, vb): (&[Q5KPacked], &[[__m512i; 64]]),
    ys: [&[BlockQ8K]; T],
    pair_sums: [&[[i16; 8]]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    // SAFETY: the caller's features (AVX-512 F/BW/VL, VNNI, AVX2, FMA, F16C); rows of the
    // group's arrays, four values of a token's 256, i16 elements of its sums (the whole body).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 8]; T];
        let mut mins = [_mm512_setzero_ps(); T];
        for (b, g) in g.iter().enumerate() {
            let ((sc, mn), dx, dminx) = (k_scales(&g.sc), ld_f16(&g.d), ld_f16(&g.dmin));
            // (scale, scale) as i16 pairs, one register a sub-block; paired, (scale[2p],
            // scale[2p + 1]) in registers 0..4. A loop, not `from_fn`: a closure would not
            // share the caller's features.
            let mut scale = [_mm512_setzero_si512(); 8];
            for j in 0..if PAIRED { 4 } else { 8 } {
                let (lo, hi) = if PAIRED {
                    (sc[2 * j], sc[2 * j + 1])
                } else {
                    (sc[j], sc[j])
                };
                scale[j] = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
            }
            let mut y = [std::ptr::null::<i8>(); T];
            let mut d = [_mm512_setzero_ps(); T];
            for t in 0..T {
                y[t] = ys[t][b].qs.as_ptr();
                d[t] = _mm512_mul_ps(_mm512_set1_ps(ys[t][b].d), dx);
                let ps = &pair_sums[t][b];
                let mut m = _mm512_setzero_si512();
                for (j, &mn) in mn.iter().enumerate() {
                    m = dpwssd_by::<T, _>(m, mn, ps.as_ptr().add(2 * j));
                }
                let a = _mm512_mul_ps(_mm512_set1_ps(-ys[t][b].d), dminx);
                mins[t] = _mm512_fmadd_ps(a, _mm512_cvtepi32_ps(m), mins[t]);
            }
            for k in 0..8 {
                if !UNPACKED {
                    prefetch_part(g, k, 8);
                }
                let mut lane = [_mm512_setzero_si512(); T];
                let mut lane1 = [_mm512_setzero_si512(); T];
                for p in 0..4 {
                    let v = if UNPACKED {
                        let at = &vb[b][8 * k + 2 * p..];
                        [at[0], at[1]]
                    } else {
                        q5_k_values(g, k, p)
                    };
                    // v[h]: values 64p + 32h + 4k..+4, sub-block 2p + h.
                    if PAIRED {
                        for t in 0..T {
                            let chain = if T > 1 || p < 2 {
                                &mut lane[t]
                            } else {
                                &mut lane1[t]
                            };
                            let zero = _mm512_setzero_si512();
                            let at = 64 * p + 4 * k;
                            let s0 = _mm512_dpbusd_epi32(zero, v[0], bcast4(y[t].add(at)));
                            let s1 = _mm512_dpbusd_epi32(zero, v[1], bcast4(y[t].add(at + 32)));
                            // (s0, s1) as the halves of each word: (s0 & low16) | s1 << 16.
                            let both = _mm512_ternarylogic_epi32::<0xEA>(
                                s0,
                                _mm512_set1_epi32(0xFFFF),
                                _mm512_slli_epi32::<16>(s1),
                            );
                            *chain = dpwssd(*chain, both, scale[p]);
                        }
                    } else {
                        for (h, v) in v.into_iter().enumerate() {
                            let j = 2 * p + h;
                            for t in 0..T {
                                let chain = if T > 1 || p < 2 {
                                    &mut lane[t]
                                } else {
                                    &mut lane1[t]
                                };
                                let a = bcast4(y[t].add(32 * j + 4 * k));
                                *chain = dpwssd(*chain, _mm512_maddubs_epi16(v, a), scale[j]);
                            }
                        }
                    }
                }
                fuse_lanes(&mut acc, k, &d, &lane, &lane1);
            }
        }
        for (t, a) in acc.iter().enumerate() {
            let v = _mm512_add_ps(hsum8(a), mins[t]);
            store_rows(out, (stride, r0, t0), t, v);
        }
    }
}

pass_entries!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    q5_k_pass<false>: q5_k_tokens, q5_k_tokens_unpacked, Q5KPacked, [__m512i; 64],
    (ys: [&[BlockQ8K]; T], pair_sums: [&[[i16; 8]]; T])
);

pass_entries!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    q5_k_pass<true>: q5_k_paired, q5_k_paired_unpacked, Q5KPacked, [__m512i; 64],
    (ys: [&[BlockQ8K]; T], pair_sums: [&[[i16; 8]]; T])
);

/// Whether Q5_K's passes take the paired form of the scaling ([`q5_k_pass`]; three multiplies,
/// a shift and a `vpternlogd` for 128 products, where the plain form takes four multiplies):
/// on AMD's cores, whose shift and logic pipes are not the multipliers' (a Zen 5 issues two
/// 512-bit multiplies a cycle and four 512-bit adds), where the paired form ran faster
/// (measurements: docs/perf-log.md, "AVX-512 packed K-quants and IQ4_XS"). Elsewhere the plain
/// form, the one measured before: the shift and the logic operation may take the multipliers'
/// own port (Intel's 512-bit shifts do), where the paired form would be the slower. The kernel
/// configuration may choose (`paired`: to compare the forms, and to test the one this CPU
/// would not take); only the speed depends on it.
fn shifts_beside_multiplies() -> bool {
    crate::config().paired.unwrap_or_else(crate::x86::is_amd)
}

/// Packed Q5_K groups times every token, as [`q4_k`]. Up to eight tokens, passes of four that
/// unpack the values as they go; more, and each group is unpacked once and taken eight tokens a
/// pass, the faster (measurements: docs/perf-log.md, "AVX-512 packed K-quants and IQ4_XS").
///
/// # Safety
/// As [`q4_k`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_k(p: &[Q5KPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    PAIR_SUMS.with_borrow_mut(|ps| {
        pair_sums(a, ps);
        let n_tok = a.len() / per_row;
        let paired = shifts_beside_multiplies();
        if n_tok <= 8 {
            if paired {
                group_passes!(p, per_row, a, out, q5_k_paired, 4, [1 2 3], (ps));
            } else {
                group_passes!(p, per_row, a, out, q5_k_tokens, 4, [1 2 3], (ps));
            }
            return;
        }
        UNPACKED_VALUES.with_borrow_mut(|vb| {
            if paired {
                unpacked_passes!(
                    p, per_row, a, out,
                    q5_k_unpack, vb, q5_k_paired_unpacked,
                    8, [1 2 3 4 5 6 7], (ps)
                )
            } else {
                unpacked_passes!(
                    p, per_row, a, out,
                    q5_k_unpack, vb, q5_k_tokens_unpacked,
                    8, [1 2 3 4 5 6 7], (ps)
                )
            }
        });
    });
}

packed_format!(Q5_K: Q5KPacked, BlockQ8K, GgmlType::Q5_K, GgmlType::Q8_K => q5_k);

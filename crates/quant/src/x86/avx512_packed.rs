//! AVX-512 VNNI kernels on weights packed at load time, one weight row per i32 lane ("rows in
//! lanes"), for every batch size, one token included.
//!
//! The tiles of [`super::avx512_ktile`] and [`super::avx512_tile`] put 64 values of one row in a
//! register and dot them with one token: every (row, token, block) ends as sixteen lanes to
//! scale and reduce across the register, and the row kernels of one token are bound by those
//! instructions, well below the machine's read bandwidth. Here each group of sixteen rows is
//! stored block by block, each 4-byte word of a block as sixteen consecutive words, one per
//! row, so that one 512-bit load gives a register with the same word of the sixteen rows and a
//! `vpdpbusd` against four bytes of a token (broadcast) adds into each row's own lane, with
//! nothing to reduce. The transposition is done once, when the model is loaded (it replaced
//! rows-in-lanes kernels that transposed on every call, which a batch of 64 tokens could pay
//! for but one token could not). The packed matrix has exactly the size of the file's (each
//! block's bytes are only moved, scales and heads included), so the engine keeps one copy of
//! the weights: the packed one, and drops the mapped pages it came from (a tied token
//! embedding's lookups fault back the rows they read).
//!
//! One token then costs, per four values of sixteen rows, a load share, one to three unpacking
//! instructions and one `vpdpbusd` (Q6_K: two `vpmaddubsw`, an add and one `vpdpwssd` for
//! eight values): several times the read bandwidth of a core, so that decode runs at the speed
//! of memory. A batch shares the
//! unpacked registers between the tokens of a pass.
//!
//! The formats: Q4_K, Q2_K, Q4_0 and IQ4_NL in llama.cpp's repacked order (one exact integer total
//! per block and row, one fused multiply-add), Q3_K, Q5_K, Q6_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1
//! and Q8_0 in `vec_dot` order (ggml's eight exact integer lanes per block, each fused into its
//! own float lane, added as `avx2::hsum` adds them; the mins as each format's reference has
//! them). The float side of each is the order it had; integer sums are exact in any order, so
//! every output has the bits of the row kernels (tested), and G1, D1 and the golden logits are
//! unchanged. Q2_K is packed in the repacked order only (every Q2_K matrix whose row count is a
//! multiple of 16 is one); F16 and BF16 are packed in their own layouts, chain by chain
//! ([`super::f16`], [`super::bf16`]).
//!
//! On CPUs without AVX-512 VNNI the same packed matrices serve [`super::avx2_packed`]'s
//! kernels, eight rows a register, for the formats it has (`crate::packed` chooses by the
//! CPU).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::packed_common::{
    group_passes, ld, nibble_or, pair_sums, pass_entries, q3_k_acts, q6_k_acts, token_passes,
    unpacked_passes, word_shuffle_bytes, Act32, Pack32, Q3KAct, Q3KActs, Q6KAct, Tok32, Unpacked32,
    LANES32_TILE_WEIGHTS, PAIR_SUMS, Q3K_ACTS, Q6K_ACTS, TOKS32,
};
use super::{prefetch_ahead, prefetch_part, prefetch_part_as, Ahead};
use crate::blocks::*;
use crate::packed::layout::{
    packed_format, IQ4NLPacked, IQ4XSPacked, PackError, PackedFormat, Q2KPacked, Q3KPairs,
    Q4KPacked, Q4_0Packed, Q4_1Packed, Q5KPacked, Q5_0Packed, Q5_1Packed, Q6KPairs, Q8_0Packed,
    ROWS,
};
use crate::{GgmlType, QuantError};

/// Sixteen f16 (bits) as floats.
#[inline(always)]
unsafe fn ld_f16(p: &[u16; ROWS]) -> __m512 {
    // SAFETY: 32 readable bytes; AVX-512 F (the callers' features).
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.as_ptr().cast())) }
}

/// Four bytes of `p` as one i32 in every lane (a broadcast load).
#[inline(always)]
unsafe fn bcast4<T>(p: *const T) -> __m512i {
    // SAFETY: the caller's: 4 readable bytes at `p`.
    unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// [`word_shuffle_bytes`] in every lane of a register.
#[inline(always)]
unsafe fn word_shuffle(sel: [u8; 4]) -> __m512i {
    let c = word_shuffle_bytes(sel);
    // SAFETY: 16 readable bytes; AVX-512 F (the callers' features).
    unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(c.as_ptr().cast())) }
}

/// The low byte of each byte's product `a * b` (signed or unsigned alike: the low eight bits do
/// not depend on the sign), from two 16-bit multiplies, the even bytes and the odd.
#[inline(always)]
unsafe fn mullo_epi8(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: AVX-512 BW (the callers' features).
    unsafe {
        let even = _mm512_mullo_epi16(a, b);
        let odd = _mm512_mullo_epi16(_mm512_srli_epi16::<8>(a), _mm512_srli_epi16::<8>(b));
        _mm512_or_si512(
            _mm512_and_si512(even, _mm512_set1_epi16(0x00FF)),
            _mm512_slli_epi16::<8>(odd),
        )
    }
}

/// [`dpwssd`] by the four bytes at `b` in every lane: in a pass of several tokens (`T > 1`)
/// with the broadcast folded into the instruction's memory operand, where a register operand
/// takes a `vpbroadcastd` of its own (IQ4_XS batches, two such products a four values: 70.5 ->
/// 87.6 GMAC/s in tilebench `IQ4_XS 512 2048 64`, the IQ4_XS file's pp64 1.32x at one thread
/// and 1.34x at two, bench/alternate.sh, four pairs; Q5_K_M's and Q6_K's 1.01x, 1.03x). A
/// one-token pass keeps the register form: those passes stream their weights from memory in
/// decode, where a change of their instruction mix changed how much of the memory they read
/// on a Zen 4 (see `lanes8!`), and the fold was not measured there.
///
/// # Safety
/// Four readable bytes at `b`; the CPU must have AVX-512 F and VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd_by<const T: usize, P>(acc: __m512i, a: __m512i, b: *const P) -> __m512i {
    if T == 1 {
        // SAFETY: the caller's.
        return unsafe { dpwssd(acc, a, bcast4(b)) };
    }
    let mut acc = acc;
    // SAFETY: the caller's: four readable bytes at `b`; AVX-512 VNNI.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, dword ptr [{b}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(reg) b,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// `acc + Σ a.i16[2l + p] * b.i16[2l + p]` per i32 lane, as one `vpdpwssd`: LLVM splits the
/// intrinsic into `vpmaddwd` + `vpaddd` unless it is told the CPU runs it fast.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: AVX-512 VNNI (the callers' features); registers only.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `for $l in 0..8 { $body }`, with the eight copies written out when a pass has one token
/// (`$t == 1`): as a loop, the compiler kept a one-token pass's eight float lanes on the stack,
/// indexed by `l`, and worked out each lane's shuffle masks and prefetch lines at run time.
/// Only Q3_K's pass takes it (decode, where that pass runs: 63.5 -> 74.8 GMAC/s hot, 77-90% ->
/// 90-103% of a plain read over cold copies, the Q3_K_M file's tg32 1.157x at one thread and
/// 0.98-1.04x at two). Written out, the Q6_K, Q5_K and IQ4_XS passes ran faster hot (Q6_K 53
/// -> 60, 75 GMAC/s with their prefetch loop's tests hoisted) but streamed less of the memory
/// over cold copies (Q6_K 87-90% -> 75-78%, Q5_K 82-88% -> 52-70%), or decoded slower at two
/// threads (IQ4_XS 0.95x), on the Zen 4 (docs/perf-log.md, 2026-12-03 03:30 UTC): they keep the
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

/// Sixteen rows' results `v` for token `t0 + t` into `out[(t0 + t) * stride + r0..][..16]`
/// (the `(stride, r0, t0)` of a pass).
#[inline(always)]
fn store_rows(out: &mut [f32], (stride, r0, t0): (usize, usize, usize), t: usize, v: __m512) {
    let o = &mut out[(t0 + t) * stride + r0..][..ROWS];
    // SAFETY: 16 writable floats; AVX-512 F (the callers' features).
    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
}

/// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as `avx2::hsum` adds ggml's lanes.
#[inline(always)]
unsafe fn hsum8(a: &[__m512; 8]) -> __m512 {
    // SAFETY: AVX-512 F (the callers' features).
    unsafe {
        let even = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
        let odd = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
        _mm512_add_ps(even, odd)
    }
}

/// Each token's lane `k` of a block: its two integer chains added, converted and fused into its
/// float lane by `d[t]` (`vec_dot`'s `acc = fma(d, float(sum), acc)`, a lane at a time).
#[inline(always)]
fn fuse_lanes<const T: usize>(
    acc: &mut [[__m512; 8]; T],
    k: usize,
    d: &[__m512; T],
    lane: &[__m512i; T],
    lane1: &[__m512i; T],
) {
    for t in 0..T {
        // SAFETY: AVX-512 F (the callers' features); registers only.
        acc[t][k] = unsafe {
            let sum = _mm512_add_epi32(lane[t], lane1[t]);
            _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(sum), acc[t][k])
        };
    }
}

/// Each token's eight float lanes added as ggml adds them ([`hsum8`]), into its sixteen rows
/// of `out` ([`store_rows`]).
#[inline(always)]
fn store_tokens<const T: usize>(
    out: &mut [f32],
    at: (usize, usize, usize),
    acc: &[[__m512; 8]; T],
) {
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: AVX-512 F (the callers' features).
        store_rows(out, at, t, unsafe { hsum8(a) });
    }
}

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
/// streamed weights between two uses to push the token's lines out of the first level. Cold
/// copies against a plain read of the same bytes, on the Zen 4 EPYC (tilebench
/// `TILEBENCH_COLD=1024 TILEBENCH_SUSTAINED`, without -> with these requests, alternated in one
/// process): 4096 x 14336 (Llama 3.1 8B's `ffn_down`) 80.6 / 73.7% -> 89.0 / 87.1%, 1024 x
/// 16384 76.7% -> 86.6% (and with requests for the first five lines of the block alone, an
/// earlier form: 69.4 / 87.6 / 75.7% -> 81.8 / 94.5 / 85.1%, and 72.6 / 87.6 / 81.6% -> 89.6 /
/// 90.9 / 87.2%; docs/perf-log.md); in the engine, that
/// file's shapes in Q4_K (`synth llama-3.1-8b --layers 4 --type Q4_K_M --pure`, `--profile`,
/// three runs of each build) its `ffn_down` read at 0.965-0.975 of its `ffn_gate_up`'s rate
/// without, 1.033-1.057 with. At 8192 columns neither way led (91.2 / 88.3 / 90.4% -> 93.6 /
/// 87.9 / 87.8%), and narrower rows read less with them (2048 x 2048 98.3% -> 92.5%, 14336 x
/// 4096 87.2% -> 82.6%). The same requests gained nothing in the one-token passes of Q5_K and
/// Q6_K (which ask for their weights ahead themselves) or Q8_0 (4096 x 14336: 92.9 / 87.9% ->
/// 90.1 / 90.2%). Only the speed depends on them.
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
                    super::prefetch_value(next);
                    super::prefetch_value(sums);
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

thread_local! {
    /// Each thread's group of blocks unpacked to one byte a value ([`q2_k_fold`],
    /// [`q4_k_unpack`], [`q5_k_unpack`], [`q6_k_unpack`]), reused from call to call.
    static UNPACKED_VALUES: RefCell<Vec<[__m512i; 64]>> = const { RefCell::new(Vec::new()) };
}

/// Packed Q4_K groups (`per_row` blocks each) times every token of `a`, into `out`
/// (`(n_tok, 16 * groups)`), eight tokens a pass; more than a pass, and each group is unpacked
/// once for all its passes.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/DQ/VL, AVX-512 VNNI, AVX2, FMA and F16C; `a` holds `n_tok *
/// per_row` blocks and `out` `n_tok * 16 * (p.len() / per_row)` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k(p: &[Q4KPacked], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    PAIR_SUMS.with_borrow_mut(|ps| {
        pair_sums(a, ps);
        let n_tok = a.len() / per_row;
        if n_tok <= 8 {
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

/// Whether Q5_K's passes take the paired form of the scaling ([`q5_k_pass`]; three multiplies,
/// a shift and a `vpternlogd` for 128 products, where the plain form takes four multiplies):
/// on AMD's cores, whose shift and logic pipes are not the multipliers' (a Zen 5 issues two
/// 512-bit multiplies a cycle and four 512-bit adds; a loop of the paired form's instructions
/// ran 1.3x the plain one's products there, tilebench Q5_K 1.14-1.16x, and the Q5_K file's
/// prefill 0.87-1.00x the time at one thread and 0.90-1.03x at two, alternated in one process
/// over four runs). Elsewhere the plain form, the one
/// measured before: the shift and the logic operation may take the multipliers' own port
/// (Intel's 512-bit shifts do), where the paired form would be the slower. The kernel
/// configuration may choose (`paired`: to compare the forms, and to test the one this CPU
/// would not take); only the speed depends on it.
fn shifts_beside_multiplies() -> bool {
    crate::config().paired.unwrap_or_else(super::is_amd)
}

/// Packed Q6_K groups times every token, as [`q4_k`], the tokens' blocks first reordered for
/// the paired products ([`q6_k_acts`]): up to eight tokens in passes that unpack as they go,
/// more from each group unpacked once.
///
/// # Safety
/// As [`q4_k`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k(p: &[Q6KPairs], per_row: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let n_tok = a.len() / per_row;
    Q6K_ACTS.with_borrow_mut(|ya| {
        // SAFETY: this function's features.
        unsafe { q6_k_acts(a, ya) };
        let a = &ya[..];
        if n_tok <= 8 {
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

/// Packed Q5_K groups times every token, as [`q4_k`]. Up to eight tokens, passes of four that
/// unpack the values as they go; more, and each group is unpacked once and taken eight tokens a
/// pass (tilebench Q5_K 2048 2048 64: 124.9 GMAC/s at four a pass, 129.8 at eight).
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

// ---------------------------------------------------------------------------------------------
// Q3_K in `vec_dot` order: the eight lanes of the other K-quants, each value `q` (-4..=3: the
// two low bits and the high bit, less 4) times its 16-value group's scale less 32. A few
// tokens take two groups' four-value sums as a word's halves and scale both by one
// `vpdpwssd`, as Q6_K does ([`Q3KPairs`]); a batch folds the scales into the values once
// ([`q3_k_unpack`]: the product fits a byte) and takes one `vpdpbusd` for 64 products. The
// AVX2 kernels read the same layout.

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
            // work left the multipliers waiting (45 against 69 GMAC/s in tilebench). Passes of
            // sixteen tokens (one chain each) ran slower still (see `iq4_xs`).
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
        // Passes of eight tokens: the IQ4_XS file's prefill, passes of sixteen (one chain a
        // token) and of eight (two) alternated in one process on a Zen 5, took 0.65-0.76x the
        // time with eight; passes of four or six took 1.04-1.08x eight's. Likely why (not
        // checked with counters, which that machine lacks): eight tokens' widened blocks, 4
        // KiB a token at 2048 columns, fit its 48 KiB first-level cache; sixteen do not.
        group_passes!(p, per_row, a, out, iq4_xs_tokens, 8, [1 2 3 4 5 6 7], (y16))
    });
}

// ---------------------------------------------------------------------------------------------
// The 32-value formats in `vec_dot` order: eight float lanes a (row, token), lane `l` taking
// values `4l..4l + 4` of every block, fused by `d_x * d_y` block by block.

/// Where [`tokens32`] reads a block of sixteen rows from: the packed block itself, or its
/// lanes unpacked once per call ([`Unpacked32`]) when several passes over the tokens share
/// them.
trait Lanes32 {
    /// # Safety
    /// AVX-512 F.
    unsafe fn lane(&self, l: usize) -> __m512i;
    fn d(&self) -> &[u16; ROWS];
    fn m(&self) -> &[u16; ROWS];
    /// Ask for the bytes as far ahead of this block as its kind wants: the packed weights
    /// from memory at their format's distances ([`Pack32::AHEAD`]).
    fn ask_ahead(&self);
}

impl<P: Pack32> Lanes32 for P {
    #[inline(always)]
    unsafe fn lane(&self, l: usize) -> __m512i {
        // SAFETY: the caller's.
        unsafe { Pack32::lane(self, l) }
    }
    #[inline(always)]
    fn ask_ahead(&self) {
        prefetch_part_as(P::AHEAD, self, 0, 1);
    }
    fn d(&self) -> &[u16; ROWS] {
        Pack32::d(self)
    }
    fn m(&self) -> &[u16; ROWS] {
        Pack32::m(self)
    }
}

impl Lanes32 for Unpacked32 {
    #[inline(always)]
    unsafe fn lane(&self, l: usize) -> __m512i {
        // SAFETY: a row of `q`; the caller's features.
        unsafe { _mm512_load_si512(self.q[l].as_ptr().cast()) }
    }
    fn d(&self) -> &[u16; ROWS] {
        &self.d
    }
    fn m(&self) -> &[u16; ROWS] {
        &self.m
    }
    #[inline(always)]
    fn ask_ahead(&self) {
        prefetch_ahead(self);
    }
}

/// Passes over the tokens from which a group's lanes are unpacked once per call rather than
/// once per pass: at two passes (four to six tokens, a speculative pass) the store and reload
/// of the unpacked lanes cost more than unpacking twice.
const UNPACK_FROM_PASSES: usize = 3;

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`, `toks[t]`), into `out[(t0 + t) *
/// stride + r0..][..16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn tokens32<P: Pack32, L: Lanes32, const T: usize>(
    g: &[L],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let mut mins = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        g.ask_ahead();
        // SAFETY: a row of `d`.
        let dx = unsafe { ld_f16(g.d()) };
        let tk: [&Tok32; T] = std::array::from_fn(|t| &toks[t][b]);
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs().as_ptr());
        let d: [__m512; T] = std::array::from_fn(|t| _mm512_mul_ps(dx, _mm512_set1_ps(tk[t].d)));
        if P::MIN {
            // SAFETY: a row of `m`.
            let mx = unsafe { ld_f16(g.m()) };
            for t in 0..T {
                mins[t] = _mm512_fmadd_ps(mx, _mm512_set1_ps(tk[t].s), mins[t]);
            }
        }
        for l in 0..8 {
            // SAFETY: this function's features.
            let w = unsafe { g.lane(l) };
            for t in 0..T {
                // SAFETY: values 4l..4l + 4 of the token's 32.
                let a = unsafe { bcast4(y[t].add(4 * l)) };
                // Q4_1's and Q5_1's lanes start at zero, their bias being all zeros: the
                // broadcast of it took a load a lane (tilebench hot on a Zen 5, Q4_1 one token
                // 125 -> 156 GMAC/s, 64 tokens 127-132 -> 167-171; Q5_1 112 -> 116-120 and
                // 122 -> 144-166; SmolLM2-135M Q4_1's prefill 1.119x / 1.107x at one / two
                // threads, bench/alternate.sh, four pairs; its decode unchanged).
                let start = if P::OFFSET == 0 {
                    _mm512_setzero_si512()
                } else {
                    _mm512_set1_epi32(tk[t].bias[l])
                };
                let s = _mm512_dpbusd_epi32(start, w, a);
                acc[t][l] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(s), acc[t][l]);
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: this function's features.
        let mut v = unsafe { hsum8(a) };
        if P::MIN {
            v = _mm512_add_ps(v, mins[t]);
        }
        store_rows(out, (stride, r0, t0), t, v);
    }
}

/// [`tokens32`] in the order of llama.cpp's repacked gemv (Q4_0, IQ4_NL): each block's exact
/// integer total fused into one running float a (row, token) by `d_x * d_y`
/// (`reference::dot::vec_dot_q4_0_q8_0_rows8`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn tokens32_rows8<P: Pack32, L: Lanes32, const T: usize>(
    g: &[L],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let mut acc = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        g.ask_ahead();
        // SAFETY: a row of `d`.
        let dx = unsafe { ld_f16(g.d()) };
        let tk: [&Tok32; T] = std::array::from_fn(|t| &toks[t][b]);
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs().as_ptr());
        // Two chains a token (even and odd lanes), added at the end.
        let mut even: [__m512i; T] = std::array::from_fn(|t| _mm512_set1_epi32(tk[t].total));
        let mut odd = [_mm512_setzero_si512(); T];
        for l in 0..8 {
            // SAFETY: this function's features.
            let w = unsafe { g.lane(l) };
            for t in 0..T {
                // SAFETY: values 4l..4l + 4 of the token's 32.
                let a = unsafe { bcast4(y[t].add(4 * l)) };
                if l % 2 == 0 {
                    even[t] = _mm512_dpbusd_epi32(even[t], w, a);
                } else {
                    odd[t] = _mm512_dpbusd_epi32(odd[t], w, a);
                }
            }
        }
        for t in 0..T {
            let total = _mm512_add_epi32(even[t], odd[t]);
            let d = _mm512_mul_ps(dx, _mm512_set1_ps(tk[t].d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), d, acc[t]);
        }
    }
    for (t, &a) in acc.iter().enumerate() {
        store_rows(out, (stride, r0, t0), t, a);
    }
}

/// Packed 32-value groups times every token, as [`q4_k`]: in `vec_dot` order, or in the order
/// of llama.cpp's repacked gemv (`REPACKED`, Q4_0 and IQ4_NL).
///
/// # Safety
/// As [`q4_k`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn lanes32<P: Pack32, const REPACKED: bool>(
    p: &[P],
    per_row: usize,
    a: &[P::A],
    out: &mut [f32],
) {
    let stride = p.len() / per_row * ROWS;
    let n_tok = a.len() / per_row;
    TOKS32.with_borrow_mut(|(toks, unpacked)| {
        toks.clear();
        toks.extend(a.iter().map(|y| {
            // SAFETY: 32 readable bytes; this function's features.
            let q = unsafe { _mm256_loadu_si256(y.qs().as_ptr().cast()) };
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
            // SAFETY: this function's features.
            unsafe { Tok32::new(y, sums, P::OFFSET) }
        }));
        let per_pass = if REPACKED { TOKENS32_ROWS8 } else { TOKENS32 };
        let unpack = n_tok.div_ceil(per_pass) >= UNPACK_FROM_PASSES;
        if unpack && unpacked.len() < per_row {
            let zero = Unpacked32 {
                q: [[0; ROWS]; 8],
                d: [0; ROWS],
                m: [0; ROWS],
            };
            unpacked.resize(per_row, zero);
        }
        for (gi, g) in p.chunks_exact(per_row).enumerate() {
            let tok = |t: usize| &a[t * per_row..][..per_row];
            let tk = |t: usize| &toks[t * per_row..][..per_row];
            if unpack {
                for (u, g) in unpacked.iter_mut().zip(g) {
                    for (l, q) in u.q.iter_mut().enumerate() {
                        // SAFETY: 64 writable, aligned bytes; this function's features.
                        unsafe { _mm512_store_si512(q.as_mut_ptr().cast(), Pack32::lane(g, l)) };
                    }
                    u.d = *Pack32::d(g);
                    u.m = *Pack32::m(g);
                }
            }
            macro_rules! pass {
                ($n:expr, $t0:expr) => {{
                    let ys = std::array::from_fn(|t| tok($t0 + t));
                    let tks = std::array::from_fn(|t| tk($t0 + t));
                    let at = (stride, ROWS * gi, $t0);
                    match (unpack, REPACKED) {
                        (true, false) => tokens32::<P, Unpacked32, { $n }>(
                            &unpacked[..per_row],
                            ys,
                            tks,
                            out,
                            at,
                        ),
                        (false, false) => tokens32::<P, P, { $n }>(g, ys, tks, out, at),
                        (true, true) => tokens32_rows8::<P, Unpacked32, { $n }>(
                            &unpacked[..per_row],
                            ys,
                            tks,
                            out,
                            at,
                        ),
                        (false, true) => tokens32_rows8::<P, P, { $n }>(g, ys, tks, out, at),
                    }
                }};
            }
            if REPACKED {
                token_passes!(n_tok, pass, TOKENS32_ROWS8, [1 2 3 4 5 6 7]);
            } else {
                token_passes!(n_tok, pass, TOKENS32, [1 2]);
            }
        }
    });
}

/// Tokens per pass over a group's 32-value blocks (eight float lanes each).
const TOKENS32: usize = 3;
/// Tokens per pass in the repacked order (one float a token).
const TOKENS32_ROWS8: usize = 8;

// ---------------------------------------------------------------------------------------------
// Entries.

packed_format!(Q4_K_ROWS8: Q4KPacked, BlockQ8K, GgmlType::Q4_K, GgmlType::Q8_K => q4_k);
// IQ4_XS widens every token's values to i16 once a call (`iq4_xs`): calls of 256 rows where a
// row has 2048 columns spread that over more (tilebench IQ4_XS at 64 tokens by 2048 columns:
// 82.5, 87.5, 90.3 and 91.9 GMAC/s at 64, 128, 256 and 512 rows; kbench, engine matmul, 2048x2048
// 75 -> 87, 8192x2048 77 -> 86). With 8192 columns the widened tokens alone are 1 MiB, and 256
// rows a call measured 5% slower there than 64: the same number of weights a call, not rows.
packed_format!(
    IQ4_XS: IQ4XSPacked, BlockQ8K, GgmlType::IQ4_XS, GgmlType::Q8_K => iq4_xs, 256 * 2048
);
// Q3_K's batch calls cover 256 x 2048 weights: each call prepares every token's block (values
// interleaved, lane sums), which took much of the lane sums' gain back in calls of 64 rows
// (tilebench `TILEBENCH_IN_TILES=1 Q3_K 8192 2048 64`: 138-141 -> 152-154 GMAC/s; about 1.07x of
// the Q3_K_M file's 1.2x pp64, docs/perf-log.md).
packed_format!(Q3_K: Q3KPairs, BlockQ8K, GgmlType::Q3_K, GgmlType::Q8_K => q3_k, 256 * 2048);
packed_format!(Q5_K: Q5KPacked, BlockQ8K, GgmlType::Q5_K, GgmlType::Q8_K => q5_k);
packed_format!(Q2_K_ROWS8: Q2KPacked, BlockQ8K, GgmlType::Q2_K, GgmlType::Q8_K => q2_k);
packed_format!(Q6_K: Q6KPairs, BlockQ8K, GgmlType::Q6_K, GgmlType::Q8_K => q6_k);

packed_format!(Q8_0: Q8_0Packed, BlockQ8_0, GgmlType::Q8_0, GgmlType::Q8_0 => lanes32::<Q8_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q5_0: Q5_0Packed, BlockQ8_0, GgmlType::Q5_0, GgmlType::Q8_0 => lanes32::<Q5_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_1: Q4_1Packed, BlockQ8_1, GgmlType::Q4_1, GgmlType::Q8_1 => lanes32::<Q4_1Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0_ROWS8: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, true>, LANES32_TILE_WEIGHTS);
packed_format!(IQ4_NL_ROWS8: IQ4NLPacked, BlockQ8_0, GgmlType::IQ4_NL, GgmlType::Q8_0 => lanes32::<IQ4NLPacked, true>, LANES32_TILE_WEIGHTS);
packed_format!(Q5_1: Q5_1Packed, BlockQ8_1, GgmlType::Q5_1, GgmlType::Q8_1 => lanes32::<Q5_1Packed, false>, LANES32_TILE_WEIGHTS);

/// F16 matrices, sixteen rows a register chain by chain (`super::f16`'s packed layout: the
/// reference's 64 sums of an output each a chain of steps): batches run on it without a
/// transposition a call.
pub(crate) static F16_PACKED: PackedFormat = PackedFormat {
    pack: |w, row_bytes, groups, release| {
        float_rows(GgmlType::F16, w, row_bytes, groups)?;
        super::f16::pack_rows(w, row_bytes, groups, release).map_err(PackError::Io)
    },
    kernel: super::f16::packed_kernel,
    block_bytes: ROWS * 2,
    tile_weights: F16_TILE_WEIGHTS,
};

/// BF16 matrices, sixteen rows a register chain by chain (`super::bf16`'s packed layout), as
/// F16's.
pub(crate) static BF16_PACKED: PackedFormat = PackedFormat {
    pack: |w, row_bytes, groups, release| {
        float_rows(GgmlType::BF16, w, row_bytes, groups)?;
        super::bf16::pack_rows(w, row_bytes, groups, release).map_err(PackError::Io)
    },
    kernel: super::bf16::packed_kernel,
    block_bytes: ROWS * 2,
    tile_weights: F16_TILE_WEIGHTS,
};

/// Whether `w` holds `groups` groups of sixteen rows of `row_bytes` of a two-byte float format
/// `ty`: the float formats' packing takes rows of whole values.
fn float_rows(ty: GgmlType, w: &[u8], row_bytes: usize, groups: usize) -> Result<(), PackError> {
    if row_bytes % 2 != 0 || w.len() < groups * ROWS * row_bytes {
        return Err(PackError::Quant(QuantError::ByteLength {
            ty,
            bytes: w.len(),
        }));
    }
    Ok(())
}

/// Weights of an F16 (and BF16) batch call. Each call lays its tokens out chain by chain first
/// (a sixteenth of a pass's work per call of 1024 x 2048 weights, measured): calls of up to a
/// whole 8192 x 2048 matrix do that once a matrix.
const F16_TILE_WEIGHTS: usize = 8192 * 2048;

/// The AVX-512 VNNI packed format of a weight matrix of type `ty` (`repacked`: in llama.cpp's
/// repacked order), if there is one.
pub(crate) fn format(ty: GgmlType, repacked: bool) -> Option<&'static PackedFormat> {
    match (ty, repacked) {
        (GgmlType::Q4_K, true) => Some(&Q4_K_ROWS8),
        (GgmlType::Q2_K, true) => Some(&Q2_K_ROWS8),
        (GgmlType::Q3_K, _) => Some(&Q3_K),
        (GgmlType::IQ4_XS, _) => Some(&IQ4_XS),
        (GgmlType::Q5_K, _) => Some(&Q5_K),
        (GgmlType::Q6_K, _) => Some(&Q6_K),
        (GgmlType::Q8_0, _) => Some(&Q8_0),
        (GgmlType::Q5_0, _) => Some(&Q5_0),
        (GgmlType::Q4_0, false) => Some(&Q4_0),
        (GgmlType::Q4_0, true) => Some(&Q4_0_ROWS8),
        (GgmlType::IQ4_NL, true) => Some(&IQ4_NL_ROWS8),
        (GgmlType::Q4_1, _) => Some(&Q4_1),
        (GgmlType::Q5_1, _) => Some(&Q5_1),
        (GgmlType::F16, _) => Some(&F16_PACKED),
        (GgmlType::BF16, _) if super::bf16::has_avx512_bf16() => Some(&BF16_PACKED),
        _ => None,
    }
}

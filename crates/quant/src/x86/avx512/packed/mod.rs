//! AVX-512 VNNI kernels on weights packed at load time, one weight row per i32 lane ("rows in
//! lanes"), for every batch size, one token included.
//!
//! The tiles of [`crate::x86::avx512::ktile`] and [`crate::x86::avx512::tile`] put 64 values of one row in a
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
//! ([`crate::x86::f16`], [`crate::x86::bf16`]).
//!
//! On CPUs without AVX-512 VNNI the same packed matrices serve [`crate::x86::avx2::packed`]'s
//! kernels, eight rows a register, for the formats it has (the kernel table chooses by the
//! CPU: `crate::kernels`).

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::packed::layout::{PackError, PackedFormat, ROWS};
use crate::x86::packed_common::word_shuffle_bytes;
use crate::{GgmlType, QuantError};
pub(crate) use iq4_xs::IQ4_XS;
pub(crate) use kpairs::{Q3_K, Q6_K};
pub(crate) use kquants::{Q2_K_ROWS8, Q4_K_ROWS8, Q5_K};
pub(crate) use legacy::{IQ4_NL_ROWS8, MXFP4_ROWS8, Q4_0, Q4_0_ROWS8, Q4_1, Q5_0, Q5_1, Q8_0};

mod iq4_xs;
mod kpairs;
mod kquants;
mod legacy;

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
/// takes a `vpbroadcastd` of its own (IQ4_XS batches, two such products a four values, ran
/// faster so: docs/perf-log.md, "AVX-512 packed K-quants and IQ4_XS"). A one-token pass keeps
/// the register form: those passes stream their weights from memory in decode, where a change
/// of their instruction mix changed how much of the memory they read on a Zen 4 (see
/// `lanes8!`), and the fold was not measured there.
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

thread_local! {
    /// Each thread's group of blocks unpacked to one byte a value ([`q2_k_fold`],
    /// [`q4_k_unpack`], [`q5_k_unpack`], [`q6_k_unpack`]), reused from call to call.
    ///
    /// [`q2_k_fold`]: kquants
    /// [`q4_k_unpack`]: kquants
    /// [`q5_k_unpack`]: kquants
    /// [`q6_k_unpack`]: kpairs
    static UNPACKED_VALUES: RefCell<Vec<[__m512i; 64]>> = const { RefCell::new(Vec::new()) };
}

// ---------------------------------------------------------------------------------------------
// Entries.

/// F16 matrices, sixteen rows a register chain by chain (`crate::x86::f16`'s packed layout: the
/// reference's 64 sums of an output each a chain of steps): batches run on it without a
/// transposition a call.
pub(crate) static F16_PACKED: PackedFormat = PackedFormat {
    pack: |w, row_bytes, groups, release| {
        float_rows(GgmlType::F16, w, row_bytes, groups)?;
        crate::x86::f16::pack_rows(w, row_bytes, groups, release).map_err(PackError::Io)
    },
    kernel: crate::x86::f16::packed_kernel,
    block_bytes: ROWS * 2,
    tile_weights: F16_TILE_WEIGHTS,
};

/// BF16 matrices, sixteen rows a register chain by chain (`crate::x86::bf16`'s packed layout), as
/// F16's.
pub(crate) static BF16_PACKED: PackedFormat = PackedFormat {
    pack: |w, row_bytes, groups, release| {
        float_rows(GgmlType::BF16, w, row_bytes, groups)?;
        crate::x86::bf16::pack_rows(w, row_bytes, groups, release).map_err(PackError::Io)
    },
    kernel: crate::x86::bf16::packed_kernel,
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

/// Weights of an F16 (and BF16) batch call. Each call lays its tokens out chain by chain
/// first, a cost worth a share of a small call's work (docs/perf-log.md, "Batch calls'
/// sizes"): calls of up to a whole 8192 x 2048 matrix do that once a matrix.
const F16_TILE_WEIGHTS: usize = 8192 * 2048;

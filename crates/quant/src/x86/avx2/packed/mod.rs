//! AVX2 kernels on the packed weights of [`crate::x86::avx512::packed`] (the same layout, the same
//! bytes), for CPUs without AVX-512 VNNI: AMD Zen 2 and 3, Intel client cores. There a packed
//! matrix's sixteen rows are two registers of eight i32 lanes, one row a lane, and the products
//! of four values of a row with four of a token are `vpmaddubsw` (u8 x i8, pairs added into
//! i16) into a row's two i16 halves of its lane, instead of one `vpdpbusd`.
//!
//! The formats: Q4_K, Q2_K, Q4_0 and IQ4_NL in llama.cpp's repacked order; Q3_K, Q5_K, Q6_K,
//! IQ4_XS, Q4_1, Q5_0, Q5_1 and Q8_0 in `vec_dot` order (Q8_0 since its passes caught up:
//! docs/perf-log.md, "Which kernels the table prefers"). Q2_K in `vec_dot` order (matrices whose row count is not a multiple of
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
//! `vpdpbusd` into i32 lanes instead, scaled by a 32-bit multiply, a little faster.
//!
//! Eight rows (one register) are done at a time; for Q4_K six tokens a pass: every unpacked
//! weight register serves six tokens. AVX2 has sixteen vector registers, so some of a pass's sums
//! live in memory; six measured best of two to eight (measurements, AVX-VNNI's too:
//! docs/perf-log.md, "AVX2 packed: tokens a pass").

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::packed::layout::ROWS;
use crate::x86::packed_common::word_shuffle_bytes;
pub(crate) use iq4_xs::IQ4_XS;
pub(crate) use kpairs::{Q3_K, Q6_K};
pub(crate) use kquants::{Q2_K_ROWS8, Q4_K_ROWS8, Q5_K};
pub(crate) use legacy::{IQ4_NL_ROWS8, MXFP4_ROWS8, Q4_0, Q4_0_ROWS8, Q4_1, Q5_0, Q5_1, Q8_0};

mod iq4_xs;
mod kpairs;
mod kquants;
mod legacy;

/// Rows `8h..8h + 8` of sixteen f16 (bits), as floats.
#[inline(always)]
unsafe fn ld8_f16(p: &[u16; ROWS], h: usize) -> __m256 {
    // SAFETY: 16 readable bytes (h < 2); F16C (the callers' features).
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.as_ptr().add(8 * h).cast())) }
}

/// The low byte of each byte's product `a * b` (signed or unsigned alike), from two 16-bit
/// multiplies: [`crate::x86::avx512::packed`]'s `mullo_epi8` in 256 bits.
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

thread_local! {
    /// Each thread's group of blocks unpacked to one byte a value ([`q5_k_unpack`],
    /// [`q6_k_unpack`]), reused from call to call.
    static UNPACKED_VALUES: RefCell<Vec<[__m256i; 64]>> = const { RefCell::new(Vec::new()) };
}

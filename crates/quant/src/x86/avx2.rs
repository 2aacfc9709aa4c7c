//! AVX2 dot products for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
//!
//! Each computes exactly the reference's arithmetic ([`crate::reference::dot`]): per block, eight
//! 32-bit lanes holding the exact integer sums of values `4j..4j+4` (`vpmaddubsw` then
//! `vpmaddwd` with ones: no overflow for these formats), one fused multiply-add of the lanes by
//! `d_x * d_y` into eight float accumulators, and one horizontal sum in the reference's tree
//! order at the end. Same operations, same order: the same bits as the reference, and so as
//! llama.cpp's x86 kernels.

use std::arch::x86_64::*;

use crate::blocks::*;

/// F16 to f32 with the F16C instruction (exact, like every f16 -> f32 conversion), inline; the
/// `half` crate's conversion checks the CPU's features on every call.
#[inline]
#[target_feature(enable = "f16c")]
fn f32_of(h: half::f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

/// The 32 nibbles of a block as bytes: low nibbles (values 0..16) then high nibbles (16..32).
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; unaligned loads are allowed.
    let lo = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let hi = _mm_srli_epi16(lo, 4);
    let mask = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(_mm_and_si128(hi, mask), _mm_and_si128(lo, mask))
}

#[inline]
#[target_feature(enable = "avx2")]
fn load32(q: &[i8; 32]) -> __m256i {
    // SAFETY: `q` is 32 readable bytes; unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

/// Lane sums of unsigned `x` (0..=255, here 0..=31) times signed `y`, as floats.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes_us(x: __m256i, y: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(x, y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// Lane sums of signed `x` times signed `y`, as floats (the sign moved onto `y`).
#[inline]
#[target_feature(enable = "avx2")]
fn lanes_ss(x: __m256i, y: __m256i) -> __m256 {
    lanes_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(a: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The 5-bit values of a Q5 block as bytes, minus `offset`.
#[inline]
fn q5_bytes(qs: &[u8; 16], qh: [u8; 4], offset: i8) -> [i8; 32] {
    let h = u32::from_le_bytes(qh);
    std::array::from_fn(|j| {
        let nib = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
        (nib | (((h >> j) & 1) as u8) << 4) as i8 - offset
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d = _mm256_set1_ps(f32_of(x.d) * f32_of(y.d));
        let qx = _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8));
        acc = _mm256_fmadd_ps(d, lanes_ss(qx, load32(&y.qs)), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        mins = f32_of(x.m).mul_add(f32_of(y.s), mins);
        let d = _mm256_set1_ps(f32_of(x.d) * f32_of(y.d));
        acc = _mm256_fmadd_ps(d, lanes_us(nibbles(&x.qs), load32(&y.qs)), acc);
    }
    hsum(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d = _mm256_set1_ps(f32_of(x.d) * f32_of(y.d));
        let qx = load32(&q5_bytes(&x.qs, x.qh, 16));
        acc = _mm256_fmadd_ps(d, lanes_ss(qx, load32(&y.qs)), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        mins = f32_of(x.m).mul_add(f32_of(y.s), mins);
        let d = _mm256_set1_ps(f32_of(x.d) * f32_of(y.d));
        let qx = load32(&q5_bytes(&x.qs, x.qh, 0));
        acc = _mm256_fmadd_ps(d, lanes_us(qx, load32(&y.qs)), acc);
    }
    hsum(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d = _mm256_set1_ps(f32_of(x.d) * f32_of(y.d));
        acc = _mm256_fmadd_ps(d, lanes_ss(load32(&x.qs), load32(&y.qs)), acc);
    }
    hsum(acc)
}

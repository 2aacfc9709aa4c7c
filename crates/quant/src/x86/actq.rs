//! The activation quantizers (Q8_0, Q8_1 and Q8_K: [`crate::reference::quantize`]'s runtime
//! forms) written out in AVX2, block by block, with the reference's bits. Compiled from the
//! reference's source, each block paid scalar work the compiler left in place: a chain of
//! maxima, the search for the value of largest magnitude, the F16 conversions in software.
//! In decode they run on the calling thread between products, about one call per product.
//!
//! What keeps the bits: the largest magnitude is a maximum (the same in any order) that
//! skips NaN as the reference's does (`max(|v|, m)` keeps `m` when `|v|` is NaN); the scales
//! are the reference's scalar expressions; `nearest_int` is the same additions and masks in
//! eight lanes; Q8_0's and Q8_1's clamp then cast to `i8` is a saturating pack, Q8_K's cast
//! without a clamp below keeps each lane's low byte; F16 rounding is F16C's, which rounds to
//! nearest even as `half` does.

use std::arch::x86_64::*;

use half::f16;

use crate::blocks::*;

/// `|v|` of eight values.
#[inline(always)]
fn abs8(v: __m256) -> __m256 {
    // SAFETY: AVX (the callers' features).
    unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), v) }
}

/// The largest of eight values, none NaN.
#[inline(always)]
fn hmax8(m: __m256) -> f32 {
    // SAFETY: AVX (the callers' features).
    unsafe {
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        _mm_cvtss_f32(m)
    }
}

/// ggml's `nearest_int` of eight values (see `reference::quantize`): ties to even for
/// `|v| < 2^22`, integer operations after one addition.
#[inline(always)]
fn nearest_int8(v: __m256) -> __m256i {
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        let b = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12_582_912.0)));
        _mm256_sub_epi32(
            _mm256_and_si256(b, _mm256_set1_epi32(0x007F_FFFF)),
            _mm256_set1_epi32(0x0040_0000),
        )
    }
}

/// Thirty-two i32 lanes (four registers, in order) saturated to `i8`, in order.
#[inline(always)]
fn pack32(q: [__m256i; 4]) -> __m256i {
    // SAFETY: AVX2 (the callers' features).
    unsafe {
        // The packs work within 128-bit halves: the bytes come out in the order of the dwords
        // 0 4 1 5 2 6 3 7, which the permutation puts back.
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// `x` rounded to F16 by F16C (to nearest even), as `half::f16::from_f32`.
#[inline(always)]
fn to_f16(x: f32) -> f16 {
    // SAFETY: F16C (the callers' features).
    let bits =
        unsafe { _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x))) };
    f16::from_bits(bits as u16)
}

/// One 32-value block of Q8_0 or Q8_1: its scale `d`, its values, and their sum.
#[inline(always)]
fn q8_32(x: &[f32; QK]) -> (f32, __m256i, i32) {
    // SAFETY: AVX2 (the callers' features); 32 floats.
    unsafe {
        // Loops, not closures: a closure would not share the caller's features.
        let mut v = [_mm256_setzero_ps(); 4];
        let mut m = _mm256_setzero_ps();
        for (i, v) in v.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(x.as_ptr().add(8 * i));
            m = _mm256_max_ps(abs8(*v), m);
        }
        let amax = hmax8(m);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut q = [_mm256_setzero_si256(); 4];
        for (q, v) in q.iter_mut().zip(v) {
            *q = nearest_int8(_mm256_mul_ps(v, idv));
        }
        let q = pack32(q);
        // The sum of the (saturated) bytes: pairs, quads, then the eight lanes.
        let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(quads),
            _mm256_extracti128_si256::<1>(quads),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        (amax / 127.0, q, _mm_cvtsi128_si32(s))
    }
}

/// Q8_0 as `reference::quantize::quantize_q8_0_act`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (y, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, q, _) = q8_32(x.try_into().expect("a block"));
        y.d = to_f16(d);
        // SAFETY: 32 writable bytes.
        unsafe { _mm256_storeu_si256(y.qs.as_mut_ptr().cast(), q) };
    }
}

/// Q8_1 as `reference::quantize::quantize_q8_1_act`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (y, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, q, sum) = q8_32(x.try_into().expect("a block"));
        y.d = to_f16(d);
        y.s = to_f16(d * sum as f32);
        // SAFETY: 32 writable bytes.
        unsafe { _mm256_storeu_si256(y.qs.as_mut_ptr().cast(), q) };
    }
}

/// Q8_K as `reference::quantize::quantize_q8_k`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (y, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        // SAFETY: 256 floats; 256 + 32 writable bytes (the body).
        unsafe {
            // Loops, not closures: a closure would not share this function's features.
            let p = x.as_ptr();
            let mut m = _mm256_setzero_ps();
            for i in 0..QK_K / 8 {
                m = _mm256_max_ps(abs8(_mm256_loadu_ps(p.add(8 * i))), m);
            }
            let amax = hmax8(m);
            if amax == 0.0 {
                *y = bytemuck::Zeroable::zeroed();
                continue;
            }
            // The first value of that magnitude (the reference keeps the first).
            let target = _mm256_set1_ps(amax);
            let mut max = 0.0;
            for i in 0..QK_K / 8 {
                let a = abs8(_mm256_loadu_ps(p.add(8 * i)));
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, target));
                if hit != 0 {
                    max = x[8 * i + hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            let sv = _mm256_set1_ps(iscale);
            let (cap, low) = (_mm256_set1_epi32(127), _mm256_set1_epi32(0xFF));
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for c in 0..QK_K / 32 {
                // The reference's `min(127) as i8`: the low byte of each lane (a scale that
                // overflowed to infinity leaves lanes far below -128, which the cast wraps).
                let mut q = [_mm256_setzero_si256(); 4];
                for (i, q) in q.iter_mut().enumerate() {
                    let v = _mm256_loadu_ps(p.add(32 * c + 8 * i));
                    let n = _mm256_min_epi32(nearest_int8(_mm256_mul_ps(sv, v)), cap);
                    *q = _mm256_and_si256(n, low);
                }
                // Bytes 0..=255 pack unchanged; the permutation undoes the packs' halves.
                let w = _mm256_packus_epi16(
                    _mm256_packus_epi32(q[0], q[1]),
                    _mm256_packus_epi32(q[2], q[3]),
                );
                let bytes = _mm256_permutevar8x32_epi32(w, order);
                _mm256_storeu_si256(y.qs.as_mut_ptr().add(32 * c).cast(), bytes);
                // Groups 2c and 2c + 1 (the two halves), summed as the signed bytes stored.
                let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes);
                let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
                let h = _mm256_hadd_epi32(quads, quads);
                let h = _mm256_hadd_epi32(h, h);
                y.bsums[2 * c] = _mm256_cvtsi256_si32(h) as i16;
                y.bsums[2 * c + 1] = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(h)) as i16;
            }
            y.d = 1.0 / iscale;
        }
    }
}

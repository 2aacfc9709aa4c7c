//! ggml's F16 arithmetic in the attention heads, held in f32: which values it rounds, the
//! multiply-add that rounds once as AVX512-FP16's does, and the same in eight and sixteen
//! lanes.

/// Values of a head that ggml-cpu's F16 vector kernels (`ggml_vec_mad_f16`, `ggml_vec_scale_f16`)
/// process in native F16 arithmetic when built with AVX512-FP16 (`GGML_F16_STEP`, 128); the rest
/// of a head (its last `head_dim % 128` values) goes through their scalar tail, in f32.
pub(crate) const F16_STEP: usize = 128;

/// Whether `s` lies exactly halfway between two adjacent F16 values (F16 subnormals included).
#[inline(always)]
pub(crate) fn is_f16_tie(s: f32) -> bool {
    let bits = s.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127;
    if exp < -25 {
        return false; // below half the smallest F16 subnormal (or an f32 subnormal)
    }
    // The halfway bit: 13 places below an F16 normal's last one, lower for F16 subnormals.
    let half_bit = if exp >= -14 { 12 } else { -2 - exp } as u32;
    let m = (bits & 0x7f_ffff) | 0x80_0000;
    m & ((2 << half_bit) - 1) == 1 << half_bit
}

/// `a * b + c` for F16 values held in f32, as an f32 whose rounding to F16 is that of the exact
/// result: AVX512-FP16's `vfmadd...ph`, which rounds once. The product is exact in f32; the sum's
/// rounding error (TwoSum) matters only when the f32 sum is an F16 tie, and then moves it one f32
/// step towards the exact result.
#[inline(always)]
pub(crate) fn fma_for_f16(a: f32, b: f32, c: f32) -> f32 {
    let p = a * b;
    let s = p + c;
    let pb = s - p;
    let e = (p - (s - pb)) + (c - pb);
    if e != 0.0 && is_f16_tie(s) {
        let away = (e > 0.0) == (s > 0.0);
        return f32::from_bits(if away {
            s.to_bits() + 1
        } else {
            s.to_bits() - 1
        });
    }
    s
}

/// `q . k` of F16 values (held in f32) in the order of ggml's AVX-512 `ggml_vec_dot_f16`, which
/// accumulates in f32 on AVX512-FP16 builds too: four 16-lane accumulators over 64-value steps,
/// fused multiply-adds, the accumulators added pairwise, the lanes reduced by halves, the tail
/// in f64.
#[inline(always)]
pub(crate) fn dot_f16(q: &[f32], k: &[f32]) -> f32 {
    let n = q.len();
    let np = n & !63;
    let mut sum = crate::ops::ggml_lanes_64(np, |e| (q[e], k[e])) as f64;
    for e in np..n {
        sum += (q[e] * k[e]) as f64;
    }
    sum as f32
}

/// Every lane of `x` rounded to F16 (to nearest, ties to even) and widened back.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn round_f16_ymm(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// Nonzero in the lanes of `s` that may lie halfway between two F16 values: the halfway
/// pattern of an F16 normal in the low thirteen bits, or a magnitude below the smallest F16
/// normal (2^-14), whose halfway bit is lower (zero among them). Few sums are:
/// [`fma_for_f16_ymm`] and the AVX2 value pass take the exact path only for registers with such
/// a lane.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn may_be_f16_tie_ymm(s: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // Both tests at once on 16-bit halves: the high half keeps the exponent (below 0x3880
    // under 2^-14), the low half the low thirteen bits less the halfway pattern (zero for
    // it, never negative); `0x3880 > high` and `1 > low` in one signed 16-bit compare.
    let u = _mm256_and_si256(
        _mm256_xor_si256(_mm256_castps_si256(s), _mm256_set1_epi32(0x1000)),
        _mm256_set1_epi32(0x7f80_1fff),
    );
    _mm256_cmpgt_epi16(_mm256_set1_epi32(0x3880_0001), u)
}

/// [`fma_for_f16`] lane by lane, eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fma_for_f16_ymm(
    a: std::arch::x86_64::__m256,
    b: std::arch::x86_64::__m256,
    c: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // `a * b` is exact in f32 (F16 operands): the fused multiply-add is the sum `p + c`.
    let s = _mm256_fmadd_ps(a, b, c);
    let maybe = may_be_f16_tie_ymm(s);
    if _mm256_testz_si256(maybe, maybe) != 0 {
        return s;
    }
    let one = _mm256_set1_epi32(1);
    // The sum's rounding error (TwoSum).
    let p = _mm256_mul_ps(a, b);
    let pb = _mm256_sub_ps(s, p);
    let e = _mm256_add_ps(_mm256_sub_ps(p, _mm256_sub_ps(s, pb)), _mm256_sub_ps(c, pb));
    // is_f16_tie(s): the halfway bit of an F16 at s's exponent set, none below.
    let bits = _mm256_castps_si256(s);
    let exp = _mm256_sub_epi32(
        _mm256_and_si256(_mm256_srli_epi32::<23>(bits), _mm256_set1_epi32(0xff)),
        _mm256_set1_epi32(127),
    );
    let half_bit = _mm256_max_epi32(
        _mm256_set1_epi32(12),
        _mm256_sub_epi32(_mm256_set1_epi32(-2), exp),
    );
    let mant = _mm256_or_si256(
        _mm256_and_si256(bits, _mm256_set1_epi32(0x7f_ffff)),
        _mm256_set1_epi32(0x80_0000),
    );
    let below = _mm256_sub_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(2), half_bit), one);
    let tie = _mm256_and_si256(
        _mm256_cmpeq_epi32(
            _mm256_and_si256(mant, below),
            _mm256_sllv_epi32(one, half_bit),
        ),
        _mm256_cmpgt_epi32(exp, _mm256_set1_epi32(-26)),
    );
    let err = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_NEQ_UQ>(e, _mm256_setzero_ps()));
    let fix = _mm256_and_si256(tie, err);
    // One f32 step towards the exact sum: +1 on the bits (away from zero) when e and
    // s share a sign, -1 when their signs differ.
    let differ = _mm256_cmpgt_epi32(
        _mm256_setzero_si256(),
        _mm256_xor_si256(_mm256_castps_si256(e), bits),
    );
    let step = _mm256_or_si256(_mm256_andnot_si256(differ, one), differ);
    let fixed = _mm256_add_epi32(bits, _mm256_and_si256(fix, step));
    _mm256_castsi256_ps(fixed)
}

/// Every lane of `x` rounded to F16 (to nearest, ties to even) and widened back.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn round_f16_zmm(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    _mm512_cvtph_ps(_mm512_cvtps_ph::<
        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
    >(x))
}

/// [`fma_for_f16`] lane by lane (as `V3::mad_f16` does eight lanes), without its test for
/// ties: the sum rounded to odd. `a * b` is exact in f32 (F16 operands), so the sum rounded down
/// and up are the same f32 when it is exact and adjacent f32s when not; of those, the one with
/// an odd last bit is the sum rounded to odd, and a sum rounded to odd with at least two more
/// bits than F16 (f32 has thirteen) rounds to F16 as the exact sum does. Two multiply-adds, a
/// test and a blend: no branch, no rarely taken path to keep registers for.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn fma_for_f16_zmm(
    a: std::arch::x86_64::__m512,
    b: std::arch::x86_64::__m512,
    c: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let down = _mm512_fmadd_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(a, b, c);
    let up = _mm512_fmadd_round_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(a, b, c);
    let odd = _mm512_test_epi32_mask(_mm512_castps_si512(down), _mm512_set1_epi32(1));
    _mm512_mask_blend_ps(odd, up, down)
}

//! AVX-512 kernels with VNNI (`vpdpbusd`, `vpdpwssd`) for the hottest formats: Q4_0 (both
//! orders), Q4_1 and Q8_0 against Q8_0/Q8_1, several rows at a time; Q4_K (both orders) and Q6_K
//! against Q8_K.
//!
//! The float side is [`super::avx2`]'s, which is the reference's: eight float lanes, one fused
//! multiply-add per block (super-block), the same horizontal-sum tree. Only the exact integer
//! lanes are made differently: VNNI's dot products of four bytes fold `vpmaddubsw` + `vpmaddwd`
//! (+ add) into one instruction, and the K-quants take 64 values per 512-bit step, the two
//! 32-value halves landing in lanes 0..8 and 8..16 and folded at the end (lane `l` of both halves
//! is the reference's lane `l`). Integer sums are exact in any order: same bits.

use std::arch::x86_64::*;

use super::avx2::{f32_of, head_f16x2, hsum, hsum_i32, load32, nibbles};
use crate::blocks::*;

/// `acc + Σ_{k<4} u[4l + k] * s[4l + k]` per i32 lane: unsigned bytes times signed bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_us(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

// The 32-value formats: each block's fused multiply-add waits for the previous one's (the
// reference's order), so one row runs at the latency of that chain, not at the throughput of the
// integer work. These kernels take `R` rows at once, each with its own accumulators and exactly
// its own operations in the reference's order: `R` independent chains interleaved.

/// Lanes of `Σ (q - 8) * a` for Q4_0's nibbles `q`: `Σ q * a - Σ 8 * a`, both exact.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_0_lanes(x: &BlockQ4_0, a: __m256i) -> __m256i {
    let zero = _mm256_setzero_si256();
    _mm256_sub_epi32(
        dot_us(zero, nibbles(&x.qs), a),
        dot_us(zero, _mm256_set1_epi8(8), a),
    )
}

/// Q4_0 over `R` rows (each `y.len()` blocks long) in `vec_dot` order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn vec_dot_q4_0_q8_0_xr<const R: usize>(x: [&[BlockQ4_0]; R], y: &[BlockQ8_0]) -> [f32; R] {
    let x = x.map(|r| &r[..y.len()]);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, y) in y.iter().enumerate() {
        let (hy, a) = (head_f16x2(y), load32(&y.qs));
        for (acc, x) in acc.iter_mut().zip(x) {
            let x = &x[b];
            let d = _mm256_broadcastss_ps(_mm_mul_ps(head_f16x2(x), hy));
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q4_0_lanes(x, a)), *acc);
        }
    }
    acc.map(|a| hsum(a))
}

/// Q4_0 over `R` rows in the order of llama.cpp's repacked gemv
/// (`reference::dot::vec_dot_q4_0_q8_0_rows8`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn vec_dot_q4_0_q8_0_rows8_xr<const R: usize>(
    x: [&[BlockQ4_0]; R],
    y: &[BlockQ8_0],
) -> [f32; R] {
    let x = x.map(|r| &r[..y.len()]);
    let mut acc = [0.0f32; R];
    for (b, y) in y.iter().enumerate() {
        let (hy, a) = (head_f16x2(y), load32(&y.qs));
        for (acc, x) in acc.iter_mut().zip(x) {
            let x = &x[b];
            let d = _mm_cvtss_f32(_mm_mul_ps(head_f16x2(x), hy));
            *acc = (hsum_i32(q4_0_lanes(x, a)) as f32).mul_add(d, *acc);
        }
    }
    acc
}

/// Q4_1 over `R` rows in `vec_dot` order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn vec_dot_q4_1_q8_1_xr<const R: usize>(x: [&[BlockQ4_1]; R], y: &[BlockQ8_1]) -> [f32; R] {
    let x = x.map(|r| &r[..y.len()]);
    let mut acc = [_mm256_setzero_ps(); R];
    // Lane 1 runs the min terms: fma(m_x, s_y, mins), block by block.
    let mut mins = [_mm_setzero_ps(); R];
    for (b, y) in y.iter().enumerate() {
        let (hy, a) = (head_f16x2(y), load32(&y.qs));
        for ((acc, mins), x) in acc.iter_mut().zip(&mut mins).zip(x) {
            let x = &x[b];
            let hx = head_f16x2(x);
            *mins = _mm_fmadd_ps(hx, hy, *mins);
            let d = _mm256_broadcastss_ps(_mm_mul_ps(hx, hy));
            let lanes = dot_us(_mm256_setzero_si256(), nibbles(&x.qs), a);
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), *acc);
        }
    }
    std::array::from_fn(|r| hsum(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(mins[r])))
}

/// Q8_0 over `R` rows in `vec_dot` order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn vec_dot_q8_0_q8_0_xr<const R: usize>(x: [&[BlockQ8_0]; R], y: &[BlockQ8_0]) -> [f32; R] {
    let x = x.map(|r| &r[..y.len()]);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, y) in y.iter().enumerate() {
        let (hy, qy) = (head_f16x2(y), load32(&y.qs));
        for (acc, x) in acc.iter_mut().zip(x) {
            let x = &x[b];
            let d = _mm256_broadcastss_ps(_mm_mul_ps(head_f16x2(x), hy));
            let qx = load32(&x.qs);
            // |x| * (y with x's sign): exact for activations in -127..=127 (ggml's quantizers).
            let u = _mm256_sign_epi8(qx, qx);
            let lanes = dot_us(_mm256_setzero_si256(), u, _mm256_sign_epi8(qy, qx));
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), *acc);
        }
    }
    acc.map(|a| hsum(a))
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block as bytes (see [`k_scale_min`]),
/// unpacked four at a time in 32-bit words.
#[inline]
fn scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let sc_hi = (w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030);
    let mn_hi = ((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030);
    let join = |lo: u32, hi: u32| ((lo as u64) | ((hi as u64) << 32)).to_le_bytes();
    (join(w0 & 0x3F3F_3F3F, sc_hi), join(w1 & 0x3F3F_3F3F, mn_hi))
}

/// Lanes 0..8 plus lanes 8..16 (exact).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Per super-block of Q4_K: the eight exact main lanes and the four min lanes of the reference
/// (`reference::dot::vec_dot_q4_k_q8_k`), as [`super::avx2`]'s `q4_k_lanes`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_k_lanes(x: &BlockQ4K, y: &BlockQ8K) -> (__m256i, __m128i) {
    let (sc, mn) = scales_mins(&x.scales);
    // SAFETY: 16 readable bytes each.
    let (bs_lo, bs_hi) = unsafe {
        (
            _mm_loadu_si128(y.bsums.as_ptr().cast()),
            _mm_loadu_si128(y.bsums.as_ptr().add(8).cast()),
        )
    };
    let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mn)));
    let prod = _mm_madd_epi16(mins, _mm_hadd_epi16(bs_lo, bs_hi));
    // Scales as i16 in lanes 0..8 of a 512-bit vector; step `p` spreads scale 2p over the low
    // 16 words and scale 2p + 1 over the high 16.
    let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(sc))));
    let m4 = _mm512_set1_epi8(0x0F);
    let mut sumi = _mm512_setzero_si512();
    for p in 0..4 {
        // SAFETY: 32 and 64 readable bytes (p < 4: qs has 128 bytes, y.qs 256).
        let (q, a) = unsafe {
            (
                _mm256_loadu_si256(x.qs.as_ptr().add(32 * p).cast()),
                _mm512_loadu_si512(y.qs.as_ptr().add(64 * p).cast()),
            )
        };
        // Low nibbles: values 64p..64p + 32; high nibbles: the 32 after.
        let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4));
        let q = _mm512_and_si512(q, m4);
        let idx = _mm512_set1_epi16(2 * p as i16);
        let idx = _mm512_mask_add_epi16(idx, 0xFFFF_0000, idx, _mm512_set1_epi16(1));
        let s = _mm512_permutexvar_epi16(idx, sc16);
        // Byte pairs fit in i16: 2 * 15 * 128 < 2^15.
        sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q, a), s);
    }
    (fold(sumi), prod)
}

/// `[d_x * d_y, dmin_x * d_y, .., ..]`: a Q4_K block's two f16 scales in one conversion.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_k_scales(x: &BlockQ4K, y: &BlockQ8K) -> __m128 {
    _mm_mul_ps(head_f16x2(x), _mm_set1_ps(y.d))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let dd = q4_k_scales(x, y);
        let d = _mm256_broadcastss_ps(dd);
        // -(dmin_x * d_y) is -d_y * dmin_x exactly.
        let dmin = _mm_set1_ps(-_mm_cvtss_f32(_mm_movehdup_ps(dd)));
        let (sumi, prod) = q4_k_lanes(x, y);
        acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(prod), acc_m);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    hsum(acc) + _mm_cvtss_f32(m)
}

/// Q4_K in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q4_k_q8_k_rows8`):
/// its two running floats (main and min terms) are lanes 0 and 1 of one vector, each lane's
/// fused multiply-add the reference's.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn vec_dot_q4_k_q8_k_rows8(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let (sumi, prod) = q4_k_lanes(x, y);
        // [isum, msum, isum, msum], exact.
        let t = _mm_add_epi32(
            _mm256_castsi256_si128(sumi),
            _mm256_extracti128_si256::<1>(sumi),
        );
        let h = _mm_hadd_epi32(t, prod);
        let h = _mm_hadd_epi32(h, h);
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(h), q4_k_scales(x, y), acc);
    }
    _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let m15 = _mm512_set1_epi8(15);
    // Per 256-bit half: the mask and shift that move bits 2k..2k + 2 of qh to bits 4..6.
    let lo_hi = |a: i8, b: i8| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi8(a)),
            _mm256_set1_epi8(b),
        )
    };
    let (mask01, mask23) = (lo_hi(3, 12), lo_hi(48, -64));
    let shl01 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
    let shr23 = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        let d = y.d * f32_of(x.d);
        // SAFETY: 32 and 16 readable bytes.
        let (bsums, sc8) = unsafe {
            (
                _mm256_loadu_si256(y.bsums.as_ptr().cast()),
                _mm_loadu_si128(x.scales.as_ptr().cast()),
            )
        };
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        // 32 * (bsum[2l] * sc[2l] + bsum[2l+1] * sc[2l+1]): the -32 offset of every value.
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
        let sc16 = _mm512_castsi256_si512(sc16);
        let mut sumi = _mm512_setzero_si512();
        for h in 0..2 {
            // SAFETY: in bounds for h < 2 (ql: 128 bytes, qh: 64, qs: 256).
            let (b, qh, a01, a23) = unsafe {
                (
                    _mm512_loadu_si512(x.ql.as_ptr().add(64 * h).cast()),
                    _mm256_loadu_si256(x.qh.as_ptr().add(32 * h).cast()),
                    _mm512_loadu_si512(y.qs.as_ptr().add(128 * h).cast()),
                    _mm512_loadu_si512(y.qs.as_ptr().add(128 * h + 64).cast()),
                )
            };
            let qh = _mm512_broadcast_i64x4(qh);
            // Values 128h + 32k + l for k = 0, 1 (low nibbles) and k = 2, 3 (high nibbles).
            let hi01 = _mm512_sllv_epi16(_mm512_and_si512(qh, mask01), shl01);
            let hi23 = _mm512_srlv_epi16(_mm512_and_si512(qh, mask23), shr23);
            let q01 = _mm512_or_si512(_mm512_and_si512(b, m15), hi01);
            let q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), m15), hi23);
            // Each 16 values share a scale: group 8h + 2k (+1 for the second 16), so each
            // 128-bit lane of the product takes one scale.
            let g = 8 * h as i16;
            let group = |first: i16| {
                _mm512_set_epi64(
                    0x0001_0001_0001_0001 * (first + 3) as i64,
                    0x0001_0001_0001_0001 * (first + 3) as i64,
                    0x0001_0001_0001_0001 * (first + 2) as i64,
                    0x0001_0001_0001_0001 * (first + 2) as i64,
                    0x0001_0001_0001_0001 * (first + 1) as i64,
                    0x0001_0001_0001_0001 * (first + 1) as i64,
                    0x0001_0001_0001_0001 * first as i64,
                    0x0001_0001_0001_0001 * first as i64,
                )
            };
            let s01 = _mm512_permutexvar_epi16(group(g), sc16);
            let s23 = _mm512_permutexvar_epi16(group(g + 4), sc16);
            // q < 64: byte pairs fit in i16 (2 * 63 * 128 < 2^15).
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q01, a01), s01);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q23, a23), s23);
        }
        let sumi = _mm256_sub_epi32(fold(sumi), offset);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

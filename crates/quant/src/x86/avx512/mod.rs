//! AVX-512 kernels with VNNI (`vpdpbusd`, `vpdpwssd`) for the hottest formats: Q4_0 (both
//! orders), Q4_1 and Q8_0 against Q8_0/Q8_1, several rows at a time; Q6_K against Q8_K. (Q4_K
//! had one too, 64 values per step; once [`crate::x86::avx2`]'s Q4_K unpacked its scales without
//! scalar loops it was no faster, measured, and went.)
//!
//! The float side is [`crate::x86::avx2`]'s, which is the reference's: eight float lanes, one fused
//! multiply-add per block (super-block), the same horizontal-sum tree. Only the exact integer
//! lanes are made differently: VNNI's dot products of four bytes fold `vpmaddubsw` + `vpmaddwd`
//! (+ add) into one instruction, and Q6_K takes 64 values per 512-bit step, the two 32-value
//! halves landing in lanes 0..8 and 8..16 and folded at the end (lane `l` of both halves is the
//! reference's lane `l`). Integer sums are exact in any order: same bits.

pub mod ktile;
pub mod nl;
pub(crate) mod packed;
pub mod tile;

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::x86::avx2::{f32_of, head_f16x2, hsum, hsum_i32, load32, nibbles};
use crate::x86::prefetch_ahead;

/// The multi-row kernels of the 32-value formats, for an instruction set with a 256-bit
/// `vpdpbusd` (`$dpbusd`, under `$features`): AVX-512 VNNI (EVEX) here, AVX-VNNI (VEX) in
/// [`crate::x86::avxvnni`]. Everything else they use is AVX2.
macro_rules! vnni_row_kernels {
    ($features:literal, $dpbusd:path) => {
        /// `acc + Σ_{k<4} u[4l + k] * s[4l + k]` per i32 lane: unsigned bytes times signed bytes.
        #[inline]
        #[target_feature(enable = $features)]
        fn dot_us(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
            $dpbusd(acc, u, s)
        }

        // The 32-value formats: each block's fused multiply-add waits for the previous one's (the
        // reference's order), so one row runs at the latency of that chain, not at the throughput of the
        // integer work. These kernels take `R` rows at once, each with its own accumulators and exactly
        // its own operations in the reference's order: `R` independent chains interleaved.

        /// Lanes of `Σ (q - 8) * a` for Q4_0's nibbles `q`: `Σ q * a - Σ 8 * a`, both exact.
        #[inline]
        #[target_feature(enable = $features)]
        fn q4_0_lanes(x: &BlockQ4_0, a: __m256i) -> __m256i {
            let zero = _mm256_setzero_si256();
            _mm256_sub_epi32(
                dot_us(zero, nibbles(&x.qs), a),
                dot_us(zero, _mm256_set1_epi8(8), a),
            )
        }

        /// Q4_0 over `R` rows (each `y.len()` blocks long) in `vec_dot` order.
        #[target_feature(enable = $features)]
        pub fn vec_dot_q4_0_q8_0_xr<const R: usize>(
            x: [&[BlockQ4_0]; R],
            y: &[BlockQ8_0],
        ) -> [f32; R] {
            let x = x.map(|r| &r[..y.len()]);
            let mut acc = [_mm256_setzero_ps(); R];
            for (b, y) in y.iter().enumerate() {
                let (hy, a) = (head_f16x2(y), load32(&y.qs));
                for (acc, x) in acc.iter_mut().zip(x) {
                    let x = &x[b];
                    prefetch_ahead(x);
                    let d = _mm256_broadcastss_ps(_mm_mul_ps(head_f16x2(x), hy));
                    *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q4_0_lanes(x, a)), *acc);
                }
            }
            acc.map(|a| hsum(a))
        }

        /// Q4_0 over `R` rows in the order of llama.cpp's repacked gemv
        /// (`reference::dot::vec_dot_q4_0_q8_0_rows8`).
        #[target_feature(enable = $features)]
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
                    prefetch_ahead(x);
                    let d = _mm_cvtss_f32(_mm_mul_ps(head_f16x2(x), hy));
                    *acc = (hsum_i32(q4_0_lanes(x, a)) as f32).mul_add(d, *acc);
                }
            }
            acc
        }

        /// Q4_1 over `R` rows in `vec_dot` order.
        #[target_feature(enable = $features)]
        pub fn vec_dot_q4_1_q8_1_xr<const R: usize>(
            x: [&[BlockQ4_1]; R],
            y: &[BlockQ8_1],
        ) -> [f32; R] {
            let x = x.map(|r| &r[..y.len()]);
            let mut acc = [_mm256_setzero_ps(); R];
            // Lane 1 runs the min terms: fma(m_x, s_y, mins), block by block.
            let mut mins = [_mm_setzero_ps(); R];
            for (b, y) in y.iter().enumerate() {
                let (hy, a) = (head_f16x2(y), load32(&y.qs));
                for ((acc, mins), x) in acc.iter_mut().zip(&mut mins).zip(x) {
                    let x = &x[b];
                    prefetch_ahead(x);
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
        #[target_feature(enable = $features)]
        pub fn vec_dot_q8_0_q8_0_xr<const R: usize>(
            x: [&[BlockQ8_0]; R],
            y: &[BlockQ8_0],
        ) -> [f32; R] {
            let x = x.map(|r| &r[..y.len()]);
            let mut acc = [_mm256_setzero_ps(); R];
            for (b, y) in y.iter().enumerate() {
                let (hy, qy) = (head_f16x2(y), load32(&y.qs));
                for (acc, x) in acc.iter_mut().zip(x) {
                    let x = &x[b];
                    prefetch_ahead(x);
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
    };
}
pub(super) use vnni_row_kernels;

vnni_row_kernels!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    _mm256_dpbusd_epi32
);

/// Lanes 0..8 plus lanes 8..16 (exact).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
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
        prefetch_ahead(x);
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

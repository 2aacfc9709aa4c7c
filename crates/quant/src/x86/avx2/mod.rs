//! AVX2 dot products for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), the
//! K-quants (Q2_K..Q6_K) and IQ4_XS.
//!
//! Each computes exactly the reference's arithmetic ([`crate::reference::dot`]): per block, eight
//! 32-bit lanes holding the exact integer sums of values `4j..4j+4` (`vpmaddubsw` then
//! `vpmaddwd` with ones: no overflow for these formats), one fused multiply-add of the lanes by
//! `d_x * d_y` into eight float accumulators, and one horizontal sum in the reference's tree
//! order at the end. Same operations, same order: the same bits as the reference, and so as
//! llama.cpp's x86 kernels.

pub(crate) mod packed;
pub mod tile;

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::x86::prefetch_ahead;

/// F16 to f32, exactly (every conversion agrees), inline and in integer registers: the `half`
/// crate's default conversion checks the CPU's features on every call, and an F16C conversion
/// of a scalar compiles to a `vpinsrw` into a live vector register, which chained every block
/// of the loop through the previous block's accumulator (measured: 2.5x slower).
#[inline(always)]
pub(super) fn f32_of(h: half::f16) -> f32 {
    h.to_f32_const()
}

/// The first two F16 values of a block (its `d`, and `m` or `s` where the format has them) as
/// lanes 0 and 1 of a vector. Loads 8 bytes, so the block must be at least that long; lanes 2
/// and 3 hold whatever follows and are not used. A full-width load breaks the false dependency a
/// scalar F16C conversion suffers (see [`f32_of`]).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn head_f16x2<B>(b: &B) -> __m128 {
    const { assert!(size_of::<B>() >= 8) };
    // SAFETY: `b` is at least 8 readable bytes (asserted at compile time).
    _mm_cvtph_ps(unsafe { _mm_loadl_epi64((b as *const B).cast()) })
}

/// The 32 nibbles of a block as bytes: low nibbles (values 0..16) then high nibbles (16..32).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; unaligned loads are allowed.
    let lo = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let hi = _mm_srli_epi16(lo, 4);
    let mask = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(_mm_and_si128(hi, mask), _mm_and_si128(lo, mask))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32(q: &[i8; 32]) -> __m256i {
    // SAFETY: `q` is 32 readable bytes; unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

/// Lane sums of unsigned `x` (0..=255, here 0..=31) times signed `y`, as floats.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lanes_us(x: __m256i, y: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(x, y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// Lane sums of signed `x` times signed `y`, as floats (the sign moved onto `y`).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lanes_ss(x: __m256i, y: __m256i) -> __m256 {
    lanes_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum(a: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The 5-bit values of a Q5 block as bytes: the nibbles, plus 16 where bit `j` of `qh` is set
/// (byte `j` of the vector takes byte `j / 8` of `qh`, masked by bit `j % 8`).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q5_bytes(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(i32::from_le_bytes(qh)), spread);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
    _mm256_or_si256(nibbles(qs), _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let d = _mm256_broadcastss_ps(_mm_mul_ps(head_f16x2(x), head_f16x2(y)));
        let qx = _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8));
        acc = _mm256_fmadd_ps(d, lanes_ss(qx, load32(&y.qs)), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    // Lane 1 runs the min terms: fma(m_x, s_y, mins), block by block.
    let mut mins = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let (hx, hy) = (head_f16x2(x), head_f16x2(y));
        mins = _mm_fmadd_ps(hx, hy, mins);
        let d = _mm256_broadcastss_ps(_mm_mul_ps(hx, hy));
        acc = _mm256_fmadd_ps(d, lanes_us(nibbles(&x.qs), load32(&y.qs)), acc);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_movehdup_ps(mins))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let d = _mm256_broadcastss_ps(_mm_mul_ps(head_f16x2(x), head_f16x2(y)));
        let qx = _mm256_sub_epi8(q5_bytes(&x.qs, x.qh), _mm256_set1_epi8(16));
        acc = _mm256_fmadd_ps(d, lanes_ss(qx, load32(&y.qs)), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let (hx, hy) = (head_f16x2(x), head_f16x2(y));
        mins = _mm_fmadd_ps(hx, hy, mins);
        let d = _mm256_broadcastss_ps(_mm_mul_ps(hx, hy));
        let qx = q5_bytes(&x.qs, x.qh);
        acc = _mm256_fmadd_ps(d, lanes_us(qx, load32(&y.qs)), acc);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_movehdup_ps(mins))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let d = _mm256_broadcastss_ps(_mm_mul_ps(head_f16x2(x), head_f16x2(y)));
        acc = _mm256_fmadd_ps(d, lanes_ss(load32(&x.qs), load32(&y.qs)), acc);
    }
    hsum(acc)
}

/// Eight copies of `a` in the low half and eight of `b` in the high half, as i16.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn halves_i16(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

/// Sum of eight i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Per super-block of Q4_K: the eight exact lanes of the main term and the four of the min.
#[inline]
#[target_feature(enable = "avx2")]
fn q4_k_lanes(x: &BlockQ4K, y: &BlockQ8K) -> (__m256i, __m128i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let (sc, mn) = k_scales_mins(&x.scales);
    // SAFETY: 16 readable bytes each.
    let (bs_lo, bs_hi) = unsafe {
        (
            _mm_loadu_si128(y.bsums.as_ptr().cast()),
            _mm_loadu_si128(y.bsums.as_ptr().add(8).cast()),
        )
    };
    let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mn)));
    // bsum[2k] + bsum[2k+1]: the sums of the eight 32-value sub-blocks.
    let prod = _mm_madd_epi16(mins, _mm_hadd_epi16(bs_lo, bs_hi));
    let mut sumi = _mm256_setzero_si256();
    for j in 0..4 {
        // SAFETY: 32 readable bytes each (j < 4).
        let (q4, q8l, q8h) = unsafe {
            (
                _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()),
                _mm256_loadu_si256(y.qs.as_ptr().add(64 * j).cast()),
                _mm256_loadu_si256(y.qs.as_ptr().add(64 * j + 32).cast()),
            )
        };
        let q4l = _mm256_and_si256(q4, m4);
        let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
        let (sl, sh) = (sc[2 * j] as i16, sc[2 * j + 1] as i16);
        let pl = _mm256_madd_epi16(_mm256_set1_epi16(sl), _mm256_maddubs_epi16(q4l, q8l));
        let ph = _mm256_madd_epi16(_mm256_set1_epi16(sh), _mm256_maddubs_epi16(q4h, q8h));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
    }
    (sumi, prod)
}

/// `[d_x * d_y, dmin_x * d_y, .., ..]`: a Q4_K block's two f16 scales in one conversion.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_k_scales(x: &BlockQ4K, y: &BlockQ8K) -> __m128 {
    _mm_mul_ps(head_f16x2(x), _mm_set1_ps(y.d))
}

/// `[Σ main lanes, Σ min lanes, (the same again)]`, exact.
#[inline]
#[target_feature(enable = "avx2")]
fn totals(sumi: __m256i, prod: __m128i) -> __m128i {
    let t = _mm_add_epi32(
        _mm256_castsi256_si128(sumi),
        _mm256_extracti128_si256::<1>(sumi),
    );
    let h = _mm_hadd_epi32(t, prod);
    _mm_hadd_epi32(h, h)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
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
#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q4_k_q8_k_rows8(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = _mm_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let (sumi, prod) = q4_k_lanes(x, y);
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(totals(sumi, prod)), q4_k_scales(x, y), acc);
    }
    _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let m15 = _mm256_set1_epi8(15);
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
        // 32 * (bsum[2l] * sc[2l] + bsum[2l+1] * sc[2l+1]): the -32 offset of every value.
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, _mm256_cvtepi8_epi16(sc8)), 5);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            // SAFETY: in bounds for j < 2 (ql: 128 bytes, qh: 64, qs: 256).
            let (b1, b2, h) = unsafe {
                (
                    _mm256_loadu_si256(x.ql.as_ptr().add(64 * j).cast()),
                    _mm256_loadu_si256(x.ql.as_ptr().add(64 * j + 32).cast()),
                    _mm256_loadu_si256(x.qh.as_ptr().add(32 * j).cast()),
                )
            };
            let hi0 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(3)), 4);
            let hi1 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(12)), 2);
            let hi2 = _mm256_and_si256(h, _mm256_set1_epi8(48));
            let hi3 = _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(-64)), 2);
            let q = [
                _mm256_or_si256(_mm256_and_si256(b1, m15), hi0),
                _mm256_or_si256(_mm256_and_si256(b2, m15), hi1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15), hi2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15), hi3),
            ];
            for (k, &qk) in q.iter().enumerate() {
                // SAFETY: 32 readable bytes (128j + 32k + 32 <= 256).
                let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * j + 32 * k).cast()) };
                let g = 8 * j + 2 * k;
                let s = halves_i16(x.scales[g] as i16, x.scales[g + 1] as i16);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, _mm256_maddubs_epi16(qk, a)));
            }
        }
        sumi = _mm256_sub_epi32(sumi, offset);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let (sc, mn) = k_scales_mins(&x.scales);
        // SAFETY: 16 readable bytes each.
        let (bs_lo, bs_hi) = unsafe {
            (
                _mm_loadu_si128(y.bsums.as_ptr().cast()),
                _mm_loadu_si128(y.bsums.as_ptr().add(8).cast()),
            )
        };
        let mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mn)));
        let prod = _mm_madd_epi16(mn, _mm_hadd_epi16(bs_lo, bs_hi));
        let total = hsum_i32(_mm256_set_m128i(_mm_setzero_si128(), prod));
        // [d_x * d_y, dmin_x * d_y]; -(dmin_x * d_y) is -d_y * dmin_x exactly.
        let dd = _mm_mul_ps(head_f16x2(x), _mm_set1_ps(y.d));
        let dmin = -_mm_cvtss_f32(_mm_movehdup_ps(dd));
        mins = dmin.mul_add(total as f32, mins);
        // SAFETY: 32 readable bytes.
        let hbits = unsafe { _mm256_loadu_si256(x.qh.as_ptr().cast()) };
        let high = |bit: i32| {
            let b = _mm256_set1_epi8(1 << bit);
            _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, b), b), sixteen)
        };
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            // SAFETY: 32 readable bytes each (j < 4).
            let (q, q8l, q8h) = unsafe {
                (
                    _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()),
                    _mm256_loadu_si256(y.qs.as_ptr().add(64 * j).cast()),
                    _mm256_loadu_si256(y.qs.as_ptr().add(64 * j + 32).cast()),
                )
            };
            let q5l = _mm256_or_si256(_mm256_and_si256(q, m4), high(2 * j as i32));
            let q5h = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                high(2 * j as i32 + 1),
            );
            let (sl, sh) = (sc[2 * j] as i16, sc[2 * j + 1] as i16);
            let pl = _mm256_madd_epi16(_mm256_set1_epi16(sl), _mm256_maddubs_epi16(q5l, q8l));
            let ph = _mm256_madd_epi16(_mm256_set1_epi16(sh), _mm256_maddubs_epi16(q5h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) + mins
}

/// The 32 IQ4 values of 16 packed bytes, looked up in the non-uniform table: low nibbles
/// (values 0..16) in the low half, high nibbles (16..32) in the high half.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn iq4_values(qs: &[u8]) -> __m256i {
    table_values(&KVALUES_IQ4NL, qs)
}

/// The 32 values of 16 packed bytes of nibbles, each looked up in `table`: low nibbles (values
/// 0..16) in the low half, high nibbles (16..32) in the high half.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn table_values(table: &[i8; 16], qs: &[u8]) -> __m256i {
    assert!(qs.len() >= 16);
    // SAFETY: 16 readable bytes each (the table has 16 entries; `qs` checked above).
    let (table, packed) = unsafe {
        (
            _mm_loadu_si128(table.as_ptr().cast()),
            _mm_loadu_si128(qs.as_ptr().cast()),
        )
    };
    let mask = _mm_set1_epi8(0x0F);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(packed, mask));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(packed, 4), mask));
    _mm256_set_m128i(hi, lo)
}

/// Exact i32 lane sums of signed `x` times signed `y` (lane `l`: bytes `4l..4l+4`).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lanes_ss_i32(x: __m256i, y: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..8 {
            // SAFETY: 32 readable bytes (32j + 32 <= 256).
            let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * j).cast()) };
            let q = iq4_values(&x.qs[16 * j..16 * j + 16]);
            let ls = iq4xs_scale(x, j) as i32 - 32;
            sumi = _mm256_add_epi32(
                sumi,
                _mm256_mullo_epi32(lanes_ss_i32(q, a), _mm256_set1_epi32(ls)),
            );
        }
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(f32_of(x.d) * y.d),
            _mm256_cvtepi32_ps(sumi),
            acc,
        );
    }
    hsum(acc)
}

/// IQ4_NL in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_iq4_nl_q8_0_rows8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_iq4_nl_q8_0_rows8(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    table_rows8(x, y, |x| iq4_values(&x.qs), |x, y| iq4_nl_d(x, y))
}

/// MXFP4 in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_mxfp4_q8_0_rows8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_mxfp4_q8_0_rows8(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    table_rows8(x, y, |x| mxfp4_values(x), |x, y| mxfp4_d(x, y))
}

/// The repacked gemv's order for the formats of one scale and 32 table values a block
/// (IQ4_NL, MXFP4): each block's exact sum fused by `d(x, y)`, the two blocks' scales' product.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table_rows8<X>(
    x: &[X],
    y: &[BlockQ8_0],
    values: impl Fn(&X) -> __m256i,
    d: impl Fn(&X, &BlockQ8_0) -> f32,
) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let isum = hsum_i32(lanes_ss_i32(values(x), load32(&y.qs)));
        acc = (isum as f32).mul_add(d(x, y), acc);
    }
    acc
}

/// An IQ4_NL block's `d` times the token block's, both widened by one F16C load each.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn iq4_nl_d(x: &BlockIQ4NL, y: &BlockQ8_0) -> f32 {
    _mm_cvtss_f32(_mm_mul_ps(head_f16x2(y), head_f16x2(x)))
}

#[inline]
#[target_feature(enable = "avx2")]
fn mxfp4_values(x: &BlockMXFP4) -> __m256i {
    table_values(&KVALUES_MXFP4, &x.qs)
}

/// An MXFP4 block's E8M0 scale times the token block's `d`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn mxfp4_d(x: &BlockMXFP4, y: &BlockQ8_0) -> f32 {
    f32_of(y.d) * e8m0_half(x.e)
}

/// Q4_0 in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q4_0_q8_0_rows8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q4_0_q8_0_rows8(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let q = _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8));
        let isum = hsum_i32(lanes_ss_i32(q, load32(&y.qs)));
        let d = _mm_cvtss_f32(_mm_mul_ps(head_f16x2(x), head_f16x2(y)));
        acc = (isum as f32).mul_add(d, acc);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let sc: [i16; 16] = q3k_scales(&x.scales).map(|s| s as i16 - 32);
        // SAFETY: 32 readable bytes.
        let hm = unsafe { _mm256_loadu_si256(x.hmask.as_ptr().cast()) };
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            // SAFETY: 32 readable bytes (32h + 32 <= 64).
            let q2 = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * h).cast()) };
            for s in 0..4 {
                let low = match s {
                    0 => _mm256_and_si256(q2, m3),
                    1 => _mm256_and_si256(_mm256_srli_epi16(q2, 2), m3),
                    2 => _mm256_and_si256(_mm256_srli_epi16(q2, 4), m3),
                    _ => _mm256_and_si256(_mm256_srli_epi16(q2, 6), m3),
                };
                let bit = _mm256_set1_epi8(1 << (4 * h + s));
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
                // q = low - 4 where the high bit is clear: -4..=3.
                let q = _mm256_sub_epi8(low, _mm256_andnot_si256(set, four));
                // SAFETY: 32 readable bytes (128h + 32s + 32 <= 256).
                let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * h + 32 * s).cast()) };
                let g = 8 * h + 2 * s;
                let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(halves_i16(sc[g], sc[g + 1]), p16));
            }
        }
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(y.d * f32_of(x.d)),
            _mm256_cvtepi32_ps(sumi),
            acc,
        );
    }
    hsum(acc)
}

/// `vpshufb` controls for [`q2_k_lanes`]: step `s` takes i16 element `2s` of its half into
/// every i16 of the low half and element `2s + 1` into the high half.
const Q2K_SCALE_PICK: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut s = 0;
    while s < 4 {
        let mut i = 0;
        while i < 32 {
            let e = 2 * s + i / 16;
            t[s][i] = (2 * e + i % 2) as u8;
            i += 1;
        }
        s += 1;
    }
    t
};

/// The eight exact lanes of a Q2_K super-block's main term (lane `l`: the values whose index
/// mod 32 is in `4l..4l+4`, each times its group's 4-bit scale).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q2_k_lanes(x: &BlockQ2K, y: &BlockQ8K) -> __m256i {
    let m3 = _mm256_set1_epi8(3);
    // The sixteen 4-bit scales as i16: groups 0..8 in both halves of `sc[0]`, 8..16 of `sc[1]`
    // (built from a scalar pair a step instead, the row kernel ran slower: docs/perf-log.md,
    // "Row kernels").
    // SAFETY: 16 readable bytes of scales.
    let raw = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
    let raw = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
    let (lo, hi) = (
        _mm_cvtepu8_epi16(raw),
        _mm_cvtepu8_epi16(_mm_srli_si128::<8>(raw)),
    );
    let sc = [_mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi)];
    let mut sumi = _mm256_setzero_si256();
    for h in 0..2 {
        // SAFETY: 32 readable bytes (32h + 32 <= 64).
        let q2 = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * h).cast()) };
        for (s, pick) in Q2K_SCALE_PICK.iter().enumerate() {
            let q = match s {
                0 => _mm256_and_si256(q2, m3),
                1 => _mm256_and_si256(_mm256_srli_epi16(q2, 2), m3),
                2 => _mm256_and_si256(_mm256_srli_epi16(q2, 4), m3),
                _ => _mm256_and_si256(_mm256_srli_epi16(q2, 6), m3),
            };
            // SAFETY: 32 readable bytes (128h + 32s + 32 <= 256).
            let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * h + 32 * s).cast()) };
            // Groups 8h + 2s (low half) and 8h + 2s + 1 (high half).
            // SAFETY: 32 readable bytes.
            let pick = unsafe { _mm256_loadu_si256(pick.as_ptr().cast()) };
            let sc = _mm256_shuffle_epi8(sc[h], pick);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, a)));
        }
    }
    sumi
}

/// The eight exact lanes of a Q2_K super-block's min term: lane `l` is
/// `min[2l] * bsum[2l] + min[2l + 1] * bsum[2l + 1]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q2_k_min_lanes(x: &BlockQ2K, y: &BlockQ8K) -> __m256i {
    // SAFETY: 16 readable bytes of scales, 32 of bsums (16 i16).
    let (sc, bsums) = unsafe {
        (
            _mm_loadu_si128(x.scales.as_ptr().cast()),
            _mm256_loadu_si256(y.bsums.as_ptr().cast()),
        )
    };
    let mins = _mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F));
    _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), bsums)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let mins = q2_k_min_lanes(x, y);
        // -d_y * dmin_x, then d_y * d_x: the reference's products.
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(-y.d * f32_of(x.dmin)),
            _mm256_cvtepi32_ps(mins),
            acc,
        );
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(y.d * f32_of(x.d)),
            _mm256_cvtepi32_ps(q2_k_lanes(x, y)),
            acc,
        );
    }
    hsum(acc)
}

/// IQ4_NL in `vec_dot` order (`reference::dot::vec_dot_iq4_nl_q8_0`): see [`paired_table`].
#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    paired_table(x, y, |x| iq4_values(&x.qs), |x, y| iq4_nl_d(x, y))
}

/// MXFP4 in `vec_dot` order (`reference::dot::vec_dot_mxfp4_q8_0`): see [`paired_table`].
#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_mxfp4_q8_0(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    paired_table(x, y, |x| mxfp4_values(x), |x, y| mxfp4_d(x, y))
}

/// ggml's x86 `vec_dot` order for the formats of one scale and 32 table values a block
/// (IQ4_NL, MXFP4): blocks in pairs, even blocks into one accumulator and odd into another,
/// added lane by lane before the horizontal sum; a last odd block fused onto that sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn paired_table<X>(
    x: &[X],
    y: &[BlockQ8_0],
    values: impl Fn(&X) -> __m256i,
    d: impl Fn(&X, &BlockQ8_0) -> f32,
) -> f32 {
    let n = x.len().min(y.len());
    let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let lanes = |x: &X, y: &BlockQ8_0| lanes_ss_i32(values(x), load32(&y.qs));
    let mut pairs = x[..n].chunks_exact(2).zip(y[..n].chunks_exact(2));
    for (x, y) in &mut pairs {
        prefetch_ahead(&x[0]);
        prefetch_ahead(&x[1]);
        let d0 = _mm256_set1_ps(d(&x[0], &y[0]));
        let d1 = _mm256_set1_ps(d(&x[1], &y[1]));
        even = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(lanes(&x[0], &y[0])), even);
        odd = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(lanes(&x[1], &y[1])), odd);
    }
    let mut sum = hsum(_mm256_add_ps(even, odd));
    if n % 2 == 1 {
        let (x, y) = (&x[n - 1], &y[n - 1]);
        let isum = hsum_i32(lanes(x, y));
        sum = d(x, y).mul_add(isum as f32, sum);
    }
    sum
}

/// Q2_K in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q2_k_q8_k_rows8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn vec_dot_q2_k_q8_k_rows8(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let (mut main, mut mins) = (0.0f32, 0.0f32);
    for (x, y) in x.iter().zip(y) {
        prefetch_ahead(x);
        let sumi = q2_k_lanes(x, y);
        let msum: i32 = (0..16)
            .map(|g| (x.scales[g] >> 4) as i32 * y.bsums[g] as i32)
            .sum();
        main = (hsum_i32(sumi) as f32).mul_add(f32_of(x.d) * y.d, main);
        mins = (msum as f32).mul_add(f32_of(x.dmin) * y.d, mins);
    }
    main - mins
}

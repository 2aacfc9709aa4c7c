//! NEON dot products of the 256-value formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) with Q8_K
//! activations, in `vec_dot` order and, for Q4_K and Q2_K, in the order of llama.cpp's repacked
//! gemv.
//!
//! The super-block's values are taken 32 at a time; lane `l` of a 32-value chunk sums values
//! `4l..4l+4` of it (exact i32, times the chunk's scales), so that over the super-block lane `l`
//! holds the values whose index mod 32 is in `4l..4l+4`: the reference's K-quant lanes. Then one
//! fused multiply-add of the lanes into eight float accumulators, as the reference.

use std::arch::aarch64::*;

use super::legacy::iq4_values;
use super::neon::*;
use crate::blocks::*;

/// Activations `32c..32c + 32` of a Q8_K block as 16 + 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
fn acts(y: &BlockQ8K, c: usize) -> (int8x16_t, int8x16_t) {
    (ld_s8(&y.qs, 32 * c), ld_s8(&y.qs, 32 * c + 16))
}

/// `(v & 3)` of each byte after shifting right by `2s` (s < 4): the 2-bit values of chunk `s`
/// of a Q2_K/Q3_K half.
#[inline]
#[target_feature(enable = "neon")]
fn two_bits(v: uint8x16_t, s: usize) -> uint8x16_t {
    let v = match s {
        0 => v,
        1 => vshrq_n_u8::<2>(v),
        2 => vshrq_n_u8::<4>(v),
        _ => vshrq_n_u8::<6>(v),
    };
    vandq_u8(v, vdupq_n_u8(3))
}

/// Per super-block of Q2_K: the exact main lanes (each 2-bit value times its group's 4-bit
/// scale) and the min lanes (lane `l`: `min[2l] * bsum[2l] + min[2l + 1] * bsum[2l + 1]`).
#[inline]
#[target_feature(enable = "neon")]
fn q2_k_lanes<D: Dot>(dt: D, x: &BlockQ2K, y: &BlockQ8K) -> (Lanes, Lanes) {
    let mins = vshrq_n_u8::<4>(ld_u8(&x.scales, 0));
    let mins_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
    let mins_hi = vreinterpretq_s16_u16(vmovl_high_u8(mins));
    let min_lanes = Lanes {
        lo: madd_s16(mins_lo, ld_s16(&y.bsums, 0)),
        hi: madd_s16(mins_hi, ld_s16(&y.bsums, 8)),
    };
    let mut lanes = Lanes::zero();
    for h in 0..2 {
        let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * h), ld_u8(&x.qs, 32 * h + 16));
        for s in 0..4 {
            let w = (s8(two_bits(q_lo, s)), s8(two_bits(q_hi, s)));
            let g = 8 * h + 2 * s;
            let (sl, sh) = ((x.scales[g] & 0xF) as i32, (x.scales[g + 1] & 0xF) as i32);
            lanes = lanes.add_scaled(dt, w, acts(y, 4 * h + s), sl, sh);
        }
    }
    (lanes, min_lanes)
}

/// ggml's x86 order: per super-block the min lanes fused by `-d_y * dmin_x`, then the main lanes
/// by `d_y * d_x`, into the same accumulators.
#[target_feature(enable = "neon")]
pub fn vec_dot_q2_k_q8_k<D: Dot>(dt: D, x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut acc = Acc8::new();
    for (x, y) in x.iter().zip(y) {
        let (lanes, min_lanes) = q2_k_lanes(dt, x, y);
        acc.fma(-y.d * f32_of(x.dmin), min_lanes);
        acc.fma(y.d * f32_of(x.d), lanes);
    }
    acc.hsum()
}

/// Q2_K in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q2_k_q8_k_rows8`).
#[target_feature(enable = "neon")]
pub fn vec_dot_q2_k_q8_k_rows8<D: Dot>(dt: D, x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let (mut main, mut mins) = (0.0f32, 0.0f32);
    for (x, y) in x.iter().zip(y) {
        let (lanes, min_lanes) = q2_k_lanes(dt, x, y);
        main = (lanes.sum() as f32).mul_add(f32_of(x.d) * y.d, main);
        mins = (min_lanes.sum() as f32).mul_add(f32_of(x.dmin) * y.d, mins);
    }
    main - mins
}

#[target_feature(enable = "neon")]
pub fn vec_dot_q3_k_q8_k<D: Dot>(dt: D, x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let four = vdupq_n_u8(4);
    let mut acc = Acc8::new();
    for (x, y) in x.iter().zip(y) {
        let sc: [i32; 16] = q3k_scales(&x.scales).map(|s| s as i32 - 32);
        let (hm_lo, hm_hi) = (ld_u8(&x.hmask, 0), ld_u8(&x.hmask, 16));
        let mut lanes = Lanes::zero();
        for h in 0..2 {
            let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * h), ld_u8(&x.qs, 32 * h + 16));
            for s in 0..4 {
                // q = low two bits, minus 4 where the high bit is clear: -4..=3.
                let bit = vdupq_n_u8(1 << (4 * h + s));
                let value = |q, hm| s8(vsubq_u8(two_bits(q, s), vbicq_u8(four, vtstq_u8(hm, bit))));
                let w = (value(q_lo, hm_lo), value(q_hi, hm_hi));
                let g = 8 * h + 2 * s;
                lanes = lanes.add_scaled(dt, w, acts(y, 4 * h + s), sc[g], sc[g + 1]);
            }
        }
        acc.fma(y.d * f32_of(x.d), lanes);
    }
    acc.hsum()
}

/// Per super-block of Q4_K: the eight exact main lanes (each nibble times its sub-block's scale)
/// and the four min lanes (lane `p`: `min[2p] * sub(2p) + min[2p + 1] * sub(2p + 1)`, `sub(j)`
/// the sum of sub-block `j`'s activations).
#[inline]
#[target_feature(enable = "neon")]
fn q4_k_lanes<D: Dot>(dt: D, x: &BlockQ4K, y: &BlockQ8K) -> (Lanes, int32x4_t) {
    let (sc, mins) = scales_mins(&x.scales);
    let m4 = vdupq_n_u8(0xF);
    let mut lanes = Lanes::zero();
    for p in 0..4 {
        let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * p), ld_u8(&x.qs, 32 * p + 16));
        let low = (s8(vandq_u8(q_lo, m4)), s8(vandq_u8(q_hi, m4)));
        let high = (s8(vshrq_n_u8::<4>(q_lo)), s8(vshrq_n_u8::<4>(q_hi)));
        let (s0, s1) = (sc[2 * p], sc[2 * p + 1]);
        lanes = lanes.add_scaled(dt, low, acts(y, 2 * p), s0, s0);
        lanes = lanes.add_scaled(dt, high, acts(y, 2 * p + 1), s1, s1);
    }
    (lanes, min_lanes(mins, y))
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block.
#[inline]
#[target_feature(enable = "neon")]
fn scales_mins(scales: &[u8; 12]) -> ([i32; 8], int16x8_t) {
    let (sc, mn) = k_scales_mins(scales);
    let mins = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(u64::from_le_bytes(mn))));
    (sc.map(i32::from), mins)
}

/// Four lanes, lane `p`: `min[2p] * sub(2p) + min[2p + 1] * sub(2p + 1)` where `sub(j) =
/// bsum[2j] + bsum[2j + 1]` is the sum of sub-block `j`'s activations.
#[inline]
#[target_feature(enable = "neon")]
fn min_lanes(mins: int16x8_t, y: &BlockQ8K) -> int32x4_t {
    // |bsum| <= 16 * 128, so the pair sums fit in i16.
    let sub = vpaddq_s16(ld_s16(&y.bsums, 0), ld_s16(&y.bsums, 8));
    madd_s16(mins, sub)
}

/// ggml's x86 order: main lanes fused by `d_y * d_x` into eight accumulators, min lanes by
/// `-d_y * dmin_x` into four; `hsum8(main) + ((m0 + m2) + (m1 + m3))`.
#[target_feature(enable = "neon")]
pub fn vec_dot_q4_k_q8_k<D: Dot>(dt: D, x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = Acc8::new();
    let mut acc_m = vdupq_n_f32(0.0);
    for (x, y) in x.iter().zip(y) {
        let (lanes, prod) = q4_k_lanes(dt, x, y);
        let dmin = vdupq_n_f32(-y.d * f32_of(x.dmin));
        acc_m = vfmaq_f32(acc_m, vcvtq_f32_s32(prod), dmin);
        acc.fma(y.d * f32_of(x.d), lanes);
    }
    acc.hsum() + hsum4(acc_m)
}

/// Q4_K in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q4_k_q8_k_rows8`).
#[target_feature(enable = "neon")]
pub fn vec_dot_q4_k_q8_k_rows8<D: Dot>(dt: D, x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let (mut main, mut mins) = (0.0f32, 0.0f32);
    for (x, y) in x.iter().zip(y) {
        let (lanes, prod) = q4_k_lanes(dt, x, y);
        main = (lanes.sum() as f32).mul_add(f32_of(x.d) * y.d, main);
        mins = (vaddvq_s32(prod) as f32).mul_add(f32_of(x.dmin) * y.d, mins);
    }
    main - mins
}

/// ggml's x86 order: main lanes as Q4_K's; the min term one integer per super-block, fused into
/// one running float by `-d_y * dmin_x`.
#[target_feature(enable = "neon")]
pub fn vec_dot_q5_k_q8_k<D: Dot>(dt: D, x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let m4 = vdupq_n_u8(0xF);
    let sixteen = vdupq_n_u8(0x10);
    let mut acc = Acc8::new();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let (sc, mn) = scales_mins(&x.scales);
        let total = vaddvq_s32(min_lanes(mn, y));
        mins = (-y.d * f32_of(x.dmin)).mul_add(total as f32, mins);
        let (qh_lo, qh_hi) = (ld_u8(&x.qh, 0), ld_u8(&x.qh, 16));
        let mut lanes = Lanes::zero();
        for p in 0..4 {
            let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * p), ld_u8(&x.qs, 32 * p + 16));
            // Bit 4 of value 64p + 32h + l is bit 2p + h of qh[l].
            let high = |qh, c: usize| vandq_u8(vtstq_u8(qh, vdupq_n_u8(1 << c)), sixteen);
            let low = (
                s8(vorrq_u8(vandq_u8(q_lo, m4), high(qh_lo, 2 * p))),
                s8(vorrq_u8(vandq_u8(q_hi, m4), high(qh_hi, 2 * p))),
            );
            let top = (
                s8(vorrq_u8(vshrq_n_u8::<4>(q_lo), high(qh_lo, 2 * p + 1))),
                s8(vorrq_u8(vshrq_n_u8::<4>(q_hi), high(qh_hi, 2 * p + 1))),
            );
            let (s0, s1) = (sc[2 * p], sc[2 * p + 1]);
            lanes = lanes.add_scaled(dt, low, acts(y, 2 * p), s0, s0);
            lanes = lanes.add_scaled(dt, top, acts(y, 2 * p + 1), s1, s1);
        }
        acc.fma(y.d * f32_of(x.d), lanes);
    }
    acc.hsum() + mins
}

/// ggml's x86 order: per super-block eight exact lanes of unsigned 6-bit values times their
/// group's scale, less lane `l`'s share of the -32 offset, `32 * (bsum[2l] * sc[2l] +
/// bsum[2l + 1] * sc[2l + 1])`; one fused multiply-add by `d_y * d_x`.
#[target_feature(enable = "neon")]
pub fn vec_dot_q6_k_q8_k<D: Dot>(dt: D, x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let m4 = vdupq_n_u8(0xF);
    let mut acc = Acc8::new();
    for (x, y) in x.iter().zip(y) {
        let sc8 = ld_s8(&x.scales, 0);
        let offset = Lanes {
            lo: madd_s16(ld_s16(&y.bsums, 0), vmovl_s8(vget_low_s8(sc8))),
            hi: madd_s16(ld_s16(&y.bsums, 8), vmovl_high_s8(sc8)),
        };
        let mut lanes = Lanes::zero();
        for h in 0..2 {
            for half in 0..2 {
                // Values 128h + 32k + 16 * half + (0..16), k < 4.
                let at = 16 * half;
                let b1 = ld_u8(&x.ql, 64 * h + at);
                let b2 = ld_u8(&x.ql, 64 * h + 32 + at);
                let qh = ld_u8(&x.qh, 32 * h + at);
                let q = [
                    vorrq_u8(
                        vandq_u8(b1, m4),
                        vshlq_n_u8::<4>(vandq_u8(qh, vdupq_n_u8(3))),
                    ),
                    vorrq_u8(
                        vandq_u8(b2, m4),
                        vshlq_n_u8::<2>(vandq_u8(qh, vdupq_n_u8(12))),
                    ),
                    vorrq_u8(vshrq_n_u8::<4>(b1), vandq_u8(qh, vdupq_n_u8(48))),
                    vorrq_u8(
                        vshrq_n_u8::<4>(b2),
                        vshrq_n_u8::<2>(vandq_u8(qh, vdupq_n_u8(192))),
                    ),
                ];
                for (k, &qk) in q.iter().enumerate() {
                    let a = ld_s8(&y.qs, 128 * h + 32 * k + at);
                    let s = x.scales[8 * h + 2 * k + half] as i32;
                    let l = dt.dot(vdupq_n_s32(0), s8(qk), a);
                    if half == 0 {
                        lanes.lo = vmlaq_n_s32(lanes.lo, l, s);
                    } else {
                        lanes.hi = vmlaq_n_s32(lanes.hi, l, s);
                    }
                }
            }
        }
        lanes.lo = vsubq_s32(lanes.lo, vshlq_n_s32::<5>(offset.lo));
        lanes.hi = vsubq_s32(lanes.hi, vshlq_n_s32::<5>(offset.hi));
        acc.fma(y.d * f32_of(x.d), lanes);
    }
    acc.hsum()
}

#[target_feature(enable = "neon")]
pub fn vec_dot_iq4_xs_q8_k<D: Dot>(dt: D, x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut acc = Acc8::new();
    for (x, y) in x.iter().zip(y) {
        let mut lanes = Lanes::zero();
        for j in 0..8 {
            let ls = iq4xs_scale(x, j) as i32 - 32;
            let w = iq4_values(&x.qs[16 * j..16 * j + 16]);
            lanes = lanes.add_scaled(dt, w, acts(y, j), ls, ls);
        }
        acc.fma(f32_of(x.d) * y.d, lanes);
    }
    acc.hsum()
}

//! NEON dot products of the 256-value formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) with Q8_K
//! activations, in `vec_dot` order and, for Q4_K and Q2_K, in the order of llama.cpp's repacked
//! gemv.
//!
//! The super-block's values are taken 32 at a time; lane `l` of a 32-value chunk sums values
//! `4l..4l+4` of it (exact i32, times the chunk's scales), so that over the super-block lane `l`
//! holds the values whose index mod 32 is in `4l..4l+4`: the reference's K-quant lanes. Then one
//! fused multiply-add of the lanes into eight float accumulators, as the reference. Each kernel
//! is a [`Split`]: `prep` unpacks a super-block's 256 values into eight chunks of 16 + 16 signed
//! bytes and its scales into integers, once for all the tokens of a tile; `step` is one token's
//! part.

use std::arch::aarch64::*;

use super::legacy::iq4_values;
use super::neon::*;
use super::tile::{Split, Totals};
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

/// A super-block's values as eight 32-value chunks (chunk `c`: values `32c..32c + 32`).
type Chunks = [(int8x16_t, int8x16_t); 8];

/// `Σ_c lanes(w[c], y chunk c) * (s[2c], s[2c + 1])`, the first and last 16 values of each
/// chunk with their own scale (Q2_K, Q3_K: one a group of 16).
#[inline]
#[target_feature(enable = "neon")]
fn scaled16<D: Dot>(dt: D, w: &Chunks, s: &[i32; 16], y: &BlockQ8K) -> Lanes {
    let mut lanes = Lanes::zero();
    for (c, &w) in w.iter().enumerate() {
        lanes = lanes.add_scaled(dt, w, acts(y, c), s[2 * c], s[2 * c + 1]);
    }
    lanes
}

/// `Σ_c lanes(w[c], y chunk c) * s[c]` (Q4_K, Q5_K, IQ4_XS: one scale a chunk).
#[inline]
#[target_feature(enable = "neon")]
fn scaled32<D: Dot>(dt: D, w: &Chunks, s: &[i32; 8], y: &BlockQ8K) -> Lanes {
    let mut lanes = Lanes::zero();
    for (c, &w) in w.iter().enumerate() {
        lanes = lanes.add_scaled(dt, w, acts(y, c), s[c], s[c]);
    }
    lanes
}

/// A Q2_K super-block unpacked: chunk `4h + s` is the 2-bit values at bits `2s` of bytes
/// `32h..32h + 32`; the sixteen 4-bit scales; the mins as i16; `d`, `dmin`.
pub(super) struct Q2KPrep {
    w: Chunks,
    scales: [i32; 16],
    mins: (int16x8_t, int16x8_t),
    d: f32,
    dmin: f32,
}

#[inline]
#[target_feature(enable = "neon")]
fn q2_k_prep(x: &BlockQ2K) -> Q2KPrep {
    let mins = vshrq_n_u8::<4>(ld_u8(&x.scales, 0));
    let mut w = [(vdupq_n_s8(0), vdupq_n_s8(0)); 8];
    for h in 0..2 {
        let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * h), ld_u8(&x.qs, 32 * h + 16));
        for s in 0..4 {
            w[4 * h + s] = (s8(two_bits(q_lo, s)), s8(two_bits(q_hi, s)));
        }
    }
    Q2KPrep {
        w,
        scales: x.scales.map(|s| (s & 0xF) as i32),
        mins: (
            vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
            vreinterpretq_s16_u16(vmovl_high_u8(mins)),
        ),
        d: f32_of(x.d),
        dmin: f32_of(x.dmin),
    }
}

/// Per super-block of Q2_K and a token: the exact main lanes (each 2-bit value times its
/// group's 4-bit scale) and the min lanes (lane `l`: `min[2l] * bsum[2l] + min[2l + 1] *
/// bsum[2l + 1]`).
#[inline]
#[target_feature(enable = "neon")]
fn q2_k_lanes<D: Dot>(dt: D, p: &Q2KPrep, y: &BlockQ8K) -> (Lanes, Lanes) {
    let min_lanes = Lanes {
        lo: madd_s16(p.mins.0, ld_s16(&y.bsums, 0)),
        hi: madd_s16(p.mins.1, ld_s16(&y.bsums, 8)),
    };
    (scaled16(dt, &p.w, &p.scales, y), min_lanes)
}

/// Q2_K in ggml's x86 order: per super-block the min lanes fused by `-d_y * dmin_x`, then the
/// main lanes by `d_y * d_x`, into the same accumulators.
pub(super) struct Q2K;

impl Split for Q2K {
    type W = BlockQ2K;
    type A = BlockQ8K;
    type Prep = Q2KPrep;
    type Acc = Acc8;
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockQ2K) -> Q2KPrep {
        q2_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &Q2KPrep, y: &BlockQ8K, acc: &mut Acc8) {
        let (lanes, min_lanes) = q2_k_lanes(dt, p, y);
        acc.fma(-y.d * p.dmin, min_lanes);
        acc.fma(y.d * p.d, lanes);
    }
}

/// Q2_K in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q2_k_q8_k_rows8`):
/// the main and min totals, each fused into its own running float.
pub(super) struct Q2KRows8;

impl Split for Q2KRows8 {
    type W = BlockQ2K;
    type A = BlockQ8K;
    type Prep = Q2KPrep;
    type Acc = Totals;
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockQ2K) -> Q2KPrep {
        q2_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &Q2KPrep, y: &BlockQ8K, acc: &mut Totals) {
        let (lanes, min_lanes) = q2_k_lanes(dt, p, y);
        acc.fuse((lanes.sum(), min_lanes.sum()), p.d, p.dmin, y.d);
    }
}

/// A super-block unpacked with one scale a group of 16 (Q3_K) or 32 (IQ4_XS), and `d`.
pub(super) struct ScaledPrep<const G: usize> {
    w: Chunks,
    scales: [i32; G],
    d: f32,
}

/// Q3_K in ggml's x86 order: values -4..=3 (chunk `4h + s`: bits `2s..2s + 2` of bytes
/// `32h..32h + 32`, less 4 where bit `4h + s` of hmask is clear), times the group's scale less
/// 32; one fused multiply-add by `d_y * d_x`.
pub(super) struct Q3K;

impl Split for Q3K {
    type W = BlockQ3K;
    type A = BlockQ8K;
    type Prep = ScaledPrep<16>;
    type Acc = Acc8;
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockQ3K) -> ScaledPrep<16> {
        let four = vdupq_n_u8(4);
        let (hm_lo, hm_hi) = (ld_u8(&x.hmask, 0), ld_u8(&x.hmask, 16));
        let mut w = [(vdupq_n_s8(0), vdupq_n_s8(0)); 8];
        for h in 0..2 {
            let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * h), ld_u8(&x.qs, 32 * h + 16));
            for s in 0..4 {
                // q = low two bits, minus 4 where the high bit is clear: -4..=3.
                let bit = vdupq_n_u8(1 << (4 * h + s));
                let value = |q, hm| s8(vsubq_u8(two_bits(q, s), vbicq_u8(four, vtstq_u8(hm, bit))));
                w[4 * h + s] = (value(q_lo, hm_lo), value(q_hi, hm_hi));
            }
        }
        ScaledPrep {
            w,
            scales: q3k_scales(&x.scales).map(|s| s as i32 - 32),
            d: f32_of(x.d),
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &ScaledPrep<16>, y: &BlockQ8K, acc: &mut Acc8) {
        acc.fma(y.d * p.d, scaled16(dt, &p.w, &p.scales, y));
    }
}

/// A Q4_K or Q5_K super-block unpacked: its values, the eight 6-bit scales, the mins as i16,
/// `d` and `dmin`.
pub(super) struct MinPrep {
    w: Chunks,
    scales: [i32; 8],
    mins: int16x8_t,
    d: f32,
    dmin: f32,
}

#[inline]
#[target_feature(enable = "neon")]
fn q4_k_prep(x: &BlockQ4K) -> MinPrep {
    let (scales, mins) = scales_mins(&x.scales);
    let m4 = vdupq_n_u8(0xF);
    let mut w = [(vdupq_n_s8(0), vdupq_n_s8(0)); 8];
    for p in 0..4 {
        let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * p), ld_u8(&x.qs, 32 * p + 16));
        w[2 * p] = (s8(vandq_u8(q_lo, m4)), s8(vandq_u8(q_hi, m4)));
        w[2 * p + 1] = (s8(vshrq_n_u8::<4>(q_lo)), s8(vshrq_n_u8::<4>(q_hi)));
    }
    MinPrep {
        w,
        scales,
        mins,
        d: f32_of(x.d),
        dmin: f32_of(x.dmin),
    }
}

/// Per super-block of Q4_K and a token: the eight exact main lanes (each nibble times its
/// sub-block's scale) and the four min lanes ([`min_lanes`]).
#[inline]
#[target_feature(enable = "neon")]
fn q4_k_lanes<D: Dot>(dt: D, p: &MinPrep, y: &BlockQ8K) -> (Lanes, int32x4_t) {
    (scaled32(dt, &p.w, &p.scales, y), min_lanes(p.mins, y))
}

/// Q4_K in ggml's x86 order: main lanes fused by `d_y * d_x` into eight accumulators, min lanes
/// by `-d_y * dmin_x` into four; `hsum8(main) + ((m0 + m2) + (m1 + m3))`.
pub(super) struct Q4K;

impl Split for Q4K {
    type W = BlockQ4K;
    type A = BlockQ8K;
    type Prep = MinPrep;
    type Acc = (Acc8, float32x4_t);
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockQ4K) -> MinPrep {
        q4_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &MinPrep, y: &BlockQ8K, (acc, acc_m): &mut Self::Acc) {
        let (lanes, prod) = q4_k_lanes(dt, p, y);
        let dmin = vdupq_n_f32(-y.d * p.dmin);
        *acc_m = vfmaq_f32(*acc_m, vcvtq_f32_s32(prod), dmin);
        acc.fma(y.d * p.d, lanes);
    }
}

/// Q4_K in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q4_k_q8_k_rows8`).
pub(super) struct Q4KRows8;

impl Split for Q4KRows8 {
    type W = BlockQ4K;
    type A = BlockQ8K;
    type Prep = MinPrep;
    type Acc = Totals;
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockQ4K) -> MinPrep {
        q4_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &MinPrep, y: &BlockQ8K, acc: &mut Totals) {
        let (lanes, prod) = q4_k_lanes(dt, p, y);
        acc.fuse((lanes.sum(), vaddvq_s32(prod)), p.d, p.dmin, y.d);
    }
}

/// Q5_K in ggml's x86 order: main lanes as Q4_K's; the min term one integer per super-block,
/// fused into one running float by `-d_y * dmin_x`.
pub(super) struct Q5K;

impl Split for Q5K {
    type W = BlockQ5K;
    type A = BlockQ8K;
    type Prep = MinPrep;
    type Acc = (Acc8, f32);
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockQ5K) -> MinPrep {
        let m4 = vdupq_n_u8(0xF);
        let sixteen = vdupq_n_u8(0x10);
        let (scales, mins) = scales_mins(&x.scales);
        let (qh_lo, qh_hi) = (ld_u8(&x.qh, 0), ld_u8(&x.qh, 16));
        // Bit 4 of value 64p + 32h + l is bit 2p + h of qh[l].
        let high = |qh, c: usize| vandq_u8(vtstq_u8(qh, vdupq_n_u8(1 << c)), sixteen);
        let mut w = [(vdupq_n_s8(0), vdupq_n_s8(0)); 8];
        for p in 0..4 {
            let (q_lo, q_hi) = (ld_u8(&x.qs, 32 * p), ld_u8(&x.qs, 32 * p + 16));
            w[2 * p] = (
                s8(vorrq_u8(vandq_u8(q_lo, m4), high(qh_lo, 2 * p))),
                s8(vorrq_u8(vandq_u8(q_hi, m4), high(qh_hi, 2 * p))),
            );
            w[2 * p + 1] = (
                s8(vorrq_u8(vshrq_n_u8::<4>(q_lo), high(qh_lo, 2 * p + 1))),
                s8(vorrq_u8(vshrq_n_u8::<4>(q_hi), high(qh_hi, 2 * p + 1))),
            );
        }
        MinPrep {
            w,
            scales,
            mins,
            d: f32_of(x.d),
            dmin: f32_of(x.dmin),
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &MinPrep, y: &BlockQ8K, (acc, mins): &mut (Acc8, f32)) {
        let total = vaddvq_s32(min_lanes(p.mins, y));
        *mins = (-y.d * p.dmin).mul_add(total as f32, *mins);
        acc.fma(y.d * p.d, scaled32(dt, &p.w, &p.scales, y));
    }
}

/// A Q6_K super-block unpacked: the unsigned 6-bit values (entry `4(2h + half) + k`: values
/// `128h + 32k + 16 half + (0..16)`), the sixteen scales, the scales as i16 (for the offset),
/// `d`.
pub(super) struct Q6KPrep {
    q: [int8x16_t; 16],
    scales: [i32; 16],
    sc16: (int16x8_t, int16x8_t),
    d: f32,
}

/// Q6_K in ggml's x86 order: per super-block eight exact lanes of unsigned 6-bit values times
/// their group's scale, less lane `l`'s share of the -32 offset, `32 * (bsum[2l] * sc[2l] +
/// bsum[2l + 1] * sc[2l + 1])`; one fused multiply-add by `d_y * d_x`.
pub(super) struct Q6K;

impl Split for Q6K {
    type W = BlockQ6K;
    type A = BlockQ8K;
    type Prep = Q6KPrep;
    type Acc = Acc8;
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockQ6K) -> Q6KPrep {
        let m4 = vdupq_n_u8(0xF);
        let sc8 = ld_s8(&x.scales, 0);
        let mut q = [vdupq_n_s8(0); 16];
        for h in 0..2 {
            for half in 0..2 {
                let at = 16 * half;
                let b1 = ld_u8(&x.ql, 64 * h + at);
                let b2 = ld_u8(&x.ql, 64 * h + 32 + at);
                let qh = ld_u8(&x.qh, 32 * h + at);
                let v = [
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
                for (k, v) in v.into_iter().enumerate() {
                    q[4 * (2 * h + half) + k] = s8(v);
                }
            }
        }
        Q6KPrep {
            q,
            scales: x.scales.map(i32::from),
            sc16: (vmovl_s8(vget_low_s8(sc8)), vmovl_high_s8(sc8)),
            d: f32_of(x.d),
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &Q6KPrep, y: &BlockQ8K, acc: &mut Acc8) {
        let offset = Lanes {
            lo: madd_s16(ld_s16(&y.bsums, 0), p.sc16.0),
            hi: madd_s16(ld_s16(&y.bsums, 8), p.sc16.1),
        };
        let mut lanes = Lanes::zero();
        for h in 0..2 {
            for half in 0..2 {
                for k in 0..4 {
                    let a = ld_s8(&y.qs, 128 * h + 32 * k + 16 * half);
                    let s = p.scales[8 * h + 2 * k + half];
                    let l = dt.dot(vdupq_n_s32(0), p.q[4 * (2 * h + half) + k], a);
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
        acc.fma(y.d * p.d, lanes);
    }
}

/// IQ4_XS in ggml's x86 order: the table values of sub-block `j` times its scale less 32; one
/// fused multiply-add by `d_x * d_y`.
pub(super) struct IQ4XS;

impl Split for IQ4XS {
    type W = BlockIQ4XS;
    type A = BlockQ8K;
    type Prep = ScaledPrep<8>;
    type Acc = Acc8;
    const TOKENS: usize = 8;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockIQ4XS) -> ScaledPrep<8> {
        ScaledPrep {
            w: std::array::from_fn(|j| iq4_values(&x.qs[16 * j..16 * j + 16])),
            scales: std::array::from_fn(|j| iq4xs_scale(x, j) as i32 - 32),
            d: f32_of(x.d),
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &ScaledPrep<8>, y: &BlockQ8K, acc: &mut Acc8) {
        acc.fma(p.d * y.d, scaled32(dt, &p.w, &p.scales, y));
    }
}

//! NEON dot products of the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) with Q8_0 or
//! Q8_1 activations, in `vec_dot` order and, for Q4_0 and IQ4_NL, in the order of llama.cpp's
//! repacked gemv. Per block: eight exact i32 lanes (values `4j..4j+4` each), one fused
//! multiply-add of them by `d_x * d_y`; the reference's operations in its order.

use std::arch::aarch64::*;

use super::neon::*;
use crate::blocks::*;

/// The 32 nibbles of a block as bytes: low nibbles (values 0..16), high nibbles (16..32).
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let q = ld_u8(qs, 0);
    (vandq_u8(q, vdupq_n_u8(0xF)), vshrq_n_u8::<4>(q))
}

/// The 32 activations of a Q8 block as 16 + 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
fn acts(qs: &[i8; 32]) -> (int8x16_t, int8x16_t) {
    (ld_s8(qs, 0), ld_s8(qs, 16))
}

/// `(lo - k, hi - k)` as signed bytes.
#[inline]
#[target_feature(enable = "neon")]
fn minus(v: (uint8x16_t, uint8x16_t), k: u8) -> (int8x16_t, int8x16_t) {
    let k = vdupq_n_u8(k);
    (s8(vsubq_u8(v.0, k)), s8(vsubq_u8(v.1, k)))
}

/// The 5-bit values of a Q5 block: the nibbles, plus 16 where bit `j` of the u32 `qh` is set.
#[inline]
#[target_feature(enable = "neon")]
fn q5_bytes(qs: &[u8; 16], qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let spread = |a: u8, b: u8| vcombine_u8(vdup_n_u8(a), vdup_n_u8(b));
    let sixteen = vdupq_n_u8(0x10);
    let high = |v| vandq_u8(vtstq_u8(v, bits), sixteen);
    let (lo, hi) = nibbles(qs);
    (
        vorrq_u8(lo, high(spread(qh[0], qh[1]))),
        vorrq_u8(hi, high(spread(qh[2], qh[3]))),
    )
}

/// The 32 IQ4_NL values of a block, looked up in the non-uniform table.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn iq4_values(qs: &[u8]) -> (int8x16_t, int8x16_t) {
    let table = ld_s8(&KVALUES_IQ4NL, 0);
    let q = ld_u8(qs, 0);
    (
        vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0xF))),
        vqtbl1q_s8(table, vshrq_n_u8::<4>(q)),
    )
}

#[target_feature(enable = "neon")]
pub fn vec_dot_q4_0_q8_0<D: Dot>(dt: D, x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = Acc8::new();
    for (x, y) in x.iter().zip(y) {
        let w = minus(nibbles(&x.qs), 8);
        acc.fma(f32_of(x.d) * f32_of(y.d), Lanes::of(dt, w, acts(&y.qs)));
    }
    acc.hsum()
}

#[target_feature(enable = "neon")]
pub fn vec_dot_q4_1_q8_1<D: Dot>(dt: D, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = Acc8::new();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        mins = f32_of(x.m).mul_add(f32_of(y.s), mins);
        let (lo, hi) = nibbles(&x.qs);
        let lanes = Lanes::of(dt, (s8(lo), s8(hi)), acts(&y.qs));
        acc.fma(f32_of(x.d) * f32_of(y.d), lanes);
    }
    acc.hsum() + mins
}

#[target_feature(enable = "neon")]
pub fn vec_dot_q5_0_q8_0<D: Dot>(dt: D, x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = Acc8::new();
    for (x, y) in x.iter().zip(y) {
        let w = minus(q5_bytes(&x.qs, x.qh), 16);
        acc.fma(f32_of(x.d) * f32_of(y.d), Lanes::of(dt, w, acts(&y.qs)));
    }
    acc.hsum()
}

#[target_feature(enable = "neon")]
pub fn vec_dot_q5_1_q8_1<D: Dot>(dt: D, x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = Acc8::new();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        mins = f32_of(x.m).mul_add(f32_of(y.s), mins);
        let (lo, hi) = q5_bytes(&x.qs, x.qh);
        let lanes = Lanes::of(dt, (s8(lo), s8(hi)), acts(&y.qs));
        acc.fma(f32_of(x.d) * f32_of(y.d), lanes);
    }
    acc.hsum() + mins
}

#[target_feature(enable = "neon")]
pub fn vec_dot_q8_0_q8_0<D: Dot>(dt: D, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = Acc8::new();
    for (x, y) in x.iter().zip(y) {
        let lanes = Lanes::of(dt, acts(&x.qs), acts(&y.qs));
        acc.fma(f32_of(x.d) * f32_of(y.d), lanes);
    }
    acc.hsum()
}

/// ggml's x86 order: blocks in pairs, even blocks into one set of eight lanes and odd ones into
/// another, added lane by lane before the horizontal sum; a last odd block fused onto the sum.
#[target_feature(enable = "neon")]
pub fn vec_dot_iq4_nl_q8_0<D: Dot>(dt: D, x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let (mut even, mut odd) = (Acc8::new(), Acc8::new());
    let pairs = x.len().min(y.len()) / 2;
    for (x, y) in x.chunks_exact(2).zip(y.chunks_exact(2)) {
        let l0 = Lanes::of(dt, iq4_values(&x[0].qs), acts(&y[0].qs));
        even.fma(f32_of(y[0].d) * f32_of(x[0].d), l0);
        let l1 = Lanes::of(dt, iq4_values(&x[1].qs), acts(&y[1].qs));
        odd.fma(f32_of(y[1].d) * f32_of(x[1].d), l1);
    }
    let mut sum = even.add(odd).hsum();
    if let (Some(x), Some(y)) = (x.get(2 * pairs), y.get(2 * pairs)) {
        let isum = Lanes::of(dt, iq4_values(&x.qs), acts(&y.qs)).sum();
        sum = (f32_of(y.d) * f32_of(x.d)).mul_add(isum as f32, sum);
    }
    sum
}

/// Q4_0 in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_q4_0_q8_0_rows8`).
#[target_feature(enable = "neon")]
pub fn vec_dot_q4_0_q8_0_rows8<D: Dot>(dt: D, x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = Lanes::of(dt, minus(nibbles(&x.qs), 8), acts(&y.qs)).sum();
        acc = (isum as f32).mul_add(f32_of(x.d) * f32_of(y.d), acc);
    }
    acc
}

/// IQ4_NL in the order of llama.cpp's repacked gemv (`reference::dot::vec_dot_iq4_nl_q8_0_rows8`).
#[target_feature(enable = "neon")]
pub fn vec_dot_iq4_nl_q8_0_rows8<D: Dot>(dt: D, x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = Lanes::of(dt, iq4_values(&x.qs), acts(&y.qs)).sum();
        acc = (isum as f32).mul_add(f32_of(x.d) * f32_of(y.d), acc);
    }
    acc
}

//! Reference dot products of a weight row with a quantized activation row: the oracle the fast
//! kernels are tested against.
//!
//! Each block's integer sum is exact (i32); the floats are applied per block (per super-block
//! for the K-quants) and summed in block order. Written for clarity, not speed.

use half::{bf16, f16};

use crate::blocks::*;
use crate::reference::dequant::{k_2bit, k_4bit, q3k_value, q5k_value, q6k_value};

pub fn vec_dot_f32_f32(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

pub fn vec_dot_f16_f32(x: &[f16], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a.to_f32() * b).sum()
}

pub fn vec_dot_bf16_f32(x: &[bf16], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a.to_f32() * b).sum()
}

/// Σ over a 32-value block of `w(j) * y[j]`, with `w(j)` the integer weight of value `j`.
#[inline]
fn block_isum(y: &[i8; QK], w: impl Fn(usize) -> i32) -> i32 {
    (0..QK).map(|j| w(j) * y[j] as i32).sum()
}

#[inline]
fn nibble(qs: &[u8; 16], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0xF
    } else {
        qs[j - 16] >> 4
    }
}

#[inline]
fn q5_value(qs: &[u8; 16], qh: [u8; 4], j: usize) -> u8 {
    nibble(qs, j) | (((u32::from_le_bytes(qh) >> j) & 1) as u8) << 4
}

pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| nibble(&x.qs, j) as i32 - 8);
        sum += isum as f32 * x.d.to_f32() * y.d.to_f32();
    }
    sum
}

pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| nibble(&x.qs, j) as i32);
        sum += (x.d.to_f32() * y.d.to_f32()) * isum as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sum
}

pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| q5_value(&x.qs, x.qh, j) as i32 - 16);
        sum += isum as f32 * x.d.to_f32() * y.d.to_f32();
    }
    sum
}

pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| q5_value(&x.qs, x.qh, j) as i32);
        sum += (x.d.to_f32() * y.d.to_f32()) * isum as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sum
}

pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| x.qs[j] as i32);
        sum += isum as f32 * x.d.to_f32() * y.d.to_f32();
    }
    sum
}

pub fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| KVALUES_IQ4NL[nibble(&x.qs, j) as usize] as i32);
        sum += x.d.to_f32() * y.d.to_f32() * isum as f32;
    }
    sum
}

/// Σ over group `g` of 16 values of `w(i) * y.qs[i]`.
#[inline]
fn group_isum(y: &BlockQ8K, g: usize, len: usize, w: impl Fn(usize) -> i32) -> i32 {
    (g * len..(g + 1) * len)
        .map(|i| w(i) * y.qs[i] as i32)
        .sum()
}

pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let mut isum = 0i32;
        let mut msum = 0i32;
        for g in 0..16 {
            let sc = x.scales[g];
            isum += (sc & 0xF) as i32 * group_isum(y, g, 16, |i| k_2bit(&x.qs, i) as i32);
            msum += (sc >> 4) as i32 * y.bsums[g] as i32;
        }
        sum += y.d * x.d.to_f32() * isum as f32 - y.d * x.dmin.to_f32() * msum as f32;
    }
    sum
}

pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum: i32 = (0..16)
            .map(|g| {
                let scale = q3k_scale(&x.scales, g) as i32 - 32;
                scale * group_isum(y, g, 16, |i| q3k_value(x, i) as i32)
            })
            .sum();
        sum += y.d * x.d.to_f32() * isum as f32;
    }
    sum
}

/// Σ_j min_j * (bsums of the two groups of 16 that make sub-block j).
fn k_min_sum(scales: &[u8; 12], y: &BlockQ8K) -> i32 {
    (0..8)
        .map(|j| {
            let (_, m) = k_scale_min(scales, j);
            m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)
        })
        .sum()
}

pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum: i32 = (0..8)
            .map(|j| {
                let (sc, _) = k_scale_min(&x.scales, j);
                sc as i32 * group_isum(y, j, 32, |i| k_4bit(&x.qs, i) as i32)
            })
            .sum();
        let msum = k_min_sum(&x.scales, y);
        sum += y.d * x.d.to_f32() * isum as f32 - y.d * x.dmin.to_f32() * msum as f32;
    }
    sum
}

pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum: i32 = (0..8)
            .map(|j| {
                let (sc, _) = k_scale_min(&x.scales, j);
                sc as i32 * group_isum(y, j, 32, |i| q5k_value(x, i) as i32)
            })
            .sum();
        let msum = k_min_sum(&x.scales, y);
        sum += y.d * x.d.to_f32() * isum as f32 - y.d * x.dmin.to_f32() * msum as f32;
    }
    sum
}

pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum: i32 = (0..16)
            .map(|g| x.scales[g] as i32 * group_isum(y, g, 16, |i| q6k_value(x, i) as i32))
            .sum();
        sum += y.d * x.d.to_f32() * isum as f32;
    }
    sum
}

pub fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum: i32 = (0..8)
            .map(|j| {
                let ls = iq4xs_scale(x, j) as i32 - 32;
                let qs = &x.qs[16 * j..16 * j + 16];
                ls * group_isum(y, j, 32, |i| {
                    let l = i % 32;
                    let q = if l < 16 { qs[l] & 0xF } else { qs[l - 16] >> 4 };
                    KVALUES_IQ4NL[q as usize] as i32
                })
            })
            .sum();
        sum += y.d * x.d.to_f32() * isum as f32;
    }
    sum
}

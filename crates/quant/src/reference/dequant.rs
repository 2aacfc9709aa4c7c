//! Reference dequantizers: one block to floats, written to follow the format's definition as
//! plainly as possible. The float operations and their order are those of ggml's
//! `dequantize_row_*` and of the `gguf` Python package, so the results agree bit for bit.

use half::{bf16, f16};

use crate::blocks::*;

/// Bit 4 of each of the 32 values of a Q5_0/Q5_1 block.
#[inline]
fn q5_high_bits(qh: [u8; 4]) -> u32 {
    u32::from_le_bytes(qh)
}

pub fn dequantize_f32(x: &f32, y: &mut [f32]) {
    y[0] = *x;
}

pub fn dequantize_f16(x: &f16, y: &mut [f32]) {
    y[0] = x.to_f32();
}

pub fn dequantize_bf16(x: &bf16, y: &mut [f32]) {
    y[0] = x.to_f32();
}

pub fn dequantize_q4_0(b: &BlockQ4_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * ((q & 0xF) as i32 - 8) as f32;
        y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

pub fn dequantize_q4_1(b: &BlockQ4_1, y: &mut [f32]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * (q & 0xF) as f32 + m;
        y[j + 16] = d * (q >> 4) as f32 + m;
    }
}

pub fn dequantize_q5_0(b: &BlockQ5_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    let qh = q5_high_bits(b.qh);
    for (j, &q) in b.qs.iter().enumerate() {
        let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
        let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (lo as i32 - 16) as f32;
        y[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

pub fn dequantize_q5_1(b: &BlockQ5_1, y: &mut [f32]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    let qh = q5_high_bits(b.qh);
    for (j, &q) in b.qs.iter().enumerate() {
        let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
        let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        y[j] = d * lo as f32 + m;
        y[j + 16] = d * hi as f32 + m;
    }
}

pub fn dequantize_q8_0(b: &BlockQ8_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = q as f32 * d;
    }
}

pub fn dequantize_q8_1(b: &BlockQ8_1, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = q as f32 * d;
    }
}

/// The unsigned 2-bit field of value `i` of a Q2_K/Q3_K `qs` array.
#[inline]
pub(crate) fn k_2bit(qs: &[u8; 64], i: usize) -> u8 {
    let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
    (qs[32 * h + l] >> (2 * s)) & 3
}

pub fn dequantize_q2_k(b: &BlockQ2K, y: &mut [f32]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for (i, y) in y.iter_mut().enumerate().take(QK_K) {
        let sc = b.scales[i / 16];
        let dl = d * (sc & 0xF) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *y = dl * k_2bit(&b.qs, i) as f32 - ml;
    }
}

/// The signed 3-bit value `i` (-4..=3) of a Q3_K block.
#[inline]
pub(crate) fn q3k_value(b: &BlockQ3K, i: usize) -> i8 {
    let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
    let high_set = (b.hmask[l] >> (4 * h + s)) & 1 == 1;
    k_2bit(&b.qs, i) as i8 - if high_set { 0 } else { 4 }
}

pub fn dequantize_q3_k(b: &BlockQ3K, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (i, y) in y.iter_mut().enumerate().take(QK_K) {
        let dl = d * (q3k_scale(&b.scales, i / 16) as i32 - 32) as f32;
        *y = dl * q3k_value(b, i) as f32;
    }
}

/// The unsigned 4-bit value `i` of a Q4_K/Q5_K `qs` array.
#[inline]
pub(crate) fn k_4bit(qs: &[u8; 128], i: usize) -> u8 {
    let (p, h, l) = (i / 64, (i % 64) / 32, i % 32);
    (qs[32 * p + l] >> (4 * h)) & 0xF
}

pub fn dequantize_q4_k(b: &BlockQ4K, y: &mut [f32]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for (i, y) in y.iter_mut().enumerate().take(QK_K) {
        let (sc, m) = k_scale_min(&b.scales, i / 32);
        *y = (d * sc as f32) * k_4bit(&b.qs, i) as f32 - dmin * m as f32;
    }
}

/// The unsigned 5-bit value `i` of a Q5_K block.
#[inline]
pub(crate) fn q5k_value(b: &BlockQ5K, i: usize) -> u8 {
    let (p, h, l) = (i / 64, (i % 64) / 32, i % 32);
    k_4bit(&b.qs, i) | (((b.qh[l] >> (2 * p + h)) & 1) << 4)
}

pub fn dequantize_q5_k(b: &BlockQ5K, y: &mut [f32]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for (i, y) in y.iter_mut().enumerate().take(QK_K) {
        let (sc, m) = k_scale_min(&b.scales, i / 32);
        *y = (d * sc as f32) * q5k_value(b, i) as f32 - dmin * m as f32;
    }
}

/// The signed 6-bit value `i` (-32..=31) of a Q6_K block.
#[inline]
pub(crate) fn q6k_value(b: &BlockQ6K, i: usize) -> i8 {
    let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = (b.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
    let high = (b.qh[32 * h + l] >> (2 * k)) & 3;
    (low | (high << 4)) as i8 - 32
}

pub fn dequantize_q6_k(b: &BlockQ6K, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (i, y) in y.iter_mut().enumerate().take(QK_K) {
        *y = (d * b.scales[i / 16] as f32) * q6k_value(b, i) as f32;
    }
}

pub fn dequantize_q8_k(b: &BlockQ8K, y: &mut [f32]) {
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = b.d * q as f32;
    }
}

pub fn dequantize_iq4_nl(b: &BlockIQ4NL, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

pub fn dequantize_mxfp4(b: &BlockMXFP4, y: &mut [f32]) {
    let d = e8m0_half(b.e);
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = KVALUES_MXFP4[(q & 0xF) as usize] as f32 * d;
        y[j + 16] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
    }
}

pub fn dequantize_iq4_xs(b: &BlockIQ4XS, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (j, y) in y.chunks_exact_mut(32).enumerate().take(QK_K / 32) {
        let dl = d * (iq4xs_scale(b, j) as i32 - 32) as f32;
        let qs = &b.qs[16 * j..16 * j + 16];
        for (l, &q) in qs.iter().enumerate() {
            y[l] = dl * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
            y[l + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

//! The 32-value formats: Q4_0, Q4_1, Q5_0, Q5_1 (Q8_0's encoder is the reference one).
//!
//! Without an importance matrix ggml encodes each block from its own extremes (its `_ref`
//! quantizers, C casts included); with one it searches the scale, weighting each value by its
//! importance times `sqrt(σ² + x²)`, σ² the row's mean square.

use half::f16;

use super::search::{asymmetric_levels, cvtt, signed_max, sum_squares, symmetric_levels, Ladder};
use crate::blocks::*;

/// The ladder ggml's importance-weighted quantizers search (also the K-quants').
pub(super) const WEIGHTED: Ladder = Ladder {
    start: -0.9,
    step: 0.05,
    steps: 36,
    mad: false,
};

/// `importance[i] · sqrt(σ² + x[i]²)` for a block.
pub(super) fn importance_weights(x: &[f32], qw: &[f32], sigma2: f32, out: &mut [f32]) {
    for ((w, &v), &q) in out.iter_mut().zip(x).zip(qw) {
        *w = q * (sigma2 + v * v).sqrt();
    }
}

/// The mean square of a row, as ggml sums it.
fn mean_square(row: &[f32]) -> f32 {
    sum_squares(row) / row.len() as f32
}

/// Two 16-value halves of levels packed as ggml's 32-value formats store nibbles.
fn pack_nibbles(l: &[u8; QK], qs: &mut [u8; QK / 2]) {
    for j in 0..QK / 2 {
        qs[j] = (l[j] & 0x0F) | ((l[j + QK / 2] & 0x0F) << 4);
    }
}

/// The fifth bits of 32 levels, as Q5_0/Q5_1 store them.
fn fifth_bits(l: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &q) in l.iter().enumerate() {
        qh |= (((q & 0x10) >> 4) as u32) << j;
    }
    qh.to_le_bytes()
}

/// Symmetric levels `0..2·half` from `value / d + (half + 0.5)` truncated (the `_ref`
/// encoders' arithmetic), capped at `2·half - 1`.
fn symmetric_ref(x: &[f32], half: f32, l: &mut [u8; QK]) -> f32 {
    let (max, _) = signed_max(x);
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let top = 2 * half as i32 - 1;
    for (q, &v) in l.iter_mut().zip(x) {
        *q = top.min(cvtt(v * id + (half + 0.5)) as i8 as i32) as u8;
    }
    d
}

/// Asymmetric levels from the block's extremes, `(value - min) / d + 0.5` truncated; `clamp`
/// caps them (Q4_1's encoder does, Q5_1's does not).
fn asymmetric_ref(x: &[f32], nmax: u8, clamp: bool, l: &mut [u8; QK]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / nmax as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in l.iter_mut().zip(x) {
        let t = cvtt((v - min) * id + 0.5);
        *q = if clamp {
            15.min(t as i8 as i32) as u8
        } else {
            t as u8
        };
    }
    (d, min)
}

/// Symmetric levels of a block searched against importance weights, offset to `0..2·nmax`.
fn symmetric_weighted(x: &[f32], qw: &[f32], sigma2: f32, nmax: i32, l: &mut [u8; QK]) -> f32 {
    let mut w = [0.0f32; QK];
    importance_weights(x, qw, sigma2, &mut w);
    let mut li = [0i8; QK];
    let d = symmetric_levels(nmax, x, &mut li, Some(&w));
    for (q, &v) in l.iter_mut().zip(&li) {
        *q = v as u8;
    }
    d
}

/// Asymmetric levels of a block searched against importance weights: `(d, -min)`.
fn asymmetric_weighted(
    x: &[f32],
    qw: &[f32],
    sigma2: f32,
    nmax: i32,
    l: &mut [u8; QK],
) -> (f32, f32) {
    let mut w = [0.0f32; QK];
    importance_weights(x, qw, sigma2, &mut w);
    asymmetric_levels(nmax, x, &w, l, &WEIGHTED)
}

pub(super) fn q4_0(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ4_0]) {
    let sigma2 = qw.map(|_| mean_square(row));
    let mut l = [0u8; QK];
    for (ib, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK)).enumerate() {
        let d = match (qw, sigma2) {
            (Some(qw), Some(s)) => symmetric_weighted(x, &qw[ib * QK..][..QK], s, 8, &mut l),
            _ => symmetric_ref(x, 8.0, &mut l),
        };
        b.d = f16::from_f32(d);
        pack_nibbles(&l, &mut b.qs);
    }
}

pub(super) fn q5_0(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ5_0]) {
    let sigma2 = qw.map(|_| mean_square(row));
    let mut l = [0u8; QK];
    for (ib, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK)).enumerate() {
        let d = match (qw, sigma2) {
            (Some(qw), Some(s)) => symmetric_weighted(x, &qw[ib * QK..][..QK], s, 16, &mut l),
            _ => symmetric_ref(x, 16.0, &mut l),
        };
        b.d = f16::from_f32(d);
        pack_nibbles(&l, &mut b.qs);
        b.qh = fifth_bits(&l);
    }
}

pub(super) fn q4_1(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ4_1]) {
    let sigma2 = qw.map(|_| mean_square(row));
    let mut l = [0u8; QK];
    for (ib, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK)).enumerate() {
        let (d, m) = match (qw, sigma2) {
            (Some(qw), Some(s)) => {
                let (d, neg_min) = asymmetric_weighted(x, &qw[ib * QK..][..QK], s, 15, &mut l);
                (d, -neg_min)
            }
            _ => asymmetric_ref(x, 15, true, &mut l),
        };
        b.d = f16::from_f32(d);
        b.m = f16::from_f32(m);
        pack_nibbles(&l, &mut b.qs);
    }
}

pub(super) fn q5_1(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ5_1]) {
    let sigma2 = qw.map(|_| mean_square(row));
    let mut l = [0u8; QK];
    for (ib, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK)).enumerate() {
        let (d, m) = match (qw, sigma2) {
            (Some(qw), Some(s)) => {
                let (d, neg_min) = asymmetric_weighted(x, &qw[ib * QK..][..QK], s, 31, &mut l);
                (d, -neg_min)
            }
            _ => asymmetric_ref(x, 31, false, &mut l),
        };
        b.d = f16::from_f32(d);
        b.m = f16::from_f32(m);
        pack_nibbles(&l, &mut b.qs);
        b.qh = fifth_bits(&l);
    }
}

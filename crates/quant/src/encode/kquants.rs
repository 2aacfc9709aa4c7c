//! The K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, 256-value super-blocks of 16- or 32-value
//! groups whose scales are themselves quantized against one super-block scale.
//!
//! Each format has two encoders in ggml, and so here: without an importance matrix (ggml's
//! `quantize_row_*_ref`) and with one (its `quantize_row_*_impl`), which searches harder and
//! weighs each value by its importance times `sqrt(σ² + x²)`.

use half::f16;

use super::legacy::{importance_weights, WEIGHTED};
use super::search::{
    asymmetric_levels, q3_levels, scale_levels, sum, sum_squares, symmetric_levels, Ladder,
    GROUP_MAX_EPS,
};
use crate::blocks::*;
use crate::reference::quantize::nearest_int;

/// 2-bit levels, four to a byte: byte `l` of each 32-byte half holds values `l`, `l+32`,
/// `l+64`, `l+96` of its 128.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for (half, q) in l.chunks_exact(128).zip(qs.chunks_exact_mut(32)) {
        for i in 0..32 {
            q[i] = half[i] | (half[i + 32] << 2) | (half[i + 64] << 4) | (half[i + 96] << 6);
        }
    }
}

/// The levels of a group re-derived from its stored (rounded) scale and minimum.
fn requantize(x: &[f32], d: f32, dm: f32, nmax: i32, l: &mut [u8]) {
    for (q, &v) in l.iter_mut().zip(x) {
        *q = nearest_int((v + dm) / d).clamp(0, nmax) as u8;
    }
}

pub(super) fn q2_k(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ2K]) {
    const REF: Ladder = Ladder {
        start: -0.5,
        step: 0.1,
        steps: 15,
        mad: true,
    };
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut mins = [0.0f32; QK_K / 16];
    let mut w = [0.0f32; 16];
    for (i, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK_K)).enumerate() {
        if let Some(qw) = qw {
            let sigma2 = sum_squares(x) / QK_K as f32;
            let mut sw = [0.0f32; QK_K / 16];
            for j in 0..QK_K / 16 {
                let g = &x[16 * j..][..16];
                importance_weights(g, &qw[QK_K * i + 16 * j..][..16], sigma2, &mut w);
                sw[j] = sum(&w);
                (scales[j], mins[j]) =
                    asymmetric_levels(3, g, &w, &mut l[16 * j..][..16], &WEIGHTED);
            }
            let (mut ls, mut lm) = ([0u8; QK_K / 16], [0u8; QK_K / 16]);
            b.d = f16::from_f32(scale_levels(15, &scales, &mut ls, &sw));
            b.dmin = f16::from_f32(scale_levels(15, &mins, &mut lm, &sw));
            for j in 0..QK_K / 16 {
                b.scales[j] = ls[j] | (lm[j] << 4);
            }
        } else {
            let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
            for j in 0..QK_K / 16 {
                let g = &x[16 * j..][..16];
                for (wi, &v) in w.iter_mut().zip(g) {
                    *wi = v.abs();
                }
                (scales[j], mins[j]) = asymmetric_levels(3, g, &w, &mut l[16 * j..][..16], &REF);
                if scales[j] > max_scale {
                    max_scale = scales[j];
                }
                if mins[j] > max_min {
                    max_min = mins[j];
                }
            }
            if max_scale > 0.0 {
                let iscale = 15.0 / max_scale;
                for (s, &v) in b.scales.iter_mut().zip(&scales) {
                    *s = nearest_int(iscale * v) as u8;
                }
                b.d = f16::from_f32(max_scale / 15.0);
            } else {
                b.scales = [0; QK_K / 16];
                b.d = f16::from_f32(0.0);
            }
            if max_min > 0.0 {
                let iscale = 15.0 / max_min;
                for (s, &v) in b.scales.iter_mut().zip(&mins) {
                    *s |= (nearest_int(iscale * v) << 4) as u8;
                }
                b.dmin = f16::from_f32(max_min / 15.0);
            } else {
                b.dmin = f16::from_f32(0.0);
            }
        }
        let (dall, mall) = (b.d.to_f32(), b.dmin.to_f32());
        for j in 0..QK_K / 16 {
            let d = dall * (b.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = mall * (b.scales[j] >> 4) as f32;
            requantize(&x[16 * j..][..16], d, dm, 3, &mut l[16 * j..][..16]);
        }
        pack_2bit(&l, &mut b.qs);
    }
}

/// Q3_K's sixteen 6-bit group scales (`0..64`, offset by 32) in its 12 bytes: low nibbles of
/// groups 0-7 and 8-15 share bytes 0-7, the high two bits go to bytes 8-11.
fn pack_q3_scales(levels: &[i32; QK_K / 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in levels.iter().enumerate() {
        if j < 8 {
            s[j] = (l & 0xF) as u8;
        } else {
            s[j - 8] |= ((l & 0xF) << 4) as u8;
        }
        s[j % 4 + 8] |= ((l >> 4) << (2 * (j / 4))) as u8;
    }
    s
}

/// Group `j`'s signed scale from Q3_K's packed scales.
fn q3_scale(s: &[u8; 12], j: usize) -> i32 {
    let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

pub(super) fn q3_k(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ3K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    for (i, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK_K)).enumerate() {
        let mut levels = [0i32; QK_K / 16];
        if let Some(qw) = qw {
            let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
            let mut w = [0.0f32; 16];
            let mut sw = [0.0f32; QK_K / 16];
            for j in 0..QK_K / 16 {
                let g = &x[16 * j..][..16];
                importance_weights(g, &qw[QK_K * i + 16 * j..][..16], sigma2, &mut w);
                sw[j] = sum(&w);
                scales[j] = symmetric_levels(4, g, &mut l[16 * j..][..16], Some(&w));
            }
            let mut ls = [0i8; QK_K / 16];
            let d = symmetric_levels(32, &scales, &mut ls, Some(&sw));
            for (lv, &s) in levels.iter_mut().zip(&ls) {
                *lv = s as i32;
            }
            b.scales = pack_q3_scales(&levels);
            b.d = f16::from_f32(d);
        } else {
            let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
            for j in 0..QK_K / 16 {
                scales[j] = q3_levels(4, &x[16 * j..][..16], &mut l[16 * j..][..16]);
                if scales[j].abs() > amax {
                    amax = scales[j].abs();
                    max_scale = scales[j];
                }
            }
            if max_scale != 0.0 {
                let iscale = -32.0 / max_scale;
                for (lv, &s) in levels.iter_mut().zip(&scales) {
                    *lv = (nearest_int(iscale * s) as i8 as i32).clamp(-32, 31) + 32;
                }
                b.scales = pack_q3_scales(&levels);
                b.d = f16::from_f32(1.0 / iscale);
            } else {
                b.scales = [0; 12];
                b.d = f16::from_f32(0.0);
            }
        }
        let dall = b.d.to_f32();
        for j in 0..QK_K / 16 {
            let d = dall * q3_scale(&b.scales, j) as f32;
            if d == 0.0 {
                continue;
            }
            for (q, &v) in l[16 * j..][..16].iter_mut().zip(&x[16 * j..][..16]) {
                *q = (nearest_int(v / d).clamp(-4, 3) + 4) as i8;
            }
        }
        // The third bit of value j goes to bit j / 32 of hmask byte j % 32.
        b.hmask = [0; QK_K / 8];
        let mut low = [0u8; QK_K];
        for (j, (&q, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
            let q = q as u8;
            if q > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                *lo = q - 4;
            } else {
                *lo = q;
            }
        }
        pack_2bit(&low, &mut b.qs);
    }
}

/// Q4_K/Q5_K's eight 6-bit scales and eight 6-bit minimums in 12 bytes (the inverse of
/// [`k_scale_min`]).
fn pack_k_scales(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The shared part of Q4_K and Q5_K: levels `0..=nmax` of eight 32-value groups, the packed
/// scales and minimums, and the super-block scales. `cap` applies ggml's `MIN(63, ·)` to the
/// searched scale levels (its Q5_K encoder does, its Q4_K encoder does not).
fn k_groups(
    x: &[f32],
    qw: Option<&[f32]>,
    nmax: i32,
    reference: &Ladder,
    cap: bool,
    l: &mut [u8; QK_K],
) -> ([u8; 12], f16, f16) {
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut w = [0.0f32; 32];
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let (d, dmin);
    if let Some(qw) = qw {
        let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
        let mut sw = [0.0f32; 8];
        for j in 0..8 {
            let g = &x[32 * j..][..32];
            importance_weights(g, &qw[32 * j..][..32], sigma2, &mut w);
            sw[j] = sum(&w);
            (scales[j], mins[j]) =
                asymmetric_levels(nmax, g, &w, &mut l[32 * j..][..32], &WEIGHTED);
        }
        d = f16::from_f32(scale_levels(63, &scales, &mut ls, &sw));
        dmin = f16::from_f32(scale_levels(63, &mins, &mut lm, &sw));
        if cap {
            ls.iter_mut()
                .chain(lm.iter_mut())
                .for_each(|v| *v = (*v).min(63));
        }
    } else {
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..8 {
            let g = &x[32 * j..][..32];
            let av_x = (sum_squares(g) / 32.0).sqrt();
            for (wi, &v) in w.iter_mut().zip(g) {
                *wi = av_x + v.abs();
            }
            (scales[j], mins[j]) =
                asymmetric_levels(nmax, g, &w, &mut l[32 * j..][..32], reference);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        for j in 0..8 {
            ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
        }
        d = f16::from_f32(max_scale / 63.0);
        dmin = f16::from_f32(max_min / 63.0);
    }
    let packed = pack_k_scales(&ls, &lm);
    for j in 0..8 {
        let (sc, m) = k_scale_min(&packed, j);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        requantize(&x[32 * j..][..32], dj, dm, nmax, &mut l[32 * j..][..32]);
    }
    (packed, d, dmin)
}

pub(super) fn q4_k(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ4K]) {
    const REF: Ladder = Ladder {
        start: -1.0,
        step: 0.1,
        steps: 20,
        mad: false,
    };
    let mut l = [0u8; QK_K];
    for (i, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK_K)).enumerate() {
        let qw = qw.map(|w| &w[QK_K * i..][..QK_K]);
        (b.scales, b.d, b.dmin) = k_groups(x, qw, 15, &REF, false, &mut l);
        for (q, pair) in b.qs.chunks_exact_mut(32).zip(l.chunks_exact(64)) {
            for j in 0..32 {
                q[j] = pair[j] | (pair[j + 32] << 4);
            }
        }
    }
}

pub(super) fn q5_k(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ5K]) {
    const REF: Ladder = Ladder {
        start: -0.5,
        step: 0.1,
        steps: 15,
        mad: false,
    };
    let mut l = [0u8; QK_K];
    for (i, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK_K)).enumerate() {
        let qw = qw.map(|w| &w[QK_K * i..][..QK_K]);
        (b.scales, b.d, b.dmin) = k_groups(x, qw, 31, &REF, true, &mut l);
        // Values j and j+32 of each 64 share a byte of low nibbles; their fifth bits go to
        // bits 2k and 2k+1 of qh[j] for the k-th 64.
        b.qh = [0; QK_K / 8];
        for (k, (q, pair)) in
            b.qs.chunks_exact_mut(32)
                .zip(l.chunks_exact(64))
                .enumerate()
        {
            for j in 0..32 {
                let (a, c) = (pair[j], pair[j + 32]);
                b.qh[j] |= ((a >> 4) << (2 * k)) | ((c >> 4) << (2 * k + 1));
                q[j] = (a & 0xF) | ((c & 0xF) << 4);
            }
        }
    }
}

pub(super) fn q6_k(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockQ6K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    for (i, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK_K)).enumerate() {
        let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
        for ib in 0..QK_K / 16 {
            let w = qw.map(|w| &w[QK_K * i + 16 * ib..][..16]);
            scales[ib] = symmetric_levels(32, &x[16 * ib..][..16], &mut l[16 * ib..][..16], w);
            if scales[ib].abs() > max_abs {
                max_abs = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        if max_abs < GROUP_MAX_EPS {
            *b = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f16::from_f32(1.0 / iscale);
        for (s, &v) in b.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * v).min(127) as i8;
        }
        let dall = b.d.to_f32();
        for j in 0..QK_K / 16 {
            let d = dall * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for (q, &v) in l[16 * j..][..16].iter_mut().zip(&x[16 * j..][..16]) {
                *q = (nearest_int(v / d).clamp(-32, 31) + 32) as i8;
            }
        }
        // Each 128 values: low nibbles of values l and l+64 in ql[l], of l+32 and l+96 in
        // ql[l+32]; their top two bits in qh[l], in the order l, l+32, l+64, l+96.
        for ((half, ql), qh) in l
            .chunks_exact(128)
            .zip(b.ql.chunks_exact_mut(64))
            .zip(b.qh.chunks_exact_mut(32))
        {
            for j in 0..32 {
                let q = [0, 32, 64, 96].map(|o| half[j + o] as u8);
                ql[j] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
                ql[j + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
                qh[j] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
    }
}

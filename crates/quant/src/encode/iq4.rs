//! IQ4_NL and IQ4_XS: 4-bit indices into [`KVALUES_IQ4NL`]'s non-uniform levels, with one scale
//! per 32 values (IQ4_NL) or 6-bit group scales under a super-block scale (IQ4_XS).
//!
//! ggml has one encoder for both (its `quantize_row_iq4_nl_impl`), run with 7 trial scales on
//! each side of the first guess whether or not an importance matrix is given.

use half::f16;

use super::search::{nearest_level, signed_max, GROUP_MAX_EPS};
use crate::blocks::*;
use crate::reference::quantize::nearest_int;

const TRIES: i32 = 7;

/// The best scale for one 32-value group: the scale mapping the value of largest magnitude to
/// the lowest level, then `2·TRIES` neighbours, keeping the weighted least-squares optimum.
/// Writes the first guess's indices to `l`.
fn group_scale(x: &[f32], w: &[f32], l: &mut [u8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v = &KVALUES_IQ4NL;
    let lowest = v[0] as f32;
    let fit = |id: f32, mut keep: Option<&mut [u8]>| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..x.len() {
            let k = nearest_level(v, id * x[j]);
            if let Some(l) = keep.as_deref_mut() {
                l[j] = k as u8;
            }
            let q = v[k] as f32;
            sumqx += w[j] * q * x[j];
            sumq2 += w[j] * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / lowest;
    let (sumqx, sumq2) = fit(1.0 / d, Some(l));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -TRIES..=TRIES {
        let id = (itry + v[0] as i32) as f32 / max;
        let (sumqx, sumq2) = fit(id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// The weights of a group: importance times `sqrt(σ² + x²)`, or `x²` without importance.
fn weights(x: &[f32], qw: Option<&[f32]>, sigma2: f32, w: &mut [f32; 32]) {
    match qw {
        Some(qw) => super::legacy::importance_weights(x, qw, sigma2, w),
        None => {
            for (wi, &v) in w.iter_mut().zip(x) {
                *wi = v * v;
            }
        }
    }
}

/// `σ²` of a (super-)block as ggml takes it: twice the mean square.
fn sigma2(x: &[f32]) -> f32 {
    super::search::sum_squares(x) * (2.0 / x.len() as f32)
}

fn pack(l: &[u8], qs: &mut [u8]) {
    for (q, g) in qs.chunks_exact_mut(16).zip(l.chunks_exact(32)) {
        for j in 0..16 {
            q[j] = g[j] | (g[j + 16] << 4);
        }
    }
}

pub(super) fn iq4_nl(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockIQ4NL]) {
    let mut l = [0u8; QK];
    let mut w = [0.0f32; 32];
    for (ib, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK)).enumerate() {
        weights(x, qw.map(|q| &q[QK * ib..][..QK]), sigma2(x), &mut w);
        let d = group_scale(x, &w, &mut l);
        b.d = f16::from_f32(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in l.iter_mut().zip(x) {
            *q = nearest_level(&KVALUES_IQ4NL, id * v) as u8;
        }
        pack(&l, &mut b.qs);
    }
}

pub(super) fn iq4_xs(row: &[f32], qw: Option<&[f32]>, out: &mut [BlockIQ4XS]) {
    let mut l = [0u8; QK_K];
    let mut w = [0.0f32; 32];
    let mut scales = [0.0f32; QK_K / 32];
    for (i, (b, x)) in out.iter_mut().zip(row.chunks_exact(QK_K)).enumerate() {
        let s2 = sigma2(x);
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for ib in 0..QK_K / 32 {
            let g = &x[32 * ib..][..32];
            weights(g, qw.map(|q| &q[QK_K * i + 32 * ib..][..32]), s2, &mut w);
            scales[ib] = group_scale(g, &w, &mut l[32 * ib..][..32]);
            if scales[ib].abs() > amax_scale {
                amax_scale = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        let d = -max_scale / 32.0;
        b.d = f16::from_f32(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.scales_h = 0;
        b.scales_l = [0; QK_K / 64];
        for ib in 0..QK_K / 32 {
            let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for (q, &v) in l[32 * ib..][..32].iter_mut().zip(&x[32 * ib..][..32]) {
                *q = nearest_level(&KVALUES_IQ4NL, idl * v) as u8;
            }
            let ls = (ls + 32) as u8;
            b.scales_l[ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
            b.scales_h |= ((ls >> 4) as u16) << (2 * (ib % 8));
        }
        pack(&l, &mut b.qs);
    }
}

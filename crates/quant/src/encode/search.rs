//! The searches ggml's file quantizers run to choose a group's scale (and minimum): each tries
//! a ladder of candidate scales and keeps the one with the smallest weighted error. They are
//! written to do ggml's float operations in ggml's order (no fused multiply-add, sums in index
//! order), because a last-bit difference in a sum can pick another candidate and change the
//! file.

use crate::reference::quantize::nearest_int;

/// Below this largest magnitude a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// The value of largest magnitude, the first of equals; 0 for none. Returns `(value, |value|)`.
#[inline]
pub(super) fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// A float-to-integer conversion as x86's `cvttss2si` does it (what a C cast compiles to):
/// truncation toward zero, and `i32::MIN` for NaN and out-of-range values. C casts of ggml's
/// quantizers narrow the result further, which callers do with `as`.
#[inline]
pub(super) fn cvtt(v: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// The index of the level of `values` (ascending) nearest to `x`; the upper of two equally
/// near.
#[inline]
pub(super) fn nearest_level(values: &[i8; 16], x: f32) -> usize {
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[15] as f32 {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < values[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - (values[hi - 1] as f32) < (values[hi] as f32) - x {
        hi - 1
    } else {
        hi
    }
}

/// Symmetric levels `-nmax..nmax-1` for `x`, written to `l` offset by `nmax`; returns the
/// scale. Starts from the scale that maps the value of largest magnitude to `-nmax` and tries
/// 18 neighbours, keeping the one that maximises `(Σ w·x·l)² / Σ w·l²` (the least-squares
/// error at its best scale). The weights are `qw`, or `x²` without them (ggml's
/// `make_qx_quants` with `rmse_type` 1).
pub(super) fn symmetric_levels(nmax: i32, x: &[f32], l: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let weight = |i: usize| match qw {
        Some(w) => w[i],
        None => x[i] * x[i],
    };
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let q = level(iscale, v);
        l[i] = (q + nmax) as i8;
        let w = weight(i);
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (i, &v) in x.iter().enumerate() {
            let q = level(iscale, v) as f32;
            let w = weight(i);
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (level(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's levels without an importance matrix (ggml's `make_q3_quants` with `do_rmse`): the
/// levels of the scale that maps the largest magnitude to `-nmax`, then up to five sweeps that
/// move single values to the level their leave-one-out scale prefers while the `x²`-weighted
/// fit improves. Levels are written offset by `nmax`; returns the scale.
pub(super) fn q3_levels(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let cur = *li as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let q = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if q != *li as i32 {
                    slx += w * v * q as f32;
                    sl2 += w * q as f32 * q as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = q as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search over a ladder of scales for an asymmetric group (`x ≈ scale·l - min`).
pub(super) struct Ladder {
    /// First step's offset from `nmax` and the step (ggml's `rmin`, `rdelta`).
    pub start: f32,
    pub step: f32,
    /// Steps after the first.
    pub steps: i32,
    /// Absolute error instead of squared.
    pub mad: bool,
}

/// Unsigned levels `0..=nmax` with a scale and a minimum for `x`, weighted by `weights`
/// (ggml's `make_qkx2_quants` / `make_qkx3_quants`, which agree whenever weights are given).
/// Starts from the levels of `[min(x, 0), max(x)]`, then for each scale of the ladder takes the
/// weighted least-squares scale and minimum of its levels, keeping the pair of least error.
/// Returns `(scale, -min)`; `l` gets the levels.
pub(super) fn asymmetric_levels(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    ladder: &Ladder,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let error = |d: f32| if ladder.mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        best_error += weights[i] * error(scale * l[i] as f32 + min - x[i]);
    }
    if ladder.steps < 1 {
        return (scale, -min);
    }
    let mut aux = [0u8; 32];
    let aux = &mut aux[..n];
    for is in 0..=ladder.steps {
        iscale = (ladder.start + ladder.step * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let w = weights[i];
            sum_l += w * q as f32;
            sum_l2 += w * q as f32 * q as f32;
            sum_xl += w * q as f32 * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * error(this_scale * aux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l.copy_from_slice(aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Levels `0..=nmax` for a super-block's non-negative group scales (or minimums), weighted by
/// the groups' total importance (ggml's `make_qp_quants`): nine candidate scales around the one
/// that maps the largest to `nmax`, then up to five sweeps moving single levels while the fit
/// improves. Returns the super-block scale.
pub(super) fn scale_levels(nmax: i32, x: &[f32], l: &mut [u8], qw: &[f32]) -> f32 {
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (li, &v) in l.iter_mut().zip(x) {
        // A negative level wraps as ggml's `uint8_t` store does; only the later sweeps read it.
        *li = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..x.len() {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in (-4..=4).filter(|&is| is != 0) {
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..x.len() {
            let q = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * q as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..x.len() {
        let q = nearest_int(iscale * x[i]).min(nmax);
        l[i] = q as u8;
        let w = qw[i];
        sumlx += w * x[i] * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..x.len() {
            let w = qw[i];
            let cur = l[i] as f32;
            let mut slx = sumlx - w * x[i] * cur;
            let mut sl2 = suml2 - w * cur * cur;
            if slx > 0.0 && sl2 > 0.0 {
                let q = nearest_int(x[i] * sl2 / slx).min(nmax);
                if q != l[i] as i32 {
                    slx += w * x[i] * q as f32;
                    sl2 += w * q as f32 * q as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = q as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

//! The searches ggml's file quantizers run to choose a group's scale (and minimum): each tries
//! a ladder of candidate scales and keeps the one with the smallest weighted error. They are
//! written to do ggml's float operations in ggml's order (no fused multiply-add, sums in index
//! order), because a last-bit difference in a sum can pick another candidate and change the
//! file.

use crate::reference::quantize::nearest_int;

/// Below this largest magnitude a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// The sum of `x`, in index order.
pub(super) fn sum(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v;
    }
    s
}

/// The sum of the squares of `x`, in index order.
pub(super) fn sum_squares(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

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
    let iscale = -(nmax as f32) / max;
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
    // The 18 trial scales' sums are independent: LANES of them at a time, each lane summing
    // in index order; then the trials are judged one by one, in order, as ggml judges them.
    const TRIALS: [i32; 18] = [
        -9, -8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9,
    ];
    for group in TRIALS.chunks(LANES) {
        let mut iscale = [0.0f32; LANES];
        for (s, is) in iscale.iter_mut().enumerate() {
            let trial = group[s.min(group.len() - 1)];
            *is = -(nmax as f32 + 0.1 * trial as f32) / max;
        }
        let (mut sumlx, mut suml2) = ([0.0f32; LANES], [0.0f32; LANES]);
        for (i, &v) in x.iter().enumerate() {
            let w = weight(i);
            let q = lane_levels(&iscale, v, -nmax, nmax - 1);
            for s in 0..LANES {
                sumlx[s] += w * v * q[s];
                suml2[s] += w * q[s] * q[s];
            }
        }
        for s in 0..group.len() {
            if suml2[s] > 0.0 && sumlx[s] * sumlx[s] > best * suml2[s] {
                for (li, &v) in l.iter_mut().zip(x) {
                    *li = (level(iscale[s], v) + nmax) as i8;
                }
                scale = sumlx[s] / suml2[s];
                best = scale * sumlx[s];
            }
        }
    }
    scale
}

/// Trial scales searched side by side, one a SIMD lane.
const LANES: usize = 8;

/// `nearest_int(iscale[s] · v)` clamped to `lo..=hi`, for each lane, as floats.
#[inline(always)]
fn lane_levels(iscale: &[f32; LANES], v: f32, lo: i32, hi: i32) -> [f32; LANES] {
    let mut q = [0.0f32; LANES];
    for s in 0..LANES {
        q[s] = nearest_int(iscale[s] * v).clamp(lo, hi) as f32;
    }
    q
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
    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        best_error += weights[i] * error(scale * l[i] as f32 + min - x[i]);
    }
    if ladder.steps < 1 {
        return (scale, -min);
    }
    // A step's sums depend on the steps before it only through `min`, which changes when a
    // step wins: LANES steps are summed at a time, each lane in index order, with the current
    // `min`, then judged one by one in order as ggml judges them; after a win the steps past
    // it are summed again with the new `min`.
    let mut lv = [[0.0f32; LANES]; 32];
    let lv = &mut lv[..n];
    let total = ladder.steps as usize + 1;
    let mut first = 0;
    while first < total {
        let count = LANES.min(total - first);
        let mut iscale = [0.0f32; LANES];
        for (s, is) in iscale.iter_mut().enumerate() {
            let step = (first + s.min(count - 1)) as f32;
            *is = (ladder.start + ladder.step * step + nmax as f32) / (max - min);
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) =
            ([0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES]);
        for i in 0..n {
            let q = lane_levels(&iscale, x[i] - min, 0, nmax);
            lv[i] = q;
            let w = weights[i];
            for s in 0..LANES {
                sum_l[s] += w * q[s];
                sum_l2[s] += w * q[s] * q[s];
                sum_xl[s] += w * q[s] * x[i];
            }
        }
        let (mut this_scale, mut this_min) = ([0.0f32; LANES], [0.0f32; LANES]);
        let mut usable = [false; LANES];
        for s in 0..LANES {
            let det = sum_w * sum_l2[s] - sum_l[s] * sum_l[s];
            usable[s] = det > 0.0;
            this_scale[s] = (sum_w * sum_xl[s] - sum_x * sum_l[s]) / det;
            this_min[s] = (sum_l2[s] * sum_x - sum_l[s] * sum_xl[s]) / det;
            if this_min[s] > 0.0 {
                this_min[s] = 0.0;
                this_scale[s] = sum_xl[s] / sum_l2[s];
            }
        }
        let mut cur_error = [0.0f32; LANES];
        for i in 0..n {
            for s in 0..LANES {
                let d = this_scale[s] * lv[i][s] + this_min[s] - x[i];
                cur_error[s] += weights[i] * if ladder.mad { d.abs() } else { d * d };
            }
        }
        let mut next = first + count;
        for s in 0..count {
            if usable[s] && cur_error[s] < best_error {
                for (li, q) in l.iter_mut().zip(lv.iter()) {
                    *li = q[s] as u8;
                }
                best_error = cur_error[s];
                scale = this_scale[s];
                if this_min[s].to_bits() != min.to_bits() {
                    min = this_min[s];
                    next = first + s + 1;
                    break;
                }
            }
        }
        first = next;
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

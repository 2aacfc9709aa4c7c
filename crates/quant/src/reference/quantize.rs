//! Reference quantizers for the activation formats (Q8_0, Q8_1, Q8_K) and the float formats.
//! They reproduce ggml's `quantize_row_*_ref` bit for bit: the same scale, the same rounding
//! (`roundf`, half away from zero, for Q8_0/Q8_1; round half to even for Q8_K) and the same
//! conversion to f16 (round to nearest even).
//!
//! At inference llama.cpp does not call the `_ref` quantizers for Q8_0 and Q8_1 but ggml-cpu's
//! vectorised ones, which compute the reciprocal scale as `127 / amax` rather than `1 / d` and
//! round half to even; the two disagree on a value now and then, and each disagreement moves an
//! activation by a whole quantization step. [`quantize_q8_0_act`] and [`quantize_q8_1_act`] are
//! those runtime quantizers, so that a model's matmuls see the activations llama.cpp's see.

use half::{bf16, f16};

use crate::blocks::*;

pub fn quantize_f32(x: &[f32], y: &mut f32) {
    *y = x[0];
}

pub fn quantize_f16(x: &[f32], y: &mut f16) {
    *y = f16::from_f32(x[0]);
}

/// ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, NaN kept quiet (not truncated to
/// infinity).
pub fn quantize_bf16(x: &[f32], y: &mut bf16) {
    *y = f32_to_bf16(x[0]);
}

/// [`quantize_bf16`] of one value (also the row loop of `codec`'s BF16 activations, which the
/// compiler vectorises).
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> bf16 {
    let bits = x.to_bits();
    bf16::from_bits(if bits & 0x7fff_ffff > 0x7f80_0000 {
        ((bits >> 16) | 64) as u16
    } else {
        ((bits + (0x7fff + ((bits >> 16) & 1))) >> 16) as u16
    })
}

#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Scale and reciprocal of a Q8_0/Q8_1 block: `d = amax / 127`.
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let d = abs_max(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^22` (ggml's `nearest_int`):
/// adding 1.5 * 2^23 leaves the integer in the low bits. Integer operations only, so that the
/// quantizers' loops vectorise (a float-to-int cast kept them scalar); the default NaN gives 0,
/// as a cast does.
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// Scale and reciprocal as ggml-cpu's vectorised quantizers compute them.
#[inline(always)]
fn q8_scale_act(x: &[f32]) -> (f32, f32) {
    let amax = abs_max(x);
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (amax / 127.0, id)
}

/// Q8_0 as llama.cpp quantizes activations at inference (ggml-cpu's `quantize_row_q8_0`).
#[inline(always)]
pub fn quantize_q8_0_act(x: &[f32], y: &mut BlockQ8_0) {
    let (d, id) = q8_scale_act(x);
    y.d = f16::from_f32(d);
    // |v * id| <= 127 (id = 127 / amax): the clamp only keeps the cast's saturation.
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = nearest_int(v * id).clamp(-128, 127) as i8;
    }
}

/// Q8_1 as llama.cpp quantizes activations at inference (ggml-cpu's `quantize_row_q8_1`).
#[inline(always)]
pub fn quantize_q8_1_act(x: &[f32], y: &mut BlockQ8_1) {
    let (d, id) = q8_scale_act(x);
    y.d = f16::from_f32(d);
    let mut sum = 0i32;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = nearest_int(v * id).clamp(-128, 127) as i8;
        sum += *q as i32;
    }
    y.s = f16::from_f32(d * sum as f32);
}

pub fn quantize_q8_0(x: &[f32], y: &mut BlockQ8_0) {
    let (d, id) = q8_scale(x);
    y.d = f16::from_f32(d);
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
}

pub fn quantize_q8_1(x: &[f32], y: &mut BlockQ8_1) {
    let (d, id) = q8_scale(x);
    y.d = f16::from_f32(d);
    let mut sum = 0i32;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
        sum += *q as i32;
    }
    y.s = f16::from_f32(sum as f32 * d);
}

/// Q8_K: the scale is set by the value of largest magnitude, which maps to -127 exactly
/// (`iscale = -127 / max`); values are rounded half to even and clamped at 127.
#[inline(always)]
pub fn quantize_q8_k(x: &[f32], y: &mut BlockQ8K) {
    // The value of largest magnitude, the first of them if several: ggml's loop keeps `v` when
    // `|v| > amax`, which skips NaN. Written as a maximum over eight running lanes (exact in
    // any order), then a search for its first occurrence, so that the compiler vectorises it.
    let x = &x[..QK_K];
    let mut lanes = [0.0f32; 8];
    for c in x.chunks_exact(8) {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v.abs() > *m { v.abs() } else { *m };
        }
    }
    let amax = lanes.iter().fold(0.0f32, |m, &v| if v > m { v } else { m });
    let max = x.iter().find(|v| v.abs() == amax).copied().unwrap_or(0.0);
    if amax == 0.0 {
        *y = bytemuck::Zeroable::zeroed();
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        // |iscale * v| <= 127: ggml's `nearest_int` applies.
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, g) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = g.iter().map(|&q| q as i16).sum();
    }
    y.d = 1.0 / iscale;
}

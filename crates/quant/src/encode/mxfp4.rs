//! MXFP4: each block's E8M0 exponent from its largest magnitude, then each value's nearest
//! level (ggml's `quantize_row_mxfp4_ref`; it takes no importance).

use crate::blocks::{e8m0_half, BlockMXFP4, KVALUES_MXFP4};

pub(super) fn mxfp4(row: &[f32], _qw: Option<&[f32]>, out: &mut [BlockMXFP4]) {
    for (x, b) in row.chunks_exact(32).zip(out) {
        // NaN never becomes the maximum (`amax < |v|` is false), as in ggml.
        let amax = x
            .iter()
            .fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        // ggml converts the float exponent to its u8 through x86's truncating conversion:
        // what is out of an i32's range (an infinite maximum) comes out as 0.
        b.e = if amax > 0.0 {
            truncate_like_x86(amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_half(b.e);
        for j in 0..16 {
            b.qs[j] = nearest(x[j], d) | (nearest(x[j + 16], d) << 4);
        }
    }
}

/// The first level of the least error `|level * d - x|` (the products are exact: a small
/// integer times a power of two).
fn nearest(x: f32, d: f32) -> u8 {
    let err = |i: usize| (KVALUES_MXFP4[i] as f32 * d - x).abs();
    let (mut best, mut best_err) = (0, err(0));
    for i in 1..16 {
        let e = err(i);
        if e < best_err {
            (best, best_err) = (i, e);
        }
    }
    best as u8
}

/// `cvttss2si`: toward zero, and `i32::MIN` for NaN and what an i32 cannot hold (Rust's `as`
/// saturates instead).
fn truncate_like_x86(x: f32) -> i32 {
    if (-2147483648.0..2147483648.0).contains(&x) {
        x as i32
    } else {
        i32::MIN
    }
}

//! BF16 weights with BF16 activations on NEON, with the reference's bits
//! ([`crate::reference::dot::vec_dot_bf16_bf16`]: `vdpbf16ps` as llama.cpp's x86 build runs it,
//! emulated): each pair's odd product first, then the even one, each a fused multiply-add in
//! f32 lanes, subnormal inputs taken as zero and subnormal results flushed to zero of their
//! sign, as [`crate::x86::bf16`]'s AVX2 form does. aarch64's own BF16 dot product (`BFDOT`)
//! does not round step by step as `vdpbf16ps` does, so it cannot give these bits.
//!
//! The reference's two accumulators of sixteen lanes are eight `float32x4_t`: register `q`
//! holds lanes `4 (q % 4)..+4` of accumulator `q / 4`, whose pairs are the eight values
//! `64 i + 8 q..+8` of each 64-value step, one 16-byte load.

use std::arch::aarch64::*;

use half::bf16;

use crate::codec::gemm_operands;
use crate::reference::dot::bf16_tail;
use crate::QuantError;

/// `v`'s lanes as floats, those with a zero exponent (zeros and subnormals) as zero of their
/// sign.
#[inline(always)]
fn flush4(v: uint32x4_t) -> float32x4_t {
    // SAFETY: NEON is part of the aarch64 baseline; registers only.
    unsafe {
        let exp = vandq_u32(v, vdupq_n_u32(0x7F80_0000));
        let tiny = vceqq_u32(exp, vdupq_n_u32(0));
        let clear = vandq_u32(tiny, vdupq_n_u32(0x7FFF_FFFF));
        vreinterpretq_f32_u32(vbicq_u32(v, clear))
    }
}

/// Eight values from `p` as their four pairs' odd and even values (lane `l`: pair `l`), taken
/// as `vdpbf16ps` takes them.
///
/// # Safety
/// `p..p + 8` must be readable.
#[inline(always)]
unsafe fn pairs4(p: *const bf16) -> [float32x4_t; 2] {
    // SAFETY: the caller's bounds; NEON is part of the aarch64 baseline.
    unsafe {
        let v = vld1q_u32(p.cast());
        let odd = vandq_u32(v, vdupq_n_u32(0xFFFF_0000));
        [flush4(odd), flush4(vshlq_n_u32::<16>(v))]
    }
}

/// One `vdpbf16ps` step of four lanes: `acc + odd products`, then `+ even products`, each
/// result's subnormals flushed.
#[inline(always)]
fn dp4(acc: float32x4_t, x: [float32x4_t; 2], y: [float32x4_t; 2]) -> float32x4_t {
    // SAFETY: NEON is part of the aarch64 baseline; registers only.
    unsafe {
        let a = flush4(vreinterpretq_u32_f32(vfmaq_f32(acc, x[0], y[0])));
        flush4(vreinterpretq_u32_f32(vfmaq_f32(a, x[1], y[1])))
    }
}

/// The reference's `reduce_add_16` of one accumulator (its four registers `a`): lanes `i` and
/// `i + 8`, then `i` and `i + 4`, then the last four pairwise.
#[inline(always)]
fn reduce16(a: &[float32x4_t]) -> f32 {
    // SAFETY: NEON is part of the aarch64 baseline; registers only.
    unsafe {
        let t4 = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
        (vgetq_lane_f32::<0>(t4) + vgetq_lane_f32::<2>(t4))
            + (vgetq_lane_f32::<1>(t4) + vgetq_lane_f32::<3>(t4))
    }
}

/// `R` rows (each at least `y.len()` long) with one activation row.
pub fn dot_bf16<const R: usize>(x: [&[bf16]; R], y: &[bf16]) -> [f32; R] {
    let n = y.len();
    let x = x.map(|r| &r[..n]);
    let np = n & !63;
    // SAFETY: NEON is part of the aarch64 baseline.
    let mut acc = [[unsafe { vdupq_n_f32(0.0) }; 8]; R];
    let mut i = 0;
    while i < np {
        for q in 0..8 {
            // SAFETY: values i + 8q..+8 < np <= n of `y` and of every row.
            unsafe {
                let yv = pairs4(y.as_ptr().add(i + 8 * q));
                for (acc, x) in acc.iter_mut().zip(&x) {
                    acc[q] = dp4(acc[q], pairs4(x.as_ptr().add(i + 8 * q)), yv);
                }
            }
        }
        i += 64;
    }
    let mut out = [0f32; R];
    for (r, o) in out.iter_mut().enumerate() {
        *o = bf16_tail(
            reduce16(&acc[r][..4]),
            reduce16(&acc[r][4..]),
            &x[r][np..],
            &y[np..],
        );
    }
    out
}

/// One row with one activation row ([`dot_bf16`]).
pub fn dot_bf16_row(x: &[bf16], y: &[bf16]) -> f32 {
    dot_bf16::<1>([x], y)[0]
}

/// Rows times a batch of tokens ([`crate::GemmFn`]): two rows at a time, every token against them
/// while they are in the first-level cache.
pub fn gemm_bf16(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (x, y, per_row) = gemm_operands::<bf16>(w, row_bytes, a, n_tok, out)?;
    let rows = x.len() / per_row.max(1);
    let mut r = 0;
    while r < rows {
        let left = rows - r;
        for t in 0..n_tok {
            let yt = &y[t * per_row..][..per_row];
            let row = |k: usize| &x[(r + k) * per_row..][..per_row];
            if left >= 2 {
                let [a, b] = dot_bf16::<2>([row(0), row(1)], yt);
                out[t * rows + r] = a;
                out[t * rows + r + 1] = b;
            } else {
                out[t * rows + r] = dot_bf16::<1>([row(0)], yt)[0];
            }
        }
        r += left.min(2);
    }
    Ok(())
}

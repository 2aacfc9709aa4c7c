//! NEON dot products of the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) with Q8_0 or
//! Q8_1 activations, in `vec_dot` order and, for Q4_0 and IQ4_NL, in the order of llama.cpp's
//! repacked gemv. Per block: eight exact i32 lanes (values `4j..4j+4` each), one fused
//! multiply-add of them by `d_x * d_y`; the reference's operations in its order. Each kernel is
//! a [`Split`]: the block's values unpacked once (`prep`), then each token's part (`step`).

use std::arch::aarch64::*;

use super::neon::*;
use super::tile::{Split, Sums};
use crate::blocks::*;

/// The 32 nibbles of a block as bytes: low nibbles (values 0..16), high nibbles (16..32).
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let q = ld_u8(qs, 0);
    (vandq_u8(q, vdupq_n_u8(0xF)), vshrq_n_u8::<4>(q))
}

/// The 32 activations of a Q8 block as 16 + 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
fn acts(qs: &[i8; 32]) -> (int8x16_t, int8x16_t) {
    (ld_s8(qs, 0), ld_s8(qs, 16))
}

/// `(lo - k, hi - k)` as signed bytes.
#[inline]
#[target_feature(enable = "neon")]
fn minus(v: (uint8x16_t, uint8x16_t), k: u8) -> (int8x16_t, int8x16_t) {
    let k = vdupq_n_u8(k);
    (s8(vsubq_u8(v.0, k)), s8(vsubq_u8(v.1, k)))
}

/// The 5-bit values of a Q5 block: the nibbles, plus 16 where bit `j` of the u32 `qh` is set.
#[inline]
#[target_feature(enable = "neon")]
fn q5_bytes(qs: &[u8; 16], qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let spread = |a: u8, b: u8| vcombine_u8(vdup_n_u8(a), vdup_n_u8(b));
    let sixteen = vdupq_n_u8(0x10);
    let high = |v| vandq_u8(vtstq_u8(v, bits), sixteen);
    let (lo, hi) = nibbles(qs);
    (
        vorrq_u8(lo, high(spread(qh[0], qh[1]))),
        vorrq_u8(hi, high(spread(qh[2], qh[3]))),
    )
}

/// The 32 IQ4_NL values of a block, looked up in the non-uniform table.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn iq4_values(qs: &[u8]) -> (int8x16_t, int8x16_t) {
    table_values(&KVALUES_IQ4NL, qs)
}

/// The 32 values of a block of nibbles, each looked up in `table`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn table_values(table: &[i8; 16], qs: &[u8]) -> (int8x16_t, int8x16_t) {
    let table = ld_s8(table, 0);
    let q = ld_u8(qs, 0);
    (
        vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0xF))),
        vqtbl1q_s8(table, vshrq_n_u8::<4>(q)),
    )
}

/// A 32-value block unpacked: its values as 16 + 16 signed bytes, `d` and (Q4_1, Q5_1) `m`.
pub(super) struct Prep32 {
    w: (int8x16_t, int8x16_t),
    d: f32,
    m: f32,
}

/// A [`Split`] of the `vec_dot` order of a format without a min (Q4_0, Q5_0, Q8_0): per block,
/// `acc.fma(d_x * d_y, lanes)`.
macro_rules! plain_split {
    ($(#[$doc:meta])* $name:ident: $w:ty, $a:ty, $tokens:literal, |$x:ident| $values:expr) => {
        $(#[$doc])*
        pub(super) struct $name;
        impl Split for $name {
            type W = $w;
            type A = $a;
            type Prep = Prep32;
            type Acc = Acc8;
            const TOKENS: usize = $tokens;
            #[inline]
            #[target_feature(enable = "neon")]
            unsafe fn prep($x: &$w) -> Prep32 {
                Prep32 {
                    w: $values,
                    d: f32_of($x.d),
                    m: 0.0,
                }
            }
            #[inline]
            #[target_feature(enable = "neon")]
            unsafe fn step<D: Dot>(dt: D, p: &Prep32, y: &$a, acc: &mut Acc8) {
                acc.fma(p.d * f32_of(y.d), Lanes::of(dt, p.w, acts(&y.qs)));
            }
        }
    };
}

/// A [`Split`] of the `vec_dot` order of a format with a min (Q4_1, Q5_1), against Q8_1: per
/// block, the min fused into one running float by the activations' sum, then the lanes.
macro_rules! min_split {
    ($(#[$doc:meta])* $name:ident: $w:ty, |$x:ident| $values:expr) => {
        $(#[$doc])*
        pub(super) struct $name;
        impl Split for $name {
            type W = $w;
            type A = BlockQ8_1;
            type Prep = Prep32;
            type Acc = (Acc8, f32);
            #[inline]
            #[target_feature(enable = "neon")]
            unsafe fn prep($x: &$w) -> Prep32 {
                let (lo, hi) = $values;
                Prep32 {
                    w: (s8(lo), s8(hi)),
                    d: f32_of($x.d),
                    m: f32_of($x.m),
                }
            }
            #[inline]
            #[target_feature(enable = "neon")]
            unsafe fn step<D: Dot>(dt: D, p: &Prep32, y: &BlockQ8_1, (acc, mins): &mut Self::Acc) {
                *mins = p.m.mul_add(f32_of(y.s), *mins);
                acc.fma(p.d * f32_of(y.d), Lanes::of(dt, p.w, acts(&y.qs)));
            }
        }
    };
}

/// A [`Split`] of the order of llama.cpp's repacked gemv (Q4_0, IQ4_NL; `reference::dot`'s
/// `_rows8` kernels): the block unpacked as the `vec_dot`-order split `$base` has it, and per
/// block the exact total, fused into one running float.
macro_rules! rows8_split {
    ($(#[$doc:meta])* $name:ident: $w:ty => $base:ty) => {
        $(#[$doc])*
        pub(super) struct $name;
        impl Split for $name {
            type W = $w;
            type A = BlockQ8_0;
            type Prep = Prep32;
            type Acc = f32;
            const TOKENS: usize = 8;
            #[inline]
            #[target_feature(enable = "neon")]
            unsafe fn prep(x: &$w) -> Prep32 {
                // SAFETY: this function's features.
                unsafe { <$base as Split>::prep(x) }
            }
            #[inline]
            #[target_feature(enable = "neon")]
            unsafe fn step<D: Dot>(dt: D, p: &Prep32, y: &BlockQ8_0, acc: &mut f32) {
                let isum = Lanes::of(dt, p.w, acts(&y.qs)).sum();
                *acc = (isum as f32).mul_add(p.d * f32_of(y.d), *acc);
            }
        }
    };
}

plain_split!(
    /// Q4_0 in `vec_dot` order: nibbles less 8.
    Q4_0: BlockQ4_0, BlockQ8_0, 8, |x| minus(nibbles(&x.qs), 8)
);
plain_split!(
    /// Q5_0 in `vec_dot` order: 5-bit values less 16.
    Q5_0: BlockQ5_0, BlockQ8_0, 8, |x| minus(q5_bytes(&x.qs, x.qh), 16)
);
plain_split!(
    /// Q8_0 in `vec_dot` order.
    Q8_0: BlockQ8_0, BlockQ8_0, 4, |x| acts(&x.qs)
);
min_split!(
    /// Q4_1 in `vec_dot` order: nibbles, and the min.
    Q4_1: BlockQ4_1, |x| nibbles(&x.qs)
);
min_split!(
    /// Q5_1 in `vec_dot` order: 5-bit values, and the min.
    Q5_1: BlockQ5_1, |x| q5_bytes(&x.qs, x.qh)
);
rows8_split!(
    /// Q4_0 in the order of llama.cpp's repacked gemv.
    Q4_0Rows8: BlockQ4_0 => Q4_0
);
rows8_split!(
    /// IQ4_NL in the order of llama.cpp's repacked gemv.
    IQ4NLRows8: BlockIQ4NL => IQ4NL
);

rows8_split!(
    /// MXFP4 in the order of llama.cpp's repacked gemv.
    MXFP4Rows8: BlockMXFP4 => MXFP4
);

/// IQ4_NL in ggml's x86 `vec_dot` order: blocks in pairs, even blocks into one set of eight
/// lanes and odd ones into another, added lane by lane before the horizontal sum; a last odd
/// block fused onto the sum ([`PairedBlocks`]).
pub(super) struct IQ4NL;

/// The sums of [`IQ4NL`]: an even block waits (`held`) for its pair, so that a row's last
/// block, if it has none, is fused after the horizontal sum as the reference does.
#[derive(Clone, Copy)]
pub(super) struct PairedBlocks {
    even: Acc8,
    odd: Acc8,
    held: Option<(f32, Lanes)>,
}

impl Sums for PairedBlocks {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn zero() -> PairedBlocks {
        PairedBlocks {
            even: Acc8::new(),
            odd: Acc8::new(),
            held: None,
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn finish(self) -> f32 {
        let sum = self.even.add(self.odd).hsum();
        match self.held {
            Some((d, lanes)) => d.mul_add(lanes.sum() as f32, sum),
            None => sum,
        }
    }
}

impl Split for IQ4NL {
    type W = BlockIQ4NL;
    type A = BlockQ8_0;
    type Prep = Prep32;
    type Acc = PairedBlocks;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockIQ4NL) -> Prep32 {
        Prep32 {
            w: iq4_values(&x.qs),
            d: f32_of(x.d),
            m: 0.0,
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &Prep32, y: &BlockQ8_0, acc: &mut PairedBlocks) {
        let lanes = Lanes::of(dt, p.w, acts(&y.qs));
        let d = f32_of(y.d) * p.d;
        match acc.held.take() {
            None => acc.held = Some((d, lanes)),
            Some((d0, l0)) => {
                acc.even.fma(d0, l0);
                acc.odd.fma(d, lanes);
            }
        }
    }
}

/// MXFP4 in ggml's x86 `vec_dot` order: [`IQ4NL`]'s, with MXFP4's levels and E8M0 scale.
pub(super) struct MXFP4;

impl Split for MXFP4 {
    type W = BlockMXFP4;
    type A = BlockQ8_0;
    type Prep = Prep32;
    type Acc = PairedBlocks;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn prep(x: &BlockMXFP4) -> Prep32 {
        Prep32 {
            w: table_values(&KVALUES_MXFP4, &x.qs),
            d: e8m0_half(x.e),
            m: 0.0,
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn step<D: Dot>(dt: D, p: &Prep32, y: &BlockQ8_0, acc: &mut PairedBlocks) {
        // SAFETY: this function's features.
        unsafe { <IQ4NL as Split>::step(dt, p, y, acc) }
    }
}

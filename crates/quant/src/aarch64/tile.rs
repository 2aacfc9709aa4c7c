//! Batches on NEON: each weight block unpacked once for several tokens.
//!
//! Every aarch64 kernel is written in two parts ([`Split`]): `prep` unpacks one weight block
//! (nibbles and high bits to bytes, packed scales to integers), and `step` takes one token's
//! activation block through the reference's operations on those values, into that (row,
//! token)'s accumulators. The row kernels run the two parts one token at a time ([`dot`]); the
//! tiles ([`gemm`]) run `prep` once per block and `step` for [`Split::TOKENS`] tokens. Each (row,
//! token) so sees the same operations on the same values in the same order either way, and
//! gets the row kernel's bits whatever the batch (G1; tested under qemu-user), while the
//! unpacking, which in the K-quant row kernels is about as many vector instructions as the dot
//! products themselves, is paid once for the tokens of a tile instead of once for each.

use std::arch::aarch64::*;

use super::neon::{hsum4, Acc8, Dot};

/// The running sums of one (row, token): where they start and how they end as the dot product.
pub(super) trait Sums: Copy {
    /// # Safety
    /// The CPU must have NEON (every aarch64 target Rust builds for enables it), as for every
    /// method here and in [`Split`].
    unsafe fn zero() -> Self;
    /// # Safety
    /// As [`Sums::zero`].
    unsafe fn finish(self) -> f32;
}

/// A dot-product kernel in two parts: per weight block, and per (weight block, token).
pub(super) trait Split {
    /// The weight block.
    type W;
    /// The activation block.
    type A;
    /// A weight block unpacked.
    type Prep;
    /// The running sums of one (row, token).
    type Acc: Sums;
    /// Tokens a tile takes at once: whichever of four and eight executed fewer instructions per
    /// multiply-add under qemu-user (docs/perf-log.md): eight for the K-quants, Q4_0, Q5_0 and the
    /// repacked orders, four where a (row, token)'s running sums take more registers.
    const TOKENS: usize = 4;
    /// # Safety
    /// As [`Sums::zero`].
    unsafe fn prep(x: &Self::W) -> Self::Prep;
    /// # Safety
    /// As [`Sums::zero`].
    unsafe fn step<D: Dot>(dt: D, p: &Self::Prep, y: &Self::A, acc: &mut Self::Acc);
}

impl Sums for Acc8 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn zero() -> Acc8 {
        Acc8::new()
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn finish(self) -> f32 {
        self.hsum()
    }
}

/// Eight float lanes and one running float of the min term (Q4_1, Q5_1, Q5_K):
/// `hsum8(lanes) + mins`.
impl Sums for (Acc8, f32) {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn zero() -> Self {
        (Acc8::new(), 0.0)
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn finish(self) -> f32 {
        self.0.hsum() + self.1
    }
}

/// Eight float lanes and four of the min term (Q4_K): `hsum8(lanes) + ((m0 + m2) + (m1 +
/// m3))`.
impl Sums for (Acc8, float32x4_t) {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn zero() -> Self {
        (Acc8::new(), vdupq_n_f32(0.0))
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn finish(self) -> f32 {
        self.0.hsum() + hsum4(self.1)
    }
}

/// One running float (the 32-value formats in the repacked order).
impl Sums for f32 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn zero() -> f32 {
        0.0
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn finish(self) -> f32 {
        self
    }
}

/// The K-quants in the repacked order: the exact main and min totals of each block, each fused
/// into its own running float; `main - mins` at the end.
#[derive(Clone, Copy)]
pub(super) struct Totals {
    main: f32,
    mins: f32,
}

impl Totals {
    /// One block's totals, by `d_x * d_y` and `dmin_x * d_y`.
    #[inline]
    pub(super) fn fuse(&mut self, (main, mins): (i32, i32), d: f32, dmin: f32, yd: f32) {
        self.main = (main as f32).mul_add(d * yd, self.main);
        self.mins = (mins as f32).mul_add(dmin * yd, self.mins);
    }
}

impl Sums for Totals {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn zero() -> Totals {
        Totals {
            main: 0.0,
            mins: 0.0,
        }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn finish(self) -> f32 {
        self.main - self.mins
    }
}

/// One row times one token: the row kernel.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dot<K: Split, D: Dot>(dt: D, x: &[K::W], y: &[K::A]) -> f32 {
    // SAFETY: this function's features are what the methods need.
    unsafe {
        let mut acc = K::Acc::zero();
        for (x, y) in x.iter().zip(y) {
            let p = K::prep(x);
            K::step(dt, &p, y, &mut acc);
        }
        acc.finish()
    }
}

/// Every row of `w` (`per_row` blocks each) times every token of `a` (as many blocks each), into
/// `out` as `(tokens, rows)`: tokens [`Split::TOKENS`] at a time (then four, if eight), then one
/// at a time, each group over every row (the group's activations stay in cache while the rows
/// stream past).
#[target_feature(enable = "neon")]
pub(super) fn gemm<K: Split, D: Dot>(
    dt: D,
    w: &[K::W],
    a: &[K::A],
    per_row: usize,
    out: &mut [f32],
) {
    if K::TOKENS == 8 {
        gemm_by::<K, D, 8>(dt, w, a, per_row, out)
    } else {
        gemm_by::<K, D, 4>(dt, w, a, per_row, out)
    }
}

/// [`gemm`] with tiles of `T` tokens.
#[inline]
#[target_feature(enable = "neon")]
fn gemm_by<K: Split, D: Dot, const T: usize>(
    dt: D,
    w: &[K::W],
    a: &[K::A],
    per_row: usize,
    out: &mut [f32],
) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let mut t0 = 0;
    while n_tok - t0 >= T {
        tiles::<K, D, T>(dt, w, a, per_row, t0, out);
        t0 += T;
    }
    // Four of the tokens left after tiles of eight still share their blocks' unpacking.
    if T > 4 && n_tok - t0 >= 4 {
        tiles::<K, D, 4>(dt, w, a, per_row, t0, out);
        t0 += 4;
    }
    for t in t0..n_tok {
        let y = &a[t * per_row..][..per_row];
        for (r, o) in out[t * rows..][..rows].iter_mut().enumerate() {
            *o = dot::<K, D>(dt, &w[r * per_row..][..per_row], y);
        }
    }
}

/// Every row of `w` times tokens `t0..t0 + T` of `a`, into `out` as [`gemm`]'s.
#[inline]
#[target_feature(enable = "neon")]
fn tiles<K: Split, D: Dot, const T: usize>(
    dt: D,
    w: &[K::W],
    a: &[K::A],
    per_row: usize,
    t0: usize,
    out: &mut [f32],
) {
    let rows = w.len() / per_row;
    for r in 0..rows {
        let sums = tile::<K, D, T>(dt, &w[r * per_row..][..per_row], &a[t0 * per_row..]);
        for (t, s) in sums.into_iter().enumerate() {
            out[(t0 + t) * rows + r] = s;
        }
    }
}

/// One row `x` times the `T` tokens that start `a` (`x.len()` blocks each).
#[inline]
#[target_feature(enable = "neon")]
fn tile<K: Split, D: Dot, const T: usize>(dt: D, x: &[K::W], a: &[K::A]) -> [f32; T] {
    let per_row = x.len();
    let ys: [&[K::A]; T] = std::array::from_fn(|t| &a[t * per_row..][..per_row]);
    // SAFETY: this function's features are what the methods need.
    unsafe {
        let mut acc = [K::Acc::zero(); T];
        for (b, x) in x.iter().enumerate() {
            let p = K::prep(x);
            for (acc, y) in acc.iter_mut().zip(&ys) {
                K::step(dt, &p, &y[b], acc);
            }
        }
        acc.map(|acc| acc.finish())
    }
}

//! NEON building blocks of the aarch64 kernels: the reference's eight float lanes as two
//! `float32x4_t`, exact integer lanes, and the two ways to make them (`sdot`, or widening
//! multiplies on CPUs without FEAT_DotProd).

use std::arch::aarch64::*;
use std::arch::asm;

use half::f16;

/// A way to take exact dot products of signed bytes four at a time. A value of the type proves
/// the CPU can run it ([`Dot::detect`]).
pub trait Dot: Copy {
    /// What a CPU without it lacks, for the error an entry gives if it is called there anyway.
    const NEEDS: &'static str;
    /// The capability, if this CPU has it.
    fn detect() -> Option<Self>;
    /// `acc[l] + Σ_{k<4} a[4l + k] * b[4l + k]` for the four lanes `l`, exactly.
    fn dot(self, acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Baseline NEON (ARMv8.0): widening byte multiplies, then pairwise widening adds.
#[derive(Clone, Copy)]
pub struct Widen;

impl Dot for Widen {
    const NEEDS: &'static str = "NEON kernel (no NEON)";

    fn detect() -> Option<Widen> {
        Some(Widen)
    }

    #[inline(always)]
    fn dot(self, acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: NEON is part of the aarch64 baseline; every aarch64 target Rust builds for
        // enables it.
        unsafe {
            // i8 * i8 fits in i16 (|p| <= 2^14); pairs of them in i32.
            let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
            let hi = vpaddlq_s16(vmull_high_s8(a, b));
            vaddq_s32(acc, vpaddq_s32(lo, hi))
        }
    }
}

/// FEAT_DotProd's `sdot` (Armv8.2 and later: Cortex-A55/A76, Neoverse, Apple M1 on).
#[derive(Clone, Copy)]
pub struct DotProd(());

impl Dot for DotProd {
    const NEEDS: &'static str = "NEON dot-product kernel (no FEAT_DotProd on this CPU)";

    fn detect() -> Option<DotProd> {
        crate::Cpu::detect().dotprod().then_some(DotProd(()))
    }

    #[inline(always)]
    fn dot(self, acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: a `DotProd` is made only by `detect`, after the CPU reported FEAT_DotProd;
        // `sdot` reads and writes these three registers and nothing else. (The intrinsic
        // `vdotq_s32` is not stable yet, hence the assembly.)
        unsafe {
            asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }
}

/// F16 to f32, exactly: one `fcvt` (base ARMv8 floating point), where the `half` crate would
/// check the CPU's features on every call.
#[inline]
#[target_feature(enable = "neon")]
pub fn f32_of(h: f16) -> f32 {
    let v = vdup_n_u16(h.to_bits());
    let out: float32x4_t;
    // SAFETY: `fcvt` between half and single precision is base ARMv8 floating point; it only
    // reads and writes these registers.
    unsafe {
        asm!(
            "fcvt {out:s}, {v:h}",
            out = lateout(vreg) out,
            v = in(vreg) v,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    vgetq_lane_f32::<0>(out)
}

/// 16 signed bytes of `s` from `at`.
#[inline]
#[target_feature(enable = "neon")]
pub fn ld_s8(s: &[i8], at: usize) -> int8x16_t {
    let s = &s[at..at + 16];
    // SAFETY: `s` is 16 readable bytes; NEON loads need no alignment.
    unsafe { vld1q_s8(s.as_ptr()) }
}

/// 16 unsigned bytes of `s` from `at`.
#[inline]
#[target_feature(enable = "neon")]
pub fn ld_u8(s: &[u8], at: usize) -> uint8x16_t {
    let s = &s[at..at + 16];
    // SAFETY: as in `ld_s8`.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// Eight i16 of `s` from `at`.
#[inline]
#[target_feature(enable = "neon")]
pub fn ld_s16(s: &[i16], at: usize) -> int16x8_t {
    let s = &s[at..at + 8];
    // SAFETY: `s` is 8 readable i16.
    unsafe { vld1q_s16(s.as_ptr()) }
}

/// Unsigned bytes (all below 128 here) as signed ones.
#[inline]
#[target_feature(enable = "neon")]
pub fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// `_mm_madd_epi16`: lane `l` is `a[2l] * b[2l] + a[2l + 1] * b[2l + 1]`, exactly.
#[inline]
#[target_feature(enable = "neon")]
pub fn madd_s16(a: int16x8_t, b: int16x8_t) -> int32x4_t {
    vpaddq_s32(
        vmull_s16(vget_low_s16(a), vget_low_s16(b)),
        vmull_high_s16(a, b),
    )
}

/// The reference's eight exact integer lanes: lanes 0..4 in `lo`, 4..8 in `hi`.
#[derive(Clone, Copy)]
pub struct Lanes {
    pub lo: int32x4_t,
    pub hi: int32x4_t,
}

impl Lanes {
    #[inline]
    #[target_feature(enable = "neon")]
    pub fn zero() -> Lanes {
        Lanes {
            lo: vdupq_n_s32(0),
            hi: vdupq_n_s32(0),
        }
    }

    /// The lanes of one 32-value chunk: `w` and `y` as 16 + 16 bytes.
    #[inline(always)]
    pub fn of<D: Dot>(d: D, w: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) -> Lanes {
        // SAFETY: NEON is part of the aarch64 baseline.
        let zero = unsafe { vdupq_n_s32(0) };
        Lanes {
            lo: d.dot(zero, w.0, y.0),
            hi: d.dot(zero, w.1, y.1),
        }
    }

    /// `self + lanes(w, y) * (s_lo, s_hi)`: one 32-value chunk whose first 16 values have
    /// scale `s_lo` and last 16 `s_hi`.
    #[inline(always)]
    pub fn add_scaled<D: Dot>(
        self,
        d: D,
        w: (int8x16_t, int8x16_t),
        y: (int8x16_t, int8x16_t),
        s_lo: i32,
        s_hi: i32,
    ) -> Lanes {
        let l = Lanes::of(d, w, y);
        // SAFETY: NEON is part of the aarch64 baseline.
        unsafe {
            Lanes {
                lo: vmlaq_n_s32(self.lo, l.lo, s_lo),
                hi: vmlaq_n_s32(self.hi, l.hi, s_hi),
            }
        }
    }

    /// The sum of the eight lanes (exact).
    #[inline]
    #[target_feature(enable = "neon")]
    pub fn sum(self) -> i32 {
        vaddvq_s32(vaddq_s32(self.lo, self.hi))
    }
}

/// The reference's `Lanes8`: eight f32 accumulators, lanes 0..4 in `lo` and 4..8 in `hi`.
#[derive(Clone, Copy)]
pub struct Acc8 {
    lo: float32x4_t,
    hi: float32x4_t,
}

impl Acc8 {
    #[inline]
    #[target_feature(enable = "neon")]
    pub fn new() -> Acc8 {
        Acc8 {
            lo: vdupq_n_f32(0.0),
            hi: vdupq_n_f32(0.0),
        }
    }

    /// `acc_j = fma(d, lane_j, acc_j)`, one rounding each, as the reference's `mul_add`.
    #[inline]
    #[target_feature(enable = "neon")]
    pub fn fma(&mut self, d: f32, l: Lanes) {
        let d = vdupq_n_f32(d);
        self.lo = vfmaq_f32(self.lo, vcvtq_f32_s32(l.lo), d);
        self.hi = vfmaq_f32(self.hi, vcvtq_f32_s32(l.hi), d);
    }

    /// Lane by lane `self + other`.
    #[inline]
    #[target_feature(enable = "neon")]
    pub fn add(self, other: Acc8) -> Acc8 {
        Acc8 {
            lo: vaddq_f32(self.lo, other.lo),
            hi: vaddq_f32(self.hi, other.hi),
        }
    }

    /// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`, ggml's `hsum_float_8` tree.
    #[inline]
    #[target_feature(enable = "neon")]
    pub fn hsum(self) -> f32 {
        let r = vaddq_f32(self.lo, self.hi);
        let t = vadd_f32(vget_low_f32(r), vget_high_f32(r));
        vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
    }
}

/// `(m0 + m2) + (m1 + m3)` of four float lanes.
#[inline]
#[target_feature(enable = "neon")]
pub fn hsum4(m: float32x4_t) -> f32 {
    let t = vadd_f32(vget_low_f32(m), vget_high_f32(m));
    vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
}

//! AVX-512 VNNI tiles for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 in `vec_dot`
//! order): two weight rows in one 512-bit register, row A in the low eight lanes and row B in
//! the high eight.
//!
//! The AVX2 kernels ([`super::avx2`]) spend four to six multiply-port instructions per block
//! and row (`vpmaddubsw`, `vpmaddwd`, the conversion and the fused multiply-adds); here one
//! `vpdpbusd` gives the exact integer lane sums of two rows' blocks, and one conversion, one
//! product of the scales and one fused multiply-add finish both. Each 8-lane half runs exactly
//! the single-row kernel's float operations in its order (lane `l` of row A's half is lane `l`
//! of the AVX2 kernel's accumulator for row A), and the integer sums are exact whichever
//! instructions form them, so every output is bit-identical to `vec_dot`.
//!
//! Signed weights go through `vpdpbusd`'s unsigned operand with an offset: `x + c` is a byte
//! in 0..=255, and `sum((x + c) * y) - c * sum(y)` is `sum(x * y)` exactly; the `- c * sum(y)`
//! term depends on the token alone and is computed once per token and block, shared by every
//! row, as the accumulator `vpdpbusd` starts from.

use std::arch::x86_64::*;

use super::avx2::{head_f16x2, hsum, load32, nibbles, q5_bytes};
use crate::blocks::*;
use crate::codec::gemm_operands;
use crate::{DotBlock, QuantError};

/// Whether this CPU has what these kernels use: AVX-512 F/BW/DQ/VL with VNNI (and the AVX2,
/// FMA and F16C of the helpers they share with [`super::avx2`]).
pub fn available() -> bool {
    static HAVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAVE.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// A dot product over pairs of rows: per-token work (`tok`, shared by every pair), per-pair work
/// (`prep`) and the work per pair and token (`step`).
trait Pair {
    type W: DotBlock;
    type Tok;
    type Prep;
    type Acc: Copy;
    /// # Safety
    /// The CPU must have what [`available`] checks (as for every method here).
    unsafe fn zero() -> Self::Acc;
    /// # Safety
    /// As [`Pair::zero`].
    unsafe fn tok(y: &<Self::W as DotBlock>::Act) -> Self::Tok;
    /// # Safety
    /// As [`Pair::zero`].
    unsafe fn prep(a: &Self::W, b: &Self::W) -> Self::Prep;
    /// # Safety
    /// As [`Pair::zero`].
    unsafe fn step(p: &Self::Prep, y: &Self::Tok, acc: Self::Acc) -> Self::Acc;
    /// Row A's and row B's results.
    /// # Safety
    /// As [`Pair::zero`].
    unsafe fn finish(acc: Self::Acc) -> (f32, f32);
}

type Act<K> = <<K as Pair>::W as DotBlock>::Act;

/// `P` pairs of rows from `r0` (the last pair repeats its row A when `rows` runs out; that
/// copy's result is not written) times tokens `t0..t0 + T`, into `out` (`(n_tok, rows)`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `b` indexes every row and token of the tile
unsafe fn tile<K: Pair, const P: usize, const T: usize>(
    w: &[K::W],
    a: &[Act<K>],
    per_row: usize,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    let rows = w.len() / per_row;
    let row = |r: usize| &w[r * per_row..][..per_row];
    let pair_rows: [(usize, usize); P] = std::array::from_fn(|p| {
        let ra = r0 + 2 * p;
        (ra, if ra + 1 < rows { ra + 1 } else { ra })
    });
    let xa: [&[K::W]; P] = pair_rows.map(|(ra, _)| row(ra));
    let xb: [&[K::W]; P] = pair_rows.map(|(_, rb)| row(rb));
    let ys: [&[Act<K>]; T] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    // SAFETY: the caller's CPU has what `available` checks, all the `Pair` methods need.
    unsafe {
        let mut acc = [[K::zero(); T]; P];
        for b in 0..per_row {
            let toks: [K::Tok; T] = std::array::from_fn(|t| K::tok(&ys[t][b]));
            for p in 0..P {
                let prep = K::prep(&xa[p][b], &xb[p][b]);
                for t in 0..T {
                    acc[p][t] = K::step(&prep, &toks[t], acc[p][t]);
                }
            }
        }
        for (p, &(ra, rb)) in pair_rows.iter().enumerate() {
            for t in 0..T {
                let (va, vb) = K::finish(acc[p][t]);
                out[(t0 + t) * rows + ra] = va;
                if rb != ra {
                    out[(t0 + t) * rows + rb] = vb;
                }
            }
        }
    }
}

/// Every row of `w` times every token of `a`: eight rows a token for one token, four rows by
/// four tokens for batches.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm<K: Pair>(w: &[K::W], a: &[Act<K>], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    // SAFETY: the caller's CPU has what `available` checks; the tiles stay in bounds (the
    // loops' conditions), which the slicing in `tile` checks again.
    unsafe {
        let mut t0 = 0;
        while n_tok - t0 >= 4 {
            let mut r0 = 0;
            while rows - r0 >= 4 {
                tile::<K, 2, 4>(w, a, per_row, (r0, t0), out);
                r0 += 4;
            }
            while r0 < rows {
                tile::<K, 1, 4>(w, a, per_row, (r0, t0), out);
                r0 += 2;
            }
            t0 += 4;
        }
        for t0 in t0..n_tok {
            let mut r0 = 0;
            while rows - r0 >= 8 {
                tile::<K, 4, 1>(w, a, per_row, (r0, t0), out);
                r0 += 8;
            }
            while r0 < rows {
                tile::<K, 1, 1>(w, a, per_row, (r0, t0), out);
                r0 += 2;
            }
        }
    }
}

macro_rules! gemm_entries {
    ($( $name:ident: $pair:ty; )*) => {$(
        /// Tiled product of weight rows with a batch of tokens (see [`crate::GemmFn`]).
        pub fn $name(
            w: &[u8],
            row_bytes: usize,
            a: &[u8],
            n_tok: usize,
            out: &mut [f32],
        ) -> Result<(), QuantError> {
            let (x, y, per_row) =
                gemm_operands::<<$pair as Pair>::W>(w, row_bytes, a, n_tok, out)?;
            // SAFETY: `gemm_kernel` hands these entries out only after `available()`; the
            // operands' sizes agree (checked above).
            unsafe { gemm::<$pair>(x, y, per_row, out) };
            Ok(())
        }
    )*};
}

gemm_entries! {
    q4_0: Q4_0;
    q4_1: Q4_1;
    q5_0: Q5_0;
    q5_1: Q5_1;
    q8_0: Q8_0;
}

/// Two 32-byte halves as one register: `a` low, `b` high.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn join(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// Eight lanes of `a` then eight of `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn join_ps(a: f32, b: f32) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b))
}

/// The AVX2 kernels' horizontal sum of each half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn hsum_halves(acc: __m512) -> (f32, f32) {
    (
        hsum(_mm512_castps512_ps256(acc)),
        hsum(_mm512_extractf32x8_ps::<1>(acc)),
    )
}

/// A token's block for the signed formats: its bytes in both halves, the offset term, its scale.
struct SignedTok {
    y: __m512i,
    bias: __m512i,
    dy: f32,
}

/// `OFFSET_SHIFT`: log2 of the offset `c` that makes the weights unsigned.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn signed_tok<const OFFSET_SHIFT: u32>(y: &BlockQ8_0) -> SignedTok {
    let y512 = _mm512_broadcast_i64x4(load32(&y.qs));
    let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), y512);
    SignedTok {
        y: y512,
        bias: _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_slli_epi32::<OFFSET_SHIFT>(sums),
        ),
        dy: _mm_cvtss_f32(head_f16x2(y)),
    }
}

/// Two rows' blocks for the signed formats: offset bytes and scales (eight lanes each).
struct SignedPrep {
    x: __m512i,
    dx: __m512,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn signed_step(p: &SignedPrep, y: &SignedTok, acc: __m512) -> __m512 {
    let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(y.bias, p.x, y.y));
    let d = _mm512_mul_ps(p.dx, _mm512_set1_ps(y.dy));
    _mm512_fmadd_ps(d, q, acc)
}

macro_rules! signed_pair {
    ($name:ident: $block:ty, shift $shift:literal, |$x:ident| $bytes:expr) => {
        struct $name;
        impl Pair for $name {
            type W = $block;
            type Tok = SignedTok;
            type Prep = SignedPrep;
            type Acc = __m512;
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn zero() -> __m512 {
                _mm512_setzero_ps()
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn tok(y: &BlockQ8_0) -> SignedTok {
                signed_tok::<$shift>(y)
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn prep(a: &$block, b: &$block) -> SignedPrep {
                let bytes = |$x: &$block| $bytes;
                SignedPrep {
                    x: join(bytes(a), bytes(b)),
                    dx: join_ps(_mm_cvtss_f32(head_f16x2(a)), _mm_cvtss_f32(head_f16x2(b))),
                }
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn step(p: &SignedPrep, y: &SignedTok, acc: __m512) -> __m512 {
                signed_step(p, y, acc)
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn finish(acc: __m512) -> (f32, f32) {
                hsum_halves(acc)
            }
        }
    };
}

// The weights plus the offset, as unsigned bytes: Q4_0 nibbles are x + 8, Q5_0 values x + 16,
// and Q8_0 bytes with the sign bit flipped x + 128.
signed_pair!(Q4_0: BlockQ4_0, shift 3, |x| nibbles(&x.qs));
signed_pair!(Q5_0: BlockQ5_0, shift 4, |x| q5_bytes(&x.qs, x.qh));
signed_pair!(Q8_0: BlockQ8_0, shift 7, |x| _mm256_xor_si256(load32(&x.qs), _mm256_set1_epi8(-128)));

/// A Q8_1 token block: bytes in both halves, `d` and `s`.
struct UnsignedTok {
    y: __m512i,
    dy: f32,
    sy: f32,
}

/// Two rows' blocks of an unsigned format: bytes, scales (eight lanes each) and mins (lanes
/// 0 and 1).
struct UnsignedPrep {
    x: __m512i,
    dx: __m512,
    mx: __m128,
}

/// The unsigned formats with a min against Q8_1 (`avx2::vec_dot_q4_1_q8_1`): lane 0 and 1 of
/// the second accumulator run row A's and row B's min terms.
macro_rules! unsigned_pair {
    ($name:ident: $block:ty, |$x:ident| $bytes:expr) => {
        struct $name;
        impl Pair for $name {
            type W = $block;
            type Tok = UnsignedTok;
            type Prep = UnsignedPrep;
            type Acc = (__m512, __m128);
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn zero() -> Self::Acc {
                (_mm512_setzero_ps(), _mm_setzero_ps())
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn tok(y: &BlockQ8_1) -> UnsignedTok {
                let h = head_f16x2(y);
                UnsignedTok {
                    y: _mm512_broadcast_i64x4(load32(&y.qs)),
                    dy: _mm_cvtss_f32(h),
                    sy: _mm_cvtss_f32(_mm_movehdup_ps(h)),
                }
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn prep(a: &$block, b: &$block) -> UnsignedPrep {
                let bytes = |$x: &$block| $bytes;
                let (ha, hb) = (head_f16x2(a), head_f16x2(b));
                UnsignedPrep {
                    x: join(bytes(a), bytes(b)),
                    dx: join_ps(_mm_cvtss_f32(ha), _mm_cvtss_f32(hb)),
                    // [m_a, m_b, m_a, m_b]: lanes 0 and 1 are used.
                    mx: _mm_unpacklo_ps(_mm_movehdup_ps(ha), _mm_movehdup_ps(hb)),
                }
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn step(p: &UnsignedPrep, y: &UnsignedTok, (acc, mins): Self::Acc) -> Self::Acc {
                let mins = _mm_fmadd_ps(p.mx, _mm_set1_ps(y.sy), mins);
                let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), p.x, y.y));
                let d = _mm512_mul_ps(p.dx, _mm512_set1_ps(y.dy));
                (_mm512_fmadd_ps(d, q, acc), mins)
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn finish((acc, mins): Self::Acc) -> (f32, f32) {
                let (a, b) = hsum_halves(acc);
                (
                    a + _mm_cvtss_f32(mins),
                    b + _mm_cvtss_f32(_mm_movehdup_ps(mins)),
                )
            }
        }
    };
}

unsigned_pair!(Q4_1: BlockQ4_1, |x| nibbles(&x.qs));
unsigned_pair!(Q5_1: BlockQ5_1, |x| q5_bytes(&x.qs, x.qh));

//! AVX-512 VNNI tiles for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 in `vec_dot`
//! order): two weight rows in one 512-bit register, row A in the low eight lanes and row B in
//! the high eight.
//!
//! The AVX2 kernels ([`crate::x86::avx2`]) spend four to six multiply-port instructions per block
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

use crate::blocks::*;
use crate::x86::avx2::{head_f16x2, hsum, load32, q5_bytes};
use crate::{DotBlock, QuantError};

/// A dot product over pairs of rows: per-token work (`tok`, shared by every pair), per-pair work
/// (`prep`) and the work per pair and token (`step`).
trait Pair {
    type W: DotBlock;
    type Tok;
    type Prep;
    type Acc: Copy;
    /// Pairs of rows a batch tile takes (by four tokens): as many as the accumulators leave
    /// registers for.
    const BATCH_PAIRS: usize;
    /// Whether batch tiles take eight tokens (two pairs of rows if [`Pair::BATCH_PAIRS`] is 4,
    /// else one): for the formats whose unpacking is dear enough that sharing it with eight
    /// tokens beats more rows (measured with `examples/tilebench`).
    const EIGHT_TOKENS: bool;
    /// # Safety
    /// The CPU must have what [`crate::Cpu::avx512_vnni`] checks (as for every method here).
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
/// copy's result is not written) times tokens `t0..t0 + T`, whose per-block work is `toks`
/// (`toks[b][t]`), into `out` (`(n_tok, rows)`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `b` indexes every row and token of the tile
unsafe fn tile<K: Pair, const P: usize, const T: usize>(
    w: &[K::W],
    toks: &[[K::Tok; T]],
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
    let toks = &toks[..per_row];
    // SAFETY: the caller's CPU has what `Cpu::avx512_vnni` checks, all the `Pair` methods need.
    unsafe {
        let mut acc = [[K::zero(); T]; P];
        for b in 0..per_row {
            for p in 0..P {
                let prep = K::prep(&xa[p][b], &xb[p][b]);
                for t in 0..T {
                    acc[p][t] = K::step(&prep, &toks[b][t], acc[p][t]);
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

/// The per-block work of tokens `t0..t0 + T`, for every block of a row, into `toks`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tokens<K: Pair, const T: usize>(
    a: &[Act<K>],
    per_row: usize,
    t0: usize,
    toks: &mut Vec<[K::Tok; T]>,
) {
    toks.clear();
    // SAFETY: the caller's CPU has what `Cpu::avx512_vnni` checks.
    toks.extend(
        (0..per_row)
            .map(|b| std::array::from_fn(|t| unsafe { K::tok(&a[(t0 + t) * per_row + b]) })),
    );
}

/// Every row of `w` times every token of `a`: four or two rows by eight tokens
/// ([`Pair::EIGHT_TOKENS`]), or eight or four ([`Pair::BATCH_PAIRS`]) rows by four tokens, for
/// batches, eight rows a token for the tokens left over (and for one token). A group of tokens' per-block
/// work is done once, for every row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm<K: Pair>(w: &[K::W], a: &[Act<K>], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    // SAFETY: the caller's CPU has what `Cpu::avx512_vnni` checks; the tiles stay in bounds (the
    // loops' conditions), which the slicing in `tile` checks again.
    unsafe {
        let mut t0 = 0;
        let mut toks8 = Vec::new();
        while K::EIGHT_TOKENS && n_tok - t0 >= 8 {
            tokens::<K, 8>(a, per_row, t0, &mut toks8);
            let mut r0 = 0;
            while K::BATCH_PAIRS == 4 && rows - r0 >= 4 {
                tile::<K, 2, 8>(w, &toks8, per_row, (r0, t0), out);
                r0 += 4;
            }
            while r0 < rows {
                tile::<K, 1, 8>(w, &toks8, per_row, (r0, t0), out);
                r0 += 2;
            }
            t0 += 8;
        }
        let mut toks4 = Vec::new();
        while n_tok - t0 >= 4 {
            tokens::<K, 4>(a, per_row, t0, &mut toks4);
            let mut r0 = 0;
            while K::BATCH_PAIRS == 4 && rows - r0 >= 8 {
                tile::<K, 4, 4>(w, &toks4, per_row, (r0, t0), out);
                r0 += 8;
            }
            while rows - r0 >= 4 {
                tile::<K, 2, 4>(w, &toks4, per_row, (r0, t0), out);
                r0 += 4;
            }
            while r0 < rows {
                tile::<K, 1, 4>(w, &toks4, per_row, (r0, t0), out);
                r0 += 2;
            }
            t0 += 4;
        }
        let mut toks1 = Vec::new();
        for t0 in t0..n_tok {
            tokens::<K, 1>(a, per_row, t0, &mut toks1);
            let mut r0 = 0;
            while rows - r0 >= 8 {
                tile::<K, 4, 1>(w, &toks1, per_row, (r0, t0), out);
                r0 += 8;
            }
            while r0 < rows {
                tile::<K, 1, 1>(w, &toks1, per_row, (r0, t0), out);
                r0 += 2;
            }
        }
    }
}

gemm_entries! {
    Pair;
    q4_0: Q4_0;
    q4_1: Q4_1;
    q5_0: Q5_0;
    q5_1: Q5_1;
    q8_0: Q8_0;
}

// The layout of a pair in a register, by 128-bit lane: [A 0..16, B 0..16, A 16..32, B 16..32]
// (values of the blocks of row A and row B), so that two rows' nibbles unpack with one shift
// and one mask. A token's 32 bytes are laid out to match: [y 0..16, y 0..16, y 16..32, y 16..32].
// The i32 lanes 0-3 and 8-11 are row A's lanes 0-7 of the AVX2 kernel, 4-7 and 12-15 row B's.

/// A token's 32 bytes in the pair layout.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn token_bytes(q: &[i8; 32]) -> __m512i {
    let y = _mm512_castsi256_si512(load32(q));
    _mm512_shuffle_i64x2::<0b01_01_00_00>(y, y)
}

/// Two rows' 16 bytes of packed nibbles in the pair layout (low nibbles are values 0..16).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair_nibbles(a: &[u8; 16], b: &[u8; 16]) -> __m512i {
    // SAFETY: 16 readable bytes each; unaligned loads are allowed.
    let ab = unsafe { _mm256_loadu2_m128i(b.as_ptr().cast(), a.as_ptr().cast()) };
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4));
    _mm512_and_si512(both, _mm512_set1_epi8(0x0F))
}

/// Two rows' 32 bytes (values in order) in the pair layout.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair_bytes(a: __m256i, b: __m256i) -> __m512i {
    let idx = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    _mm512_permutex2var_epi64(_mm512_castsi256_si512(a), idx, _mm512_castsi256_si512(b))
}

/// The first two F16 values of two blocks (`d` and `m`, where the format has `m`) as
/// `[d_a, m_a, d_b, m_b]`; loads 4 bytes of each block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair_heads<B>(a: &B, b: &B) -> __m128 {
    const { assert!(size_of::<B>() >= 4) };
    // SAFETY: 4 readable bytes each (asserted at compile time); unaligned reads are allowed.
    let (ha, hb) = unsafe {
        (
            std::ptr::read_unaligned((a as *const B).cast::<i32>()),
            std::ptr::read_unaligned((b as *const B).cast::<i32>()),
        )
    };
    _mm_cvtph_ps(_mm_set_epi32(0, 0, hb, ha))
}

/// Each row's `d` in its lanes of the pair layout.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair_scales(heads: __m128) -> __m512 {
    let idx = _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(heads))
}

/// Row A's and row B's sums, each by the AVX2 kernels' horizontal sum of its eight lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn hsum_pair(acc: __m512) -> (f32, f32) {
    let idx = _mm512_set_epi32(15, 14, 13, 12, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0);
    let rows = _mm512_permutexvar_ps(idx, acc);
    (
        hsum(_mm512_castps512_ps256(rows)),
        hsum(_mm512_extractf32x8_ps::<1>(rows)),
    )
}

/// A token's block for the signed formats: its bytes, the offset term, its scale.
struct SignedTok {
    y: __m512i,
    bias: __m512i,
    dy: __m512,
}

/// `OFFSET_SHIFT`: log2 of the offset `c` that makes the weights unsigned.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn signed_tok<const OFFSET_SHIFT: u32>(y: &BlockQ8_0) -> SignedTok {
    let y512 = token_bytes(&y.qs);
    let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), y512);
    SignedTok {
        y: y512,
        bias: _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_slli_epi32::<OFFSET_SHIFT>(sums),
        ),
        dy: _mm512_set1_ps(_mm_cvtss_f32(head_f16x2(y))),
    }
}

/// Two rows' blocks for the signed formats: offset bytes and scales, in the pair layout.
struct SignedPrep {
    x: __m512i,
    dx: __m512,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
fn signed_step(p: &SignedPrep, y: &SignedTok, acc: __m512) -> __m512 {
    let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(y.bias, p.x, y.y));
    _mm512_fmadd_ps(_mm512_mul_ps(p.dx, y.dy), q, acc)
}

macro_rules! signed_pair {
    ($name:ident: $block:ty, shift $shift:literal, eight tokens $eight:literal, |$a:ident, $b:ident| $bytes:expr) => {
        struct $name;
        impl Pair for $name {
            type W = $block;
            type Tok = SignedTok;
            type Prep = SignedPrep;
            type Acc = __m512;
            const BATCH_PAIRS: usize = 4;
            const EIGHT_TOKENS: bool = $eight;
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
            unsafe fn prep($a: &$block, $b: &$block) -> SignedPrep {
                SignedPrep {
                    x: $bytes,
                    dx: pair_scales(pair_heads($a, $b)),
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
                hsum_pair(acc)
            }
        }
    };
}

// The weights plus the offset, as unsigned bytes: Q4_0 nibbles are x + 8, Q5_0 values x + 16,
// and Q8_0 bytes with the sign bit flipped x + 128.
signed_pair!(Q4_0: BlockQ4_0, shift 3, eight tokens true, |a, b| pair_nibbles(&a.qs, &b.qs));
signed_pair!(Q5_0: BlockQ5_0, shift 4, eight tokens true, |a, b| pair_bytes(
    q5_bytes(&a.qs, a.qh),
    q5_bytes(&b.qs, b.qh)
));
signed_pair!(Q8_0: BlockQ8_0, shift 7, eight tokens false, |a, b| _mm512_xor_si512(
    pair_bytes(load32(&a.qs), load32(&b.qs)),
    _mm512_set1_epi8(-128)
));

/// A Q8_1 token block: bytes, `d` in every lane, `s` in every lane.
struct UnsignedTok {
    y: __m512i,
    dy: __m512,
    sy: __m128,
}

/// Two rows' blocks of an unsigned format: bytes and scales in the pair layout, and
/// `[d_a, m_a, d_b, m_b]`.
struct UnsignedPrep {
    x: __m512i,
    dx: __m512,
    heads: __m128,
}

/// The unsigned formats with a min against Q8_1 (`avx2::vec_dot_q4_1_q8_1`): lanes 1 and 3 of
/// the second accumulator run row A's and row B's min terms (lanes 0 and 2 are not used).
macro_rules! unsigned_pair {
    ($name:ident: $block:ty, eight tokens $eight:literal, |$a:ident, $b:ident| $bytes:expr) => {
        struct $name;
        impl Pair for $name {
            type W = $block;
            type Tok = UnsignedTok;
            type Prep = UnsignedPrep;
            type Acc = (__m512, __m128);
            // Sixteen accumulators and sixteen for the mins would take every register.
            const BATCH_PAIRS: usize = 2;
            const EIGHT_TOKENS: bool = $eight;
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
                    y: token_bytes(&y.qs),
                    dy: _mm512_broadcastss_ps(h),
                    sy: _mm_movehdup_ps(_mm_movelh_ps(h, h)),
                }
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn prep($a: &$block, $b: &$block) -> UnsignedPrep {
                let heads = pair_heads($a, $b);
                UnsignedPrep {
                    x: $bytes,
                    dx: pair_scales(heads),
                    heads,
                }
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn step(p: &UnsignedPrep, y: &UnsignedTok, (acc, mins): Self::Acc) -> Self::Acc {
                let mins = _mm_fmadd_ps(p.heads, y.sy, mins);
                let dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), p.x, y.y);
                let d = _mm512_mul_ps(p.dx, y.dy);
                (_mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dots), acc), mins)
            }
            #[inline]
            #[target_feature(
                enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"
            )]
            unsafe fn finish((acc, mins): Self::Acc) -> (f32, f32) {
                let (a, b) = hsum_pair(acc);
                let mins_b = _mm_movehl_ps(mins, mins);
                (
                    a + _mm_cvtss_f32(_mm_movehdup_ps(mins)),
                    b + _mm_cvtss_f32(_mm_movehdup_ps(mins_b)),
                )
            }
        }
    };
}

unsigned_pair!(Q4_1: BlockQ4_1, eight tokens false, |a, b| pair_nibbles(&a.qs, &b.qs));
unsigned_pair!(Q5_1: BlockQ5_1, eight tokens true, |a, b| pair_bytes(
    q5_bytes(&a.qs, a.qh),
    q5_bytes(&b.qs, b.qh)
));

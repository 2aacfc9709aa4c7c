//! Tiled AVX2 products of several weight rows with several tokens: gemv for decode (four rows
//! a token) and gemm for prefill (two rows by four tokens).
//!
//! Each format's dot product ([`crate::x86::avx2`]) is split into the work that depends on the weight
//! block alone (`prep`: unpacking nibbles, high bits, scales), done once per block of a tile, and
//! the work per token (`step`), done for every token of the tile while the unpacked block is in
//! registers. Each (row, token) pair keeps its own accumulator and runs exactly the operations of
//! the single-row kernel in the same order, so every output is bit-identical to `vec_dot` of that
//! row and token, whatever the tile shape, the batch size (G1) or the thread that computes it
//! (D1). What the tiles buy is independent dependency chains (a row's fused multiply-adds are
//! serial; four rows' overlap) and unpacking a weight block once for four tokens.

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::x86::avx2::{
    f32_of, halves_i16, head_f16x2, hsum, hsum_i32, iq4_values, lanes_ss_i32, lanes_us, load32,
    nibbles, q5_bytes,
};
use crate::{DotBlock, QuantError};

/// A dot product split into per-weight-block and per-token work (see the module doc).
trait Tile {
    type W: DotBlock;
    type Prep;
    type Acc: Copy;
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C (as for every method here).
    unsafe fn zero() -> Self::Acc;
    /// # Safety
    /// As [`Tile::zero`].
    unsafe fn prep(x: &Self::W) -> Self::Prep;
    /// # Safety
    /// As [`Tile::zero`].
    unsafe fn step(p: &Self::Prep, y: &<Self::W as DotBlock>::Act, acc: Self::Acc) -> Self::Acc;
    /// # Safety
    /// As [`Tile::zero`].
    unsafe fn finish(acc: Self::Acc) -> f32;
}

type Act<K> = <<K as Tile>::W as DotBlock>::Act;

/// Rows `r0..r0 + R` times tokens `t0..t0 + T`, into `out` (`(n_tok, rows)`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<K: Tile, const R: usize, const T: usize>(
    w: &[K::W],
    a: &[Act<K>],
    per_row: usize,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    let rows = w.len() / per_row;
    let xs: [&[K::W]; R] = std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row]);
    let ys: [&[Act<K>]; T] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    // SAFETY: the caller's CPU has AVX2, FMA and F16C, all the `Tile` methods need.
    unsafe {
        let mut acc = [[K::zero(); T]; R];
        for b in 0..per_row {
            for r in 0..R {
                let p = K::prep(&xs[r][b]);
                for t in 0..T {
                    acc[r][t] = K::step(&p, &ys[t][b], acc[r][t]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (t, &acc) in acc.iter().enumerate() {
                out[(t0 + t) * rows + r0 + r] = K::finish(acc);
            }
        }
    }
}

/// Every row of `w` times every token of `a`, tile by tile.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm<K: Tile>(w: &[K::W], a: &[Act<K>], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    // SAFETY: the caller's CPU has AVX2, FMA and F16C; the tiles stay in bounds (the loops'
    // conditions), which the slicing in `tile` checks again.
    unsafe {
        let mut t0 = 0;
        while n_tok - t0 >= 4 {
            let mut r0 = 0;
            while rows - r0 >= 2 {
                tile::<K, 2, 4>(w, a, per_row, (r0, t0), out);
                r0 += 2;
            }
            if r0 < rows {
                tile::<K, 1, 4>(w, a, per_row, (r0, t0), out);
            }
            t0 += 4;
        }
        single_tokens::<K>(w, a, per_row, t0, out);
    }
}

/// Tokens `t0..` (fewer than four) one at a time, four rows a tile.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn single_tokens<K: Tile>(
    w: &[K::W],
    a: &[Act<K>],
    per_row: usize,
    t0: usize,
    out: &mut [f32],
) {
    let rows = w.len() / per_row;
    // SAFETY: the caller's CPU has AVX2, FMA and F16C; the tiles stay in bounds (the loops'
    // conditions), which the slicing in `tile` checks again.
    unsafe {
        for t0 in t0..a.len() / per_row {
            let mut r0 = 0;
            while rows - r0 >= 4 {
                tile::<K, 4, 1>(w, a, per_row, (r0, t0), out);
                r0 += 4;
            }
            for r0 in r0..rows {
                tile::<K, 1, 1>(w, a, per_row, (r0, t0), out);
            }
        }
    }
}

gemm_entries! {
    Tile;
    q4_0_rows8: Q4_0Rows8;
    q4_1: Q4_1;
    q5_1: Q5_1;
    q4_k: Q4K;
    q4_k_rows8: Q4KRows8;
    q6_k: Q6K;
    q2_k: Q2K;
    q2_k_rows8: Q2KRows8;
    q3_k: Q3K;
    q5_k: Q5K;
    iq4_xs: IQ4XS;
    iq4_nl: IQ4NL;
    iq4_nl_rows8: IQ4NLRows8;
}

/// The signed 32-value formats against Q8_0: `x` as signed bytes and its absolute values (the
/// sign moves onto the token's bytes, as `avx2::lanes_ss` does).
struct Signed {
    hx: __m128,
    x: __m256i,
    ax: __m256i,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed(hx: __m128, x: __m256i) -> Signed {
    Signed {
        hx,
        x,
        ax: _mm256_sign_epi8(x, x),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed_step(p: &Signed, y: &BlockQ8_0, acc: __m256) -> __m256 {
    let d = _mm256_broadcastss_ps(_mm_mul_ps(p.hx, head_f16x2(y)));
    let q = lanes_us(p.ax, _mm256_sign_epi8(load32(&y.qs), p.x));
    _mm256_fmadd_ps(d, q, acc)
}

macro_rules! signed_tile {
    ($name:ident: $block:ty, |$x:ident| $bytes:expr) => {
        struct $name;
        impl Tile for $name {
            type W = $block;
            type Prep = Signed;
            type Acc = __m256;
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn zero() -> __m256 {
                _mm256_setzero_ps()
            }
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn prep($x: &$block) -> Signed {
                signed(head_f16x2($x), $bytes)
            }
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn step(p: &Signed, y: &BlockQ8_0, acc: __m256) -> __m256 {
                signed_step(p, y, acc)
            }
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn finish(acc: __m256) -> f32 {
                hsum(acc)
            }
        }
    };
}

signed_tile!(Q4_0: BlockQ4_0, |x| _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8)));
signed_tile!(Q5_0: BlockQ5_0, |x| _mm256_sub_epi8(q5_bytes(&x.qs, x.qh), _mm256_set1_epi8(16)));
signed_tile!(Q8_0: BlockQ8_0, |x| load32(&x.qs));

/// The signed formats' tiles, whose step is [`signed_step`].
trait SignedTile: Tile<Prep = Signed, Acc = __m256, W: DotBlock<Act = BlockQ8_0>> {}
impl SignedTile for Q4_0 {}
impl SignedTile for Q5_0 {}
impl SignedTile for Q8_0 {}

/// [`gemm`] for the signed formats, by tiles of two rows and four tokens whose scales are
/// multiplied ahead. [`signed_step`] converts the token's F16 scale and multiplies it by the
/// row's in every step, three of its eight operations (on a Skylake-class core, eight of the
/// twelve in flight on the two vector ports all of them contend for: the tile was bound there).
/// Here the tokens' scales are widened once for every row of the matrix, a tile first computes
/// every block's eight products `dx * dy` into a buffer (one multiply a row and block), and each
/// step broadcasts its own from memory (a load, no vector operation). The same products,
/// rounded the same, in the same multiply-adds as `vec_dot`: the same bits. (llvm-mca
/// `-mcpu=skylake` over the two inner loops: 28.6 -> 21.1 cycles a block of eight steps;
/// `znver3` 22.2 -> 16.5.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_signed<K: SignedTile>(w: &[K::W], a: &[BlockQ8_0], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    // The four tokens' scales, block by block (`dy[4 b + t]`), and a tile's products
    // (`dd[b][r][t]`).
    let mut dy = vec![0.0f32; 4 * per_row];
    let mut dd = vec![0.0f32; 8 * per_row];
    let mut t0 = 0;
    while n_tok - t0 >= 4 {
        for (b, d) in dy.chunks_exact_mut(4).enumerate() {
            for (t, d) in d.iter_mut().enumerate() {
                *d = f32_of(a[(t0 + t) * per_row + b].d);
            }
        }
        let mut r0 = 0;
        // SAFETY: the caller's CPU has AVX2, FMA and F16C; the tiles stay in bounds (the
        // loops' conditions), which the slicing in `signed_tile` checks again.
        unsafe {
            while rows - r0 >= 2 {
                signed_tile::<K, 2>(w, a, &dy, &mut dd, per_row, (r0, t0), out);
                r0 += 2;
            }
            if r0 < rows {
                signed_tile::<K, 1>(w, a, &dy, &mut dd, per_row, (r0, t0), out);
            }
        }
        t0 += 4;
    }
    // SAFETY: as above.
    unsafe { single_tokens::<K>(w, a, per_row, t0, out) };
}

/// Rows `r0..r0 + R` times tokens `t0..t0 + 4` for [`gemm_signed`]: `dy` holds the four
/// tokens' scales block by block, `dd` room for the tile's products of scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_tile<K: SignedTile, const R: usize>(
    w: &[K::W],
    a: &[BlockQ8_0],
    dy: &[f32],
    dd: &mut [f32],
    per_row: usize,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    let rows = w.len() / per_row;
    let xs: [&[K::W]; R] = std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row]);
    let ys: [&[BlockQ8_0]; 4] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    let dy = &dy[..4 * per_row];
    let dd = &mut dd[..4 * R * per_row];
    // SAFETY: the caller's CPU has AVX2, FMA and F16C, all the `Tile` methods need. Block `b`
    // of each row and token is `b < per_row` into slices of `per_row` blocks; `dd` holds
    // `4 R` values a block, `dy` four.
    unsafe {
        for b in 0..per_row {
            let dy4 = _mm_loadu_ps(dy.as_ptr().add(4 * b));
            for (r, x) in xs.iter().enumerate() {
                let dx = _mm_broadcastss_ps(head_f16x2(&x[b]));
                _mm_storeu_ps(dd.as_mut_ptr().add(4 * (R * b + r)), _mm_mul_ps(dx, dy4));
            }
        }
        // Pointers, not the slices, in the loop: indexing left dead address arithmetic
        // in it (a fifth of its instructions).
        let px: [*const K::W; R] = std::array::from_fn(|r| xs[r].as_ptr());
        let py: [*const BlockQ8_0; 4] = std::array::from_fn(|t| ys[t].as_ptr());
        let ones = _mm256_set1_epi16(1);
        let mut pd = dd.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for b in 0..per_row {
            for acc in acc.iter_mut().zip(&px) {
                let (acc, px) = acc;
                let p = K::prep(&*px.add(b));
                for (t, acc) in acc.iter_mut().enumerate() {
                    // `signed_step` with `d` read from `dd`.
                    let sy = _mm256_sign_epi8(load32(&(*py[t].add(b)).qs), p.x);
                    let pairs = _mm256_maddubs_epi16(p.ax, sy);
                    let q = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    *acc = _mm256_fmadd_ps(q, _mm256_broadcast_ss(&*pd.add(t)), *acc);
                }
                pd = pd.add(4);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (t, &acc) in acc.iter().enumerate() {
                out[(t0 + t) * rows + r0 + r] = hsum(acc);
            }
        }
    }
}

tiled_entry! {
    /// Tiled product of weight rows with a batch of tokens (see [`crate::GemmFn`]).
    q4_0: BlockQ4_0 => gemm_signed::<Q4_0>
}
tiled_entry! {
    /// Tiled product of weight rows with a batch of tokens (see [`crate::GemmFn`]).
    q5_0: BlockQ5_0 => gemm_signed::<Q5_0>
}
tiled_entry! {
    /// Tiled product of weight rows with a batch of tokens (see [`crate::GemmFn`]).
    q8_0: BlockQ8_0 => gemm_signed::<Q8_0>
}

/// The unsigned 32-value formats with a min against Q8_1 (`avx2::vec_dot_q4_1_q8_1`): lane 1
/// of a second accumulator runs the min terms.
macro_rules! unsigned_tile {
    ($name:ident: $block:ty, |$x:ident| $bytes:expr) => {
        struct $name;
        impl Tile for $name {
            type W = $block;
            type Prep = (__m128, __m256i);
            type Acc = (__m256, __m128);
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn zero() -> Self::Acc {
                (_mm256_setzero_ps(), _mm_setzero_ps())
            }
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn prep($x: &$block) -> Self::Prep {
                (head_f16x2($x), $bytes)
            }
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn step(p: &Self::Prep, y: &BlockQ8_1, (acc, mins): Self::Acc) -> Self::Acc {
                let (hx, q) = *p;
                let hy = head_f16x2(y);
                let mins = _mm_fmadd_ps(hx, hy, mins);
                let d = _mm256_broadcastss_ps(_mm_mul_ps(hx, hy));
                (_mm256_fmadd_ps(d, lanes_us(q, load32(&y.qs)), acc), mins)
            }
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn finish((acc, mins): Self::Acc) -> f32 {
                hsum(acc) + _mm_cvtss_f32(_mm_movehdup_ps(mins))
            }
        }
    };
}

unsigned_tile!(Q4_1: BlockQ4_1, |x| nibbles(&x.qs));
unsigned_tile!(Q5_1: BlockQ5_1, |x| q5_bytes(&x.qs, x.qh));

/// Q4_0 in llama.cpp's repacked order (`avx2::vec_dot_q4_0_q8_0_rows8`).
struct Q4_0Rows8;
impl Tile for Q4_0Rows8 {
    type W = BlockQ4_0;
    type Prep = (__m128, __m256i);
    type Acc = f32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> f32 {
        0.0
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ4_0) -> Self::Prep {
        (
            head_f16x2(x),
            _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8)),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(&(hx, q): &Self::Prep, y: &BlockQ8_0, acc: f32) -> f32 {
        let isum = hsum_i32(lanes_ss_i32(q, load32(&y.qs)));
        let d = _mm_cvtss_f32(_mm_mul_ps(hx, head_f16x2(y)));
        (isum as f32).mul_add(d, acc)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: f32) -> f32 {
        acc
    }
}

/// A Q4_K super-block unpacked: nibbles, sub-block scales as i16 vectors, and the mins.
struct Q4KPrep {
    lo: [__m256i; 4],
    hi: [__m256i; 4],
    scale_lo: [__m256i; 4],
    scale_hi: [__m256i; 4],
    mins: __m128i,
    d: f32,
    dmin: f32,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_prep(x: &BlockQ4K) -> Q4KPrep {
    let m4 = _mm256_set1_epi8(0x0F);
    let (scales, mins) = k_scales_mins(&x.scales);
    let (scales, mins) = (u64::from_le_bytes(scales), u64::from_le_bytes(mins));
    // The eight scales as i16 in both halves; scale `k` spread over a register by a shuffle
    // that repeats its two bytes.
    let scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64)));
    let spread = |k: i32| {
        let pair = (2 * k) | (2 * k + 1) << 8;
        _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(pair as i16))
    };
    // SAFETY: 32 readable bytes each (j < 4: 32j + 32 <= 128).
    let q4: [__m256i; 4] =
        std::array::from_fn(|j| unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()) });
    Q4KPrep {
        lo: q4.map(|q| _mm256_and_si256(q, m4)),
        hi: q4.map(|q| _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)),
        scale_lo: std::array::from_fn(|j| spread(2 * j as i32)),
        scale_hi: std::array::from_fn(|j| spread(2 * j as i32 + 1)),
        mins: _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64)),
        d: f32_of(x.d),
        dmin: f32_of(x.dmin),
    }
}

/// The exact lanes of `avx2::q4_k_lanes`, from an unpacked block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_lanes(p: &Q4KPrep, y: &BlockQ8K) -> (__m256i, __m128i) {
    // SAFETY: 16 readable bytes each (bsums has 16 i16), 32 each from qs (64j + 64 <= 256).
    let (bs_lo, bs_hi) = unsafe {
        (
            _mm_loadu_si128(y.bsums.as_ptr().cast()),
            _mm_loadu_si128(y.bsums.as_ptr().add(8).cast()),
        )
    };
    let prod = _mm_madd_epi16(p.mins, _mm_hadd_epi16(bs_lo, bs_hi));
    let mut sumi = _mm256_setzero_si256();
    for j in 0..4 {
        // SAFETY: as above.
        let (q8l, q8h) = unsafe {
            (
                _mm256_loadu_si256(y.qs.as_ptr().add(64 * j).cast()),
                _mm256_loadu_si256(y.qs.as_ptr().add(64 * j + 32).cast()),
            )
        };
        let pl = _mm256_madd_epi16(p.scale_lo[j], _mm256_maddubs_epi16(p.lo[j], q8l));
        let ph = _mm256_madd_epi16(p.scale_hi[j], _mm256_maddubs_epi16(p.hi[j], q8h));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
    }
    (sumi, prod)
}

/// Q4_K in `vec_dot` order (`avx2::vec_dot_q4_k_q8_k`).
struct Q4K;
impl Tile for Q4K {
    type W = BlockQ4K;
    type Prep = Q4KPrep;
    type Acc = (__m256, __m128);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_ps(), _mm_setzero_ps())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ4K) -> Q4KPrep {
        q4_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Q4KPrep, y: &BlockQ8K, (acc, acc_m): Self::Acc) -> Self::Acc {
        let d = y.d * p.d;
        let dmin = -y.d * p.dmin;
        let (sumi, prod) = q4_k_lanes(p, y);
        let acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        (acc, acc_m)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish((acc, acc_m): Self::Acc) -> f32 {
        let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum(acc) + _mm_cvtss_f32(m)
    }
}

/// Q4_K in llama.cpp's repacked order (`avx2::vec_dot_q4_k_q8_k_rows8`).
struct Q4KRows8;
impl Tile for Q4KRows8 {
    type W = BlockQ4K;
    type Prep = Q4KPrep;
    type Acc = (f32, f32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        (0.0, 0.0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ4K) -> Q4KPrep {
        q4_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Q4KPrep, y: &BlockQ8K, (main, mins): Self::Acc) -> Self::Acc {
        let (sumi, prod) = q4_k_lanes(p, y);
        let msum = hsum_i32(_mm256_set_m128i(_mm_setzero_si128(), prod));
        (
            (hsum_i32(sumi) as f32).mul_add(p.d * y.d, main),
            (msum as f32).mul_add(p.dmin * y.d, mins),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish((main, mins): Self::Acc) -> f32 {
        main - mins
    }
}

/// A Q6_K super-block unpacked: its 6-bit values as bytes, sub-block scales as i16 vectors.
struct Q6KPrep {
    q: [__m256i; 8],
    scales: [__m256i; 8],
    scales16: __m256i,
    d: f32,
}

/// Q6_K (`avx2::vec_dot_q6_k_q8_k`).
struct Q6K;
impl Tile for Q6K {
    type W = BlockQ6K;
    type Prep = Q6KPrep;
    type Acc = __m256;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ6K) -> Q6KPrep {
        let m15 = _mm256_set1_epi8(15);
        let mut q = [_mm256_setzero_si256(); 8];
        for j in 0..2 {
            // SAFETY: in bounds for j < 2 (ql: 128 bytes, qh: 64).
            let (b1, b2, h) = unsafe {
                (
                    _mm256_loadu_si256(x.ql.as_ptr().add(64 * j).cast()),
                    _mm256_loadu_si256(x.ql.as_ptr().add(64 * j + 32).cast()),
                    _mm256_loadu_si256(x.qh.as_ptr().add(32 * j).cast()),
                )
            };
            let hi0 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(3)), 4);
            let hi1 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(12)), 2);
            let hi2 = _mm256_and_si256(h, _mm256_set1_epi8(48));
            let hi3 = _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(-64)), 2);
            q[4 * j] = _mm256_or_si256(_mm256_and_si256(b1, m15), hi0);
            q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(b2, m15), hi1);
            q[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15), hi2);
            q[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15), hi3);
        }
        // SAFETY: 16 readable bytes.
        let sc8 = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
        let scales16 = _mm256_cvtepi8_epi16(sc8);
        // Scales 0..8 and 8..16 (as i16) in both halves; `halves_i16(sc[2i], sc[2i + 1])` is a
        // shuffle of one of them that repeats element 2i in the low half, 2i + 1 in the high.
        let first = _mm256_permute2x128_si256::<0x00>(scales16, scales16);
        let second = _mm256_permute2x128_si256::<0x11>(scales16, scales16);
        let spread = |i: usize| {
            let e = 2 * (i % 4) as i32;
            let lo = (2 * e) | (2 * e + 1) << 8;
            let hi = (2 * e + 2) | (2 * e + 3) << 8;
            let mask = _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16));
            _mm256_shuffle_epi8(if i < 4 { first } else { second }, mask)
        };
        Q6KPrep {
            q,
            scales: std::array::from_fn(spread),
            scales16,
            d: f32_of(x.d),
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Q6KPrep, y: &BlockQ8K, acc: __m256) -> __m256 {
        // SAFETY: 32 readable bytes of bsums (16 i16).
        let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, p.scales16), 5);
        let mut sumi = _mm256_setzero_si256();
        for i in 0..8 {
            // SAFETY: 32 readable bytes (32i + 32 <= 256).
            let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * i).cast()) };
            let prod = _mm256_madd_epi16(p.scales[i], _mm256_maddubs_epi16(p.q[i], a));
            sumi = _mm256_add_epi32(sumi, prod);
        }
        sumi = _mm256_sub_epi32(sumi, offset);
        _mm256_fmadd_ps(_mm256_set1_ps(y.d * p.d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum(acc)
    }
}

/// A Q2_K super-block unpacked: its 2-bit values as bytes (chunk `i` pairs with the token's
/// bytes `32i..32i + 32`), each chunk's two group scales as i16 halves, the 16 mins as i16.
struct Q2KPrep {
    q: [__m256i; 8],
    scales: [__m256i; 8],
    mins: __m256i,
    d: f32,
    dmin: f32,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k_prep(x: &BlockQ2K) -> Q2KPrep {
    let m3 = _mm256_set1_epi8(3);
    // SAFETY: 32 readable bytes each (32h + 32 <= 64), 16 of scales.
    let (q0, q1, sc) = unsafe {
        (
            _mm256_loadu_si256(x.qs.as_ptr().cast()),
            _mm256_loadu_si256(x.qs.as_ptr().add(32).cast()),
            _mm_loadu_si128(x.scales.as_ptr().cast()),
        )
    };
    let q = std::array::from_fn(|i| {
        let q2 = if i < 4 { q0 } else { q1 };
        match i % 4 {
            0 => _mm256_and_si256(q2, m3),
            1 => _mm256_and_si256(_mm256_srli_epi16(q2, 2), m3),
            2 => _mm256_and_si256(_mm256_srli_epi16(q2, 4), m3),
            _ => _mm256_and_si256(_mm256_srli_epi16(q2, 6), m3),
        }
    });
    let low = |g: usize| (x.scales[g] & 0xF) as i16;
    Q2KPrep {
        q,
        scales: std::array::from_fn(|i| halves_i16(low(2 * i), low(2 * i + 1))),
        mins: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F))),
        d: f32_of(x.d),
        dmin: f32_of(x.dmin),
    }
}

/// The exact main and min lanes of `avx2::q2_k_lanes` and `avx2::q2_k_min_lanes`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k_lanes(p: &Q2KPrep, y: &BlockQ8K) -> (__m256i, __m256i) {
    // SAFETY: 32 readable bytes of bsums (16 i16), 32 of qs each (32i + 32 <= 256).
    let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
    let mut sumi = _mm256_setzero_si256();
    for i in 0..8 {
        // SAFETY: as above.
        let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * i).cast()) };
        let prod = _mm256_madd_epi16(p.scales[i], _mm256_maddubs_epi16(p.q[i], a));
        sumi = _mm256_add_epi32(sumi, prod);
    }
    (sumi, _mm256_madd_epi16(p.mins, bsums))
}

/// Q2_K in `vec_dot` order (`avx2::vec_dot_q2_k_q8_k`).
struct Q2K;
impl Tile for Q2K {
    type W = BlockQ2K;
    type Prep = Q2KPrep;
    type Acc = __m256;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ2K) -> Q2KPrep {
        q2_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Q2KPrep, y: &BlockQ8K, acc: __m256) -> __m256 {
        let (sumi, mins) = q2_k_lanes(p, y);
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(-y.d * p.dmin), _mm256_cvtepi32_ps(mins), acc);
        _mm256_fmadd_ps(_mm256_set1_ps(y.d * p.d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum(acc)
    }
}

/// Q2_K in llama.cpp's repacked order (`avx2::vec_dot_q2_k_q8_k_rows8`).
struct Q2KRows8;
impl Tile for Q2KRows8 {
    type W = BlockQ2K;
    type Prep = Q2KPrep;
    type Acc = (f32, f32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        (0.0, 0.0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ2K) -> Q2KPrep {
        q2_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Q2KPrep, y: &BlockQ8K, (main, mins): Self::Acc) -> Self::Acc {
        let (sumi, msum) = q2_k_lanes(p, y);
        (
            (hsum_i32(sumi) as f32).mul_add(p.d * y.d, main),
            (hsum_i32(msum) as f32).mul_add(p.dmin * y.d, mins),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish((main, mins): Self::Acc) -> f32 {
        main - mins
    }
}

/// A Q3_K super-block unpacked: its values (-4..=3) as absolute values and signs, chunk `i`
/// pairing with the token's bytes `32i..32i + 32`, and each chunk's group scales as i16 halves.
struct Q3KPrep {
    abs: [__m256i; 8],
    q: [__m256i; 8],
    scales: [__m256i; 8],
    d: f32,
}

/// Q3_K (`avx2::vec_dot_q3_k_q8_k`).
struct Q3K;
impl Tile for Q3K {
    type W = BlockQ3K;
    type Prep = Q3KPrep;
    type Acc = __m256;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ3K) -> Q3KPrep {
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let sc: [i16; 16] = q3k_scales(&x.scales).map(|s| s as i16 - 32);
        // SAFETY: 32 readable bytes each (hmask: 32, qs: 64).
        let (hm, q0, q1) = unsafe {
            (
                _mm256_loadu_si256(x.hmask.as_ptr().cast()),
                _mm256_loadu_si256(x.qs.as_ptr().cast()),
                _mm256_loadu_si256(x.qs.as_ptr().add(32).cast()),
            )
        };
        let q: [__m256i; 8] = std::array::from_fn(|i| {
            let q2 = if i < 4 { q0 } else { q1 };
            let low = match i % 4 {
                0 => _mm256_and_si256(q2, m3),
                1 => _mm256_and_si256(_mm256_srli_epi16(q2, 2), m3),
                2 => _mm256_and_si256(_mm256_srli_epi16(q2, 4), m3),
                _ => _mm256_and_si256(_mm256_srli_epi16(q2, 6), m3),
            };
            let bit = _mm256_set1_epi8(1 << i);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            _mm256_sub_epi8(low, _mm256_andnot_si256(set, four))
        });
        Q3KPrep {
            abs: q.map(|q| _mm256_sign_epi8(q, q)),
            q,
            scales: std::array::from_fn(|i| halves_i16(sc[2 * i], sc[2 * i + 1])),
            d: f32_of(x.d),
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Q3KPrep, y: &BlockQ8K, acc: __m256) -> __m256 {
        let mut sumi = _mm256_setzero_si256();
        for i in 0..8 {
            // SAFETY: 32 readable bytes (32i + 32 <= 256).
            let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * i).cast()) };
            let p16 = _mm256_maddubs_epi16(p.abs[i], _mm256_sign_epi8(a, p.q[i]));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p.scales[i], p16));
        }
        _mm256_fmadd_ps(_mm256_set1_ps(y.d * p.d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum(acc)
    }
}

/// A Q5_K super-block unpacked: its 5-bit values as bytes (chunk `i` pairs with the token's
/// bytes `32i..32i + 32`), each chunk's scale as i16, the eight mins as i16.
struct Q5KPrep {
    q: [__m256i; 8],
    scales: [__m256i; 8],
    mins: __m128i,
    d: f32,
    dmin: f32,
}

/// Q5_K (`avx2::vec_dot_q5_k_q8_k`).
struct Q5K;
impl Tile for Q5K {
    type W = BlockQ5K;
    type Prep = Q5KPrep;
    type Acc = (__m256, f32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_ps(), 0.0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ5K) -> Q5KPrep {
        let m4 = _mm256_set1_epi8(0x0F);
        let sixteen = _mm256_set1_epi8(0x10);
        let (sc, mn) = k_scales_mins(&x.scales);
        // SAFETY: 32 readable bytes of qh.
        let hbits = unsafe { _mm256_loadu_si256(x.qh.as_ptr().cast()) };
        let q = std::array::from_fn(|i| {
            // SAFETY: 32 readable bytes (32(i / 2) + 32 <= 128).
            let q = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * (i / 2)).cast()) };
            let q = if i % 2 == 0 {
                _mm256_and_si256(q, m4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)
            };
            let b = _mm256_set1_epi8(1 << i);
            let high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, b), b), sixteen);
            _mm256_or_si256(q, high)
        });
        Q5KPrep {
            q,
            scales: std::array::from_fn(|i| _mm256_set1_epi16(sc[i] as i16)),
            mins: _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mn))),
            d: f32_of(x.d),
            dmin: f32_of(x.dmin),
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Q5KPrep, y: &BlockQ8K, (acc, mins): Self::Acc) -> Self::Acc {
        // SAFETY: 16 readable bytes each (bsums has 16 i16).
        let (bs_lo, bs_hi) = unsafe {
            (
                _mm_loadu_si128(y.bsums.as_ptr().cast()),
                _mm_loadu_si128(y.bsums.as_ptr().add(8).cast()),
            )
        };
        let prod = _mm_madd_epi16(p.mins, _mm_hadd_epi16(bs_lo, bs_hi));
        let total = hsum_i32(_mm256_set_m128i(_mm_setzero_si128(), prod));
        let mins = (-y.d * p.dmin).mul_add(total as f32, mins);
        let mut sumi = _mm256_setzero_si256();
        for i in 0..8 {
            // SAFETY: 32 readable bytes (32i + 32 <= 256).
            let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * i).cast()) };
            let prod = _mm256_madd_epi16(p.scales[i], _mm256_maddubs_epi16(p.q[i], a));
            sumi = _mm256_add_epi32(sumi, prod);
        }
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(p.d * y.d), _mm256_cvtepi32_ps(sumi), acc);
        (acc, mins)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish((acc, mins): Self::Acc) -> f32 {
        hsum(acc) + mins
    }
}

/// An IQ4_XS super-block unpacked: its table values as absolute values and signs (chunk `j`
/// pairs with the token's bytes `32j..32j + 32`), each sub-block's scale as i16.
struct IQ4XSPrep {
    abs: [__m256i; 8],
    q: [__m256i; 8],
    scales: [__m256i; 8],
    d: f32,
}

/// IQ4_XS (`avx2::vec_dot_iq4_xs_q8_k`). Each lane is `ls * (Σ of its four products)`; here
/// `vpmaddwd` applies `ls` to the pair sums, the same exact integer.
struct IQ4XS;
impl Tile for IQ4XS {
    type W = BlockIQ4XS;
    type Prep = IQ4XSPrep;
    type Acc = __m256;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockIQ4XS) -> IQ4XSPrep {
        let q: [__m256i; 8] = std::array::from_fn(|j| iq4_values(&x.qs[16 * j..16 * j + 16]));
        IQ4XSPrep {
            abs: q.map(|q| _mm256_sign_epi8(q, q)),
            q,
            scales: std::array::from_fn(|j| _mm256_set1_epi16(iq4xs_scale(x, j) as i16 - 32)),
            d: f32_of(x.d),
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &IQ4XSPrep, y: &BlockQ8K, acc: __m256) -> __m256 {
        let mut sumi = _mm256_setzero_si256();
        for j in 0..8 {
            // SAFETY: 32 readable bytes (32j + 32 <= 256).
            let a = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * j).cast()) };
            let p16 = _mm256_maddubs_epi16(p.abs[j], _mm256_sign_epi8(a, p.q[j]));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p.scales[j], p16));
        }
        _mm256_fmadd_ps(_mm256_set1_ps(p.d * y.d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum(acc)
    }
}

/// IQ4_NL in llama.cpp's repacked order (`avx2::vec_dot_iq4_nl_q8_0_rows8`).
struct IQ4NLRows8;
impl Tile for IQ4NLRows8 {
    type W = BlockIQ4NL;
    type Prep = (__m128, __m256i);
    type Acc = f32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> f32 {
        0.0
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockIQ4NL) -> Self::Prep {
        (head_f16x2(x), iq4_values(&x.qs))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(&(hx, q): &Self::Prep, y: &BlockQ8_0, acc: f32) -> f32 {
        let isum = hsum_i32(lanes_ss_i32(q, load32(&y.qs)));
        let d = _mm_cvtss_f32(_mm_mul_ps(hx, head_f16x2(y)));
        (isum as f32).mul_add(d, acc)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: f32) -> f32 {
        acc
    }
}

/// IQ4_NL in `vec_dot` order (`avx2::vec_dot_iq4_nl_q8_0`): even blocks into one accumulator,
/// odd into another. An even block waits (`pending`, its exact lanes as floats and its scale)
/// until its odd partner comes; one still waiting at the end is the lone last block, fused onto
/// the horizontal sum as the reference does (its lanes are small integers, so their float sum
/// is its exact integer sum).
struct IQ4NL;
impl Tile for IQ4NL {
    type W = BlockIQ4NL;
    type Prep = Signed;
    type Acc = (__m256, __m256, __m256, __m256, bool);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        let z = _mm256_setzero_ps();
        (z, z, z, z, false)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(x: &BlockIQ4NL) -> Signed {
        signed(head_f16x2(x), iq4_values(&x.qs))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(p: &Signed, y: &BlockQ8_0, acc: Self::Acc) -> Self::Acc {
        let (even, odd, pend_d, pend, pending) = acc;
        let d = _mm256_broadcastss_ps(_mm_mul_ps(head_f16x2(y), p.hx));
        let lanes = lanes_us(p.ax, _mm256_sign_epi8(load32(&y.qs), p.x));
        if pending {
            let even = _mm256_fmadd_ps(pend_d, pend, even);
            (even, _mm256_fmadd_ps(d, lanes, odd), pend_d, pend, false)
        } else {
            (even, odd, d, lanes, true)
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish((even, odd, pend_d, pend, pending): Self::Acc) -> f32 {
        let sum = hsum(_mm256_add_ps(even, odd));
        if pending {
            _mm256_cvtss_f32(pend_d).mul_add(hsum(pend), sum)
        } else {
            sum
        }
    }
}

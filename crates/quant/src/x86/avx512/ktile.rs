//! AVX-512 VNNI tiles for the K-quants against Q8_K: Q4_K (both orders) and Q6_K, for prefill
//! (two rows by four tokens) and for decode (four rows a token, with the weights asked for
//! ahead of the kernel).
//!
//! The AVX2 kernels ([`crate::x86::avx2`]) take a 32-value sub-block per `vpmaddubsw` + `vpmaddwd`
//! (+ add); here one 512-bit instruction takes two sub-blocks:
//!
//! - **Q4_K:** `vpdpbusd` gives the exact sums of four nibble-times-byte products per i32 lane,
//!   sub-block `2j` in lanes 0..8 and `2j + 1` in lanes 8..16; `vpdpwssd` against a register
//!   whose i32 lanes hold that sub-block's scale (`s`, upper half zero) multiplies and
//!   accumulates (a lane's sum has |sum| <= 4 * 15 * 128, so its low 16 bits are the sum as a
//!   signed i16 and `s * sum` is exact). Lane `l` of the AVX2 kernel's `vpmaddwd` sums the
//!   same four products times the same scale.
//! - **Q6_K:** as [`crate::x86::avx512::vec_dot_q6_k_q8_k`], 64 values per step.
//!
//! The two 8-lane halves are folded before the float side, which is the single-row kernel's:
//! same lanes, same conversions, same fused multiply-adds in the same order. Integer sums are
//! exact in any order, so every output is bit-identical to `vec_dot` of its row and token,
//! whatever the tile shape, the batch size (G1) or the thread (D1).

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::codec::prefetch_ahead;
use crate::x86::avx2::{f32_of, head_f16x2, hsum, hsum_i32};
use crate::{DotBlock, QuantError};

/// A dot product split into per-token work (`tok`), per-weight-block work (`prep`) and the work
/// per (row, token) pair (`step`).
trait KTile {
    type W: DotBlock + bytemuck::Pod;
    type Tok: Copy;
    type Prep;
    type Acc: Copy;
    /// # Safety
    /// The CPU must have what [`crate::Cpu::avx512_vnni`] checks (as for every method
    /// here).
    unsafe fn zero() -> Self::Acc;
    /// # Safety
    /// As [`KTile::zero`].
    unsafe fn tok(y: &Act<Self>) -> Self::Tok;
    /// # Safety
    /// As [`KTile::zero`].
    unsafe fn prep(x: &Self::W) -> Self::Prep;
    /// # Safety
    /// As [`KTile::zero`].
    unsafe fn step(p: &Self::Prep, y: &Act<Self>, tok: Self::Tok, acc: Self::Acc) -> Self::Acc;
    /// # Safety
    /// As [`KTile::zero`].
    unsafe fn finish(acc: Self::Acc) -> f32;
}

type Act<K> = <<K as KTile>::W as DotBlock>::Act;

/// Rows `r0..r0 + R` times tokens `t0..t0 + T`, into `out` (`(n_tok, rows)`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `b` indexes every row and token of the tile
unsafe fn tile<K: KTile, const R: usize, const T: usize>(
    w: &[K::W],
    a: &[Act<K>],
    per_row: usize,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    let rows = w.len() / per_row;
    let xs: [&[K::W]; R] = std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row]);
    let ys: [&[Act<K>]; T] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    // SAFETY: the caller's CPU has what `Cpu::avx512_vnni` checks, all the `KTile` methods need.
    unsafe {
        let mut acc = [[K::zero(); T]; R];
        for b in 0..per_row {
            let toks: [K::Tok; T] = std::array::from_fn(|t| K::tok(&ys[t][b]));
            for r in 0..R {
                let p = K::prep(&xs[r][b]);
                for t in 0..T {
                    acc[r][t] = K::step(&p, &ys[t][b], toks[t], acc[r][t]);
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

/// Every row of `w` times every token of `a`: two rows by four tokens, then four rows a token
/// for the tokens left over (and for decode, where the weights come from memory and are asked
/// for ahead of the kernel).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm<K: KTile>(w: &[K::W], a: &[Act<K>], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let row_bytes = per_row * size_of::<K::W>();
    // SAFETY: the caller's CPU has what `Cpu::avx512_vnni` checks; the tiles stay in bounds (the
    // loops' conditions), which the slicing in `tile` checks again.
    unsafe {
        let mut t0 = 0;
        while n_tok - t0 >= 8 {
            for r0 in 0..rows {
                tile::<K, 1, 8>(w, a, per_row, (r0, t0), out);
            }
            t0 += 8;
        }
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
        for t0 in t0..n_tok {
            let mut r0 = 0;
            while rows - r0 >= 4 {
                prefetch_ahead(bytes, r0 * row_bytes..(r0 + 4) * row_bytes);
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
    KTile;
    q4_k: Q4K;
    q2_k: Q2K;
    q3_k: Q3K;
    iq4_xs: IQ4XS;
}

tiled_entry! {
    /// Tiled Q4_K in llama.cpp's repacked order (see [`crate::GemmFn`]): eight (row, token) pairs
    /// at a time, whose per-block totals are reduced together ([`reduce8`]).
    q4_k_rows8: BlockQ4K => gemm_q4_k_rows8_tiles
}

tiled_entry! {
    /// Tiled Q6_K (see [`crate::GemmFn`]).
    q6_k: BlockQ6K => gemm::<Q6K>
}

/// [`gemm`] for [`Q4KRows8`], with eight-pair tiles: two rows by four tokens, eight rows a
/// token.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_q4_k_rows8_tiles(w: &[BlockQ4K], a: &[BlockQ8K], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let row_bytes = per_row * size_of::<BlockQ4K>();
    // SAFETY: as in `gemm`.
    unsafe {
        let mut t0 = 0;
        if n_tok >= 8 {
            let toks = Q8KTokens::new(a, per_row, n_tok);
            while n_tok - t0 >= 8 {
                for r0 in 0..rows {
                    q4_k_rows8_row_by_8(&w[r0 * per_row..][..per_row], a, &toks, (r0, t0), out);
                }
                t0 += 8;
            }
        }
        while n_tok - t0 >= 4 {
            let mut r0 = 0;
            while rows - r0 >= 2 {
                q4_k_rows8_tile8::<2, 4>(w, a, per_row, (r0, t0), out);
                r0 += 2;
            }
            if r0 < rows {
                tile::<Q4KRows8, 1, 4>(w, a, per_row, (r0, t0), out);
            }
            t0 += 4;
        }
        for t0 in t0..n_tok {
            let mut r0 = 0;
            while rows - r0 >= 8 {
                prefetch_ahead(bytes, r0 * row_bytes..(r0 + 8) * row_bytes);
                q4_k_rows8_tile8::<8, 1>(w, a, per_row, (r0, t0), out);
                r0 += 8;
            }
            for r0 in r0..rows {
                tile::<Q4KRows8, 1, 1>(w, a, per_row, (r0, t0), out);
            }
        }
    }
}

/// What every row needs of the tokens, block by block, gathered once per product: each
/// block's `d` for every token (`d[b * n_tok + t]`) and its sub-block sums
/// (`pair_sums[b * n_tok + t]`, eight i16: `bsum[2k] + bsum[2k + 1]`).
struct Q8KTokens {
    n_tok: usize,
    d: Vec<f32>,
    pair_sums: Vec<[i16; 8]>,
}

impl Q8KTokens {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(a: &[BlockQ8K], per_row: usize, n_tok: usize) -> Q8KTokens {
        let mut pair_sums = vec![[0i16; 8]; per_row * n_tok];
        let mut d = vec![0.0f32; per_row * n_tok];
        for (t, y) in a.chunks_exact(per_row).enumerate() {
            for (b, y) in y.iter().enumerate() {
                d[b * n_tok + t] = y.d;
                let ps = &mut pair_sums[b * n_tok + t];
                // SAFETY: 16 writable bytes.
                unsafe { _mm_storeu_si128(ps.as_mut_ptr().cast(), q8_k_pair_sums(y)) };
            }
        }
        Q8KTokens {
            n_tok,
            d,
            pair_sums,
        }
    }
}

/// One row (`x`, row `r0`) times tokens `t0..t0 + 8` of [`Q4KRows8`], lane `t` of two float
/// vectors running token `t0 + t`'s two floats with exactly the scalar kernel's operations
/// (as in [`q4_k_rows8_tile8`]). The token-side work (the `d`s, the mins' sums) comes from
/// `toks`, and the mins term of all eight tokens takes two `vpmaddwd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_rows8_row_by_8(
    x: &[BlockQ4K],
    a: &[BlockQ8K],
    toks: &Q8KTokens,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    let per_row = x.len();
    let rows = out.len() / toks.n_tok;
    let ys: [&[BlockQ8K]; 8] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    // Token k's lanes at 4k and 4k + 1 of the mins' reduction, moved to lane k.
    let gather = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    let (mut main, mut mins) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (b, x) in x.iter().enumerate() {
        let at = b * toks.n_tok + t0;
        let p = q4_k_prep_packed(x);
        let zero = _mm_setzero_si128();
        let sums: [__m512i; 8] = std::array::from_fn(|t| q4_k_raw_packed(&p, &ys[t][b], zero).0);
        // SAFETY: `at + 8 <= per_row * n_tok` entries of each (t0 + 8 <= n_tok).
        let (yd, ps_lo, ps_hi) = unsafe {
            (
                _mm256_loadu_ps(toks.d.as_ptr().add(at)),
                _mm512_loadu_si512(toks.pair_sums.as_ptr().add(at).cast()),
                _mm512_loadu_si512(toks.pair_sums.as_ptr().add(at + 4).cast()),
            )
        };
        // Per 128-bit lane k: token k's (ps_lo) and k + 4's (ps_hi) four products of pairs.
        let m = _mm512_broadcast_i32x4(p.mins);
        let (lo, hi) = (_mm512_madd_epi16(ps_lo, m), _mm512_madd_epi16(ps_hi, m));
        let u = _mm512_add_epi32(_mm512_unpacklo_epi32(lo, hi), _mm512_unpackhi_epi32(lo, hi));
        let u = _mm512_add_epi32(u, _mm512_shuffle_epi32::<0b01_00_11_10>(u));
        let msum = _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, u));
        let d = _mm256_mul_ps(_mm256_set1_ps(p.d), yd);
        let dmin = _mm256_mul_ps(_mm256_set1_ps(p.dmin), yd);
        main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(sums)), d, main);
        mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), dmin, mins);
    }
    let mut res = [0.0f32; 8];
    // SAFETY: 8 writable floats.
    unsafe { _mm256_storeu_ps(res.as_mut_ptr(), _mm256_sub_ps(main, mins)) };
    for (t, v) in res.into_iter().enumerate() {
        out[(t0 + t) * rows + r0] = v;
    }
}

/// Rows `r0..r0 + R` times tokens `t0..t0 + T` (`R * T == 8`) of [`Q4KRows8`]: pair `i` is
/// row `i / T`, token `i % T`, and lane `i` of two float vectors is its two running floats.
/// Each lane takes exactly the scalar kernel's operations: the block's exact totals converted,
/// one fused multiply-add with `d_x * d_y` (`dmin_x * d_y`), and `main - mins` at the end.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_rows8_tile8<const R: usize, const T: usize>(
    w: &[BlockQ4K],
    a: &[BlockQ8K],
    per_row: usize,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    const { assert!(R * T == 8) };
    let rows = w.len() / per_row;
    let xs: [&[BlockQ4K]; R] = std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row]);
    let ys: [&[BlockQ8K]; T] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    let (mut main, mut mins) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in 0..per_row {
        let toks: [__m128i; T] = std::array::from_fn(|t| q8_k_pair_sums(&ys[t][b]));
        let mut sums = [_mm512_setzero_si512(); 8];
        let mut prods = [_mm_setzero_si128(); 8];
        let (mut d, mut dmin) = ([0.0f32; 8], [0.0f32; 8]);
        for (r, x) in xs.iter().enumerate() {
            let p = q4_k_prep_packed(&x[b]);
            for (t, y) in ys.iter().enumerate() {
                let i = r * T + t;
                (sums[i], prods[i]) = q4_k_raw_packed(&p, &y[b], toks[t]);
                d[i] = p.d * y[b].d;
                dmin[i] = p.dmin * y[b].d;
            }
        }
        // SAFETY: 8 readable floats each.
        let (d, dmin) = unsafe { (_mm256_loadu_ps(d.as_ptr()), _mm256_loadu_ps(dmin.as_ptr())) };
        main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(sums)), d, main);
        mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_128(prods)), dmin, mins);
    }
    let mut res = [0.0f32; 8];
    // SAFETY: 8 writable floats.
    unsafe { _mm256_storeu_ps(res.as_mut_ptr(), _mm256_sub_ps(main, mins)) };
    for (i, v) in res.into_iter().enumerate() {
        out[(t0 + i % T) * rows + r0 + i / T] = v;
    }
}

/// Lane `i` is the (exact) sum of the sixteen lanes of `v[i]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn reduce8(v: [__m512i; 8]) -> __m256i {
    // Per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
    let pair = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let t: [__m512i; 4] = std::array::from_fn(|k| pair(v[2 * k], v[2 * k + 1]));
    // Per 128-bit lane: [a, b, c, d], each that lane's share of v[4k..4k + 4].
    let quad = |c, d| _mm512_add_epi32(_mm512_unpacklo_epi64(c, d), _mm512_unpackhi_epi64(c, d));
    let (u0, u1) = (quad(t[0], t[1]), quad(t[2], t[3]));
    // The four 128-bit lanes of u0 and of u1 summed: [u0.0 + u0.1, u0.2 + u0.3, u1.0 + .., ..].
    let v = _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(u0, u1),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(u0, u1),
    );
    let w = _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b00_00_10_00>(v, v),
        _mm512_shuffle_i32x4::<0b00_00_11_01>(v, v),
    );
    _mm512_castsi512_si256(w)
}

/// Lane `i` is the (exact) sum of the four lanes of `v[i]`.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8_128(v: [__m128i; 8]) -> __m256i {
    let m: [__m256i; 4] = std::array::from_fn(|k| _mm256_set_m128i(v[k + 4], v[k]));
    let pair = |a, b| _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    let (t0, t1) = (pair(m[0], m[1]), pair(m[2], m[3]));
    _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1))
}

/// Lanes 0..8 plus lanes 8..16 (exact).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// A Q4_K super-block unpacked: pair `j` of sub-blocks (`2j`, `2j + 1`) as nibble bytes in one
/// register, their scales as i32 lanes of another, the mins as i16 and the two f16 scales.
struct Q4KPrep {
    q: [__m512i; 4],
    scales: [__m512i; 4],
    mins: __m128i,
    d: f32,
    dmin: f32,
}

/// A Q4_K block's `d` and `dmin` as f32, by one F16C conversion of a full-width load (the
/// integer conversion `f32_of` costs a dozen instructions a value; see also its note).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_k_head(x: &BlockQ4K) -> (f32, f32) {
    let h = head_f16x2(x);
    (_mm_cvtss_f32(h), _mm_cvtss_f32(_mm_movehdup_ps(h)))
}

/// Pair `j` of sub-blocks as nibble bytes: the low nibbles of bytes `32j..32j + 32` (sub-block
/// `2j`) in the low half, their high nibbles (`2j + 1`) in the high half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn q4_k_prep_nibbles(x: &BlockQ4K) -> [__m512i; 4] {
    let m4 = _mm512_set1_epi8(0x0F);
    std::array::from_fn(|j| {
        // SAFETY: 32 readable bytes (j < 4: 32j + 32 <= 128).
        let q =
            _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast()) });
        _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFFFF_0000, q, 4), m4)
    })
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn q4_k_prep(x: &BlockQ4K) -> Q4KPrep {
    let head = q4_k_head(x);
    let (scales, mins) = k_scales_mins(&x.scales);
    let scales32 = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(scales)));
    let q = q4_k_prep_nibbles(x);
    let scales = std::array::from_fn(|j| {
        let j = j as i32;
        let pick = _mm512_inserti64x4::<1>(_mm512_set1_epi32(2 * j), _mm256_set1_epi32(2 * j + 1));
        _mm512_permutexvar_epi32(pick, scales32)
    });
    Q4KPrep {
        q,
        scales,
        mins: _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mins))),
        d: head.0,
        dmin: head.1,
    }
}

/// [`Q4KPrep`] for the repacked order, whose per-block totals alone matter: the sub-block dot
/// products of two pairs are packed into the i16 halves of one register (each fits: |sum| <=
/// 4 * 15 * 128), so that one `vpdpwssd` scales four sub-blocks' lanes. `scales[0]` holds, per
/// 128-bit lane `k`, sub-block 0's scale (k < 2; 1 for k >= 2) for i16 elements 0..4 and
/// sub-block 2's (3) for 4..8, as `vpackssdw` of pairs 0 and 1 lays them out; `scales[1]` the
/// same for pairs 2 and 3 (sub-blocks 4..8).
struct Q4KPackedPrep {
    q: [__m512i; 4],
    scales: [__m512i; 2],
    mins: __m128i,
    d: f32,
    dmin: f32,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn q4_k_prep_packed(x: &BlockQ4K) -> Q4KPackedPrep {
    let head = q4_k_head(x);
    let p = q4_k_prep_nibbles(x);
    let (scales, mins) = k_scales_mins(&x.scales);
    let scales16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(
        i64::from_le_bytes(scales),
    )));
    let pick = |first: i64| {
        let w = |g: i64| 0x0001_0001_0001_0001 * g;
        _mm512_set_epi64(
            w(first + 3),
            w(first + 1),
            w(first + 3),
            w(first + 1),
            w(first + 2),
            w(first),
            w(first + 2),
            w(first),
        )
    };
    Q4KPackedPrep {
        q: p,
        scales: [
            _mm512_permutexvar_epi16(pick(0), scales16),
            _mm512_permutexvar_epi16(pick(4), scales16),
        ],
        mins: _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mins))),
        d: head.0,
        dmin: head.1,
    }
}

/// Sixteen lanes whose sum is the main term of a Q4_K block and the token (see
/// [`Q4KPackedPrep`]), and the four lanes of the mins.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
fn q4_k_raw_packed(p: &Q4KPackedPrep, y: &BlockQ8K, pair_sums: __m128i) -> (__m512i, __m128i) {
    let zero = _mm512_setzero_si512();
    // SAFETY: 64 readable bytes each (64j + 64 <= 256).
    let a: [__m512i; 4] =
        std::array::from_fn(|j| unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * j).cast()) });
    let dot = |j: usize| _mm512_dpbusd_epi32(zero, p.q[j], a[j]);
    let lo = _mm512_packs_epi32(dot(0), dot(1));
    let hi = _mm512_packs_epi32(dot(2), dot(3));
    let sum = _mm512_dpwssd_epi32(_mm512_madd_epi16(lo, p.scales[0]), hi, p.scales[1]);
    (sum, _mm_madd_epi16(p.mins, pair_sums))
}

/// The token's sub-block sums (`bsum[2k] + bsum[2k + 1]`, i16), which the mins multiply.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q8_k_pair_sums(y: &BlockQ8K) -> __m128i {
    // SAFETY: 16 readable bytes each (bsums has 16 i16).
    let (lo, hi) = unsafe {
        (
            _mm_loadu_si128(y.bsums.as_ptr().cast()),
            _mm_loadu_si128(y.bsums.as_ptr().add(8).cast()),
        )
    };
    _mm_hadd_epi16(lo, hi)
}

/// The exact lanes of `avx2::q4_k_lanes`: eight of the main term, four of the mins.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
fn q4_k_lanes(p: &Q4KPrep, y: &BlockQ8K, pair_sums: __m128i) -> (__m256i, __m128i) {
    let (sumi, prod) = q4_k_raw(p, y, pair_sums);
    (fold(sumi), prod)
}

/// [`q4_k_lanes`] before the fold: sixteen lanes whose sum is the main term's.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
fn q4_k_raw(p: &Q4KPrep, y: &BlockQ8K, pair_sums: __m128i) -> (__m512i, __m128i) {
    let zero = _mm512_setzero_si512();
    // SAFETY: 64 readable bytes each (64j + 64 <= 256).
    let a: [__m512i; 4] =
        std::array::from_fn(|j| unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * j).cast()) });
    let dot = |j: usize| _mm512_dpbusd_epi32(zero, p.q[j], a[j]);
    // Two chains, so that the multiply-accumulates of one wait less on the other's.
    let even = _mm512_dpwssd_epi32(
        _mm512_dpwssd_epi32(zero, dot(0), p.scales[0]),
        dot(2),
        p.scales[2],
    );
    let odd = _mm512_dpwssd_epi32(
        _mm512_dpwssd_epi32(zero, dot(1), p.scales[1]),
        dot(3),
        p.scales[3],
    );
    (
        _mm512_add_epi32(even, odd),
        _mm_madd_epi16(p.mins, pair_sums),
    )
}

/// Q4_K in `vec_dot` order (`avx2::vec_dot_q4_k_q8_k`).
struct Q4K;
impl KTile for Q4K {
    type W = BlockQ4K;
    type Tok = __m128i;
    type Prep = Q4KPrep;
    type Acc = (__m256, __m128);
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_ps(), _mm_setzero_ps())
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tok(y: &BlockQ8K) -> __m128i {
        q8_k_pair_sums(y)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ4K) -> Q4KPrep {
        q4_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(p: &Q4KPrep, y: &BlockQ8K, tok: __m128i, (acc, acc_m): Self::Acc) -> Self::Acc {
        // d_x * d_y and -(dmin_x * d_y), as the row kernel forms them.
        let d = y.d * p.d;
        let dmin = -y.d * p.dmin;
        let (sumi, prod) = q4_k_lanes(p, y, tok);
        let acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        (acc, acc_m)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn finish((acc, acc_m): Self::Acc) -> f32 {
        let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum(acc) + _mm_cvtss_f32(m)
    }
}

/// Q4_K in llama.cpp's repacked order (`avx2::vec_dot_q4_k_q8_k_rows8`): per super-block, the
/// exact totals of the main and min terms, each into its own running float.
struct Q4KRows8;
impl KTile for Q4KRows8 {
    type W = BlockQ4K;
    type Tok = __m128i;
    type Prep = Q4KPrep;
    type Acc = (f32, f32);
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        (0.0, 0.0)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tok(y: &BlockQ8K) -> __m128i {
        q8_k_pair_sums(y)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ4K) -> Q4KPrep {
        q4_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(p: &Q4KPrep, y: &BlockQ8K, tok: __m128i, (main, mins): Self::Acc) -> Self::Acc {
        let (sumi, prod) = q4_k_lanes(p, y, tok);
        let msum = hsum_i32(_mm256_set_m128i(_mm_setzero_si128(), prod));
        (
            (hsum_i32(sumi) as f32).mul_add(p.d * y.d, main),
            (msum as f32).mul_add(p.dmin * y.d, mins),
        )
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn finish((main, mins): Self::Acc) -> f32 {
        main - mins
    }
}

/// A Q6_K super-block unpacked, half `h` (128 values) at a time: values `128h + 32k + l` for
/// k = 0, 1 in `q01[h]` and k = 2, 3 in `q23[h]`, each 128-bit lane's scale (as i16 pairs) in
/// `s01[h]`/`s23[h]`, and the sixteen scales as i16 for the -32 offset.
struct Q6KPrep {
    q01: [__m512i; 2],
    q23: [__m512i; 2],
    s01: [__m512i; 2],
    s23: [__m512i; 2],
    sc16: __m256i,
    d: f32,
}

/// Q6_K (`avx512::vec_dot_q6_k_q8_k`, the same lanes as `avx2::vec_dot_q6_k_q8_k`).
struct Q6K;
impl KTile for Q6K {
    type W = BlockQ6K;
    type Tok = __m256i;
    type Prep = Q6KPrep;
    type Acc = __m256;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tok(y: &BlockQ8K) -> __m256i {
        // SAFETY: 32 readable bytes (bsums has 16 i16).
        unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ6K) -> Q6KPrep {
        let m15 = _mm512_set1_epi8(15);
        // Per 256-bit half: the mask and shift that move bits 2k..2k + 2 of qh to bits 4..6.
        let lo_hi = |a: i8, b: i8| {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi8(a)),
                _mm256_set1_epi8(b),
            )
        };
        let (mask01, mask23) = (lo_hi(3, 12), lo_hi(48, -64));
        let shl01 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
        let shr23 = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
        // SAFETY: 16 readable bytes.
        let sc16 = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) });
        let sc512 = _mm512_castsi256_si512(sc16);
        // Each 16 values share a scale: group 8h + 2k (+1 for the second 16), so each 128-bit
        // lane of a product takes one scale.
        let group = |first: i16| {
            let w = |g: i16| 0x0001_0001_0001_0001 * g as i64;
            _mm512_set_epi64(
                w(first + 3),
                w(first + 3),
                w(first + 2),
                w(first + 2),
                w(first + 1),
                w(first + 1),
                w(first),
                w(first),
            )
        };
        let mut p = Q6KPrep {
            q01: [_mm512_setzero_si512(); 2],
            q23: [_mm512_setzero_si512(); 2],
            s01: [_mm512_setzero_si512(); 2],
            s23: [_mm512_setzero_si512(); 2],
            sc16,
            d: f32_of(x.d),
        };
        for h in 0..2 {
            // SAFETY: in bounds for h < 2 (ql: 128 bytes, qh: 64).
            let (b, qh) = unsafe {
                (
                    _mm512_loadu_si512(x.ql.as_ptr().add(64 * h).cast()),
                    _mm256_loadu_si256(x.qh.as_ptr().add(32 * h).cast()),
                )
            };
            let qh = _mm512_broadcast_i64x4(qh);
            let hi01 = _mm512_sllv_epi16(_mm512_and_si512(qh, mask01), shl01);
            let hi23 = _mm512_srlv_epi16(_mm512_and_si512(qh, mask23), shr23);
            p.q01[h] = _mm512_or_si512(_mm512_and_si512(b, m15), hi01);
            p.q23[h] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), m15), hi23);
            let g = 8 * h as i16;
            p.s01[h] = _mm512_permutexvar_epi16(group(g), sc512);
            p.s23[h] = _mm512_permutexvar_epi16(group(g + 4), sc512);
        }
        p
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(p: &Q6KPrep, y: &BlockQ8K, bsums: __m256i, acc: __m256) -> __m256 {
        // 32 * (bsum[2l] * sc[2l] + bsum[2l+1] * sc[2l+1]): the -32 offset of every value.
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, p.sc16), 5);
        let mut sumi = _mm512_setzero_si512();
        for h in 0..2 {
            // SAFETY: in bounds for h < 2 (qs: 256 bytes).
            let (a01, a23) = unsafe {
                (
                    _mm512_loadu_si512(y.qs.as_ptr().add(128 * h).cast()),
                    _mm512_loadu_si512(y.qs.as_ptr().add(128 * h + 64).cast()),
                )
            };
            // q < 64: byte pairs fit in i16 (2 * 63 * 128 < 2^15).
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(p.q01[h], a01), p.s01[h]);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(p.q23[h], a23), p.s23[h]);
        }
        let sumi = _mm256_sub_epi32(fold(sumi), offset);
        _mm256_fmadd_ps(_mm256_set1_ps(y.d * p.d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum(acc)
    }
}

/// Bytes `lo` in the low 256 bits of a register and `hi` in the high 256.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn halves8(lo: i8, hi: i8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi8(lo), _mm256_set1_epi8(hi))
}

/// Q5_K (`avx2::vec_dot_q5_k_q8_k`): [`Q4KPrep`] with 5-bit values (each four-product sum of
/// `vpdpbusd` has |sum| <= 4 * 31 * 128, so it fits the i16 that `vpdpwssd` scales); the min
/// term's exact total fused into one running float per (row, token).
struct Q5K;
impl KTile for Q5K {
    type W = BlockQ5K;
    type Tok = __m128i;
    type Prep = Q4KPrep;
    type Acc = (__m256, f32);
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_ps(), 0.0)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tok(y: &BlockQ8K) -> __m128i {
        q8_k_pair_sums(y)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ5K) -> Q4KPrep {
        let m4 = _mm512_set1_epi8(0x0F);
        // SAFETY: 32 readable bytes of qh.
        let qh = _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(x.qh.as_ptr().cast()) });
        let sixteen = _mm512_set1_epi8(0x10);
        let q = std::array::from_fn(|j| {
            // SAFETY: 32 readable bytes (j < 4: 32j + 32 <= 128).
            let q = _mm512_broadcast_i64x4(unsafe {
                _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast())
            });
            let q = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFFFF_0000, q, 4), m4);
            // Sub-block 2j's high bit is bit 2j of qh, 2j + 1's bit 2j + 1.
            let bits = halves8(1 << (2 * j), (1u8 << (2 * j + 1)) as i8);
            let set = _mm512_test_epi8_mask(qh, bits);
            _mm512_mask_add_epi8(q, set, q, sixteen)
        });
        let (scales, mins) = k_scales_mins(&x.scales);
        let scales32 = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(scales)));
        let scales = std::array::from_fn(|j| {
            let j = j as i32;
            let pick =
                _mm512_inserti64x4::<1>(_mm512_set1_epi32(2 * j), _mm256_set1_epi32(2 * j + 1));
            _mm512_permutexvar_epi32(pick, scales32)
        });
        Q4KPrep {
            q,
            scales,
            mins: _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(mins))),
            d: f32_of(x.d),
            dmin: f32_of(x.dmin),
        }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(p: &Q4KPrep, y: &BlockQ8K, tok: __m128i, (acc, mins): Self::Acc) -> Self::Acc {
        let (sumi, prod) = q4_k_lanes(p, y, tok);
        let total = hsum_i32(_mm256_set_m128i(_mm_setzero_si128(), prod));
        let mins = (-y.d * p.dmin).mul_add(total as f32, mins);
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(p.d * y.d), _mm256_cvtepi32_ps(sumi), acc);
        (acc, mins)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn finish((acc, mins): Self::Acc) -> f32 {
        hsum(acc) + mins
    }
}

/// A Q2_K super-block unpacked for `vpdpbusd`: pair `m` of 32-value chunks (`2m`, `2m + 1`,
/// which pair with the token's bytes `64m..64m + 64`) as 2-bit values, each i32 lane's group
/// scale (lane `k` of pair `m`: group `4m + k / 4`), the sixteen mins as i16, `[d, dmin]`.
struct Q2KPrep {
    q: [__m512i; 4],
    scales: [__m512i; 4],
    mins: __m256i,
    dd: __m128,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn q2_k_prep(x: &BlockQ2K) -> Q2KPrep {
    let m3 = _mm512_set1_epi8(3);
    // SAFETY: 16 readable bytes of scales.
    let sc = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
    let low = _mm512_cvtepu8_epi32(_mm_and_si128(sc, _mm_set1_epi8(0x0F)));
    let q = std::array::from_fn(|m| {
        // Chunk 4h + s is bits 2s..2s + 2 of bytes 32h..32h + 32.
        let (h, s) = (m / 2, 2 * (m % 2) as i64);
        // SAFETY: 32 readable bytes (32h + 32 <= 64).
        let q2 =
            _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * h).cast()) });
        let shift = _mm512_inserti64x4::<1>(
            _mm512_set1_epi16(2 * s as i16),
            _mm256_set1_epi16(2 * s as i16 + 2),
        );
        _mm512_and_si512(_mm512_srlv_epi16(q2, shift), m3)
    });
    let scales = std::array::from_fn(|m| {
        let m = m as i32;
        let pick = _mm512_set_epi32(
            4 * m + 3,
            4 * m + 3,
            4 * m + 3,
            4 * m + 3,
            4 * m + 2,
            4 * m + 2,
            4 * m + 2,
            4 * m + 2,
            4 * m + 1,
            4 * m + 1,
            4 * m + 1,
            4 * m + 1,
            4 * m,
            4 * m,
            4 * m,
            4 * m,
        );
        _mm512_permutexvar_epi32(pick, low)
    });
    // d and dmin lie at the block's end: converted one by one.
    let dd = _mm_set_ps(0.0, 0.0, f32_of(x.dmin), f32_of(x.d));
    Q2KPrep {
        q,
        scales,
        mins: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F))),
        dd,
    }
}

/// The exact lanes of `avx2::q2_k_lanes` and `avx2::q2_k_min_lanes` (`bsums`: the token's).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
fn q2_k_lanes(p: &Q2KPrep, y: &BlockQ8K, bsums: __m256i) -> (__m256i, __m256i) {
    let zero = _mm512_setzero_si512();
    // SAFETY: 64 readable bytes each (64m + 64 <= 256).
    let a: [__m512i; 4] =
        std::array::from_fn(|m| unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * m).cast()) });
    // |four-product sum| <= 4 * 3 * 128 fits the i16 `vpdpwssd` scales.
    let dot = |m: usize| _mm512_dpbusd_epi32(zero, p.q[m], a[m]);
    let even = _mm512_dpwssd_epi32(
        _mm512_dpwssd_epi32(zero, dot(0), p.scales[0]),
        dot(2),
        p.scales[2],
    );
    let odd = _mm512_dpwssd_epi32(
        _mm512_dpwssd_epi32(zero, dot(1), p.scales[1]),
        dot(3),
        p.scales[3],
    );
    (
        fold(_mm512_add_epi32(even, odd)),
        _mm256_madd_epi16(p.mins, bsums),
    )
}

/// Q2_K in `vec_dot` order (`avx2::vec_dot_q2_k_q8_k`).
struct Q2K;
impl KTile for Q2K {
    type W = BlockQ2K;
    type Tok = __m256i;
    type Prep = Q2KPrep;
    type Acc = __m256;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tok(y: &BlockQ8K) -> __m256i {
        // SAFETY: 32 readable bytes (bsums has 16 i16).
        unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ2K) -> Q2KPrep {
        q2_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(p: &Q2KPrep, y: &BlockQ8K, bsums: __m256i, acc: __m256) -> __m256 {
        let (sumi, mins) = q2_k_lanes(p, y, bsums);
        let (d, dmin) = (_mm_cvtss_f32(p.dd), _mm_cvtss_f32(_mm_movehdup_ps(p.dd)));
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(-y.d * dmin), _mm256_cvtepi32_ps(mins), acc);
        _mm256_fmadd_ps(_mm256_set1_ps(y.d * d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum(acc)
    }
}

/// Q2_K in llama.cpp's repacked order (`avx2::vec_dot_q2_k_q8_k_rows8`): the main and min
/// terms' exact totals in lanes 0 and 1 of one vector, each lane fused by its own scale
/// (`d_x * d_y`, `dmin_x * d_y`) into its running float; `main - mins` at the end.
struct Q2KRows8;
impl KTile for Q2KRows8 {
    type W = BlockQ2K;
    type Tok = __m256i;
    type Prep = Q2KPrep;
    type Acc = __m128;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn zero() -> __m128 {
        _mm_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tok(y: &BlockQ8K) -> __m256i {
        // SAFETY: 32 readable bytes (bsums has 16 i16).
        unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(x: &BlockQ2K) -> Q2KPrep {
        q2_k_prep(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(p: &Q2KPrep, y: &BlockQ8K, bsums: __m256i, acc: __m128) -> __m128 {
        let (sumi, mins) = q2_k_lanes(p, y, bsums);
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(sumi),
            _mm256_extracti128_si256::<1>(sumi),
        );
        let m = _mm_add_epi32(
            _mm256_castsi256_si128(mins),
            _mm256_extracti128_si256::<1>(mins),
        );
        let h = _mm_hadd_epi32(s, m);
        let totals = _mm_hadd_epi32(h, h);
        _mm_fmadd_ps(
            _mm_cvtepi32_ps(totals),
            _mm_mul_ps(p.dd, _mm_set1_ps(y.d)),
            acc,
        )
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn finish(acc: __m128) -> f32 {
        _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc))
    }
}

/// Signed weight bytes against a token's bytes through `vpmaddubsw`: the weights' absolute
/// values, and the mask of the negative ones (whose token bytes are negated), as `vpsignb`
/// does in the AVX2 kernels (a zero weight contributes zero either way).
#[derive(Clone, Copy)]
struct SignedBytes {
    abs: __m512i,
    neg: __mmask64,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn signed_bytes(q: __m512i) -> SignedBytes {
    SignedBytes {
        abs: _mm512_abs_epi8(q),
        neg: _mm512_movepi8_mask(q),
    }
}

/// Pair sums of `q * a` as i16 (each |pair| <= 2 * 127 * 127 for the formats here).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn signed_pairs(q: SignedBytes, a: __m512i) -> __m512i {
    let a = _mm512_mask_sub_epi8(a, q.neg, _mm512_setzero_si512(), a);
    _mm512_maddubs_epi16(q.abs, a)
}

/// Super-blocks of signed values with one scale per group of 16 (Q3_K) or 32 (IQ4_XS): chunk
/// pair `m` (values `64m..64m + 64`) and its scales as i16 (element `e` scales the pair of
/// bytes `2e, 2e + 1`), and `d`.
struct SignedKPrep {
    q: [SignedBytes; 4],
    scales: [__m512i; 4],
    d: f32,
}

/// The eight exact lanes (each: the four products of bytes `4l..4l + 4` of every 32-value
/// chunk, times their scale) of a [`SignedKPrep`] block and a token.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
fn signed_k_lanes(p: &SignedKPrep, y: &BlockQ8K) -> __m256i {
    let zero = _mm512_setzero_si512();
    // SAFETY: 64 readable bytes each (64m + 64 <= 256).
    let a: [__m512i; 4] =
        std::array::from_fn(|m| unsafe { _mm512_loadu_si512(y.qs.as_ptr().add(64 * m).cast()) });
    let pairs = |m: usize| signed_pairs(p.q[m], a[m]);
    let even = _mm512_dpwssd_epi32(
        _mm512_dpwssd_epi32(zero, pairs(0), p.scales[0]),
        pairs(2),
        p.scales[2],
    );
    let odd = _mm512_dpwssd_epi32(
        _mm512_dpwssd_epi32(zero, pairs(1), p.scales[1]),
        pairs(3),
        p.scales[3],
    );
    fold(_mm512_add_epi32(even, odd))
}

/// `scales16` (sixteen i16 in the low 256 bits) spread so that element `e` of the result is
/// `scales16[first + e / per]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn spread16(scales16: __m512i, first: i16, per: usize) -> __m512i {
    let idx: [i16; 32] = std::array::from_fn(|e| first + (e / per) as i16);
    // SAFETY: 64 readable bytes.
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
    _mm512_permutexvar_epi16(idx, scales16)
}

macro_rules! signed_k_tile {
    ($name:ident: $block:ty, |$x:ident| $prep:expr) => {
        struct $name;
        impl KTile for $name {
            type W = $block;
            type Tok = ();
            type Prep = SignedKPrep;
            type Acc = __m256;
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn zero() -> __m256 {
                _mm256_setzero_ps()
            }
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn tok(_: &BlockQ8K) {}
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn prep($x: &$block) -> SignedKPrep {
                $prep
            }
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn step(p: &SignedKPrep, y: &BlockQ8K, _: (), acc: __m256) -> __m256 {
                let sumi = signed_k_lanes(p, y);
                _mm256_fmadd_ps(_mm256_set1_ps(y.d * p.d), _mm256_cvtepi32_ps(sumi), acc)
            }
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn finish(acc: __m256) -> f32 {
                hsum(acc)
            }
        }
    };
}

signed_k_tile!(Q3K: BlockQ3K, |x| q3_k_prep(x));
signed_k_tile!(IQ4XS: BlockIQ4XS, |x| iq4_xs_prep(x));

/// Q3_K (`avx2::vec_dot_q3_k_q8_k`): values -4..=3 (chunk `4h + s`: bits 2s..2s + 2 of bytes
/// 32h..32h + 32, less 4 where bit `4h + s` of hmask is clear), scale `q3k_scale - 32` per 16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn q3_k_prep(x: &BlockQ3K) -> SignedKPrep {
    let m3 = _mm512_set1_epi8(3);
    let four = _mm512_set1_epi8(4);
    // SAFETY: 32 readable bytes of hmask.
    let hm = _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(x.hmask.as_ptr().cast()) });
    let q = std::array::from_fn(|m| {
        let (h, s) = (m / 2, 2 * (m % 2) as i16);
        // SAFETY: 32 readable bytes (32h + 32 <= 64).
        let q2 =
            _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * h).cast()) });
        let shift = _mm512_inserti64x4::<1>(_mm512_set1_epi16(2 * s), _mm256_set1_epi16(2 * s + 2));
        let low = _mm512_and_si512(_mm512_srlv_epi16(q2, shift), m3);
        let bits = halves8((1u8 << (2 * m)) as i8, (1u8 << (2 * m + 1)) as i8);
        let clear = _mm512_testn_epi8_mask(hm, bits);
        signed_bytes(_mm512_mask_sub_epi8(low, clear, low, four))
    });
    let sc: [i16; 16] = q3k_scales(&x.scales).map(|s| s as i16 - 32);
    // SAFETY: 32 readable bytes.
    let sc16 = _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(sc.as_ptr().cast()) });
    SignedKPrep {
        q,
        scales: std::array::from_fn(|m| spread16(sc16, 4 * m as i16, 8)),
        d: f32_of(x.d),
    }
}

/// IQ4_XS (`avx2::vec_dot_iq4_xs_q8_k`): the table values of sub-block `j` (low nibbles of
/// bytes `16j..16j + 16`, then their high nibbles), scale `ls - 32` per 32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn iq4_xs_prep(x: &BlockIQ4XS) -> SignedKPrep {
    // SAFETY: 16 readable bytes.
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) });
    let m4 = _mm512_set1_epi8(0x0F);
    let q = std::array::from_fn(|m| {
        // SAFETY: 32 readable bytes (32m + 32 <= 128).
        let b =
            _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * m).cast()) });
        // 128-bit lanes [A, A, B, B] of the 32 bytes [A, B], then the high nibbles in 1 and 3.
        let b = _mm512_shuffle_i64x2::<0b01_01_00_00>(b, b);
        let n = _mm512_and_si512(_mm512_mask_srli_epi16(b, 0xFF00_FF00, b, 4), m4);
        signed_bytes(_mm512_shuffle_epi8(table, n))
    });
    let ls: [i16; 16] = std::array::from_fn(|j| {
        if j < 8 {
            iq4xs_scale(x, j) as i16 - 32
        } else {
            0
        }
    });
    // SAFETY: 32 readable bytes.
    let ls16 = _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(ls.as_ptr().cast()) });
    SignedKPrep {
        q,
        scales: std::array::from_fn(|m| spread16(ls16, 2 * m as i16, 16)),
        d: f32_of(x.d),
    }
}

tiled_entry! {
    /// Tiled Q5_K (see [`crate::GemmFn`]): one row by eight tokens, whose min terms run as the
    /// lanes of one vector ([`q5_k_row_by_8`]), then [`gemm`]'s tiles for the tokens left over.
    q5_k: BlockQ5K => gemm_q5_k
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_q5_k(w: &[BlockQ5K], a: &[BlockQ8K], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let groups = n_tok / 8;
    // SAFETY: the caller's CPU has what `Cpu::avx512_vnni` checks; the slices stay in bounds.
    unsafe {
        if groups > 0 {
            let toks = Q8KTokens::new(a, per_row, n_tok);
            for g in 0..groups {
                for r0 in 0..rows {
                    q5_k_row_by_8(&w[r0 * per_row..][..per_row], a, &toks, (r0, 8 * g), out);
                }
            }
        }
        let t0 = 8 * groups;
        if t0 < n_tok {
            gemm::<Q5K>(w, &a[t0 * per_row..], per_row, &mut out[t0 * rows..]);
        }
    }
}

/// One row (`x`, row `r0`) times tokens `t0..t0 + 8` of [`Q5K`]: each token's eight main
/// lanes in its own float vector as the row kernel runs them, and the eight tokens' min-term
/// floats as the lanes of one vector, each lane taking exactly the row kernel's fused
/// multiply-add (`-d_y * dmin_x` times the exact total); `hsum(main) + mins` at the end.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_k_row_by_8(
    x: &[BlockQ5K],
    a: &[BlockQ8K],
    toks: &Q8KTokens,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    let per_row = x.len();
    let rows = out.len() / toks.n_tok;
    let ys: [&[BlockQ8K]; 8] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    // Token k's lanes at 4k and 4k + 1 of the mins' reduction, moved to lane k.
    let gather = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    let mut main = [_mm256_setzero_ps(); 8];
    let mut mins = _mm256_setzero_ps();
    let zero = _mm_setzero_si128();
    for (b, x) in x.iter().enumerate() {
        let at = b * toks.n_tok + t0;
        // SAFETY: the CPU has what `Cpu::avx512_vnni` checks.
        let p = unsafe { Q5K::prep(x) };
        for (t, main) in main.iter_mut().enumerate() {
            let y = &ys[t][b];
            let (sumi, _) = q4_k_lanes(&p, y, zero);
            *main = _mm256_fmadd_ps(_mm256_set1_ps(p.d * y.d), _mm256_cvtepi32_ps(sumi), *main);
        }
        // SAFETY: `at + 8 <= per_row * n_tok` entries of each (t0 + 8 <= n_tok).
        let (yd, ps_lo, ps_hi) = unsafe {
            (
                _mm256_loadu_ps(toks.d.as_ptr().add(at)),
                _mm512_loadu_si512(toks.pair_sums.as_ptr().add(at).cast()),
                _mm512_loadu_si512(toks.pair_sums.as_ptr().add(at + 4).cast()),
            )
        };
        // Per 128-bit lane k: token k's (ps_lo) and k + 4's (ps_hi) four products of pairs.
        let m = _mm512_broadcast_i32x4(p.mins);
        let (lo, hi) = (_mm512_madd_epi16(ps_lo, m), _mm512_madd_epi16(ps_hi, m));
        let u = _mm512_add_epi32(_mm512_unpacklo_epi32(lo, hi), _mm512_unpackhi_epi32(lo, hi));
        let u = _mm512_add_epi32(u, _mm512_shuffle_epi32::<0b01_00_11_10>(u));
        let total = _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, u));
        // -d_y * dmin_x, lane by lane (negation and the product commute exactly).
        let dmin = _mm256_mul_ps(yd, _mm256_set1_ps(-p.dmin));
        mins = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(total), mins);
    }
    let mut m = [0.0f32; 8];
    // SAFETY: 8 writable floats.
    unsafe { _mm256_storeu_ps(m.as_mut_ptr(), mins) };
    for (t, (main, m)) in main.iter().zip(m).enumerate() {
        out[(t0 + t) * rows + r0] = hsum(*main) + m;
    }
}

tiled_entry! {
    /// Tiled Q2_K in llama.cpp's repacked order (see [`crate::GemmFn`]): one row by eight tokens
    /// ([`q2_k_rows8_row_by_8`]), then [`gemm`]'s tiles for the tokens left over.
    q2_k_rows8: BlockQ2K => gemm_q2_k_rows8
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_q2_k_rows8(w: &[BlockQ2K], a: &[BlockQ8K], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let groups = n_tok / 8;
    // SAFETY: the caller's CPU has what `Cpu::avx512_vnni` checks; the slices stay in bounds.
    unsafe {
        if groups > 0 {
            let toks = Q8KTokens::new(a, per_row, n_tok);
            for g in 0..groups {
                for r0 in 0..rows {
                    let x = &w[r0 * per_row..][..per_row];
                    q2_k_rows8_row_by_8(x, a, &toks, (r0, 8 * g), out);
                }
            }
        }
        let t0 = 8 * groups;
        if t0 < n_tok {
            gemm::<Q2KRows8>(w, &a[t0 * per_row..], per_row, &mut out[t0 * rows..]);
        }
    }
}

/// One row (`x`, row `r0`) times tokens `t0..t0 + 8` of [`Q2KRows8`]: lane `t` of two float
/// vectors runs token `t0 + t`'s two floats, the eight tokens' exact main and min totals
/// reduced together, each lane fused by its own `d_x * d_y` (`dmin_x * d_y`) as the row kernel
/// does; `main - mins` at the end.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_k_rows8_row_by_8(
    x: &[BlockQ2K],
    a: &[BlockQ8K],
    toks: &Q8KTokens,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    use crate::x86::avx512::nl::reduce8 as reduce8_256;
    let per_row = x.len();
    let rows = out.len() / toks.n_tok;
    let ys: [&[BlockQ8K]; 8] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    let (mut main, mut mins) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (b, x) in x.iter().enumerate() {
        let p = q2_k_prep(x);
        let mut sums = [_mm256_setzero_si256(); 8];
        let mut msums = [_mm256_setzero_si256(); 8];
        for t in 0..8 {
            let y = &ys[t][b];
            // SAFETY: 32 readable bytes (bsums has 16 i16).
            let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) };
            (sums[t], msums[t]) = q2_k_lanes(&p, y, bsums);
        }
        // SAFETY: `b * n_tok + t0 + 8 <= per_row * n_tok` (t0 + 8 <= n_tok).
        let yd = unsafe { _mm256_loadu_ps(toks.d.as_ptr().add(b * toks.n_tok + t0)) };
        let (d, dmin) = (_mm_cvtss_f32(p.dd), _mm_cvtss_f32(_mm_movehdup_ps(p.dd)));
        let dd = _mm256_mul_ps(_mm256_set1_ps(d), yd);
        let ddmin = _mm256_mul_ps(_mm256_set1_ps(dmin), yd);
        main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_256(sums)), dd, main);
        mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_256(msums)), ddmin, mins);
    }
    let mut res = [0.0f32; 8];
    // SAFETY: 8 writable floats.
    unsafe { _mm256_storeu_ps(res.as_mut_ptr(), _mm256_sub_ps(main, mins)) };
    for (t, v) in res.into_iter().enumerate() {
        out[(t0 + t) * rows + r0] = v;
    }
}

//! AVX-512 VNNI products of IQ4_NL weights in llama.cpp's repacked order
//! (`reference::dot::vec_dot_iq4_nl_q8_0_rows8`), where every block's exact integer sum is
//! fused by `d_x * d_y` into one running float per (row, token).
//!
//! `vpdpbusd` takes unsigned bytes times signed bytes, so a weight's table value `v` (signed)
//! goes in as `v + 128` and the token's block sum times 128 comes off the exact total:
//! `Σ v a = Σ (v + 128) a - 128 Σ a`, all in i32 without overflow. Eight (row, token) pairs'
//! lanes are reduced together ([`reduce8`]) and their eight running floats are the lanes of one
//! vector: each lane takes exactly the scalar kernel's operations (the block's exact total
//! converted, one fused multiply-add by `d_x * d_y`). For prefill a row meets eight tokens at a
//! time (the token-side work, `d_y` and the block sums, gathered once per product); for decode
//! eight rows meet the token, their weights asked for ahead of the kernel.

use std::arch::x86_64::*;

use super::avx2::{f32_of, load32};
use crate::blocks::*;
use crate::codec::{gemm_operands, prefetch_ahead};
use crate::QuantError;

/// Tiled IQ4_NL in llama.cpp's repacked order (see [`crate::GemmFn`]).
pub fn iq4_nl_rows8(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (x, y, per_row) = gemm_operands::<BlockIQ4NL>(w, row_bytes, a, n_tok, out)?;
    // SAFETY: `gemm_kernel` hands this entry out only after `avx512_tile::available` found
    // every feature these functions need; the operands' sizes agree (checked above).
    unsafe { gemm(x, y, per_row, out) };
    Ok(())
}

/// Per (block, token) of a batch: the token's `d` and 128 times its block sum, at
/// `[b * n_tok + t]`.
struct Tokens {
    n_tok: usize,
    d: Vec<f32>,
    s128: Vec<i32>,
}

impl Tokens {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
    fn new(a: &[BlockQ8_0], per_row: usize, n_tok: usize) -> Tokens {
        let mut d = vec![0.0f32; per_row * n_tok];
        let mut s128 = vec![0i32; per_row * n_tok];
        for (t, y) in a.chunks_exact(per_row).enumerate() {
            for (b, y) in y.iter().enumerate() {
                d[b * n_tok + t] = f32_of(y.d);
                s128[b * n_tok + t] = 128 * y.qs.iter().map(|&q| q as i32).sum::<i32>();
            }
        }
        Tokens { n_tok, d, s128 }
    }
}

/// The block's table values plus 128 (unsigned), values 0..16 in the low half, 16..32 in the
/// high; `table` holds the table plus 128 in both 128-bit halves.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn unsigned_values(x: &BlockIQ4NL, table: __m256i) -> __m256i {
    // SAFETY: 16 readable bytes.
    let q = unsafe { _mm_loadu_si128(x.qs.as_ptr().cast()) };
    let q = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_shuffle_epi8(table, _mm256_and_si256(q, _mm256_set1_epi8(0x0F)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn table128() -> __m256i {
    // SAFETY: 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
    // v + 128 (mod 256) is v with its top bit flipped.
    _mm256_broadcastsi128_si256(_mm_xor_si128(t, _mm_set1_epi8(-128)))
}

/// Lane `i` is the (exact) sum of the eight lanes of `v[i]`.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8(v: [__m256i; 8]) -> __m256i {
    // Per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
    let pair = |a, b| _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    let t: [__m256i; 4] = std::array::from_fn(|k| pair(v[2 * k], v[2 * k + 1]));
    // Per 128-bit lane: each of four vectors' share.
    let quad = |c, d| _mm256_add_epi32(_mm256_unpacklo_epi64(c, d), _mm256_unpackhi_epi64(c, d));
    let (u0, u1) = (quad(t[0], t[1]), quad(t[2], t[3]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

/// Every row of `w` times every token of `a`: one row by eight tokens, then eight rows a token
/// (and the last rows one by one) for the tokens left over and for decode.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm(w: &[BlockIQ4NL], a: &[BlockQ8_0], per_row: usize, out: &mut [f32]) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let row_bytes = per_row * size_of::<BlockIQ4NL>();
    let mut t0 = 0;
    // SAFETY: the caller's CPU has every feature these functions need.
    unsafe {
        if n_tok >= 8 {
            let toks = Tokens::new(a, per_row, n_tok);
            while n_tok - t0 >= 8 {
                for r0 in 0..rows {
                    row_by_8(&w[r0 * per_row..][..per_row], a, &toks, (r0, t0), out);
                }
                t0 += 8;
            }
        }
        for t in t0..n_tok {
            let y = &a[t * per_row..][..per_row];
            let toks = Tokens::new(y, per_row, 1);
            let o = &mut out[t * rows..][..rows];
            let mut r0 = 0;
            while rows - r0 >= 8 {
                prefetch_ahead(bytes, r0 * row_bytes..(r0 + 8) * row_bytes);
                let xs = std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row]);
                rows8_by_1(xs, y, &toks, &mut o[r0..r0 + 8]);
                r0 += 8;
            }
            for r in r0..rows {
                o[r] = super::avx2::vec_dot_iq4_nl_q8_0_rows8(&w[r * per_row..][..per_row], y);
            }
        }
    }
}

/// One row (`x`, row `r0`) times tokens `t0..t0 + 8`: lane `t` runs token `t0 + t`'s float.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_by_8(
    x: &[BlockIQ4NL],
    a: &[BlockQ8_0],
    toks: &Tokens,
    (r0, t0): (usize, usize),
    out: &mut [f32],
) {
    let per_row = x.len();
    let rows = out.len() / toks.n_tok;
    let ys: [&[BlockQ8_0]; 8] = std::array::from_fn(|t| &a[(t0 + t) * per_row..][..per_row]);
    let table = table128();
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    for (b, x) in x.iter().enumerate() {
        let u = unsigned_values(x, table);
        let v: [__m256i; 8] =
            std::array::from_fn(|t| _mm256_dpbusd_epi32(zero, u, load32(&ys[t][b].qs)));
        let at = b * toks.n_tok + t0;
        // SAFETY: `at + 8 <= per_row * n_tok` entries of each (t0 + 8 <= n_tok).
        let (yd, s128) = unsafe {
            (
                _mm256_loadu_ps(toks.d.as_ptr().add(at)),
                _mm256_loadu_si256(toks.s128.as_ptr().add(at).cast()),
            )
        };
        let total = _mm256_sub_epi32(reduce8(v), s128);
        let d = _mm256_mul_ps(_mm256_set1_ps(f32_of(x.d)), yd);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), d, acc);
    }
    let mut res = [0.0f32; 8];
    // SAFETY: 8 writable floats.
    unsafe { _mm256_storeu_ps(res.as_mut_ptr(), acc) };
    for (t, v) in res.into_iter().enumerate() {
        out[(t0 + t) * rows + r0] = v;
    }
}

/// Eight rows times one token (`toks` its own, `n_tok == 1`): lane `r` runs row `r`'s float.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows8_by_1(xs: [&[BlockIQ4NL]; 8], y: &[BlockQ8_0], toks: &Tokens, out: &mut [f32]) {
    let table = table128();
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    for (b, y) in y.iter().enumerate() {
        let a = load32(&y.qs);
        let v: [__m256i; 8] = std::array::from_fn(|r| {
            _mm256_dpbusd_epi32(zero, unsigned_values(&xs[r][b], table), a)
        });
        let total = _mm256_sub_epi32(reduce8(v), _mm256_set1_epi32(toks.s128[b]));
        let dx: [u16; 8] = std::array::from_fn(|r| xs[r][b].d.to_bits());
        // SAFETY: 16 readable bytes.
        let dx = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(dx.as_ptr().cast()) });
        let d = _mm256_mul_ps(dx, _mm256_set1_ps(toks.d[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), d, acc);
    }
    // SAFETY: `out` has 8 writable floats (the caller's slice).
    unsafe { _mm256_storeu_ps(out[..8].as_mut_ptr(), acc) };
}

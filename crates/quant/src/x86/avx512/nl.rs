//! AVX-512 VNNI products of IQ4_NL, Q4_0 and MXFP4 weights in llama.cpp's repacked order
//! (`reference::dot::vec_dot_iq4_nl_q8_0_rows8`, `vec_dot_q4_0_q8_0_rows8`,
//! `vec_dot_mxfp4_q8_0_rows8`), where every block's exact integer sum is fused by `d_x * d_y`
//! into one running float per (row, token). The three formats share a block's shape (a scale,
//! then 16 bytes of nibbles: values 0..16 low, 16..32 high, [`TableBlock`]) and differ in the
//! value a nibble stands for, a table lookup ([`Values`]), and in the scale: an F16 `d` for
//! IQ4_NL and Q4_0 (whose blocks go through as IQ4_NL blocks with Q4_0's table), an E8M0
//! exponent for MXFP4.
//!
//! `vpdpbusd` takes unsigned bytes times signed bytes, so a weight's table value `v` (signed)
//! goes in as `v + 128` and the token's block sum times 128 comes off the exact total:
//! `Σ v a = Σ (v + 128) a - 128 Σ a`, all in i32 without overflow. The running floats of
//! several (row, token) pairs are the lanes of one vector, and each lane takes exactly the
//! scalar kernel's operations (the block's exact total converted, one fused multiply-add by
//! `d_x * d_y`). For prefill, four rows meet sixteen
//! tokens at a time, the tokens' bytes laid side by side once per product ([`Group16`]) so
//! that the sixteen totals need no reduction; for the tokens left over and for decode, eight
//! rows meet the token (their lanes reduced together, [`reduce8`]), their weights asked for
//! ahead of the kernel.

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::codec::{gemm_operands, prefetch_ahead};
use crate::x86::avx2::{f32_of, load32};
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
    // SAFETY: the kernel table hands this entry out only for `Isa::Avx512Vnni`, every
    // feature these functions need; the operands' sizes agree (checked above).
    unsafe { gemm(x, y, per_row, out, Values::Iq4Nl) };
    Ok(())
}

/// Tiled Q4_0 in llama.cpp's repacked order (see [`crate::GemmFn`]).
pub fn q4_0_rows8(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (x, y, per_row) = gemm_operands::<BlockQ4_0>(w, row_bytes, a, n_tok, out)?;
    // The same 18 bytes (size and layout asserted in `blocks`); only the nibbles' values
    // differ, which `Values::Q4_0` supplies.
    let x: &[BlockIQ4NL] = bytemuck::cast_slice(x);
    // SAFETY: as in `iq4_nl_rows8`.
    unsafe { gemm(x, y, per_row, out, Values::Q4_0) };
    Ok(())
}

/// Tiled MXFP4 in llama.cpp's repacked order (see [`crate::GemmFn`]).
pub fn mxfp4_rows8(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let (x, y, per_row) = gemm_operands::<BlockMXFP4>(w, row_bytes, a, n_tok, out)?;
    // SAFETY: as in `iq4_nl_rows8`.
    unsafe { gemm(x, y, per_row, out, Values::Mxfp4) };
    Ok(())
}

/// What a nibble stands for: IQ4_NL's table, Q4_0's `q - 8`, or MXFP4's levels.
#[derive(Clone, Copy)]
enum Values {
    Iq4Nl,
    Q4_0,
    Mxfp4,
}

const Q4_0_VALUES: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

impl Values {
    fn table(self) -> &'static [i8; 16] {
        match self {
            Values::Iq4Nl => &KVALUES_IQ4NL,
            Values::Q4_0 => &Q4_0_VALUES,
            Values::Mxfp4 => &KVALUES_MXFP4,
        }
    }
}

/// A block of 32 nibbles with one scale: what [`gemm`] reads.
trait TableBlock: bytemuck::Pod {
    fn qs(&self) -> &[u8; 16];
    /// Its scale, as f32.
    fn scale(&self) -> f32;
    /// Block `b` of each of eight rows: their scales.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    unsafe fn scales8(xs: &[&[Self]; 8], b: usize) -> __m256;
    /// The single-row AVX2 kernel of the format, for the rows left over.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    unsafe fn row(x: &[Self], y: &[BlockQ8_0], values: Values) -> f32;
}

impl TableBlock for BlockIQ4NL {
    #[inline(always)]
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    #[inline(always)]
    fn scale(&self) -> f32 {
        f32_of(self.d)
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn scales8(xs: &[&[Self]; 8], b: usize) -> __m256 {
        let dx: [u16; 8] = std::array::from_fn(|r| xs[r][b].d.to_bits());
        // SAFETY: 16 readable bytes.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(dx.as_ptr().cast()) })
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row(x: &[Self], y: &[BlockQ8_0], values: Values) -> f32 {
        match values {
            Values::Q4_0 => crate::x86::avx2::vec_dot_q4_0_q8_0_rows8(bytemuck::cast_slice(x), y),
            _ => crate::x86::avx2::vec_dot_iq4_nl_q8_0_rows8(x, y),
        }
    }
}

impl TableBlock for BlockMXFP4 {
    #[inline(always)]
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    #[inline(always)]
    fn scale(&self) -> f32 {
        e8m0_half(self.e)
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn scales8(xs: &[&[Self]; 8], b: usize) -> __m256 {
        let d: [f32; 8] = std::array::from_fn(|r| e8m0_half(xs[r][b].e));
        // SAFETY: 32 readable bytes.
        unsafe { _mm256_loadu_ps(d.as_ptr()) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row(x: &[Self], y: &[BlockQ8_0], _: Values) -> f32 {
        crate::x86::avx2::vec_dot_mxfp4_q8_0_rows8(x, y)
    }
}

/// One token's per-block `d` and 128 times its block sum.
struct Tokens {
    d: Vec<f32>,
    s128: Vec<i32>,
}

impl Tokens {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
    fn new(y: &[BlockQ8_0]) -> Tokens {
        Tokens {
            d: y.iter().map(|y| f32_of(y.d)).collect(),
            s128: y
                .iter()
                .map(|y| 128 * y.qs.iter().map(|&q| q as i32).sum::<i32>())
                .collect(),
        }
    }
}

/// The block's table values plus 128 (unsigned), values 0..16 in the low half, 16..32 in the
/// high; `table` holds the table plus 128 in both 128-bit halves.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn unsigned_values<B: TableBlock>(x: &B, table: __m256i) -> __m256i {
    // SAFETY: 16 readable bytes.
    let q = unsafe { _mm_loadu_si128(x.qs().as_ptr().cast()) };
    let q = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_shuffle_epi8(table, _mm256_and_si256(q, _mm256_set1_epi8(0x0F)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn table128(values: Values) -> __m256i {
    // SAFETY: 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(values.table().as_ptr().cast()) };
    // v + 128 (mod 256) is v with its top bit flipped.
    _mm256_broadcastsi128_si256(_mm_xor_si128(t, _mm_set1_epi8(-128)))
}

/// Lane `i` is the (exact) sum of the eight lanes of `v[i]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn reduce8(v: [__m256i; 8]) -> __m256i {
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

/// Sixteen tokens side by side, per block: dword `k` (bytes `4k..4k + 4`) of every token's
/// block in one 64-byte vector (`qs[(g * per_row + b) * 8 + k]`, lane `t`: token `16g + t`),
/// so that one `vpdpbusd` against a broadcast dword of the weights adds its four products to
/// sixteen (row, token) totals at once; and each token's `d` and 128 x its block sum.
struct Group16 {
    qs: Vec<[i32; 16]>,
    d: Vec<[f32; 16]>,
    s128: Vec<[i32; 16]>,
}

impl Group16 {
    fn new(a: &[BlockQ8_0], per_row: usize, groups: usize) -> Group16 {
        let mut g16 = Group16 {
            qs: vec![[0; 16]; groups * per_row * 8],
            d: vec![[0.0; 16]; groups * per_row],
            s128: vec![[0; 16]; groups * per_row],
        };
        for g in 0..groups {
            for t in 0..16 {
                let y = &a[(16 * g + t) * per_row..][..per_row];
                for (b, y) in y.iter().enumerate() {
                    let at = g * per_row + b;
                    g16.d[at][t] = f32_of(y.d);
                    g16.s128[at][t] = 128 * y.qs.iter().map(|&q| q as i32).sum::<i32>();
                    for (k, q) in y.qs.chunks_exact(4).enumerate() {
                        g16.qs[at * 8 + k][t] =
                            i32::from_le_bytes([q[0], q[1], q[2], q[3]].map(|q| q as u8));
                    }
                }
            }
        }
        g16
    }
}

/// Every row of `w` times every token of `a`: rows four at a time by sixteen tokens, then,
/// for the tokens left over and for decode, eight rows a token (the last rows one by one).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm<B: TableBlock>(
    w: &[B],
    a: &[BlockQ8_0],
    per_row: usize,
    out: &mut [f32],
    values: Values,
) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let row_bytes = per_row * size_of::<B>();
    let groups = n_tok / 16;
    // SAFETY: the caller's CPU has every feature these functions need.
    unsafe {
        if groups > 0 {
            let g16 = Group16::new(a, per_row, groups);
            for g in 0..groups {
                let mut r0 = 0;
                while rows - r0 >= 4 {
                    rows_by_16::<B, 4>(w, per_row, &g16, (r0, g), out, values);
                    r0 += 4;
                }
                for r0 in r0..rows {
                    rows_by_16::<B, 1>(w, per_row, &g16, (r0, g), out, values);
                }
            }
        }
        for t in 16 * groups..n_tok {
            let y = &a[t * per_row..][..per_row];
            let toks = Tokens::new(y);
            let o = &mut out[t * rows..][..rows];
            let mut r0 = 0;
            while rows - r0 >= 8 {
                prefetch_ahead(bytes, r0 * row_bytes..(r0 + 8) * row_bytes);
                let xs = std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row]);
                rows8_by_1(xs, y, &toks, &mut o[r0..r0 + 8], values);
                r0 += 8;
            }
            for r in r0..rows {
                o[r] = B::row(&w[r * per_row..][..per_row], y, values);
            }
        }
    }
}

/// Rows `r0..r0 + R` times tokens `16g..16g + 16`: lane `t` of row `r`'s float vector runs
/// token `16g + t`'s float, each taking the block's exact total (eight `vpdpbusd`, in two
/// chains, less 128 x the token's block sum), converted, one fused multiply-add by
/// `d_x * d_y`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `b` indexes every row and the token groups
unsafe fn rows_by_16<B: TableBlock, const R: usize>(
    w: &[B],
    per_row: usize,
    g16: &Group16,
    (r0, g): (usize, usize),
    out: &mut [f32],
    values: Values,
) {
    let rows = w.len() / per_row;
    let xs: [&[B]; R] = std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row]);
    let table = table128(values);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..per_row {
        let at = g * per_row + b;
        let u: [[i32; 8]; R] = std::array::from_fn(|r| {
            let mut u = [0i32; 8];
            // SAFETY: 32 writable bytes.
            unsafe {
                _mm256_storeu_si256(u.as_mut_ptr().cast(), unsigned_values(&xs[r][b], table))
            };
            u
        });
        let mut even = [zero; R];
        let mut odd = [zero; R];
        for k in 0..4 {
            // SAFETY: entries `at * 8 + 2k (+ 1)` exist (at < groups * per_row).
            let (q0, q1) = unsafe {
                (
                    _mm512_loadu_si512(g16.qs[at * 8 + 2 * k].as_ptr().cast()),
                    _mm512_loadu_si512(g16.qs[at * 8 + 2 * k + 1].as_ptr().cast()),
                )
            };
            for r in 0..R {
                even[r] = _mm512_dpbusd_epi32(even[r], _mm512_set1_epi32(u[r][2 * k]), q0);
                odd[r] = _mm512_dpbusd_epi32(odd[r], _mm512_set1_epi32(u[r][2 * k + 1]), q1);
            }
        }
        // SAFETY: 16 readable values each.
        let (yd, s128) = unsafe {
            (
                _mm512_loadu_ps(g16.d[at].as_ptr()),
                _mm512_loadu_si512(g16.s128[at].as_ptr().cast()),
            )
        };
        for r in 0..R {
            let total = _mm512_sub_epi32(_mm512_add_epi32(even[r], odd[r]), s128);
            let d = _mm512_mul_ps(_mm512_set1_ps(xs[r][b].scale()), yd);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), d, acc[r]);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let mut res = [0.0f32; 16];
        // SAFETY: 16 writable floats.
        unsafe { _mm512_storeu_ps(res.as_mut_ptr(), *acc) };
        for (t, v) in res.into_iter().enumerate() {
            out[(16 * g + t) * rows + r0 + r] = v;
        }
    }
}

/// Eight rows times one token (`toks` its own): lane `r` runs row `r`'s float.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows8_by_1<B: TableBlock>(
    xs: [&[B]; 8],
    y: &[BlockQ8_0],
    toks: &Tokens,
    out: &mut [f32],
    values: Values,
) {
    let table = table128(values);
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    for (b, y) in y.iter().enumerate() {
        let a = load32(&y.qs);
        let v: [__m256i; 8] = std::array::from_fn(|r| {
            _mm256_dpbusd_epi32(zero, unsigned_values(&xs[r][b], table), a)
        });
        let total = _mm256_sub_epi32(reduce8(v), _mm256_set1_epi32(toks.s128[b]));
        // SAFETY: this function's features.
        let dx = unsafe { B::scales8(&xs, b) };
        let d = _mm256_mul_ps(dx, _mm256_set1_ps(toks.d[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), d, acc);
    }
    // SAFETY: `out` has 8 writable floats (the caller's slice).
    unsafe { _mm256_storeu_ps(out[..8].as_mut_ptr(), acc) };
}

//! The AVX-512 kernels of the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL).

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::packed::layout::{
    packed_format, IQ4NLPacked, MXFP4Packed, Q4_0Packed, Q4_1Packed, Q5_0Packed, Q5_1Packed,
    Q8_0Packed, ROWS,
};
use crate::x86::avx512::packed::{bcast4, hsum8, ld_f16, store_rows};
use crate::x86::packed_common::{
    token_passes, Act32, Pack32, Tok32, Unpacked32, LANES32_TILE_WEIGHTS, TOKS32,
};
use crate::x86::{prefetch_ahead, prefetch_part_as};
use crate::GgmlType;

// ---------------------------------------------------------------------------------------------
// The 32-value formats in `vec_dot` order: eight float lanes a (row, token), lane `l` taking
// values `4l..4l + 4` of every block, fused by `d_x * d_y` block by block.

/// Where [`tokens32`] reads a block of sixteen rows from: the packed block itself, or its
/// lanes unpacked once per call ([`Unpacked32`]) when several passes over the tokens share
/// them.
trait Lanes32 {
    /// # Safety
    /// AVX-512 F.
    unsafe fn lane(&self, l: usize) -> __m512i;
    fn d(&self) -> &[u16; ROWS];
    fn m(&self) -> &[u16; ROWS];
    /// Ask for the bytes as far ahead of this block as its kind wants: the packed weights
    /// from memory at their format's distances ([`Pack32::AHEAD`]).
    fn ask_ahead(&self);
}

impl<P: Pack32> Lanes32 for P {
    #[inline(always)]
    unsafe fn lane(&self, l: usize) -> __m512i {
        // SAFETY: the caller's.
        unsafe { Pack32::lane(self, l) }
    }
    #[inline(always)]
    fn ask_ahead(&self) {
        prefetch_part_as(P::AHEAD, self, 0, 1);
    }
    fn d(&self) -> &[u16; ROWS] {
        Pack32::d(self)
    }
    fn m(&self) -> &[u16; ROWS] {
        Pack32::m(self)
    }
}

impl Lanes32 for Unpacked32 {
    #[inline(always)]
    unsafe fn lane(&self, l: usize) -> __m512i {
        // SAFETY: a row of `q`; the caller's features.
        unsafe { _mm512_load_si512(self.q[l].as_ptr().cast()) }
    }
    fn d(&self) -> &[u16; ROWS] {
        &self.d
    }
    fn m(&self) -> &[u16; ROWS] {
        &self.m
    }
    #[inline(always)]
    fn ask_ahead(&self) {
        prefetch_ahead(self);
    }
}

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`, `toks[t]`), into `out[(t0 + t) *
/// stride + r0..][..16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn tokens32<P: Pack32, L: Lanes32, const T: usize>(
    g: &[L],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let mut mins = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        g.ask_ahead();
        // SAFETY: a row of `d`.
        let dx = unsafe { ld_f16(g.d()) };
        let tk: [&Tok32; T] = std::array::from_fn(|t| &toks[t][b]);
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs().as_ptr());
        let d: [__m512; T] = std::array::from_fn(|t| _mm512_mul_ps(dx, _mm512_set1_ps(tk[t].d)));
        if P::MIN {
            // SAFETY: a row of `m`.
            let mx = unsafe { ld_f16(g.m()) };
            for t in 0..T {
                mins[t] = _mm512_fmadd_ps(mx, _mm512_set1_ps(tk[t].s), mins[t]);
            }
        }
        for l in 0..8 {
            // SAFETY: this function's features.
            let w = unsafe { g.lane(l) };
            for t in 0..T {
                // SAFETY: values 4l..4l + 4 of the token's 32.
                let a = unsafe { bcast4(y[t].add(4 * l)) };
                // Q4_1's and Q5_1's lanes start at zero, their bias being all zeros: the
                // broadcast of it took a load a lane (measurements: docs/perf-log.md, "Q4_1
                // and Q5_1: lanes without the zero bias").
                let start = if P::OFFSET == 0 {
                    _mm512_setzero_si512()
                } else {
                    _mm512_set1_epi32(tk[t].bias[l])
                };
                let s = _mm512_dpbusd_epi32(start, w, a);
                acc[t][l] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(s), acc[t][l]);
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: this function's features.
        let mut v = unsafe { hsum8(a) };
        if P::MIN {
            v = _mm512_add_ps(v, mins[t]);
        }
        store_rows(out, (stride, r0, t0), t, v);
    }
}

/// [`tokens32`] in the order of llama.cpp's repacked gemv (Q4_0, IQ4_NL): each block's exact
/// integer total fused into one running float a (row, token) by `d_x * d_y`
/// (`reference::dot::vec_dot_q4_0_q8_0_rows8`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn tokens32_rows8<P: Pack32, L: Lanes32, const T: usize>(
    g: &[L],
    ys: [&[P::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    (stride, r0, t0): (usize, usize, usize),
) {
    let mut acc = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        g.ask_ahead();
        // SAFETY: a row of `d`.
        let dx = unsafe { ld_f16(g.d()) };
        let tk: [&Tok32; T] = std::array::from_fn(|t| &toks[t][b]);
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs().as_ptr());
        // Two chains a token (even and odd lanes), added at the end.
        let mut even: [__m512i; T] = std::array::from_fn(|t| _mm512_set1_epi32(tk[t].total));
        let mut odd = [_mm512_setzero_si512(); T];
        for l in 0..8 {
            // SAFETY: this function's features.
            let w = unsafe { g.lane(l) };
            for t in 0..T {
                // SAFETY: values 4l..4l + 4 of the token's 32.
                let a = unsafe { bcast4(y[t].add(4 * l)) };
                if l % 2 == 0 {
                    even[t] = _mm512_dpbusd_epi32(even[t], w, a);
                } else {
                    odd[t] = _mm512_dpbusd_epi32(odd[t], w, a);
                }
            }
        }
        for t in 0..T {
            let total = _mm512_add_epi32(even[t], odd[t]);
            let d = _mm512_mul_ps(dx, _mm512_set1_ps(tk[t].d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), d, acc[t]);
        }
    }
    for (t, &a) in acc.iter().enumerate() {
        store_rows(out, (stride, r0, t0), t, a);
    }
}

/// Packed 32-value groups times every token, as [`q4_k`]: in `vec_dot` order, or in the order
/// of llama.cpp's repacked gemv (`REPACKED`, Q4_0 and IQ4_NL).
///
/// # Safety
/// As [`q4_k`].
///
/// [`q4_k`]: crate::x86::avx512::packed::kquants
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn lanes32<P: Pack32, const REPACKED: bool>(
    p: &[P],
    per_row: usize,
    a: &[P::A],
    out: &mut [f32],
) {
    let stride = p.len() / per_row * ROWS;
    let n_tok = a.len() / per_row;
    TOKS32.with_borrow_mut(|(toks, unpacked)| {
        toks.clear();
        toks.extend(a.iter().map(|y| {
            // SAFETY: 32 readable bytes; this function's features.
            let q = unsafe { _mm256_loadu_si256(y.qs().as_ptr().cast()) };
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
            // SAFETY: this function's features.
            unsafe { Tok32::new(y, sums, P::OFFSET) }
        }));
        let per_pass = if REPACKED {
            TOKENS32_ROWS8
        } else {
            P::PASS_TOKENS
        };
        let unpack = n_tok.div_ceil(per_pass) >= P::UNPACK_FROM_PASSES;
        if unpack && unpacked.len() < per_row {
            let zero = Unpacked32 {
                q: [[0; ROWS]; 8],
                d: [0; ROWS],
                m: [0; ROWS],
            };
            unpacked.resize(per_row, zero);
        }
        for (gi, g) in p.chunks_exact(per_row).enumerate() {
            let tok = |t: usize| &a[t * per_row..][..per_row];
            let tk = |t: usize| &toks[t * per_row..][..per_row];
            if unpack {
                for (u, g) in unpacked.iter_mut().zip(g) {
                    for (l, q) in u.q.iter_mut().enumerate() {
                        // SAFETY: 64 writable, aligned bytes; this function's features.
                        unsafe { _mm512_store_si512(q.as_mut_ptr().cast(), Pack32::lane(g, l)) };
                    }
                    u.d = *Pack32::d(g);
                    u.m = *Pack32::m(g);
                }
            }
            macro_rules! pass {
                ($n:expr, $t0:expr) => {{
                    let ys = std::array::from_fn(|t| tok($t0 + t));
                    let tks = std::array::from_fn(|t| tk($t0 + t));
                    let at = (stride, ROWS * gi, $t0);
                    match (unpack, REPACKED) {
                        (true, false) => tokens32::<P, Unpacked32, { $n }>(
                            &unpacked[..per_row],
                            ys,
                            tks,
                            out,
                            at,
                        ),
                        (false, false) => tokens32::<P, P, { $n }>(g, ys, tks, out, at),
                        (true, true) => tokens32_rows8::<P, Unpacked32, { $n }>(
                            &unpacked[..per_row],
                            ys,
                            tks,
                            out,
                            at,
                        ),
                        (false, true) => tokens32_rows8::<P, P, { $n }>(g, ys, tks, out, at),
                    }
                }};
            }
            if REPACKED {
                token_passes!(n_tok, pass, TOKENS32_ROWS8, [1 2 3 4 5 6 7]);
            } else {
                match P::PASS_TOKENS {
                    2 => token_passes!(n_tok, pass, 2, [1]),
                    3 => token_passes!(n_tok, pass, 3, [1 2]),
                    n => unreachable!("passes of {n} tokens"),
                }
            }
        }
    });
}

/// Tokens per pass in the repacked order (one float a token).
const TOKENS32_ROWS8: usize = 8;

packed_format!(Q8_0: Q8_0Packed, BlockQ8_0, GgmlType::Q8_0, GgmlType::Q8_0 => lanes32::<Q8_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q5_0: Q5_0Packed, BlockQ8_0, GgmlType::Q5_0, GgmlType::Q8_0 => lanes32::<Q5_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_1: Q4_1Packed, BlockQ8_1, GgmlType::Q4_1, GgmlType::Q8_1 => lanes32::<Q4_1Packed, false>, LANES32_TILE_WEIGHTS);
packed_format!(Q4_0_ROWS8: Q4_0Packed, BlockQ8_0, GgmlType::Q4_0, GgmlType::Q8_0 => lanes32::<Q4_0Packed, true>, LANES32_TILE_WEIGHTS);
packed_format!(IQ4_NL_ROWS8: IQ4NLPacked, BlockQ8_0, GgmlType::IQ4_NL, GgmlType::Q8_0 => lanes32::<IQ4NLPacked, true>, LANES32_TILE_WEIGHTS);
packed_format!(MXFP4_ROWS8: MXFP4Packed, BlockQ8_0, GgmlType::MXFP4, GgmlType::Q8_0 => lanes32::<MXFP4Packed, true>, LANES32_TILE_WEIGHTS);
packed_format!(Q5_1: Q5_1Packed, BlockQ8_1, GgmlType::Q5_1, GgmlType::Q8_1 => lanes32::<Q5_1Packed, false>, LANES32_TILE_WEIGHTS);

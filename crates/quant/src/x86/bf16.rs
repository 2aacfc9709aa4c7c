//! BF16 weights against BF16 activations with `vdpbf16ps` (AVX512-BF16), in the order of
//! ggml's `ggml_vec_dot_bf16` as llama.cpp's x86-64 build runs it on such a CPU
//! ([`crate::reference::dot::vec_dot_bf16_bf16`]): two accumulators of sixteen lanes over
//! 64-value steps, each lane taking a pair of values a step with the very instruction the
//! reference names, then each accumulator reduced and the leftovers added in f64
//! ([`crate::reference::dot::bf16_finish`]; here the reductions run in registers). Every
//! output runs exactly those operations; only how many outputs share a loop differs:
//!
//! - [`dot_bf16`]: `R` rows at once, one token.
//! - [`gemm_bf16`]: tiles for batches, [`TILE_ROWS`] rows by [`TILE_TOKENS`] tokens, each step
//!   loading a row's and a token's 64 values once for the whole tile (for the rows of a
//!   matrix past its last group of sixteen).
//! - [`packed_kernel`]: matrices packed at load time, sixteen rows in the lanes of each of the
//!   reference's 32 chains ([`pack_rows`]), one token and batches: a batch step is one
//!   instruction for sixteen outputs, and the lanes' reduction is vertical.
//!
//! - [`dot_bf16_avx2`]: CPUs without AVX512-BF16 but with AVX2 and FMA, one token: the
//!   instruction emulated in f32 lanes, subnormals flushed by hand.
//! - [`gemv_avx2`], [`gemm_avx2`]: the same CPUs, one token and tiles for batches, with the
//!   multiply-adds run under the SSE control word's FTZ and DAZ instead of flushing by hand;
//!   a call in which a result was flushed is computed again by [`dot_bf16_avx2`].

use std::arch::x86_64::*;

use half::bf16;

use crate::reference::dot::bf16_tail;
use crate::x86::f16::{chain_passes, lay_out_tokens, load_transposed16, transpose16};
use crate::x86::{prefetch_lines_by, prefetch_now, PREFETCH_BOTH};
use crate::QuantError;

/// 32 values from `p` as the pairs `vdpbf16ps` takes.
///
/// # Safety
/// `p..p + 32` must be readable; the CPU must have AVX-512 F and BF16.
#[inline(always)]
unsafe fn load32(p: *const bf16) -> __m512bh {
    // SAFETY: the caller's bounds; any 64 bytes are 32 BF16 values.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
}

/// Sixteen lanes summed in [`crate::reference::dot::reduce_add_16`]'s order (that of
/// `_mm512_reduce_add_ps`): halves, quarters, then the last four pairwise.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
unsafe fn reduce16(v: __m512) -> f32 {
    // SAFETY: the caller's CPU.
    unsafe {
        let v = _mm512_castps_pd(v);
        let h = _mm256_add_ps(
            _mm256_castpd_ps(_mm512_castpd512_pd256(v)),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(v)),
        );
        let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
        // Lanes 0, 1: t0 + t2, t1 + t3.
        let p = _mm_add_ps(q, _mm_movehl_ps(q, q));
        _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)))
    }
}

/// An output's two accumulators reduced and its leftovers added
/// ([`crate::reference::dot::bf16_finish`]).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
unsafe fn finish(acc: [__m512; 2], x: &[bf16], y: &[bf16]) -> f32 {
    // SAFETY: the caller's CPU.
    unsafe { bf16_tail(reduce16(acc[0]), reduce16(acc[1]), x, y) }
}

/// `R` rows (each at least `y.len()` long) with one activation row.
#[target_feature(enable = "avx512f,avx512bf16")]
pub fn dot_bf16<const R: usize>(x: [&[bf16]; R], y: &[bf16]) -> [f32; R] {
    let n = y.len();
    let x = x.map(|r| &r[..n]);
    let np = n & !63;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut i = 0;
    while i < np {
        // Each row's bytes ahead of this step's 64 values (two lines), as the F16 rows ask.
        for r in x {
            prefetch_lines_by(r.as_ptr().wrapping_add(i).cast(), 0..2, PREFETCH_BOTH);
        }
        // SAFETY: i + 64 <= np <= n, the length of `y` and of every row.
        unsafe {
            let yv = [load32(y.as_ptr().add(i)), load32(y.as_ptr().add(i + 32))];
            for (acc, x) in acc.iter_mut().zip(&x) {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_dpbf16_ps(*a, load32(x.as_ptr().add(i + 32 * j)), yv[j]);
                }
            }
        }
        i += 64;
    }
    // (A loop, not `from_fn`: a closure would not share this function's features.)
    let mut out = [0f32; R];
    for (r, o) in out.iter_mut().enumerate() {
        // SAFETY: this function's features.
        *o = unsafe { finish(acc[r], &x[r][np..], &y[np..]) };
    }
    out
}

/// Rows and tokens of a batch tile.
pub const TILE_ROWS: usize = 2;
pub const TILE_TOKENS: usize = 4;

/// `R` rows times `T` tokens (each `k` values), into `out[t][r]`: both of each output's
/// accumulators in registers, each step loading a row's and a token's 64 values once for the
/// tile.
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; every slice holds `k` values.
#[inline(always)]
unsafe fn tile<const R: usize, const T: usize>(
    x: [&[bf16]; R],
    y: [&[bf16]; T],
    k: usize,
) -> [[f32; R]; T] {
    const { assert!(R * T <= TILE_ROWS * TILE_TOKENS) };
    let np = k & !63;
    // SAFETY: (the whole body) the caller's CPU; step i reads values i..i + 64 <= np <= k of
    // each slice.
    unsafe {
        let zero = std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512());
        let xp = x.map(|x| x.as_ptr());
        let yp = y.map(|y| y.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); 2]; TILE_ROWS * TILE_TOKENS];
        let mut i = 0;
        while i < np {
            let mut xv = [[zero; 2]; R];
            for r in 0..R {
                prefetch_lines_by(xp[r].wrapping_add(i).cast(), 0..2, PREFETCH_BOTH);
                xv[r] = [load32(xp[r].add(i)), load32(xp[r].add(i + 32))];
            }
            for t in 0..T {
                let yv = [load32(yp[t].add(i)), load32(yp[t].add(i + 32))];
                for r in 0..R {
                    for j in 0..2 {
                        acc[t * R + r][j] = _mm512_dpbf16_ps(acc[t * R + r][j], xv[r][j], yv[j]);
                    }
                }
            }
            i += 64;
        }
        // (Loops, not `from_fn`: a closure would not share the callers' features.)
        let mut out = [[0f32; R]; T];
        for t in 0..T {
            for r in 0..R {
                out[t][r] = finish(acc[t * R + r], &x[r][np..k], &y[t][np..k]);
            }
        }
        out
    }
}

/// Rows of `w` (`k` values each) times the `n_tok` tokens of `y`, into `out` (`(n_tok,
/// rows)`), in tiles of [`TILE_ROWS`] x [`TILE_TOKENS`] (smaller at the edges), blocks of
/// rows at a time ([`BLOCK_BYTES`]).
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; `w` holds whole rows, `y` `n_tok k` values and `out`
/// `n_tok` outputs a row.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn gemm_unchecked(w: &[bf16], y: &[bf16], k: usize, out: &mut [f32]) {
    let rows = w.len() / k.max(1);
    let n_tok = y.len() / k.max(1);
    let row = |r: usize| &w[r * k..][..k];
    let tok = |t: usize| &y[t * k..][..k];
    let block = (BLOCK_BYTES / (2 * k).max(1))
        .clamp(1, 64)
        .next_multiple_of(TILE_ROWS);
    for b0 in (0..rows).step_by(block) {
        let b1 = rows.min(b0 + block);
        for t0 in (0..n_tok).step_by(TILE_TOKENS) {
            for r0 in (b0..b1).step_by(TILE_ROWS) {
                macro_rules! run {
                    ($r:literal, $t:literal) => {{
                        let x: [&[bf16]; $r] = std::array::from_fn(|r| row(r0 + r));
                        let ys: [&[bf16]; $t] = std::array::from_fn(|t| tok(t0 + t));
                        // SAFETY: this function's features; every slice holds k values.
                        let v = unsafe { tile::<$r, $t>(x, ys, k) };
                        for (t, v) in v.iter().enumerate() {
                            out[(t0 + t) * rows + r0..][..$r].copy_from_slice(v);
                        }
                    }};
                }
                macro_rules! rows {
                    ($r:literal) => {
                        match (n_tok - t0).min(TILE_TOKENS) {
                            4 => run!($r, 4),
                            3 => run!($r, 3),
                            2 => run!($r, 2),
                            _ => run!($r, 1),
                        }
                    };
                }
                match (b1 - r0).min(TILE_ROWS) {
                    2 => rows!(2),
                    _ => rows!(1),
                }
            }
        }
    }
}

/// Weight bytes of the rows a batch takes together, each token tile passing over all of them
/// before the next (so that they stay in the second-level cache while the tile's tokens stay
/// in the first).
const BLOCK_BYTES: usize = 128 << 10;

tiled_entry! {
    /// The AVX512-BF16 tile entry ([`crate::GemmFn`]).
    gemm_bf16: bf16 => gemm_unchecked
}

// ---------------------------------------------------------------------------------------------
// BF16 matrices packed at load time (as F16's, `crate::x86::f16`): sixteen rows in the lanes of each
// of the reference's 32 chains (accumulator `j`, lane `m`: the pairs `64 i + 32 j + 2 m`, `+ 1`
// of step `i`), so that a step of a batch is one `vdpbf16ps` of a weight register by one
// token's pair, broadcast, for sixteen outputs at once, and the lanes' reduction is vertical.
// A group of sixteen rows of `k` values (`s = k / 64` steps, `np = 64 s`):
//
// - for `m` in 0..16, for step `i` in 0..s, for `j` in 0..2: chain `16 j + m`'s pair of step
//   `i`, sixteen rows (64 bytes): both accumulators' lane `m` side by side, so that one token
//   reads the group as one stream;
// - then each row's `k - np` values, row by row.

/// Rows of a packed group.
const GROUP: usize = 16;

/// Where chain `16 j + m`'s step `i` lies in a packed group of `s` steps, in registers of
/// sixteen rows' pairs (its 32-bit words at `16 *` that): the layout above.
#[inline(always)]
fn chain_at(s: usize, m: usize, i: usize, j: usize) -> usize {
    (m * s + i) * 2 + j
}

/// Pack the first `groups` groups of sixteen rows of a BF16 matrix (`w`: its rows, `row_bytes`
/// each) in the layout above, into new anonymous memory (as F16's `pack_rows`).
pub(crate) fn pack_rows(
    w: &[u8],
    row_bytes: usize,
    groups: usize,
    release: &(dyn Fn(&[u8]) + Sync),
) -> std::io::Result<crate::pages::Pages> {
    let k = row_bytes / 2;
    let s = k / 64;
    let np = 64 * s;
    let group_bytes = GROUP * row_bytes;
    let pack_group = |g: usize, out: &mut [u8]| {
        let rows = &w[g * group_bytes..(g + 1) * group_bytes];
        let (chains, tails) = out.split_at_mut(2 * GROUP * np);
        // SAFETY: `pack_rows` is handed out only on AVX-512 CPUs (as the format's kernel).
        unsafe { gather_pairs(rows, k, s, chains) };
        if k > np {
            for (r, d) in tails.chunks_exact_mut(2 * (k - np)).enumerate() {
                d.copy_from_slice(&rows[r * row_bytes + 2 * np..(r + 1) * row_bytes]);
            }
        }
    };
    crate::packed::layout::pack_row_groups(w, row_bytes, groups, release, &pack_group)
}

/// The chains of a group (`rows`: sixteen rows of `k` values, as bytes) into `chains` in the
/// packed layout: each part's 32 values of the sixteen rows loaded and transposed as 32-bit
/// words ([`transpose16`]: word `m`, pair `m` of every row), each word one chain's step.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn gather_pairs(rows: &[u8], k: usize, s: usize, chains: &mut [u8]) {
    assert!(rows.len() >= GROUP * 2 * k && chains.len() >= GROUP * 4 * 32 * s && 64 * s <= k);
    for i in 0..s {
        for j in 0..2 {
            // SAFETY: this function's features; values 64 i + 32 j..+32 <= 64 s <= k of each
            // row.
            let pairs = unsafe { load_transposed16(rows, 2 * k, 2 * (64 * i + 32 * j)) };
            for (m, p) in pairs.iter().enumerate() {
                let dst = chain_at(s, m, i, j) * 64;
                // SAFETY: 64 bytes at `dst`, inside `chains`.
                unsafe { _mm512_storeu_ps(chains[dst..][..64].as_mut_ptr().cast(), *p) };
            }
        }
    }
}

/// A token's pair `p` broadcast to every lane.
///
/// # Safety
/// The CPU must have AVX-512 F and BF16.
#[inline(always)]
unsafe fn bcast(p: u32) -> __m512bh {
    // SAFETY: any 64 bytes are 32 BF16 values; the caller's CPU.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(p as i32)) }
}

/// A packed register: sixteen rows' pairs.
///
/// # Safety
/// `p..p + 16` must be readable; the CPU must have AVX-512 F and BF16.
#[inline(always)]
unsafe fn load_rows(p: *const u32) -> __m512bh {
    // SAFETY: the caller's bounds and CPU.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
}

/// Sixteen rows' two reduced accumulators (`v[j][m]`: accumulator `j`'s lane `m` of each row)
/// into `out`, each row's leftovers added ([`bf16_tail`]; `tails`: the group's rows past
/// `np`, `y`: the token's).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
unsafe fn finish_group(v: &[[__m512; 16]; 2], tails: &[bf16], y: &[bf16], out: &mut [f32]) {
    let mut r = [[0f32; 16]; 2];
    for (r, v) in r.iter_mut().zip(v) {
        // SAFETY: the caller's CPU; sixteen f32.
        unsafe { _mm512_storeu_ps(r.as_mut_ptr(), crate::x86::f16::reduce_pairs(*v)) };
    }
    let tail = y.len();
    for (row, o) in out.iter_mut().enumerate().take(GROUP) {
        *o = bf16_tail(r[0][row], r[1][row], &tails[row * tail..][..tail], y);
    }
}

/// Groups of sixteen packed rows (`p`, `k` values a row) times one token (`yc`: its pairs in
/// the order of the group's chains, [`chain_at`]; `y`: its values, for the leftovers), into
/// `out` (sixteen a group): each group and the token read as one stream each.
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; `p` holds whole groups, `yc` `32 s` pairs, `y` `k`
/// values, `out` sixteen a group.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::needless_range_loop)] // `m` indexes both accumulators' lanes
unsafe fn gemv_packed(p: &[u32], k: usize, (yc, y): (&[u32], &[bf16]), out: &mut [f32]) {
    let s = k / 64;
    let np = 64 * s;
    let group = GROUP * k / 2;
    let (chains, yc) = (32 * s * GROUP, &yc[..32 * s]);
    for (g, out) in p.chunks_exact(group).zip(out.chunks_exact_mut(GROUP)) {
        let x = &g[..chains];
        let mut v = [[_mm512_setzero_ps(); 16]; 2];
        for m in 0..16 {
            let mut acc = [_mm512_setzero_ps(); 2];
            for i in 0..s {
                let at = chain_at(s, m, i, 0);
                prefetch_lines_by(
                    x[16 * at..].as_ptr().cast(),
                    0..2,
                    crate::x86::prefetch_plan(),
                );
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY: this function's features; sixteen words of `x` at 16 (at + j) <
                    // 32 s 16, pair at + j of `yc`.
                    unsafe {
                        let w = load_rows(x[16 * (at + j)..][..16].as_ptr());
                        *a = _mm512_dpbf16_ps(*a, w, bcast(yc[at + j]));
                    }
                }
            }
            v[0][m] = acc[0];
            v[1][m] = acc[1];
        }
        let tails: &[bf16] = bytemuck::cast_slice(&g[chains..]);
        // SAFETY: this function's features.
        unsafe { finish_group(&v, tails, &y[np..k], out) };
    }
}

/// Groups a batch pass takes, and tokens.
const PASS_GROUPS: usize = 3;
const PASS_TOKENS: usize = 8;

/// Chain `16 j + m` of `G` groups of sixteen packed rows times `T` tokens, summed over its `s`
/// steps, into `c[g * gs + t * ts]` (`c = (c, gs, ts)`: where the batch keeps each output's
/// lanes, so that no copy follows): `x[g]` is group `g` from the chain's step 0 on (step `i` at
/// `32 i` words further, [`chain_at`]); `y` the tokens' pairs of the chain, step `i` token `t`
/// at `2 PASS_TOKENS i + t`.
///
/// # Safety
/// The CPU must have AVX-512 F and BF16.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `g` and `t` index the accumulators and the operands
unsafe fn chain_pass<const G: usize, const T: usize>(
    x: [&[u32]; G],
    y: &[u32],
    s: usize,
    (c, gs, ts): (&mut [__m512], usize, usize),
) {
    if s == 0 {
        return;
    }
    for x in x {
        assert!(x.len() >= 32 * (s - 1) + GROUP);
    }
    assert!(T <= PASS_TOKENS && y.len() >= 2 * PASS_TOKENS * (s - 1) + T);
    assert!(c.len() > (G - 1) * gs + (T - 1) * ts);
    // SAFETY: the caller's CPU; step `i < s` reads sixteen words of `x[g]` from `32 i` and
    // word `2 PASS_TOKENS i + t` of `y`, inside both (asserted above).
    unsafe {
        let zero = std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512());
        let mut acc = [[_mm512_setzero_ps(); T]; G];
        for i in 0..s {
            let mut xv = [zero; G];
            for g in 0..G {
                xv[g] = load_rows(x[g].as_ptr().add(32 * i));
            }
            for t in 0..T {
                let yv = bcast(*y.as_ptr().add(2 * PASS_TOKENS * i + t));
                for g in 0..G {
                    acc[g][t] = _mm512_dpbf16_ps(acc[g][t], xv[g], yv);
                }
            }
        }
        for g in 0..G {
            for t in 0..T {
                c[g * gs + t * ts] = acc[g][t];
            }
        }
    }
}

/// A token's pairs (`y`: its values, `s` steps of 64) in the order of a group's chains, into
/// `yc`: the pair of values `64 i + 32 j + 2 m` and `+ 1`, as `vdpbf16ps` takes it, at
/// `chain_at(s, m, i, j)`. Eight steps at a time, their 256 pairs transposed in registers
/// ([`transpose16`]: register `16 i' + j` in, lane `m`), the steps past a multiple of eight one
/// pair at a time.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn lay_out_token(y: &[bf16], s: usize, yc: &mut Vec<u32>) {
    yc.clear();
    yc.resize(32 * s, 0);
    let full = s / 8 * 8;
    for i0 in (0..full).step_by(8) {
        let mut v = [_mm512_setzero_ps(); 16];
        for (r, v) in v.iter_mut().enumerate() {
            // SAFETY: this function's CPU; values 64 i0 + 32 r..+32 < 64 s <= y.len().
            *v = unsafe { _mm512_loadu_ps(y[64 * i0 + 32 * r..][..32].as_ptr().cast()) };
        }
        // SAFETY: this function's CPU.
        let v = unsafe { transpose16(v) };
        for (m, v) in v.into_iter().enumerate() {
            // Pairs (i0 + r / 2, j = r % 2) of lane m, r = 0..16: `chain_at` runs over them.
            let at = &mut yc[chain_at(s, m, i0, 0)..][..16];
            // SAFETY: this function's CPU; sixteen writable words.
            unsafe { _mm512_storeu_ps(at.as_mut_ptr().cast(), v) };
        }
    }
    for m in 0..16 {
        for i in full..s {
            for j in 0..2 {
                let v = 64 * i + 32 * j + 2 * m;
                yc[chain_at(s, m, i, j)] =
                    y[v].to_bits() as u32 | (y[v + 1].to_bits() as u32) << 16;
            }
        }
    }
}

/// Groups of sixteen packed rows (`p`, `k` values a row) times the `n_tok` tokens of `y`
/// (`k` values each), into `out` (`(n_tok, rows)`), as F16's batch kernel: the tokens' pairs
/// laid out chain by chain once a call (blocks of [`PASS_TOKENS`]); then for each block of up
/// to [`PASS_GROUPS`] groups, lane by lane (the region of a lane's two chains in each group,
/// read from memory once, then from cache, the region two lanes on requested a share a pass),
/// passes of [`PASS_TOKENS`] tokens over its two chains ([`chain_pass`]); last each output's
/// two accumulators reduced and its leftovers added ([`finish_group`]).
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; `p` holds whole groups, `y` `n_tok k` values, `out`
/// `n_tok` outputs a row.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn gemm_packed(
    p: &[u32],
    k: usize,
    y: &[bf16],
    n_tok: usize,
    out: &mut [f32],
    (yp, sums): (&mut Vec<u32>, &mut Vec<__m512>),
) {
    const PT: usize = PASS_TOKENS;
    let s = k / 64;
    let np = 64 * s;
    let group = GROUP * k / 2;
    let groups = p.len() / group;
    let rows = GROUP * groups;
    // Each block of PT tokens: chain `16 j + m`'s pair of step `i` for token `t` at
    // `chain_at(s, m, i, j) PT + t`.
    let block_len = 32 * s * PT;
    // The tokens' pairs (values 64 i + 32 j + 2 m, + 1: word m of the 32 values from
    // 64 i + 32 j), sixteen tokens at a time (the pair-by-pair loop this replaced took a
    // share of a BF16 file's prefill: docs/perf-log.md, "F16 and BF16 kernels").
    // SAFETY: this function's CPU; 32 values from 64 i + 32 j <= k - 32 of each token, and
    // `chain_at(..) PT + 8 <= block_len`.
    unsafe {
        lay_out_tokens::<u32, 2>(
            yp,
            (n_tok, s, block_len),
            |t, i, j| _mm512_loadu_ps(y[t * k + 64 * i + 32 * j..][..32].as_ptr().cast()),
            |m, i, j| chain_at(s, m, i, j) * PT,
        )
    };
    // SAFETY: (the whole body) this function's CPU; the reads below stay inside the slices
    // (sliced to their lengths first).
    unsafe {
        let zero = _mm512_setzero_ps();
        // The 32 lanes' sums of each output (`(g, t)` of a block at `32 (g n_tok + t)`,
        // accumulator j's lane m at `16 j + m`), written by the passes.
        sums.resize(32 * PASS_GROUPS * n_tok, zero);
        let v = &mut sums[..];
        // A region: a group's two chains of one lane `m` (their `s` steps side by side).
        let region = 32 * s;
        let lines = 4 * region / 64;
        let per_pass = lines.div_ceil(2 * n_tok.div_ceil(PT));
        for g0 in (0..groups).step_by(PASS_GROUPS) {
            let n_g = (groups - g0).min(PASS_GROUPS);
            let block = &p[g0 * group..(g0 + n_g) * group];
            for m in 0..if s > 0 { 16 } else { 0 } {
                let (ahead, g_ahead) = match m + 2 {
                    a if a < 16 => (a, g0),
                    a => (a - 16, g0 + n_g),
                };
                let mut requested = 0;
                for t0 in (0..n_tok).step_by(PT) {
                    let nt = (n_tok - t0).min(PT);
                    let yb = &yp[t0 / PT * block_len..][..block_len];
                    for j in 0..2 {
                        for g in g_ahead..(g_ahead + PASS_GROUPS).min(groups) {
                            let at = &p[g * group + chain_at(s, ahead, 0, 0) * GROUP..][..region];
                            prefetch_now(
                                at.as_ptr().cast(),
                                requested..(requested + per_pass).min(lines),
                            );
                        }
                        requested = (requested + per_pass).min(lines);
                        let yl = &yb[chain_at(s, m, 0, j) * PT..];
                        // Output (g, t0 + t)'s accumulator j, lane m.
                        let c = (&mut v[32 * t0 + 16 * j + m..], 32 * n_tok, 32);
                        let x = |g: usize| &block[g * group + chain_at(s, m, 0, j) * GROUP..];
                        chain_passes!(u32, n_g, nt, x, (yl, s, c));
                    }
                }
            }
            for g in 0..n_g {
                let tails: &[bf16] = bytemuck::cast_slice(
                    &block[g * group + 32 * s * GROUP..][..group - 32 * s * GROUP],
                );
                for t in 0..n_tok {
                    let mut acc = [[zero; 16]; 2];
                    if s > 0 {
                        let o = 32 * (g * n_tok + t);
                        acc[0].copy_from_slice(&v[o..o + 16]);
                        acc[1].copy_from_slice(&v[o + 16..o + 32]);
                    }
                    let o = &mut out[t * rows + (g0 + g) * GROUP..][..GROUP];
                    finish_group(&acc, tails, &y[t * k + np..(t + 1) * k], o);
                }
            }
        }
    }
}

/// The packed kernels' copies: one token's pairs in the order they are read, a batch's in
/// blocks of tokens, and a batch's sums.
type PackedCopies = (Vec<u32>, Vec<u32>, Vec<__m512>);

thread_local! {
    static PACKED_COPIES: std::cell::RefCell<PackedCopies> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The packed BF16 kernel (`packed::layout::PackedFn`): `p` whole groups of `k = per_row`
/// values a row, `a` the `n_tok` tokens' BF16 activations, `out` `(n_tok, rows)`.
pub(crate) fn packed_kernel(
    p: &[u8],
    per_row: usize,
    a: &[u8],
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let k = per_row;
    // A packed "block": one column of a group's sixteen rows (as 32-bit words: the pairs of
    // two columns).
    let bf16 = crate::GgmlType::BF16;
    let (x, y) =
        crate::packed::layout::operands::<[u32; GROUP / 2], bf16>(bf16, bf16, p, k, a, n_tok, out)?;
    let x: &[u32] = x.as_flattened();
    PACKED_COPIES.with_borrow_mut(|(yc, yp, sums)| {
        if n_tok == 1 {
            // SAFETY: the kernel table hands this format out only for `Isa::Avx512Bf16`; the
            // sizes agree (checked above).
            unsafe {
                lay_out_token(y, k / 64, yc);
                gemv_packed(x, k, (yc, y), out)
            };
        } else {
            // SAFETY: as above.
            unsafe { gemm_packed(x, k, y, n_tok, out, (yp, sums)) };
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// CPUs without AVX512-BF16 (AVX2 and FMA): `vdpbf16ps` emulated in f32 lanes, as the
// reference does it. Each 32-bit word holds a pair (the even value in its low half): the odd
// value is the word with its low half cleared, the even one the word shifted up, both exact
// f32. Each step is a fused multiply-add (a product of two BF16 values is exact in f32); the
// instruction's treatment of subnormals is done by hand: inputs with a zero exponent taken as
// zero of their sign, and so results.

/// `v` with every lane whose exponent is zero (a zero or a subnormal) made a zero of its sign.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn flush8(v: __m256i) -> __m256 {
    // SAFETY: the caller's CPU.
    unsafe {
        let exp = _mm256_and_si256(v, _mm256_set1_epi32(0x7F80_0000));
        let tiny = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256());
        let clear = _mm256_and_si256(tiny, _mm256_set1_epi32(0x7FFF_FFFF));
        _mm256_castsi256_ps(_mm256_andnot_si256(clear, v))
    }
}

/// Sixteen values from `p` as their pairs' odd and even values (lane `l`: pair `l`), taken as
/// `vdpbf16ps` takes them.
///
/// # Safety
/// `p..p + 16` must be readable; the CPU must have AVX2.
#[inline(always)]
unsafe fn pairs8(p: *const bf16) -> [__m256; 2] {
    // SAFETY: the caller's bounds and CPU.
    unsafe { pairs8_raw(p).map(|v| flush8(_mm256_castps_si256(v))) }
}

/// One `vdpbf16ps` step of eight lanes: `acc + odd products`, then `+ even products`, each
/// result's subnormals flushed.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
unsafe fn dp8(acc: __m256, x: [__m256; 2], y: [__m256; 2]) -> __m256 {
    // SAFETY: the caller's CPU.
    unsafe {
        let a = flush8(_mm256_castps_si256(_mm256_fmadd_ps(x[0], y[0], acc)));
        flush8(_mm256_castps_si256(_mm256_fmadd_ps(x[1], y[1], a)))
    }
}

/// `R` rows (each at least `y.len()` long) with one activation row, AVX2: each of the
/// reference's 16-lane accumulators as two 8-lane halves.
#[target_feature(enable = "avx2,fma")]
pub fn dot_bf16_avx2<const R: usize>(x: [&[bf16]; R], y: &[bf16]) -> [f32; R] {
    let n = y.len();
    let x = x.map(|r| &r[..n]);
    let np = n & !63;
    // acc[r][2 j + h]: lanes 8h..8h + 8 of accumulator j.
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let mut i = 0;
    while i < np {
        for r in x {
            prefetch_lines_by(r.as_ptr().wrapping_add(i).cast(), 0..2, PREFETCH_BOTH);
        }
        for q in 0..4 {
            // SAFETY: values i + 16 q..+16 < np <= n of `y` and of every row.
            unsafe {
                let yv = pairs8(y.as_ptr().add(i + 16 * q));
                for (acc, x) in acc.iter_mut().zip(&x) {
                    acc[q] = dp8(acc[q], pairs8(x.as_ptr().add(i + 16 * q)), yv);
                }
            }
        }
        i += 64;
    }
    // (Loops, not closures: a closure would not share this function's features.)
    let mut out = [0f32; R];
    for (r, o) in out.iter_mut().enumerate() {
        let mut red = [0f32; 2];
        for (j, red) in red.iter_mut().enumerate() {
            *red = crate::x86::avx2::hsum(_mm256_add_ps(acc[r][2 * j], acc[r][2 * j + 1]));
        }
        *o = bf16_tail(red[0], red[1], &x[r][np..], &y[np..]);
    }
    out
}

/// One row with one activation row ([`dot_bf16_avx2`]).
#[target_feature(enable = "avx2,fma")]
pub fn dot_bf16_avx2_row(x: &[bf16], y: &[bf16]) -> f32 {
    dot_bf16_avx2::<1>([x], y)[0]
}

// ---------------------------------------------------------------------------------------------
// The same sums without the flushes by hand, under the SSE control word's own: with FTZ set,
// every result that would be subnormal comes out a zero of its sign, and with DAZ every
// subnormal input is taken as one, as `vdpbf16ps` does, so the main loop is two plain
// multiply-adds a pair of registers. The two can differ only about a result just under the
// smallest normal, which x86's FTZ judges tiny (before rounding, or after rounding to f32's
// precision with an unbounded exponent) and flushes where the reference rounds it to the
// subnormal grid first, up to the smallest normal, and keeps it. Any result flushed raises
// the underflow flag, so a call whose flag comes back set is computed again the exact way
// above. Without such a result the two give the same bits: the reductions of normal values
// and the f64 leftovers (run after the control word is restored, since DAZ would take their
// subnormal inputs as zeros) are the reference's operations.

/// The SSE control word's DAZ (subnormal inputs as zero) and FTZ (subnormal results flushed)
/// bits, its exception flags (sticky) and among them the underflow flag.
const MXCSR_DAZ: u32 = 1 << 6;
const MXCSR_FTZ: u32 = 1 << 15;
const MXCSR_FLAGS: u32 = 0x3F;
const MXCSR_UNDERFLOW: u32 = 1 << 4;

/// This thread's SSE control and status word.
#[inline(always)]
fn mxcsr() -> u32 {
    let mut v = 0u32;
    // SAFETY: `stmxcsr` stores four bytes to the pointer, a live local.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags));
    }
    v
}

/// Set this thread's SSE control and status word.
///
/// # Safety
/// `v` must be a valid control word (reserved bits clear), and code running under it must not
/// rely on IEEE subnormals where it sets FTZ or DAZ.
#[inline(always)]
unsafe fn set_mxcsr(v: u32) {
    // SAFETY: the caller's word; `ldmxcsr` reads four bytes from a live local. Neither `nomem`
    // nor `readonly`: memory accesses, and so the kernels' loads and stores, stay on their
    // side of it.
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, preserves_flags));
    }
}

/// Restores the control word it holds when dropped (a panic included).
struct SavedMxcsr(u32);

impl Drop for SavedMxcsr {
    fn drop(&mut self) {
        // SAFETY: the word read before it was changed.
        unsafe { set_mxcsr(self.0) }
    }
}

/// `f()` with FTZ and DAZ set and the exception flags cleared, then the control word as it
/// was; with whether any operation in `f` underflowed (a result flushed). `f` must be a call
/// the compiler cannot see into (`inline(never)`), so that none of its float operations moves
/// across the changes of the word.
fn flushing<R>(f: impl FnOnce() -> R) -> (R, bool) {
    let saved = SavedMxcsr(mxcsr());
    // SAFETY: the word as it was, its flags cleared, FTZ and DAZ set; `f` is the callers'
    // kernels, whose results are checked by the flag read below.
    unsafe { set_mxcsr((saved.0 & !MXCSR_FLAGS) | MXCSR_FTZ | MXCSR_DAZ) };
    let r = std::hint::black_box(f());
    let underflowed = mxcsr() & MXCSR_UNDERFLOW != 0;
    drop(saved);
    (r, underflowed)
}

/// Sixteen values from `p` as their pairs' odd and even values, unflushed (DAZ takes the
/// subnormals as zeros).
///
/// # Safety
/// `p..p + 16` must be readable; the CPU must have AVX2.
#[inline(always)]
unsafe fn pairs8_raw(p: *const bf16) -> [__m256; 2] {
    // SAFETY: the caller's bounds and CPU.
    unsafe {
        let v = _mm256_loadu_si256(p.cast());
        let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF_0000u32 as i32));
        [
            _mm256_castsi256_ps(odd),
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
        ]
    }
}

/// The two reduced accumulators of a row `x` (at least `y.len()` long) with one activation row,
/// over its 64-value steps, for a caller under FTZ and DAZ ([`flushing`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA (the caller's features; this is inlined into it).
#[inline(always)]
unsafe fn row_sums(x: &[bf16], y: &[bf16]) -> [f32; 2] {
    let np = y.len() & !63;
    let x = &x[..np];
    // SAFETY: the caller's CPU; values i + 16 q..+16 < np of `y` and of the row.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            crate::x86::prefetch_lines(x.as_ptr().wrapping_add(i).cast(), 0..2);
            for (q, acc) in acc.iter_mut().enumerate() {
                let yv = pairs8_raw(y.as_ptr().add(i + 16 * q));
                let xv = pairs8_raw(x.as_ptr().add(i + 16 * q));
                *acc = _mm256_fmadd_ps(xv[1], yv[1], _mm256_fmadd_ps(xv[0], yv[0], *acc));
            }
            i += 64;
        }
        [0, 1].map(|j| crate::x86::avx2::hsum(_mm256_add_ps(acc[2 * j], acc[2 * j + 1])))
    }
}

/// The reduced accumulators of every row of `x` (`k` values each) with one activation row `y`,
/// a row at a time, into `parts` (one pair a row), under FTZ and DAZ ([`flushing`]). A row at
/// a time: two, three or four rows at once made the BF16 file's decode at the AVX2 tier slower
/// (measurements: docs/perf-log.md, "F16 and BF16 kernels").
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
fn row_sums_avx2(x: &[bf16], k: usize, y: &[bf16], parts: &mut [[f32; 2]]) {
    for (r, p) in parts.iter_mut().enumerate() {
        // SAFETY: this function's features.
        *p = unsafe { row_sums(&x[r * k..][..k], y) };
    }
}

/// The outputs of a call, `out` (`(n_tok, rows)`: row `i % rows` of `w` with token `i / rows`
/// of `y`, `k` values each): `sums` fills each output's two reduced accumulators under FTZ
/// and DAZ ([`flushing`]; it must call a function the compiler cannot see into), then each
/// output adds its leftovers past the 64-value steps; a call in which a result was flushed is
/// computed again by hand ([`dot_bf16_avx2`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `w.len()` and `y.len()` must be multiples of `k > 0` and
/// `out` `(y.len() / k) * (w.len() / k)` long.
#[target_feature(enable = "avx2,fma")]
unsafe fn outputs_avx2(
    (w, y, k): (&[bf16], &[bf16], usize),
    out: &mut [f32],
    sums: impl FnOnce(&mut [[f32; 2]]),
) {
    let (np, rows) = (k & !63, w.len() / k);
    PARTS.with_borrow_mut(|parts| {
        parts.clear();
        parts.resize(out.len(), [0.0; 2]);
        let ((), underflowed) = flushing(|| sums(parts));
        for (i, (o, p)) in out.iter_mut().zip(parts.iter()).enumerate() {
            let (xr, yt) = (&w[i % rows * k..][..k], &y[i / rows * k..][..k]);
            *o = if underflowed {
                dot_bf16_avx2::<1>([xr], yt)[0]
            } else {
                bf16_tail(p[0], p[1], &xr[np..], &yt[np..])
            };
        }
    });
}

/// Every row of `x` (`k` values each) with one activation row `y`, into `out`: the 64-value
/// steps a row at a time ([`row_sums_avx2`]), then the leftovers ([`outputs_avx2`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `y.len() == k > 0`, `x.len() == k * out.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_avx2_unchecked(x: &[bf16], k: usize, y: &[bf16], out: &mut [f32]) {
    // SAFETY: the caller's CPU and sizes.
    unsafe {
        outputs_avx2((x, y, k), out, |parts| row_sums_avx2(x, k, y, parts));
    }
}

thread_local! {
    /// Each thread's reduced accumulators of a call, a pair an output.
    static PARTS: std::cell::RefCell<Vec<[f32; 2]>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The AVX2 BF16 row entry ([`crate::GemvFn`]): one token, every row.
pub fn gemv_avx2(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let (x, y, k) = crate::codec::gemm_operands::<bf16>(w, row_bytes, a, 1, out)?;
    // SAFETY: the kernel table hands this entry out only for `Isa::Avx2` (AVX2, FMA); the
    // operands' sizes agree (checked above).
    unsafe { gemv_avx2_unchecked(x, k, y, out) };
    Ok(())
}

/// The 64-value steps of `x` (`out.len()` values, a multiple of 64) as f32 into `out`, by
/// chain: the values `16c..16c + 16` of every step (those of 256-bit chain `c`, which is half
/// of the reference's accumulator `c / 2`) at `c * out.len() / 4`, step by step, each step's
/// eight odd values then its eight even ones. Unflushed: the tiles run under DAZ.
///
/// # Safety
/// The CPU must have AVX2; `x.len() >= out.len()`.
#[inline(always)]
unsafe fn widen_pairs_by_chain(x: &[bf16], out: &mut [f32]) {
    let np = out.len() & !63;
    for s in 0..np / 64 {
        for c in 0..4 {
            // SAFETY: the caller's CPU; 64 s + 16 c + 16 <= np values of `x`, and c np / 4 +
            // 16 s + 16 <= np of `out`.
            unsafe {
                let [odd, even] = pairs8_raw(x.as_ptr().add(64 * s + 16 * c));
                let at = out.as_mut_ptr().add(c * np / 4 + 16 * s);
                _mm256_storeu_ps(at, odd);
                _mm256_storeu_ps(at.add(8), even);
            }
        }
    }
}

/// The reduced accumulators of `R` rows (`x[r]`: a row's copy from [`widen_pairs_by_chain`])
/// by `T` tokens (`y[t]`, alike), `np` values each, into `parts[t][r]`: each of the four
/// chains in turn over every step, one register an output, for a caller under FTZ and DAZ.
///
/// # Safety
/// The CPU must have AVX2 and FMA (the caller's features; this is inlined into it); every
/// pointer must have `np` values.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `r` and `t` index every accumulator of the tile
unsafe fn pair_tile<const R: usize, const T: usize>(
    x: [*const f32; R],
    y: [*const f32; T],
    np: usize,
) -> [[[f32; 2]; R]; T] {
    // SAFETY: the caller's CPU and bounds: chain c's steps lie at c np / 4 + 16 s.. + 16.
    unsafe {
        let mut chains = [[[_mm256_setzero_ps(); 4]; R]; T];
        for c in 0..4 {
            let mut v = [[_mm256_setzero_ps(); R]; T];
            let base = c * np / 4;
            for s in 0..np / 64 {
                let off = base + 16 * s;
                let xv: [[__m256; 2]; R] = std::array::from_fn(|r| {
                    [
                        _mm256_loadu_ps(x[r].add(off)),
                        _mm256_loadu_ps(x[r].add(off + 8)),
                    ]
                });
                for t in 0..T {
                    let (yo, ye) = (
                        _mm256_loadu_ps(y[t].add(off)),
                        _mm256_loadu_ps(y[t].add(off + 8)),
                    );
                    for r in 0..R {
                        v[t][r] =
                            _mm256_fmadd_ps(xv[r][1], ye, _mm256_fmadd_ps(xv[r][0], yo, v[t][r]));
                    }
                }
            }
            for t in 0..T {
                for r in 0..R {
                    chains[t][r][c] = v[t][r];
                }
            }
        }
        let mut out = [[[0f32; 2]; R]; T];
        for t in 0..T {
            for r in 0..R {
                let ch = &chains[t][r];
                out[t][r] = [
                    crate::x86::avx2::hsum(_mm256_add_ps(ch[0], ch[1])),
                    crate::x86::avx2::hsum(_mm256_add_ps(ch[2], ch[3])),
                ];
            }
        }
        out
    }
}

/// The reduced accumulators of every row of `w` with every token of `y` (`k` values each),
/// into `parts` (`(n_tok, rows)`), under FTZ and DAZ ([`flushing`]): the tokens widened once
/// ([`widen_pairs_by_chain`], into `a`), then blocks of 32 rows widened once each (into `wf`)
/// and run past the tokens in tiles of three rows by four tokens.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
fn tile_sums_avx2(
    w: &[bf16],
    y: &[bf16],
    k: usize,
    parts: &mut [[f32; 2]],
    (a, wf): (&mut Vec<f32>, &mut Vec<f32>),
) {
    let np = k & !63;
    let (rows, n_tok) = (w.len() / k, y.len() / k);
    a.resize(n_tok * np, 0.0);
    for (t, at) in a.chunks_exact_mut(np.max(1)).enumerate() {
        // SAFETY: this function's features; token t has k >= np values.
        unsafe { widen_pairs_by_chain(&y[t * k..][..k], at) };
    }
    let a = &a[..];
    // Three rows by four tokens: twelve independent sums of two dependent multiply-adds a
    // step each keep both FMA pipes busy, the fastest of the shapes measured
    // (docs/perf-log.md, "F16 and BF16 kernels").
    const R: usize = 3;
    const T: usize = 4;
    // About 32 rows (256 KiB of f32 at 2048 values a row), a whole number of tiles: blocks of
    // 32 left two rows of every block to tiles of one row.
    const BLOCK: usize = 32 / R * R;
    for r0 in (0..rows).step_by(BLOCK) {
        let rs = r0..(r0 + BLOCK).min(rows);
        wf.resize(rs.len() * np, 0.0);
        for (r, at) in rs.clone().zip(wf.chunks_exact_mut(np.max(1))) {
            // SAFETY: as above, for row r.
            unsafe { widen_pairs_by_chain(&w[r * k..][..k], at) };
        }
        let wf = &wf[..];
        let row = |r: usize| wf[(r - r0) * np..].as_ptr();
        let tok = |t: usize| a[t * np..].as_ptr();
        macro_rules! tiles {
            ($r:expr, $t:expr, $ri:expr, $ti:expr) => {{
                let (ri, ti) = ($ri, $ti);
                // SAFETY: this function's features; rows ri.. and tokens ti.. exist, each
                // with np values in its copy.
                let s = unsafe {
                    pair_tile::<{ $r }, { $t }>(
                        std::array::from_fn(|i| row(ri + i)),
                        std::array::from_fn(|i| tok(ti + i)),
                        np,
                    )
                };
                for (t, s) in s.iter().enumerate() {
                    parts[(ti + t) * rows + ri..][..$r].copy_from_slice(s);
                }
            }};
        }
        // Whole tiles of R rows by T tokens, then the rows and tokens left one at a time.
        let mut t0 = 0;
        while t0 < n_tok {
            let whole = n_tok - t0 >= T;
            let mut r = rs.start;
            while r + R <= rs.end {
                if whole {
                    tiles!(R, T, r, t0);
                } else {
                    tiles!(R, 1, r, t0);
                }
                r += R;
            }
            // Rows left: two at a time before one (a row alone by T tokens takes 2T + 2
            // loads for 2T multiply-adds).
            while r + 2 <= rs.end {
                if whole {
                    tiles!(2, T, r, t0);
                } else {
                    tiles!(2, 1, r, t0);
                }
                r += 2;
            }
            while r < rs.end {
                if whole {
                    tiles!(1, T, r, t0);
                } else {
                    tiles!(1, 1, r, t0);
                }
                r += 1;
            }
            t0 += if whole { T } else { 1 };
        }
    }
}

/// Every row of `w` with every token of `y` (`k` values each), into `out` (`(n_tok, rows)`):
/// the 64-value steps in tiles under FTZ and DAZ ([`tile_sums_avx2`]), then each output's
/// leftovers; a call that underflowed computed again by hand ([`dot_bf16_avx2`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `w.len()` and `y.len()` must be multiples of `k > 0` and
/// `out` `(y.len() / k) * (w.len() / k)` long.
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_avx2_unchecked(w: &[bf16], y: &[bf16], k: usize, out: &mut [f32]) {
    TILE_COPIES.with_borrow_mut(|(a, wf)| {
        // SAFETY: the caller's CPU and sizes.
        unsafe {
            outputs_avx2((w, y, k), out, |parts| {
                tile_sums_avx2(w, y, k, parts, (a, wf))
            });
        }
    });
}

thread_local! {
    /// Each thread's tokens and block of rows of a tile call, widened ([`tile_sums_avx2`]).
    static TILE_COPIES: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

tiled_entry! {
    /// The AVX2 BF16 tile entry ([`crate::GemmFn`]).
    gemm_avx2: bf16 => gemm_avx2_unchecked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::dot::vec_dot_bf16_bf16;

    fn avx2_fma() -> bool {
        crate::Cpu::detect().avx2()
    }

    /// Rows whose first pair makes lane 0 of the first accumulator `2^-126 - 2^-150`: the odd
    /// products first, `2^-63 * 2^-63`, then `2^-75 * -2^-75`. The reference rounds that to
    /// the subnormal grid, a tie, to even: `2^-126`, normal, kept. FTZ flushes it (tiny
    /// however the CPU detects tininess), so the fast sums alone give zero.
    fn edge_row(k: usize, sign: f32) -> (Vec<bf16>, Vec<bf16>) {
        let mut x = vec![bf16::ZERO; k];
        let mut y = vec![bf16::ZERO; k];
        let p = |e: i32| bf16::from_f32(2f32.powi(e));
        (x[0], y[0]) = (p(-75), bf16::from_f32(-sign * 2f32.powi(-75)));
        (x[1], y[1]) = (p(-63), bf16::from_f32(sign * 2f32.powi(-63)));
        (x, y)
    }

    /// Values of modest size: no product or partial sum comes near f32's subnormals.
    fn modest(n: usize, seed: u32) -> Vec<bf16> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                bf16::from_f32((s % 2001) as f32 / 1000.0 - 1.0)
            })
            .collect()
    }

    #[test]
    fn the_control_word_reports_a_flushed_result_and_is_restored() {
        if !avx2_fma() {
            eprintln!("no AVX2/FMA on this CPU: the AVX2 BF16 kernels cannot run here");
            return;
        }
        let before = mxcsr();
        for k in [64, 200, 2048] {
            let (x, y) = (modest(3 * k, 1), modest(k, 2));
            let mut parts = vec![[0f32; 2]; 3];
            // SAFETY: AVX2 and FMA (checked).
            let ((), flushed) = flushing(|| unsafe { row_sums_avx2(&x, k, &y, &mut parts) });
            assert!(!flushed, "{k} values of modest size: no result is tiny");
            let (x, y) = edge_row(k, 1.0);
            // SAFETY: as above.
            let ((), flushed) = flushing(|| unsafe { row_sums_avx2(&x, k, &y, &mut parts[..1]) });
            assert!(
                flushed,
                "{k} values: the edge's result is flushed and says so"
            );
            let want = vec_dot_bf16_bf16(&x, &y);
            assert_eq!(want, 2f32.powi(-126), "the reference keeps the rounded tie");
            assert_ne!(parts[0][0], want, "the fast sums alone differ there");
        }
        // (The flags are sticky: the reference's own arithmetic above sets some.)
        assert_eq!(
            mxcsr() & !MXCSR_FLAGS,
            before & !MXCSR_FLAGS,
            "the control word is as it was"
        );
    }

    #[test]
    fn rows_and_tiles_take_the_exact_way_where_a_result_was_flushed() {
        if !avx2_fma() {
            eprintln!("no AVX2/FMA on this CPU: the AVX2 BF16 kernels cannot run here");
            return;
        }
        for k in [64, 130, 2048] {
            for sign in [1.0, -1.0] {
                // Four rows, the edge row among rows of modest values; three tokens, the edge
                // token among them.
                let (ex, ey) = edge_row(k, sign);
                let mut x = modest(4 * k, 3);
                x[2 * k..3 * k].copy_from_slice(&ex);
                let mut y = modest(3 * k, 4);
                y[k..2 * k].copy_from_slice(&ey);
                let want =
                    |r: usize, t: usize| vec_dot_bf16_bf16(&x[r * k..][..k], &y[t * k..][..k]);
                let mut out = vec![f32::NAN; 4];
                // SAFETY: AVX2 and FMA (checked); four rows of k values, one token.
                unsafe { gemv_avx2_unchecked(&x, k, &y[k..2 * k], &mut out) };
                for (r, got) in out.iter().enumerate() {
                    assert_eq!(got.to_bits(), want(r, 1).to_bits(), "{k} values, row {r}");
                }
                let mut out = vec![f32::NAN; 12];
                // SAFETY: as above; three tokens.
                unsafe { gemm_avx2_unchecked(&x, &y, k, &mut out) };
                for (i, got) in out.iter().enumerate() {
                    let (t, r) = (i / 4, i % 4);
                    assert_eq!(
                        got.to_bits(),
                        want(r, t).to_bits(),
                        "{k} values, row {r}, token {t}"
                    );
                }
            }
        }
    }
}

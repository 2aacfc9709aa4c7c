//! AVX-512 VNNI prefill kernels with one weight row per i32 lane ("rows in lanes").
//!
//! The tiles of [`super::avx512_ktile`] put 64 values of one row in a register and dot them
//! with 64 bytes of one token: every (row, token, block) ends as sixteen lanes that must be
//! scaled per sub-block (`vpackssdw`, `vpmaddwd`, `vpdpwssd`) and reduced across the register
//! (shuffles), so that four `vpdpbusd` carry about eight more instructions, most of them on the
//! one shuffle port. Here a group of sixteen rows is first transposed, once per call, so that a
//! register holds the same four values of each of the sixteen rows; a `vpdpbusd` against those
//! four values of one token (broadcast from memory, a load) then adds to each row's own lane.
//! A sub-block's dot product takes eight `vpdpbusd` a token and ends in its lane, scaled by one
//! `vpmulld` against the sixteen rows' scales, with nothing to reduce. The transposition and
//! the unpacking of the scales are paid once per sixteen rows and call, and shared by every
//! token of the batch.
//!
//! Three families: Q4_K in the repacked order, Q6_K and the 32-value formats in `vec_dot`
//! order (see each section). Each keeps its format's float order, lane by lane: for Q4_K each
//! block's exact integer totals converted, one fused multiply-add with `d_x * d_y` (`dmin_x *
//! d_y`) per block and `main - mins` at the end (`reference::dot::vec_dot_q4_k_q8_k_rows8`);
//! for the others ggml's eight integer lanes per block, each fused into its own float lane,
//! added as `avx2::hsum` adds them. Integer sums are exact in any order, so every output has
//! the bits of the row kernel (G1, D1). The callers (`lanes_then_tiles`) give batches of at
//! least [`LANES_MIN_TOKENS`] tokens and whole groups of sixteen rows to these kernels, and
//! the rest to the older tiles.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::avx512_ktile::q8_k_pair_sums;
use crate::blocks::*;

/// Rows per group: one per i32 lane of a 512-bit register.
pub(super) const ROWS: usize = 16;

/// The first `n` elements of a scratch buffer that is only ever grown, never cleared: the
/// kernels write every element before they read it.
#[inline]
fn grown<T: Copy>(v: &mut Vec<T>, n: usize, zero: T) -> &mut [T] {
    if v.len() < n {
        v.resize(n, zero);
    }
    &mut v[..n]
}

/// The rows of group `r0..r0 + 16` of a matrix of `per_row` blocks a row.
#[inline]
fn group_rows<W>(w: &[W], per_row: usize, r0: usize) -> [&[W]; ROWS] {
    std::array::from_fn(|r| &w[(r0 + r) * per_row..][..per_row])
}

/// `$pass!(T, t0)` for tokens `t0..t0 + T` over tokens `0..$n_tok`: passes of `$full`, then
/// one pass of those left (`$rest` lists every count below `$full`), so that no token takes a
/// pass of its own: each pass reads the group's transposed weights once.
macro_rules! token_passes {
    ($n_tok:expr, $pass:ident, $full:expr, [$($rest:literal)*]) => {{
        let mut t0 = 0;
        while $n_tok - t0 >= $full {
            $pass!($full, t0);
            t0 += $full;
        }
        match $n_tok - t0 {
            $($rest => $pass!($rest, t0),)*
            _ => {}
        }
    }};
}

/// One Q4_K block of sixteen rows, transposed: what the tokens' loop reads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Q4KLanes {
    /// `qs[m][r]`: bytes `4m..4m + 4` of row `r`'s quants (`m = 8j + k`: values `4k..4k + 4`
    /// of sub-block `2j` in the low nibbles, of `2j + 1` in the high nibbles).
    qs: [[u32; ROWS]; 32],
    /// Sub-block `s`'s scale of row `r`.
    scales: [[i32; ROWS]; 8],
    /// The mins of sub-blocks `2j` (low i16) and `2j + 1` (high i16) of row `r`.
    mins: [[u32; ROWS]; 4],
    d: [f32; ROWS],
    dmin: [f32; ROWS],
}

const ZERO: Q4KLanes = Q4KLanes {
    qs: [[0; ROWS]; 32],
    scales: [[0; ROWS]; 8],
    mins: [[0; ROWS]; 4],
    d: [0.0; ROWS],
    dmin: [0.0; ROWS],
};

thread_local! {
    /// Each thread's transposed group, reused from call to call.
    static SCRATCH: RefCell<(Vec<Q4KLanes>, Vec<[i16; 8]>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The sixteen registers transposed as a 16x16 matrix of i32: lane `r` of output `c` is lane
/// `c` of input `r`.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    // Per 128-bit lane of rows a, b: [a0 b0 a1 b1] and [a2 b2 a3 b3].
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    // u[4i + e], 128-bit lane L: rows 4i..4i + 4 of column 4L + e.
    let u: [__m512i; 16] = std::array::from_fn(|n| {
        let (i, e) = (n / 4, n % 4);
        let (a, b) = (t[4 * i + e / 2], t[4 * i + 2 + e / 2]);
        if e % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    let mut out = [_mm512_setzero_si512(); 16];
    for e in 0..4 {
        let p0 = _mm512_shuffle_i32x4::<0x44>(u[e], u[4 + e]);
        let p1 = _mm512_shuffle_i32x4::<0xEE>(u[e], u[4 + e]);
        let q0 = _mm512_shuffle_i32x4::<0x44>(u[8 + e], u[12 + e]);
        let q1 = _mm512_shuffle_i32x4::<0xEE>(u[8 + e], u[12 + e]);
        out[e] = _mm512_shuffle_i32x4::<0x88>(p0, q0);
        out[4 + e] = _mm512_shuffle_i32x4::<0xDD>(p0, q0);
        out[8 + e] = _mm512_shuffle_i32x4::<0x88>(p1, q1);
        out[12 + e] = _mm512_shuffle_i32x4::<0xDD>(p1, q1);
    }
    out
}

/// Block `b` of sixteen rows (`rows[r]` is row `r`'s blocks) in [`Q4KLanes`] form.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn q4_k_lanes(rows: &[&[BlockQ4K]; ROWS], b: usize, g: &mut Q4KLanes) {
    for half in 0..2 {
        // SAFETY: 64 readable bytes of each row's 128 quant bytes.
        let r: [__m512i; 16] = std::array::from_fn(|r| unsafe {
            _mm512_loadu_si512(rows[r][b].qs.as_ptr().add(64 * half).cast())
        });
        for (c, v) in transpose16(r).into_iter().enumerate() {
            // SAFETY: 64 writable bytes (a row of `qs`).
            unsafe { _mm512_storeu_si512(g.qs[16 * half + c].as_mut_ptr().cast(), v) };
        }
    }
    let mut d = [0u16; ROWS];
    let mut dmin = [0u16; ROWS];
    for (r, x) in rows.iter().enumerate() {
        let x = &x[b];
        let (sc, mn) = k_scales_mins(&x.scales);
        for (scales, &sc) in g.scales.iter_mut().zip(&sc) {
            scales[r] = sc as i32;
        }
        for j in 0..4 {
            g.mins[j][r] = mn[2 * j] as u32 | (mn[2 * j + 1] as u32) << 16;
        }
        d[r] = x.d.to_bits();
        dmin[r] = x.dmin.to_bits();
    }
    // SAFETY: 32 readable bytes each, 64 writable.
    unsafe {
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr().cast()));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(dmin.as_ptr().cast()));
        _mm512_storeu_ps(g.d.as_mut_ptr(), d);
        _mm512_storeu_ps(g.dmin.as_mut_ptr(), dmin);
    }
}

/// Four bytes of `p` as one i32 in every lane (a broadcast load).
#[inline(always)]
unsafe fn bcast4<T>(p: *const T) -> __m512i {
    // SAFETY: the caller's: 4 readable bytes at `p`.
    unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Sixteen rows (`g`, block by block) times tokens `t0..t0 + T` (`ys[t]`: token `t0 + t`'s
/// blocks; `pair_sums[t][b]`: its sub-block sums), into `out[(t0 + t) * rows + r0 ..][..16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn q4_k_lanes_tokens<const T: usize>(
    g: &[Q4KLanes],
    ys: [&[BlockQ8K]; T],
    pair_sums: [&[[i16; 8]]; T],
    out: &mut [f32],
    (rows, r0, t0): (usize, usize, usize),
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let mut main = [_mm512_setzero_ps(); T];
    let mut mins = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        let y: [*const i8; T] = std::array::from_fn(|t| ys[t][b].qs.as_ptr());
        let mut tot = [_mm512_setzero_si512(); T];
        // Sub-blocks 2j and 2j + 1 side by side: one load of the nibbles for both, and two
        // chains of `vpdpbusd` a token (each waits 5 cycles on the one before it).
        for j in 0..4 {
            let mut lo = [_mm512_setzero_si512(); T];
            let mut hi = [_mm512_setzero_si512(); T];
            for k in 0..8 {
                // SAFETY: a row of `qs` (64 bytes).
                let raw = unsafe { _mm512_loadu_si512(g.qs[8 * j + k].as_ptr().cast()) };
                let (wlo, whi) = (
                    _mm512_and_si512(raw, m4),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4),
                );
                for t in 0..T {
                    // SAFETY: values 64j + 4k..+4 and 64j + 32 + 4k..+4 of a 256-value block.
                    let (alo, ahi) = unsafe {
                        (
                            bcast4(y[t].add(64 * j + 4 * k)),
                            bcast4(y[t].add(64 * j + 32 + 4 * k)),
                        )
                    };
                    lo[t] = _mm512_dpbusd_epi32(lo[t], wlo, alo);
                    hi[t] = _mm512_dpbusd_epi32(hi[t], whi, ahi);
                }
            }
            // SAFETY: rows of `scales` (64 bytes).
            let (slo, shi) = unsafe {
                (
                    _mm512_loadu_si512(g.scales[2 * j].as_ptr().cast()),
                    _mm512_loadu_si512(g.scales[2 * j + 1].as_ptr().cast()),
                )
            };
            for t in 0..T {
                let both = _mm512_add_epi32(
                    _mm512_mullo_epi32(lo[t], slo),
                    _mm512_mullo_epi32(hi[t], shi),
                );
                tot[t] = _mm512_add_epi32(tot[t], both);
            }
        }
        // SAFETY: 64 readable bytes each.
        let (dx, dminx) = unsafe {
            (
                _mm512_loadu_ps(g.d.as_ptr()),
                _mm512_loadu_ps(g.dmin.as_ptr()),
            )
        };
        for t in 0..T {
            let ps = &pair_sums[t][b];
            let mut m = _mm512_setzero_si512();
            for j in 0..4 {
                // SAFETY: a row of `mins`; i16 elements 2j, 2j + 1 of `ps`.
                let (mn, p) = unsafe {
                    (
                        _mm512_loadu_si512(g.mins[j].as_ptr().cast()),
                        bcast4(ps.as_ptr().add(2 * j)),
                    )
                };
                m = _mm512_dpwssd_epi32(m, mn, p);
            }
            let yd = _mm512_set1_ps(ys[t][b].d);
            main[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[t]), _mm512_mul_ps(dx, yd), main[t]);
            mins[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dminx, yd), mins[t]);
        }
    }
    for t in 0..T {
        let o = &mut out[(t0 + t) * rows + r0..][..ROWS];
        // SAFETY: 16 writable floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(main[t], mins[t])) };
    }
}

/// Tokens per pass over a group's blocks.
const TOKENS: usize = 8;

/// Rows `0..rows / 16 * 16` of a Q4_K matrix in the repacked order times every token (`a`,
/// `per_row` blocks a token), into `out` (`(n_tok, rows)`); the last `rows % 16` rows are left
/// to the caller. Returns the rows done.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/DQ, AVX-512 VNNI, AVX2, FMA and F16C; `w` holds `rows *
/// per_row` blocks, `a` `n_tok * per_row` and `out` `n_tok * rows` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q4_k_rows8(
    w: &[BlockQ4K],
    a: &[BlockQ8K],
    per_row: usize,
    out: &mut [f32],
) -> usize {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let groups = rows / ROWS;
    SCRATCH.with_borrow_mut(|(g, pair_sums)| {
        let g = grown(g, per_row, ZERO);
        // Each token block's sub-block sums, which the mins multiply.
        pair_sums.clear();
        pair_sums.extend(a.iter().map(|y| {
            let mut ps = [0i16; 8];
            // SAFETY: 16 writable bytes.
            unsafe { _mm_storeu_si128(ps.as_mut_ptr().cast(), q8_k_pair_sums(y)) };
            ps
        }));
        for r0 in (0..groups).map(|i| i * ROWS) {
            let xs = group_rows(w, per_row, r0);
            for (b, g) in g.iter_mut().enumerate() {
                q4_k_lanes(&xs, b, g);
            }
            let tok = |t: usize| &a[t * per_row..][..per_row];
            let ps = |t: usize| &pair_sums[t * per_row..][..per_row];
            macro_rules! pass {
                ($n:expr, $t0:expr) => {
                    q4_k_lanes_tokens::<{ $n }>(
                        g,
                        std::array::from_fn(|t| tok($t0 + t)),
                        std::array::from_fn(|t| ps($t0 + t)),
                        out,
                        (rows, r0, $t0),
                    )
                };
            }
            token_passes!(n_tok, pass, TOKENS, [1 2 3 4 5 6 7]);
        }
    });
    groups * ROWS
}

/// One Q6_K block of sixteen rows, for `vpdpwssd`: the values times their scales as i16, and
/// the scales for the `-32` offset.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Q6KLanes {
    /// `w[16 l + 2 c + p][r]`: the i16 pair of values `32c + 4l + 2p` and `+ 1` of row `r`,
    /// each times its scale (`q` in 0..64 unsigned, so that the lanes are ggml's).
    w: [[u32; ROWS]; 128],
    /// `offset[l][r]`: `-32 * scale[2l]` and `-32 * scale[2l + 1]` of row `r` as an i16 pair,
    /// against the token's `bsum[2l]`, `bsum[2l + 1]`.
    offset: [[u32; ROWS]; 8],
    d: [f32; ROWS],
}

const ZERO6: Q6KLanes = Q6KLanes {
    w: [[0; ROWS]; 128],
    offset: [[0; ROWS]; 8],
    d: [0.0; ROWS],
};

thread_local! {
    static SCRATCH6: RefCell<(Vec<Q6KLanes>, Vec<i16>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Row `x`'s values times their scales, 32 a register (`chunk c`: values `32c..32c + 32`, as
/// dwords `16c..16c + 16` of the row's i16 pairs).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn q6_k_scaled(x: &BlockQ6K) -> [__m512i; 8] {
    let m15 = _mm256_set1_epi8(15);
    // SAFETY: 16 readable bytes.
    let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(unsafe {
        _mm_loadu_si128(x.scales.as_ptr().cast())
    }));
    let mut out = [_mm512_setzero_si512(); 8];
    for h in 0..2 {
        // SAFETY: in bounds for h < 2 (ql: 128 bytes, qh: 64).
        let (b1, b2, qh) = unsafe {
            (
                _mm256_loadu_si256(x.ql.as_ptr().add(64 * h).cast()),
                _mm256_loadu_si256(x.ql.as_ptr().add(64 * h + 32).cast()),
                _mm256_loadu_si256(x.qh.as_ptr().add(32 * h).cast()),
            )
        };
        let hi = |mask: i8| _mm256_and_si256(qh, _mm256_set1_epi8(mask));
        let q = [
            _mm256_or_si256(_mm256_and_si256(b1, m15), _mm256_slli_epi16::<4>(hi(3))),
            _mm256_or_si256(_mm256_and_si256(b2, m15), _mm256_slli_epi16::<2>(hi(12))),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15), hi(48)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15),
                _mm256_srli_epi16::<2>(hi(-64)),
            ),
        ];
        for (k, q) in q.into_iter().enumerate() {
            let c = 4 * h + k;
            let pick = _mm512_inserti64x4::<1>(
                _mm512_set1_epi16(2 * c as i16),
                _mm256_set1_epi16(2 * c as i16 + 1),
            );
            let sc = _mm512_permutexvar_epi16(pick, sc16);
            out[c] = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(q), sc);
        }
    }
    out
}

/// Block `b` of sixteen rows in [`Q6KLanes`] form.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
#[allow(clippy::needless_range_loop)] // `c` picks the inner index of every row's array
fn q6_k_lanes(rows: &[&[BlockQ6K]; ROWS], b: usize, g: &mut Q6KLanes) {
    let scaled: [[__m512i; 8]; ROWS] = std::array::from_fn(|r| q6_k_scaled(&rows[r][b]));
    for c in 0..8 {
        let cols = transpose16(std::array::from_fn(|r| scaled[r][c]));
        for (k, v) in cols.into_iter().enumerate() {
            // Dword 16c + k of the row: l = k / 2, p = k % 2.
            let (l, p) = (k / 2, k % 2);
            // SAFETY: 64 writable bytes (a row of `w`).
            unsafe { _mm512_storeu_si512(g.w[16 * l + 2 * c + p].as_mut_ptr().cast(), v) };
        }
    }
    let mut d = [0u16; ROWS];
    for (r, x) in rows.iter().enumerate() {
        let x = &x[b];
        for l in 0..8 {
            let s = |g: usize| (-32 * x.scales[g] as i32) as i16 as u16 as u32;
            g.offset[l][r] = s(2 * l) | s(2 * l + 1) << 16;
        }
        d[r] = x.d.to_bits();
    }
    // SAFETY: 32 readable bytes, 64 writable.
    unsafe {
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr().cast()));
        _mm512_storeu_ps(g.d.as_mut_ptr(), d);
    }
}

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`: the blocks; `y16[t]`: their values
/// as i16, 256 a block), into `out[(t0 + t) * rows + r0 ..][..16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn q6_k_lanes_tokens<const T: usize>(
    g: &[Q6KLanes],
    ys: [&[BlockQ8K]; T],
    y16: [&[i16]; T],
    out: &mut [f32],
    (rows, r0, t0): (usize, usize, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    for (b, g) in g.iter().enumerate() {
        // SAFETY: 64 readable bytes.
        let dx = unsafe { _mm512_loadu_ps(g.d.as_ptr()) };
        let d: [__m512; T] = std::array::from_fn(|t| _mm512_mul_ps(_mm512_set1_ps(ys[t][b].d), dx));
        let v: [*const i16; T] = std::array::from_fn(|t| y16[t][256 * b..][..256].as_ptr());
        for l in 0..8 {
            // SAFETY: a row of `offset`; i16 elements 2l, 2l + 1 of the 16 bsums.
            let mut lane: [__m512i; T] = std::array::from_fn(|t| unsafe {
                _mm512_dpwssd_epi32(
                    _mm512_setzero_si512(),
                    _mm512_loadu_si512(g.offset[l].as_ptr().cast()),
                    bcast4(ys[t][b].bsums.as_ptr().add(2 * l)),
                )
            });
            // Two chains a token (p = 0 and 1), added at the end: one chain of 17 dependent
            // `vpdpwssd` (5 cycles each) a token would leave the multipliers waiting.
            let mut odd = [_mm512_setzero_si512(); T];
            let base: [*const i16; T] = std::array::from_fn(|t| v[t].wrapping_add(4 * l));
            let wl = g.w[16 * l..].as_ptr();
            macro_rules! chunk {
                ($($c:literal)*) => {$(
                    // SAFETY: rows 16l + 2c, + 1 of `w`.
                    let (w0, w1) = unsafe {
                        (
                            _mm512_loadu_si512(wl.add(2 * $c).cast()),
                            _mm512_loadu_si512(wl.add(2 * $c + 1).cast()),
                        )
                    };
                    for t in 0..T {
                        // SAFETY: AVX-512 VNNI (this function's features); values 32c + 4l
                        // .. + 4 of the token's block.
                        unsafe {
                            std::arch::asm!(
                                "vpdpwssd {e}, {w0}, dword ptr [{b} + {o0}]{{1to16}}",
                                "vpdpwssd {d}, {w1}, dword ptr [{b} + {o1}]{{1to16}}",
                                e = inout(zmm_reg) lane[t],
                                d = inout(zmm_reg) odd[t],
                                w0 = in(zmm_reg) w0,
                                w1 = in(zmm_reg) w1,
                                b = in(reg) base[t],
                                o0 = const 2 * 32 * $c,
                                o1 = const 2 * (32 * $c + 2),
                                options(pure, readonly, nostack, preserves_flags),
                            );
                        }
                    }
                )*};
            }
            chunk!(0 1 2 3 4 5 6 7);
            for t in 0..T {
                let lane = _mm512_add_epi32(lane[t], odd[t]);
                acc[t][l] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(lane), acc[t][l]);
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as `avx2::hsum` adds the lanes.
        let even = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
        let odd = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
        let o = &mut out[(t0 + t) * rows + r0..][..ROWS];
        // SAFETY: 16 writable floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_add_ps(even, odd)) };
    }
}

/// Tokens per pass over a group's Q6_K blocks.
const TOKENS6: usize = 6;

/// Rows `0..rows / 16 * 16` of a Q6_K matrix (`vec_dot` order) times every token, as
/// [`q4_k_rows8`]. Returns the rows done.
///
/// # Safety
/// As [`q4_k_rows8`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q6_k(
    w: &[BlockQ6K],
    a: &[BlockQ8K],
    per_row: usize,
    out: &mut [f32],
) -> usize {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let groups = rows / ROWS;
    SCRATCH6.with_borrow_mut(|(g, y16)| {
        let (g, y16) = (grown(g, per_row, ZERO6), grown(y16, a.len() * 256, 0));
        for (y, v) in a.iter().zip(y16.chunks_exact_mut(256)) {
            for (c, v) in v.chunks_exact_mut(32).enumerate() {
                // SAFETY: 32 readable bytes, 64 writable.
                unsafe {
                    let q = _mm256_loadu_si256(y.qs.as_ptr().add(32 * c).cast());
                    _mm512_storeu_si512(v.as_mut_ptr().cast(), _mm512_cvtepi8_epi16(q));
                }
            }
        }
        for r0 in (0..groups).map(|i| i * ROWS) {
            let xs = group_rows(w, per_row, r0);
            for (b, g) in g.iter_mut().enumerate() {
                q6_k_lanes(&xs, b, g);
            }
            let tok = |t: usize| &a[t * per_row..][..per_row];
            let v = |t: usize| &y16[t * per_row * 256..][..per_row * 256];
            macro_rules! pass {
                ($n:expr, $t0:expr) => {
                    q6_k_lanes_tokens::<{ $n }>(
                        g,
                        std::array::from_fn(|t| tok($t0 + t)),
                        std::array::from_fn(|t| v($t0 + t)),
                        out,
                        (rows, r0, $t0),
                    )
                };
            }
            token_passes!(n_tok, pass, TOKENS6, [1 2 3 4 5]);
        }
    });
    groups * ROWS
}

// ---------------------------------------------------------------------------------------------
// The 32-value block formats in `vec_dot` order: eight float lanes a (row, token), lane `l`
// taking values `4l..4l + 4` of every block, fused by `d_x * d_y` block by block, added as
// `avx2::hsum` adds them at the end. Here lane `l` of sixteen rows is one register: a block
// of a token is eight `vpdpbusd` (four values of sixteen rows each), eight conversions and
// eight fused multiply-adds, every one of them doing sixteen rows' work.

/// A 32-value weight format for [`lanes32`]: its values as unsigned bytes (`x + OFFSET`), its
/// scale, and for the formats with a min, the min (against the token's `s`).
pub(super) trait Lanes32 {
    type W: Copy;
    type A: Copy;
    /// What [`Self::bytes`] adds to each value: the kernel subtracts `OFFSET * sum(y)`.
    const OFFSET: i32;
    const MIN: bool;
    /// # Safety
    /// AVX2.
    unsafe fn bytes(x: &Self::W) -> __m256i;
    /// The f16 bits of `d` and of the min (0 without one).
    fn heads(x: &Self::W) -> (u16, u16);
    /// The token block's bytes, `d` and `s` (f16 bits; 0 without `s`).
    fn token(y: &Self::A) -> (&[i8; 32], u16, u16);
}

macro_rules! lanes32 {
    ($name:ident: $w:ty, $a:ty, offset $off:literal, min $min:literal,
     |$x:ident| $bytes:expr, heads $heads:expr, token |$y:ident| $tok:expr) => {
        pub(super) struct $name;
        impl Lanes32 for $name {
            type W = $w;
            type A = $a;
            const OFFSET: i32 = $off;
            const MIN: bool = $min;
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn bytes($x: &$w) -> __m256i {
                $bytes
            }
            #[inline]
            fn heads($x: &$w) -> (u16, u16) {
                $heads
            }
            #[inline]
            fn token($y: &$a) -> (&[i8; 32], u16, u16) {
                $tok
            }
        }
    };
}

use super::avx2::{load32, nibbles, q5_bytes};

lanes32!(Q4_0: BlockQ4_0, BlockQ8_0, offset 8, min false,
    |x| nibbles(&x.qs), heads (x.d.to_bits(), 0), token |y| (&y.qs, y.d.to_bits(), 0));
lanes32!(Q5_0: BlockQ5_0, BlockQ8_0, offset 16, min false,
    |x| q5_bytes(&x.qs, x.qh), heads (x.d.to_bits(), 0), token |y| (&y.qs, y.d.to_bits(), 0));
lanes32!(Q8_0: BlockQ8_0, BlockQ8_0, offset 128, min false,
    |x| _mm256_xor_si256(load32(&x.qs), _mm256_set1_epi8(-128)),
    heads (x.d.to_bits(), 0), token |y| (&y.qs, y.d.to_bits(), 0));
lanes32!(Q4_1: BlockQ4_1, BlockQ8_1, offset 0, min true,
    |x| nibbles(&x.qs), heads (x.d.to_bits(), x.m.to_bits()),
    token |y| (&y.qs, y.d.to_bits(), y.s.to_bits()));
lanes32!(Q5_1: BlockQ5_1, BlockQ8_1, offset 0, min true,
    |x| q5_bytes(&x.qs, x.qh), heads (x.d.to_bits(), x.m.to_bits()),
    token |y| (&y.qs, y.d.to_bits(), y.s.to_bits()));

/// One block of sixteen rows of a 32-value format, transposed.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block32Lanes {
    /// `q[l][r]`: values `4l..4l + 4` of row `r` (plus the offset) as bytes.
    q: [[u32; ROWS]; 8],
    d: [f32; ROWS],
    m: [f32; ROWS],
}

const ZERO32: Block32Lanes = Block32Lanes {
    q: [[0; ROWS]; 8],
    d: [0.0; ROWS],
    m: [0.0; ROWS],
};

/// What the rows need of a token block: `-OFFSET * sum` of each lane's four values, `d`, `s`.
#[derive(Clone, Copy)]
#[repr(C)]
struct Tok32 {
    bias: [i32; 8],
    d: f32,
    s: f32,
}

thread_local! {
    static SCRATCH32: RefCell<(Vec<Block32Lanes>, Vec<Tok32>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Blocks `b` and `b + 1` (if there is one) of sixteen rows in [`Block32Lanes`] form.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
fn lanes32_pair<K: Lanes32>(rows: &[&[K::W]; ROWS], b: usize, g: &mut [Block32Lanes]) {
    let two = g.len() > 1;
    let r: [__m512i; 16] = std::array::from_fn(|r| {
        // SAFETY: AVX2 (this function's features).
        let lo = unsafe { K::bytes(&rows[r][b]) };
        let hi = if two {
            // SAFETY: as above.
            unsafe { K::bytes(&rows[r][b + 1]) }
        } else {
            _mm256_setzero_si256()
        };
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    });
    let cols = transpose16(r);
    for (i, g) in g.iter_mut().enumerate() {
        for l in 0..8 {
            // SAFETY: 64 writable bytes (a row of `q`).
            unsafe { _mm512_storeu_si512(g.q[l].as_mut_ptr().cast(), cols[8 * i + l]) };
        }
        let mut d = [0u16; ROWS];
        let mut m = [0u16; ROWS];
        for (r, x) in rows.iter().enumerate() {
            (d[r], m[r]) = K::heads(&x[b + i]);
        }
        // SAFETY: 32 readable bytes each, 64 writable.
        unsafe {
            _mm512_storeu_ps(
                g.d.as_mut_ptr(),
                _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr().cast())),
            );
            _mm512_storeu_ps(
                g.m.as_mut_ptr(),
                _mm512_cvtph_ps(_mm256_loadu_si256(m.as_ptr().cast())),
            );
        }
    }
}

/// Sixteen rows (`g`) times tokens `t0..t0 + T` (`ys[t]`, `toks[t]`: their blocks and what
/// [`Tok32`] keeps of them), into `out[(t0 + t) * rows + r0 ..][..16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // `l` and `t` index several arrays in step
fn lanes32_tokens<K: Lanes32, const T: usize>(
    g: &[Block32Lanes],
    ys: [&[K::A]; T],
    toks: [&[Tok32]; T],
    out: &mut [f32],
    (rows, r0, t0): (usize, usize, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let mut mins = [_mm512_setzero_ps(); T];
    for (b, g) in g.iter().enumerate() {
        // SAFETY: 64 readable bytes each.
        let (dx, mx) = unsafe { (_mm512_loadu_ps(g.d.as_ptr()), _mm512_loadu_ps(g.m.as_ptr())) };
        let tk: [&Tok32; T] = std::array::from_fn(|t| &toks[t][b]);
        let y: [*const i8; T] = std::array::from_fn(|t| K::token(&ys[t][b]).0.as_ptr());
        let d: [__m512; T] = std::array::from_fn(|t| _mm512_mul_ps(dx, _mm512_set1_ps(tk[t].d)));
        if K::MIN {
            for t in 0..T {
                mins[t] = _mm512_fmadd_ps(mx, _mm512_set1_ps(tk[t].s), mins[t]);
            }
        }
        for l in 0..8 {
            // SAFETY: a row of `q`.
            let w = unsafe { _mm512_loadu_si512(g.q[l].as_ptr().cast()) };
            for t in 0..T {
                let start = if K::OFFSET != 0 {
                    _mm512_set1_epi32(tk[t].bias[l])
                } else {
                    _mm512_setzero_si512()
                };
                // SAFETY: values 4l..4l + 4 of the token's 32.
                let a = unsafe { bcast4(y[t].add(4 * l)) };
                let s = _mm512_dpbusd_epi32(start, w, a);
                acc[t][l] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(s), acc[t][l]);
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as `avx2::hsum` adds the lanes.
        let even = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
        let odd = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
        let mut v = _mm512_add_ps(even, odd);
        if K::MIN {
            v = _mm512_add_ps(v, mins[t]);
        }
        let o = &mut out[(t0 + t) * rows + r0..][..ROWS];
        // SAFETY: 16 writable floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    }
}

/// Tokens per pass over a group's 32-value blocks (eight float lanes each).
const TOKENS32: usize = 3;

/// Rows `0..rows / 16 * 16` of a 32-value format matrix (`vec_dot` order) times every token,
/// as [`q4_k_rows8`]. Returns the rows done.
///
/// # Safety
/// As [`q4_k_rows8`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn lanes32<K: Lanes32>(
    w: &[K::W],
    a: &[K::A],
    per_row: usize,
    out: &mut [f32],
) -> usize {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    let groups = rows / ROWS;
    SCRATCH32.with_borrow_mut(|(g, toks)| {
        let g = grown(g, per_row, ZERO32);
        toks.clear();
        toks.extend(a.iter().map(|y| {
            let (qs, d, s) = K::token(y);
            // SAFETY: 32 readable bytes.
            let q = unsafe { _mm256_loadu_si256(qs.as_ptr().cast()) };
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
            let mut bias = [0i32; 8];
            let neg = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-K::OFFSET));
            // SAFETY: 32 writable bytes.
            unsafe { _mm256_storeu_si256(bias.as_mut_ptr().cast(), neg) };
            let f = |h: u16| half::f16::from_bits(h).to_f32();
            Tok32 {
                bias,
                d: f(d),
                s: f(s),
            }
        }));
        for r0 in (0..groups).map(|i| i * ROWS) {
            let xs = group_rows(w, per_row, r0);
            for (i, g) in g.chunks_mut(2).enumerate() {
                lanes32_pair::<K>(&xs, 2 * i, g);
            }
            let tok = |t: usize| &a[t * per_row..][..per_row];
            let tk = |t: usize| &toks[t * per_row..][..per_row];
            macro_rules! pass {
                ($n:expr, $t0:expr) => {
                    lanes32_tokens::<K, { $n }>(
                        g,
                        std::array::from_fn(|t| tok($t0 + t)),
                        std::array::from_fn(|t| tk($t0 + t)),
                        out,
                        (rows, r0, $t0),
                    )
                };
            }
            token_passes!(n_tok, pass, TOKENS32, [1 2]);
        }
    });
    groups * ROWS
}

/// Batches at least this long take the rows-in-lanes kernels, whose transposition of the
/// weights is paid once per call.
const LANES_MIN_TOKENS: usize = 8;

/// A rows-in-lanes kernel (`lanes`, which does whole groups of sixteen rows and returns how
/// many rows it did) for batches of at least [`LANES_MIN_TOKENS`], and `tiles` for the rows
/// left over and for shorter batches.
///
/// # Safety
/// The CPU must have what both kernels need; the operands' sizes agree (`gemm_operands`).
#[inline]
pub(super) unsafe fn lanes_then_tiles<W, A>(
    w: &[W],
    a: &[A],
    per_row: usize,
    out: &mut [f32],
    lanes: unsafe fn(&[W], &[A], usize, &mut [f32]) -> usize,
    tiles: unsafe fn(&[W], &[A], usize, &mut [f32]),
) {
    let rows = w.len() / per_row;
    let n_tok = a.len() / per_row;
    if n_tok < LANES_MIN_TOKENS || rows < ROWS {
        // SAFETY: the caller's.
        return unsafe { tiles(w, a, per_row, out) };
    }
    // SAFETY: the caller's.
    let done = unsafe { lanes(w, a, per_row, out) };
    if done < rows {
        let left = rows - done;
        let mut tail = vec![0.0f32; left * n_tok];
        // SAFETY: the caller's, for the rows left (their sizes agree as well).
        unsafe { tiles(&w[done * per_row..], a, per_row, &mut tail) };
        for (t, o) in tail.chunks_exact(left).enumerate() {
            out[t * rows + done..][..left].copy_from_slice(o);
        }
    }
}

//! Attention heads with AVX2, FMA and F16C, for x86-64 CPUs without AVX-512 (head widths of 64,
//! 128 and 256 values): the arithmetic of [`super::attend_heads`] (ggml's online softmax with an
//! F16 accumulator) in eight-lane registers, laid out as the AVX-512 path ([`super::avx512`]) is.
//!
//! - The exponentials eight at a time by [`exp8`], libm's `expf` bits (checked at first use, see
//!   [`vector_exp_matches_libm`]), after one pass over a head's scores for its running maximum.
//! - The scores eight positions at a time: each key row dotted with the query in ggml's four
//!   sixteen-lane accumulators, folded to eight lanes in registers, and the eight positions'
//!   sums across the last eight lanes taken together, by adding registers of lanes from several
//!   positions ([`reduce8`]) in the order `reduce_add_16` adds them one position at a time.
//! - The per-position chain (multiply-add, rounding to F16 and back) on whole registers, up to
//!   four heads side by side; heads that read the same rows load each row once.
//! - For a batch, the layer's keys and values are widened to f32 once ([`Staged`]) instead of
//!   by every head of every token.

use std::arch::x86_64::*;

use half::slice::HalfFloatSliceExt;

use super::exp::{C0, C1, C2, INV_LN2_32, SHIFT, TAB};
use super::f16::{fma_for_f16_ymm, may_be_f16_tie_ymm, round_f16_ymm, F16_STEP};
use super::heads::{cap_scores, finish, AttnShape, HeadJob, HeadScratch, LayerRows, Rows};

/// `e^x` of four values in double precision, rounded to f32: [`super::avx512`]'s `exp8`, step
/// for step, with the table read by a gather.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp4(x: __m128) -> __m128 {
    let xd = _mm256_cvtps_pd(x);
    let inv = _mm256_set1_pd(INV_LN2_32);
    let kd = _mm256_fmadd_pd(xd, inv, _mm256_set1_pd(SHIFT));
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, _mm256_set1_pd(SHIFT));
    let r = _mm256_fmsub_pd(xd, inv, kd);
    let i = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    // SAFETY: entries 0..32 of `TAB` (the index is masked to five bits).
    let t = unsafe { _mm256_i64gather_epi64::<8>(TAB.as_ptr().cast(), i) };
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let p = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(p, r2, y);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
}

/// `e^x` lane by lane with libm's `expf` bits, as [`super::avx512`]'s `exp16`: infinity above
/// `ln 2^128`, zero below `ln 2^-150`, NaN for NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn exp8(x: __m256) -> __m256 {
    let lo = exp4(_mm256_castps256_ps128(x));
    let hi = exp4(_mm256_extractf128_ps::<1>(x));
    let y = _mm256_set_m128(hi, lo);
    let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(f32::from_bits(0x42b1_7217)));
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-f32::from_bits(0x42cf_f1b4)));
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    let y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), over);
    let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
    _mm256_blendv_ps(y, _mm256_add_ps(x, x), nan)
}

/// Sixteen lanes of [`exp8`] (for [`super::exp_agrees`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn exp_16(x: &mut [f32; 16]) {
    for h in x.chunks_exact_mut(8) {
        // SAFETY: eight floats each way.
        unsafe { _mm256_storeu_ps(h.as_mut_ptr(), exp8(_mm256_loadu_ps(h.as_ptr()))) };
    }
}

/// Whether [`exp8`] gives `f32::exp`'s bits on this machine (the sweep of
/// [`super::exp_agrees`], once). Where it does not (another libm), the heads keep calling
/// `f32::exp` on the slow path.
pub(crate) fn vector_exp_matches_libm() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: the callers checked AVX2, FMA and F16C.
    *OK.get_or_init(|| super::exp::exp_agrees(|x| unsafe { exp_16(x) }, 0, u32::MAX, 4093))
}

/// Whether [`heads`] takes heads of `head_dim` values on this machine (the caller checked AVX2,
/// FMA and F16C).
pub(super) fn takes(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128 | 256) && vector_exp_matches_libm()
}

/// [`super::attend_heads`] for every job of `jobs` (`scratch` holds as many), for a head width
/// [`takes`] accepts, the keys and values read from `staged` when given (it must hold every
/// position of every job). Same bits.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn heads(
    s: &AttnShape,
    jobs: &mut [HeadJob],
    scratch: &mut [HeadScratch],
    staged: Option<&Staged>,
) {
    match s.head_dim {
        64 => by_width::<8>(s, jobs, scratch, staged),
        128 => by_width::<16>(s, jobs, scratch, staged),
        256 => by_width::<32>(s, jobs, scratch, staged),
        hd => unreachable!("head width {hd} is not one `takes` accepts"),
    }
}

/// [`heads`] for `CH` registers of eight values a head, four heads at a time: their scores
/// (the heads that read the same key rows together), their weights, then their value pass side
/// by side.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn by_width<const CH: usize>(
    s: &AttnShape,
    jobs: &mut [HeadJob],
    scratch: &mut [HeadScratch],
    staged: Option<&Staged>,
) {
    assert!(scratch.len() >= jobs.len(), "a scratch per head");
    let hd = 8 * CH;
    for (jobs, scratch) in jobs.chunks_mut(4).zip(scratch.chunks_mut(4)) {
        // Each head's key and value rows: staged as f32 from its first position, or the
        // cache's F16.
        let rows: [(Rows, Rows); 4] = std::array::from_fn(|i| match (jobs.get(i), staged) {
            (None, _) => (Rows::F16(&[]), Rows::F16(&[])),
            (Some(job), Some(st)) => {
                let off = (job.kv_head * st.n_pos + job.first - st.base) * hd;
                (Rows::F32(&st.kf[off..]), Rows::F32(&st.vf[off..]))
            }
            (Some(job), None) => (Rows::F16(job.keys), Rows::F16(job.values)),
        });
        let n_pos: [usize; 4] = std::array::from_fn(|i| jobs.get(i).map_or(0, |j| j.n_pos));
        // The scores of each run of heads that read the same key rows (a token's heads of one
        // KV head, or the tokens of one head from the same first position).
        let mut i = 0;
        while i < jobs.len() {
            let e = i + rows[i..jobs.len()]
                .iter()
                .take_while(|r| r.0.same(rows[i].0))
                .count();
            let (sc, n) = (&mut scratch[i..e], &n_pos[i..e]);
            for (job, sc) in jobs[i..e].iter().zip(sc.iter_mut()) {
                sc.reserve(job.n_pos);
                query::<CH>(job.q, &mut sc.qf[..hd]);
            }
            // The rows of the run's head that sees them all (the others' end sooner).
            let keys = rows[(i..e).max_by_key(|&h| n_pos[h]).unwrap_or(i)].0;
            match e - i {
                1 => scores::<CH, 1>(s.scale, keys, n, sc),
                2 => scores::<CH, 2>(s.scale, keys, n, sc),
                3 => scores::<CH, 3>(s.scale, keys, n, sc),
                4 => scores::<CH, 4>(s.scale, keys, n, sc),
                n => unreachable!("{n} heads side by side"),
            }
            i = e;
        }
        for (job, sc) in jobs.iter().zip(scratch.iter_mut()) {
            cap_scores(s, &mut sc.scores[..job.n_pos]);
            weights(job.n_pos, sc);
        }
        let values = rows.map(|r| r.1);
        match jobs.len() {
            1 => self::values::<CH, 1>(jobs, scratch, &values),
            2 => self::values::<CH, 2>(jobs, scratch, &values),
            3 => self::values::<CH, 3>(jobs, scratch, &values),
            4 => self::values::<CH, 4>(jobs, scratch, &values),
            n => unreachable!("{n} heads side by side"),
        }
    }
}

/// A head's query rounded to F16 (as ggml converts it for the F16 keys), into `qf`.
#[inline(always)]
fn query<const CH: usize>(q: &[f32], qf: &mut [f32]) {
    let (q, qf) = (&q[..8 * CH], &mut qf[..8 * CH]);
    for c in 0..CH {
        // SAFETY: AVX, F16C (the callers' features); values 8c..8c + 8 of both.
        unsafe {
            let x = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            _mm256_storeu_ps(qf.as_mut_ptr().add(8 * c), round_f16_ymm(x));
        }
    }
}

impl Rows<'_> {
    /// Row `j` (`8 * CH` values, rows as far apart) as f32, or zeros past the rows' end.
    #[inline(always)]
    fn row8<const CH: usize>(self, j: usize) -> [__m256; CH] {
        // SAFETY: AVX and F16C (the callers' features); 8 CH values of row j where it exists.
        unsafe {
            let mut x = [_mm256_setzero_ps(); CH];
            match self {
                Rows::F32(r) => {
                    if let Some(r) = r.get(j * 8 * CH..).and_then(|r| r.get(..8 * CH)) {
                        for (c, x) in x.iter_mut().enumerate() {
                            *x = _mm256_loadu_ps(r.as_ptr().add(8 * c));
                        }
                    }
                }
                Rows::F16(r) => {
                    if let Some(r) = r.get(j * 8 * CH..).and_then(|r| r.get(..8 * CH)) {
                        for (c, x) in x.iter_mut().enumerate() {
                            *x = _mm256_cvtph_ps(_mm_loadu_si128(r.as_ptr().add(8 * c).cast()));
                        }
                    }
                }
            }
            x
        }
    }
}

/// `q . k` of a query (`8 * CH` values) and a key row, in ggml's four sixteen-lane accumulators
/// over 64-value steps (`acc[2a + h]`: lanes `8h..8h + 8` of accumulator `a`), the accumulators
/// added pairwise, `(a0 + a2) + (a1 + a3)`, and the two halves of the sixteen lanes added: the
/// first step of `reduce_add_16`. Lane `l` of the result is its `t8[l]`.
#[inline(always)]
fn fold<const CH: usize>(q: &[f32], k: &[__m256; CH]) -> __m256 {
    let q = &q[..8 * CH];
    // SAFETY: AVX and FMA (the callers' features); values 8c..8c + 8 of the query.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (c, k) in k.iter().enumerate() {
            let qc = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            acc[c % 8] = _mm256_fmadd_ps(qc, *k, acc[c % 8]);
        }
        let half = |h: usize| {
            _mm256_add_ps(
                _mm256_add_ps(acc[h], acc[4 + h]),
                _mm256_add_ps(acc[2 + h], acc[6 + h]),
            )
        };
        _mm256_add_ps(half(0), half(1))
    }
}

/// The rest of `reduce_add_16` for eight positions at once: `t4[l] = t8[l] + t8[l + 4]`, then
/// `(t4[0] + t4[2]) + (t4[1] + t4[3])`, with `pairs[p]` holding the `t4` of positions `p` (low
/// half) and `p + 4` (high half). Lane `p` of the result is position `p`'s sum.
#[inline(always)]
fn reduce8(pairs: [__m256; 4]) -> __m256 {
    // SAFETY: AVX (the callers' features).
    unsafe {
        // [t4[0] + t4[2], t4[1] + t4[3]] of two positions a 128-bit half, side by side.
        let uw = |a: __m256, b: __m256| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        };
        let (x, y) = (uw(pairs[0], pairs[1]), uw(pairs[2], pairs[3]));
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(x, y),
            _mm256_shuffle_ps::<0b11_01_11_01>(x, y),
        )
    }
}

/// `t4` of positions `a` (low half) and `b` (high half) from their `t8`.
#[inline(always)]
fn t4_pair(a: __m256, b: __m256) -> __m256 {
    // SAFETY: AVX (the callers' features).
    unsafe {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    }
}

/// The scores `scale * q . k` of `N` heads that read the same key rows (`keys`, from one first
/// position; head `i` sees `n_pos[i]` of them), from each query in `scratch[i].qf`, into each
/// `scratch[i].scores`: eight positions at a time, each row loaded once for every head. (The
/// scores past a head's positions, to its next multiple of eight, are left as they come.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `p` and `i` index the rows, heads and pairs in step
fn scores<const CH: usize, const N: usize>(
    scale: f32,
    keys: Rows,
    n_pos: &[usize],
    scratch: &mut [HeadScratch],
) {
    let hd = 8 * CH;
    let most = n_pos[..N].iter().copied().max().unwrap_or(0);
    let mut sc = scratch.iter_mut();
    let mut parts: [Option<(&[f32], &mut [f32])>; N] = std::array::from_fn(|_| {
        let HeadScratch { qf, scores, .. } = sc.next().expect("N heads");
        Some((&qf[..hd], &mut scores[..]))
    });
    let q: [&[f32]; N] = std::array::from_fn(|i| parts[i].as_ref().expect("each once").0);
    let out: [&mut [f32]; N] = std::array::from_fn(|i| parts[i].take().expect("each once").1);
    let zero = _mm256_setzero_ps();
    for j0 in (0..most).step_by(8) {
        let mut pairs = [[zero; 4]; N];
        for p in 0..4 {
            if let Rows::F16(_) = keys {
                keys.prefetch(j0 + p, hd, hd);
                keys.prefetch(j0 + p + 4, hd, hd);
            }
            let (k0, k1) = (keys.row8::<CH>(j0 + p), keys.row8::<CH>(j0 + p + 4));
            for i in 0..N {
                if j0 < n_pos[i] {
                    pairs[i][p] = t4_pair(fold::<CH>(q[i], &k0), fold::<CH>(q[i], &k1));
                }
            }
        }
        for i in 0..N {
            if j0 < n_pos[i] {
                let sum = _mm256_mul_ps(reduce8(pairs[i]), _mm256_set1_ps(scale));
                // SAFETY: positions j0..j0 + 8 of the head's scores (`reserve` pads them to 16).
                unsafe { _mm256_storeu_ps(out[i][j0..j0 + 8].as_mut_ptr(), sum) };
            }
        }
    }
}

/// A head's online-softmax steps from its scores (`sc.scores[..n]`): whether the running
/// maximum grows at each position (`sc.grow`, a bit a position), and the one exponential the
/// step takes (`sc.ex`: the rescale `e^(m_old - m)` where it grows, the weight `e^(score - m)`
/// elsewhere; `sc.ex16`, it rounded to F16). The maximum in one pass over the scores, then the
/// exponentials eight at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weights(n: usize, sc: &mut HeadScratch) {
    let padded = n.div_ceil(8) * 8;
    let mut m = f32::NEG_INFINITY;
    for (j, (&x, arg)) in sc.scores[..n].iter().zip(&mut sc.ex[..n]).enumerate() {
        // As `super::step`: a NaN score never grows the maximum.
        let grow = x > m;
        *arg = if grow { m - x } else { x - m };
        if grow {
            m = x;
            sc.grow[j / 16] |= 1 << (j % 16);
        }
    }
    sc.ex[n..padded].fill(0.0);
    for (e, e16) in sc.ex[..padded]
        .chunks_exact_mut(8)
        .zip(sc.ex16[..padded].chunks_exact_mut(8))
    {
        // SAFETY: eight floats each way.
        unsafe {
            let x = exp8(_mm256_loadu_ps(e.as_ptr()));
            _mm256_storeu_ps(e.as_mut_ptr(), x);
            _mm256_storeu_ps(e16.as_mut_ptr(), round_f16_ymm(x));
        }
    }
}

/// Position `j` of a head of [`values`] (its value row `x`; the first `F16_STEP`-multiple of
/// its values take ggml's F16 path, all of them for 128 and 256, none for 64): its accumulator
/// `acc` and sum.
#[inline(always)]
fn step<const CH: usize>(
    acc: &mut [__m256; CH],
    sum: &mut f32,
    sc: &HeadScratch,
    j: usize,
    x: &[__m256; CH],
) {
    // Registers in the F16 path, a constant of the width (0, 16 or 32).
    let f16_regs = 8 * CH / F16_STEP * F16_STEP / 8;
    let (e, e16) = (sc.ex[j], sc.ex16[j]);
    let grow = sc.grow[j / 16] >> (j % 16) & 1 != 0;
    let (ms, vs, vs16) = if grow { (e, 1.0, 1.0) } else { (1.0, e, e16) };
    let (acc16, acc32) = acc.split_at_mut(f16_regs);
    let (x16, x32) = x.split_at(f16_regs);
    // SAFETY: AVX, F16C and FMA (the callers' features).
    unsafe {
        if grow {
            let (f16, f32) = (_mm256_set1_ps(e16), _mm256_set1_ps(e));
            acc16
                .iter_mut()
                .for_each(|a| *a = round_f16_ymm(_mm256_mul_ps(*a, f16)));
            acc32
                .iter_mut()
                .for_each(|a| *a = round_f16_ymm(_mm256_mul_ps(*a, f32)));
        }
        let (b16, b32) = (_mm256_set1_ps(vs16), _mm256_set1_ps(vs));
        // Four registers' sums tested at once: they take the exact path only if one of their
        // lanes may be an F16 tie (rarely).
        for (a, x) in acc16.chunks_exact_mut(4).zip(x16.chunks_exact(4)) {
            let mut s = [_mm256_setzero_ps(); 4];
            let mut maybe = _mm256_setzero_si256();
            for r in 0..4 {
                s[r] = _mm256_fmadd_ps(x[r], b16, a[r]);
                maybe = _mm256_or_si256(maybe, may_be_f16_tie_ymm(s[r]));
            }
            if _mm256_testz_si256(maybe, maybe) == 0 {
                for r in 0..4 {
                    s[r] = fma_for_f16_ymm(x[r], b16, a[r]);
                }
            }
            for r in 0..4 {
                a[r] = round_f16_ymm(s[r]);
            }
        }
        for (a, &x) in acc32.iter_mut().zip(x32) {
            *a = round_f16_ymm(_mm256_fmadd_ps(x, b32, *a));
        }
    }
    // ggml's C is compiled with contraction: this is one fused multiply-add there.
    *sum = sum.mul_add(ms, vs);
}

/// The online softmax's pass over the value rows (`rows[i]`) of `N` heads side by side (their
/// [`weights`] done), into each job's output. Heads that read the same rows (from the same
/// first position) load each row once, for the heads that see it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn values<const CH: usize, const N: usize>(
    jobs: &mut [HeadJob],
    scratch: &[HeadScratch],
    rows: &[Rows; 4],
) {
    let hd = 8 * CH;
    let n_pos: [usize; 4] = std::array::from_fn(|i| jobs.get(i).map_or(0, |j| j.n_pos));
    let most = n_pos.iter().copied().max().unwrap_or(0);
    let shared = rows[..N].iter().all(|r| r.same(rows[0]));
    // The rows of a head that sees them all: when shared, the others' are its first rows.
    let longest = rows[(0..N).max_by_key(|&i| n_pos[i]).unwrap_or(0)];
    let mut acc = [[_mm256_setzero_ps(); CH]; N];
    let mut sum = [0.0f32; N];
    for j in 0..most {
        if shared {
            if let Rows::F16(_) = longest {
                longest.prefetch(j, hd, hd);
            }
            let x = longest.row8::<CH>(j);
            for i in 0..N {
                if j < n_pos[i] {
                    step(&mut acc[i], &mut sum[i], &scratch[i], j, &x);
                }
            }
        } else {
            for i in 0..N {
                if j < n_pos[i] {
                    if let Rows::F16(_) = rows[i] {
                        rows[i].prefetch(j, hd, hd);
                    }
                    let x = rows[i].row8::<CH>(j);
                    step(&mut acc[i], &mut sum[i], &scratch[i], j, &x);
                }
            }
        }
    }
    for i in 0..N {
        let (ms, inv) = finish(&jobs[i], &scratch[i], sum[i]);
        let (ms, inv) = (_mm256_set1_ps(ms), _mm256_set1_ps(inv));
        let out = &mut jobs[i].out[..hd];
        for (c, a) in acc[i].iter().enumerate() {
            let o = _mm256_mul_ps(_mm256_mul_ps(*a, ms), inv);
            // SAFETY: values 8c..8c + 8 of the output (hd of them).
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), o) };
        }
    }
}

/// A layer's keys and values for the positions `base..` that a batch's heads see, widened to
/// f32 once per layer and batch (`kf`, `vf`: `[kv head][position][head_dim]`), instead of by
/// every head of every token.
pub(super) struct Staged<'a> {
    base: usize,
    n_pos: usize,
    kf: &'a [f32],
    vf: &'a [f32],
}

impl<'a> Staged<'a> {
    /// Stage a layer's keys and values (`rows`, from cache position `base`) into `buf`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn new(
        s: &AttnShape,
        rows: LayerRows,
        base: usize,
        buf: &'a mut Vec<f32>,
    ) -> Staged<'a> {
        let (hd, n_pos) = (s.head_dim, rows.n_pos);
        let (one, len) = (n_pos * hd, s.n_head_kv * n_pos * hd);
        if buf.len() < 2 * len {
            buf.resize(2 * len, 0.0);
        }
        let (kf, vf) = buf[..2 * len].split_at_mut(len);
        for g in 0..s.n_head_kv {
            let (keys, values) = rows.head_rows(g, hd);
            let (kf, vf) = (&mut kf[g * one..][..one], &mut vf[g * one..][..one]);
            keys.convert_to_f32_slice(kf);
            values.convert_to_f32_slice(vf);
        }
        Staged {
            base,
            n_pos,
            kf,
            vf,
        }
    }
}

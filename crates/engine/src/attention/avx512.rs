//! Attention heads with AVX-512 F, for head widths of 64, 128 and 256 values: the same
//! arithmetic as [`super::attend_heads`] (ggml's online softmax with an F16 accumulator), laid
//! out so that the per-position chain stays in registers.
//!
//! - Every exponential of a head is known once its scores are: the running maximum before
//!   position `j` is a prefix maximum of the scores. They are computed sixteen at a time by
//!   [`exp16`], which gives libm's `expf` bits (checked against it at first use, see
//!   [`vector_exp_matches_libm`]).
//! - The accumulator lives in registers for the whole pass, `head_dim / 16` of them per head,
//!   and up to four heads go side by side so that one head's dependent steps (multiply-add,
//!   rounding to F16 and back) overlap another's. Heads whose every value takes ggml's F16
//!   path (128 and 256 values) run it in native F16 where the CPU has AVX512-FP16.
//! - For a batch, the layer's keys are staged once, transposed in blocks of sixteen positions
//!   ([`Staged`]), so that the scores need no horizontal sums; for a single token, the heads
//!   of a GQA group share each row's widening, and the cache's rows are prefetched ahead.

use std::arch::x86_64::*;

use half::slice::HalfFloatSliceExt;

use super::exp::{C0, C1, C2, INV_LN2_32, SHIFT, TAB};
use super::f16::{fma_for_f16_zmm, round_f16_zmm, F16_STEP};
use super::heads::{
    cap_scores, finish, prefetch_ahead, AttnShape, HeadJob, HeadScratch, LayerRows, Rows,
};

/// `e^x` of eight values in double precision, then rounded to f32: `x 32/ln 2 = k + r` with `k`
/// an integer, a table of `2^(i/32)` for `k mod 32` and a cubic for `2^(r/32)`. The
/// multiplications are fused with the additions that follow them exactly where glibc's
/// `expf` (its FMA build) fuses them: `k` and `r` both come from a fused `x * 32/ln 2 + c`.
/// Any other choice differs from it on a few inputs out of 2^32.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn exp8(x: __m256) -> __m256 {
    let xd = _mm512_cvtps_pd(x);
    let inv = _mm512_set1_pd(INV_LN2_32);
    let kd = _mm512_fmadd_pd(xd, inv, _mm512_set1_pd(SHIFT));
    let ki = _mm512_castpd_si512(kd);
    let kd = _mm512_sub_pd(kd, _mm512_set1_pd(SHIFT));
    let r = _mm512_fmsub_pd(xd, inv, kd);
    // SAFETY: `TAB` holds 32 values: four registers of eight.
    let tab = unsafe {
        let t = TAB.as_ptr();
        [0, 8, 16, 24].map(|i| _mm512_loadu_si512(t.add(i).cast()))
    };
    let lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);
    let hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
    let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    let t = _mm512_mask_blend_epi64(upper, lo, hi);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let p = _mm512_fmadd_pd(_mm512_set1_pd(C0), r, _mm512_set1_pd(C1));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(_mm512_set1_pd(C2), r, _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(p, r2, y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

/// `e^x` lane by lane, the bits of libm's `expf` (glibc's on x86-64 with FMA, which
/// [`vector_exp_matches_libm`] checks): overflow to infinity above `ln 2^128`, zero below
/// `ln 2^-150`, NaN for NaN.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) fn exp16(x: __m512) -> __m512 {
    let lo = exp8(_mm512_castps512_ps256(x));
    let hi = exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
        _mm512_castps_pd(x),
    )));
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(_mm512_castps256_ps512(lo)),
        _mm256_castps_pd(hi),
    ));
    let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(f32::from_bits(0x42b1_7217)));
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-f32::from_bits(0x42cf_f1b4)));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let y = _mm512_mask_blend_ps(over, y, _mm512_set1_ps(f32::INFINITY));
    let y = _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
    _mm512_mask_blend_ps(nan, y, _mm512_add_ps(x, x))
}

/// Whether [`exp16`] gives `f32::exp`'s bits (libm's `expf`) on this machine: a sweep of every
/// 4093rd f32 and the boundaries of the special cases, once. Where it does not (another libm),
/// the heads keep calling `f32::exp`.
pub(crate) fn vector_exp_matches_libm() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: the callers checked AVX-512 F, AVX2, FMA and F16C.
    *OK.get_or_init(|| super::exp::exp_agrees(|x| unsafe { exp_16(x) }, 0, u32::MAX, 4093))
}

/// Sixteen lanes of [`exp16`] (for [`super::exp_agrees`]).
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn exp_16(x: &mut [f32; 16]) {
    // SAFETY: sixteen floats each way.
    unsafe { _mm512_storeu_ps(x.as_mut_ptr(), exp16(_mm512_loadu_ps(x.as_ptr()))) };
}

/// Whether [`heads`] takes heads of `head_dim` values on this machine (the caller checked
/// AVX-512 F, AVX2, FMA and F16C).
pub(super) fn takes(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128 | 256) && vector_exp_matches_libm()
}

/// [`super::attend_heads`] for every job of `jobs` (`scratch` holds as many), for a head width
/// [`takes`] accepts.
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn heads(
    s: &AttnShape,
    jobs: &mut [HeadJob],
    scratch: &mut [HeadScratch],
    staged: Option<&Staged>,
) {
    // SAFETY: the caller's features; AVX512-FP16 only where the CPU has it.
    unsafe { heads_with(s, jobs, scratch, has_avx512fp16(), staged) }
}

/// Whether the CPU has AVX512-FP16 (its F16 multiply-add rounds once, as ggml's F16 path).
pub(super) fn has_avx512fp16() -> bool {
    synapse_quant::cpu().avx512_fp16()
}

/// [`heads`], with the F16 part of heads of 128 and 256 values in native F16 arithmetic when
/// `fp16`, emulated in f32 ([`fma_for_f16_zmm`]) otherwise, and the keys and values read from
/// `staged` when given (it must hold every position of every job). Same bits.
///
/// # Safety
/// As [`heads`]; with `fp16`, the CPU must have AVX512-FP16 too.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn heads_with(
    s: &AttnShape,
    jobs: &mut [HeadJob],
    scratch: &mut [HeadScratch],
    fp16: bool,
    staged: Option<&Staged>,
) {
    // SAFETY: R > 0 only with `fp16`, when the CPU has AVX512-FP16 (the caller's word).
    unsafe {
        match (s.head_dim, fp16) {
            (64, _) => by_width::<4, 0>(s, jobs, scratch, staged),
            (128, false) => by_width::<8, 0>(s, jobs, scratch, staged),
            (256, false) => by_width::<16, 0>(s, jobs, scratch, staged),
            (128, true) => by_width::<8, 4>(s, jobs, scratch, staged),
            (256, true) => by_width::<16, 8>(s, jobs, scratch, staged),
            (hd, _) => unreachable!("head width {hd} is not one `takes` accepts"),
        }
    }
}

/// [`heads`] for `CH` registers of sixteen values a head, four heads at a time: their scores
/// and weights, then their value passes side by side, as many heads as fit sixteen registers of
/// accumulators. With `R > 0`
/// (heads whose values all take ggml's F16 path, `R = CH / 2`), the accumulator is `R`
/// registers of 32 F16 values and the pass runs in AVX512-FP16.
///
/// # Safety
/// With `R > 0`, the CPU must have AVX512-FP16.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn by_width<const CH: usize, const R: usize>(
    s: &AttnShape,
    jobs: &mut [HeadJob],
    scratch: &mut [HeadScratch],
    staged: Option<&Staged>,
) {
    assert!(scratch.len() >= jobs.len(), "a scratch per head");
    let side = (16 / if R > 0 { R } else { CH }).clamp(1, 4);
    // The scores go four heads at a time whatever the width, each key register serving all of
    // them (staged scores hold no query in registers; unstaged ones take the queries of wide
    // heads from memory); the value passes then go `side` heads at a time.
    for (jobs, scratch) in jobs.chunks_mut(4).zip(scratch.chunks_mut(4)) {
        // Heads of one KV head that see the same positions (a token's GQA group) share each
        // key and value row's widening.
        let shared = jobs.iter().all(|j| {
            j.n_pos == jobs[0].n_pos && std::ptr::eq(j.keys.as_ptr(), jobs[0].keys.as_ptr())
        });
        match (staged, jobs.len()) {
            (Some(st), _) => staged_scores::<CH>(s, jobs, scratch, st),
            (None, 2) if shared => scores::<CH, 2>(s, jobs, scratch),
            (None, 3) if shared => scores::<CH, 3>(s, jobs, scratch),
            (None, 4) if shared => scores::<CH, 4>(s, jobs, scratch),
            (None, _) => {
                for (job, sc) in jobs.iter().zip(scratch.iter_mut()) {
                    scores::<CH, 1>(s, std::slice::from_ref(job), std::slice::from_mut(sc));
                }
            }
        }
        for (job, sc) in jobs.iter().zip(scratch.iter_mut()) {
            cap_scores(s, &mut sc.scores[..job.n_pos]);
            weights(job.n_pos, sc);
        }
        for (jobs, scratch) in jobs.chunks_mut(side).zip(scratch.chunks(side)) {
            // SAFETY: R > 0 only on a CPU with AVX512-FP16 (this function's caller's word).
            unsafe { values_side::<CH, R>(jobs, scratch, staged) };
        }
    }
}

/// [`by_width`]'s value pass over up to four heads side by side.
///
/// # Safety
/// With `R > 0`, the CPU must have AVX512-FP16.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn values_side<const CH: usize, const R: usize>(
    jobs: &mut [HeadJob],
    scratch: &[HeadScratch],
    staged: Option<&Staged>,
) {
    if R > 0 {
        debug_assert!(16 * CH / F16_STEP * F16_STEP == 16 * CH && 2 * R == CH);
        // SAFETY: the CPU has AVX512-FP16 (this function's caller's word).
        unsafe {
            match jobs.len() {
                1 => values_f16::<R, 1>(jobs, scratch),
                2 => values_f16::<R, 2>(jobs, scratch),
                3 => values_f16::<R, 3>(jobs, scratch),
                4 => values_f16::<R, 4>(jobs, scratch),
                n => unreachable!("{n} heads side by side"),
            }
        }
    } else {
        match jobs.len() {
            1 => values::<CH, 1>(jobs, scratch, staged),
            2 => values::<CH, 2>(jobs, scratch, staged),
            3 => values::<CH, 3>(jobs, scratch, staged),
            4 => values::<CH, 4>(jobs, scratch, staged),
            n => unreachable!("{n} heads side by side"),
        }
    }
}

/// `acc + a * b` in F16, 32 lanes, rounded once (`vfmadd231ph`).
///
/// # Safety
/// The CPU must have AVX512-FP16.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fmadd_ph(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: AVX512-FP16 (the caller's word); registers only.
    unsafe {
        std::arch::asm!(
            "vfmadd231ph {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `a * b` in F16, 32 lanes, rounded once (`vmulph`).
///
/// # Safety
/// The CPU must have AVX512-FP16.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mul_ph(a: __m512i, b: __m512i) -> __m512i {
    let out;
    // SAFETY: AVX512-FP16 (the caller's word); registers only.
    unsafe {
        std::arch::asm!(
            "vmulph {out}, {a}, {b}",
            out = lateout(zmm_reg) out,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Position `j` (value row `v`) of a head of [`values_f16`]: its accumulator `acc` and sum.
///
/// # Safety
/// The CPU must have AVX512-FP16 (besides AVX-512 F, the callers' features).
#[inline(always)]
unsafe fn step_f16<const R: usize>(
    acc: &mut [__m512i; R],
    sum: &mut f32,
    sc: &HeadScratch,
    j: usize,
    v: &[half::f16],
) {
    let e = sc.ex[j];
    let grow = sc.grow[j / 16] >> (j % 16) & 1 != 0;
    // SAFETY: AVX-512 F (the callers' features) and AVX512-FP16 (the caller's word).
    unsafe {
        let e16 = _mm512_set1_epi16(sc.ex16h[j] as i16);
        let (ms, vs, vs16) = if grow {
            (e, 1.0, _mm512_set1_epi16(0x3c00))
        } else {
            (1.0, e, e16)
        };
        if grow {
            for a in acc.iter_mut() {
                *a = mul_ph(*a, e16);
            }
        }
        let v = &v[..32 * R];
        for (r, a) in acc.iter_mut().enumerate() {
            // Values 32r..32r + 32 of the row.
            *a = fmadd_ph(*a, _mm512_loadu_si512(v.as_ptr().add(32 * r).cast()), vs16);
        }
        // ggml's C is compiled with contraction: this is one fused multiply-add there.
        *sum = sum.mul_add(ms, vs);
    }
}

/// [`values`] for heads whose every value takes ggml's F16 path: the accumulator as F16
/// values, `R` registers of 32, each step one F16 multiply (the rescale) or multiply-add,
/// rounded once, which is what [`fma_for_f16_zmm`] and the rounding after it emulate.
///
/// # Safety
/// The CPU must have AVX512-FP16.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn values_f16<const R: usize, const N: usize>(
    jobs: &mut [HeadJob],
    scratch: &[HeadScratch],
) {
    let hd = 32 * R;
    let n_pos: [usize; 4] = std::array::from_fn(|i| jobs.get(i).map_or(0, |j| j.n_pos));
    let most = n_pos.iter().copied().max().unwrap_or(0);
    let rows: [&[half::f16]; 4] =
        std::array::from_fn(|i| jobs.get(i).map_or(&[][..], |j| j.values));
    // Each head's accumulator a variable of its own, and the loop over heads written out, so
    // that the accumulators stay in registers.
    let [mut a0, mut a1, mut a2, mut a3] = [[_mm512_setzero_si512(); R]; 4];
    let [mut s0, mut s1, mut s2, mut s3] = [0.0f32; 4];
    for j in 0..most {
        let row = |i: usize| &rows[i][j * hd..][..hd];
        // SAFETY: AVX512-FP16 (this function's caller's word).
        unsafe {
            if j < n_pos[0] {
                step_f16(&mut a0, &mut s0, &scratch[0], j, row(0));
            }
            if N > 1 && j < n_pos[1] {
                step_f16(&mut a1, &mut s1, &scratch[1], j, row(1));
            }
            if N > 2 && j < n_pos[2] {
                step_f16(&mut a2, &mut s2, &scratch[2], j, row(2));
            }
            if N > 3 && j < n_pos[3] {
                step_f16(&mut a3, &mut s3, &scratch[3], j, row(3));
            }
        }
    }
    let (acc, sum) = ([a0, a1, a2, a3], [s0, s1, s2, s3]);
    for i in 0..N {
        let (ms, inv) = finish(&jobs[i], &scratch[i], sum[i]);
        let (ms, inv) = (_mm512_set1_ps(ms), _mm512_set1_ps(inv));
        let out = &mut jobs[i].out[..hd];
        for (r, a) in acc[i].iter().enumerate() {
            let halves = [
                _mm512_castsi512_si256(*a),
                _mm256_castpd_si256(_mm512_extractf64x4_pd::<1>(_mm512_castsi512_pd(*a))),
            ];
            for (k, h) in halves.into_iter().enumerate() {
                // SAFETY: values 32r + 16k..+16 of the output (hd of them).
                unsafe {
                    _mm512_storeu_ps(
                        out.as_mut_ptr().add(32 * r + 16 * k),
                        _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(h), ms), inv),
                    )
                };
            }
        }
    }
}

/// `x` shifted up by `K` lanes, `fill` in the lowest `K`.
#[inline(always)]
fn lanes_up<const K: i32>(x: __m512, fill: __m512) -> __m512 {
    // SAFETY: AVX-512 F, the callers' features. `valignd` by 16 - K of (x : fill).
    unsafe {
        _mm512_castsi512_ps(match K {
            1 => _mm512_alignr_epi32::<15>(_mm512_castps_si512(x), _mm512_castps_si512(fill)),
            2 => _mm512_alignr_epi32::<14>(_mm512_castps_si512(x), _mm512_castps_si512(fill)),
            4 => _mm512_alignr_epi32::<12>(_mm512_castps_si512(x), _mm512_castps_si512(fill)),
            8 => _mm512_alignr_epi32::<8>(_mm512_castps_si512(x), _mm512_castps_si512(fill)),
            _ => unreachable!("a shift of 1, 2, 4 or 8 lanes"),
        })
    }
}

/// The scores `scale * q . k` of `N` heads that read the same key rows (`jobs[0].keys`,
/// `jobs[0].n_pos` positions; one head, or a token's heads of one KV head) into each
/// `scratch[i].scores`: each row widened once, then dotted with every head's query (rounded
/// to F16), in ggml's order, as [`super::V4`]'s `dot_h`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn scores<const CH: usize, const N: usize>(
    s: &AttnShape,
    jobs: &[HeadJob],
    scratch: &mut [HeadScratch],
) {
    let hd = 16 * CH;
    let n = jobs[0].n_pos;
    let keys = jobs[0].keys;
    for sc in scratch[..N].iter_mut() {
        sc.reserve(n);
    }
    let q: [[__m512; CH]; N] = std::array::from_fn(|i| query(jobs[i].q));
    let scale = _mm_set1_ps(s.scale);
    // Four positions at a time: each head's four sums of ggml's accumulators reduced together
    // ([`reduce_lanes4`]: about half the one-at-a-time reduction's shuffles, the same adds).
    // Heads of up to 128 values: wider ones, whose rows take 16 registers, ran slower so.
    let mut j = 0;
    while CH <= 8 && j + 4 <= n {
        let mut v = [[_mm512_setzero_ps(); 4]; N];
        for p in 0..4 {
            prefetch_ahead(keys, j + p, hd, hd);
            let kf = Rows::F16(keys).row::<CH>(j + p, hd);
            for (v, q) in v.iter_mut().zip(&q) {
                v[p] = pair_sums(q, &kf);
            }
        }
        for (v, sc) in v.iter().zip(scratch.iter_mut()) {
            let four = _mm_mul_ps(reduce_lanes4(*v), scale);
            // SAFETY: positions j..j + 4 of the scores (n of them, reserved above).
            unsafe { _mm_storeu_ps(sc.scores[j..j + 4].as_mut_ptr(), four) };
        }
        j += 4;
    }
    for j in j..n {
        prefetch_ahead(keys, j, hd, hd);
        let kf = Rows::F16(keys).row::<CH>(j, hd);
        for (i, q) in q.iter().enumerate() {
            scratch[i].scores[j] = reduce_pairs(pair_sums(q, &kf)) * s.scale;
        }
    }
}

/// One position's `q . k` in ggml's four 16-lane accumulators (register `c` into accumulator
/// `c % 4`), then their first adds, `(a0 + a2) + (a1 + a3)`: what [`reduce_pairs`] (one
/// position) or [`reduce_lanes4`] (four) finish.
#[inline(always)]
fn pair_sums<const CH: usize>(q: &[__m512; CH], k: &[__m512; CH]) -> __m512 {
    // SAFETY: AVX-512 F (the callers' features).
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        for c in 0..CH {
            acc[c % 4] = _mm512_fmadd_ps(q[c], k[c], acc[c % 4]);
        }
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]))
    }
}

/// [`reduce_lanes`]'s halves, quarters and last pairs for four positions at once (`v[p]`:
/// position `p`'s `(a0 + a2) + (a1 + a3)`), their sums in lanes 0..4: the same adds on the
/// same values, with two or four positions sharing each register where `reduce_lanes` gives
/// every step a register of its own.
#[inline(always)]
fn reduce_lanes4(v: [__m512; 4]) -> __m128 {
    // SAFETY: AVX-512 F (the callers' features).
    unsafe {
        // Lanes 0..8: position 0's `v[i] + v[i + 8]`; lanes 8..16 position 1's.
        let t01 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(v[0], v[1]),
            _mm512_shuffle_f32x4::<0xEE>(v[0], v[1]),
        );
        let t23 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(v[2], v[3]),
            _mm512_shuffle_f32x4::<0xEE>(v[2], v[3]),
        );
        // Quarter `p`: position p's `t[i] + t[i + 4]`.
        let u = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(t01, t23),
            _mm512_shuffle_f32x4::<0xDD>(t01, t23),
        );
        // Element 0 of quarter p: `(u0 + u2) + (u1 + u3)`.
        let w = _mm512_add_ps(u, _mm512_permute_ps::<0b01_00_11_10>(u));
        let z = _mm512_add_ps(w, _mm512_permute_ps::<0b10_11_00_01>(w));
        _mm512_castps512_ps128(_mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
            z,
        ))
    }
}

/// A head's query (`16 * CH` values) rounded to F16, as ggml converts it for the F16 keys.
#[inline(always)]
fn query<const CH: usize>(q: &[f32]) -> [__m512; CH] {
    let q = &q[..16 * CH];
    // SAFETY: AVX-512 F and F16C (the callers' features); values 16c..16c + 16 of the query.
    unsafe {
        let mut r = [_mm512_setzero_ps(); CH];
        for (c, r) in r.iter_mut().enumerate() {
            *r = round_f16_zmm(_mm512_loadu_ps(q.as_ptr().add(16 * c)));
        }
        r
    }
}

/// ggml's sum of its four 16-lane accumulators: `(a0 + a2) + (a1 + a3)`, then
/// `reduce_add_16`'s halves, quarters and last pairs ([`reduce_pairs`]).
#[inline(always)]
pub(super) fn reduce_lanes(acc: [__m512; 4]) -> f32 {
    // SAFETY: AVX-512 F (the callers' features).
    let v = unsafe { _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])) };
    reduce_pairs(v)
}

/// `reduce_add_16`'s halves, quarters and last pairs of `v`, the first adds of ggml's four
/// accumulators.
#[inline(always)]
fn reduce_pairs(v: __m512) -> f32 {
    // SAFETY: AVX-512 F (the callers' features).
    unsafe {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let t8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
        let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps::<1>(t8));
        let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
        _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps::<1>(t2, t2)))
    }
}

/// [`scores`] from [`Staged`] keys: sixteen positions in the lanes, each of ggml's 64 partial
/// sums (accumulator `j`, lane `l`) a register, added in its order (`reduce_add_16`'s tree
/// across the registers instead of across the lanes). The jobs of one KV head go block by
/// block together, so that each block's keys are read from memory once for all of them and
/// each key register serves every job's query.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn staged_scores<const CH: usize>(
    s: &AttnShape,
    jobs: &[HeadJob],
    scratch: &mut [HeadScratch],
    st: &Staged,
) {
    let hd = 16 * CH;
    // The blocks of sixteen staged positions each job sees, `b0..b1`.
    let mut blocks = [(0, 0); 4];
    for ((job, sc), b) in jobs.iter().zip(scratch.iter_mut()).zip(&mut blocks) {
        sc.reserve(job.n_pos);
        // In memory, for one broadcast load a dimension.
        let q = &mut sc.qf[..hd];
        for (c, r) in query::<CH>(job.q).into_iter().enumerate() {
            // SAFETY: values 16c..16c + 16 of `q` (hd of them).
            unsafe { _mm512_storeu_ps(q.as_mut_ptr().add(16 * c), r) };
        }
        let o = job.first - st.base;
        *b = (o / 16, (o + job.n_pos - 1) / 16 + 1);
        sc.blk.resize((b.1 - b.0) * 16, 0.0);
    }
    let mut i = 0;
    while i < jobs.len() {
        let kvh = jobs[i].kv_head;
        let e = i + jobs[i..].iter().take_while(|j| j.kv_head == kvh).count();
        let kt = &st.kt[kvh * st.blocks * hd * 16..][..st.blocks * hd * 16];
        let (sc, b) = (&mut scratch[i..e], &blocks[i..e]);
        match e - i {
            1 => staged_blocks::<CH, 1>(s.scale, kt, sc, b),
            2 => staged_blocks::<CH, 2>(s.scale, kt, sc, b),
            3 => staged_blocks::<CH, 3>(s.scale, kt, sc, b),
            4 => staged_blocks::<CH, 4>(s.scale, kt, sc, b),
            n => unreachable!("{n} heads side by side"),
        }
        i = e;
    }
    for ((job, sc), b) in jobs.iter().zip(scratch.iter_mut()).zip(&blocks) {
        let o = job.first - st.base - 16 * b.0;
        sc.scores[..job.n_pos].copy_from_slice(&sc.blk[o..][..job.n_pos]);
    }
}

/// The scores of `T` heads of one KV head (`kt`: its staged blocks) on the blocks each sees
/// (`blocks[i]`), into each `scratch[i].blk` (from its first block), from each query in
/// `scratch[i].qf`: every block once, for every head that sees it.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `l` and `i` index the keys, queries and sums in step
fn staged_blocks<const CH: usize, const T: usize>(
    scale: f32,
    kt: &[f32],
    scratch: &mut [HeadScratch],
    blocks: &[(usize, usize)],
) {
    let hd = 16 * CH;
    let mut sc = scratch.iter_mut();
    let (q, blk): ([&[f32]; T], [&mut [f32]; T]) = {
        let mut parts: [Option<(&[f32], &mut [f32])>; T] = std::array::from_fn(|_| {
            let HeadScratch { qf, blk, .. } = sc.next().expect("T heads");
            Some((&qf[..hd], &mut blk[..]))
        });
        let q = std::array::from_fn(|i| parts[i].as_ref().expect("each once").0);
        (
            q,
            std::array::from_fn(|i| parts[i].take().expect("each once").1),
        )
    };
    let lo = blocks.iter().map(|b| b.0).min().unwrap_or(0);
    let hi = blocks.iter().map(|b| b.1).max().unwrap_or(0);
    // SAFETY: AVX-512 F (the callers' features).
    let zero = unsafe { _mm512_setzero_ps() };
    let mut v = [[zero; 16]; T];
    for bb in lo..hi {
        let kt = &kt[bb * hd * 16..][..hd * 16];
        for l in 0..16 {
            let mut a = [[zero; 4]; T];
            // Registers c = 4 c4 + r into accumulator r: the index of each accumulator known
            // where it is used, so that they stay in registers when the loop over c4 does not
            // unroll (four heads of 256 values).
            for c4 in 0..CH / 4 {
                for r in 0..4 {
                    let d = 16 * (4 * c4 + r) + l;
                    // SAFETY: dimension d of the block's sixteen keys (hd * 16 values).
                    let k = unsafe { _mm512_loadu_ps(kt.as_ptr().add(16 * d)) };
                    for i in 0..T {
                        // SAFETY: AVX-512 F (the callers' features).
                        a[i][r] = unsafe { _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), k, a[i][r]) };
                    }
                }
            }
            for i in 0..T {
                // SAFETY: AVX-512 F (the callers' features).
                v[i][l] = unsafe {
                    _mm512_add_ps(
                        _mm512_add_ps(a[i][0], a[i][2]),
                        _mm512_add_ps(a[i][1], a[i][3]),
                    )
                };
            }
        }
        for i in 0..T {
            let (b0, b1) = blocks[i];
            if bb < b0 || bb >= b1 {
                continue;
            }
            // SAFETY: AVX-512 F (the callers' features); 16 writable floats (block bb - b0 of
            // the b1 - b0 the job's `blk` holds).
            unsafe {
                let v = &v[i];
                let t8: [__m512; 8] = std::array::from_fn(|i| _mm512_add_ps(v[i], v[i + 8]));
                let t4: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(t8[i], t8[i + 4]));
                let sum = _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
                _mm512_storeu_ps(
                    blk[i][(bb - b0) * 16..][..16].as_mut_ptr(),
                    _mm512_mul_ps(sum, _mm512_set1_ps(scale)),
                )
            };
        }
    }
}

/// A head's online-softmax steps from its scores (`sc.scores[..n]`): sixteen positions at a
/// time, whether the running maximum grows there (`sc.grow`, a bit a position), and the one
/// exponential the step takes (`sc.ex`: the rescale `e^(m_old - m)` where it grows, the
/// weight `e^(score - m)` elsewhere; `sc.ex16` rounded to F16).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn weights(n: usize, sc: &mut HeadScratch) {
    let padded = n.div_ceil(16) * 16;
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut carry = ninf;
    for b in 0..padded / 16 {
        // SAFETY: positions 16b..16b + 16 of the padded rows.
        let x = unsafe { _mm512_loadu_ps(sc.scores.as_ptr().add(16 * b)) };
        let live = if 16 * b + 16 <= n {
            0xffff
        } else {
            (1u16 << (n - 16 * b)) - 1
        };
        // The running maximum ignores NaN scores (`score > m` is false for them), and the
        // padding.
        let ok = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x) & live;
        let mut p = _mm512_mask_blend_ps(ok, ninf, x);
        p = _mm512_max_ps(p, lanes_up::<1>(p, ninf));
        p = _mm512_max_ps(p, lanes_up::<2>(p, ninf));
        p = _mm512_max_ps(p, lanes_up::<4>(p, ninf));
        p = _mm512_max_ps(p, lanes_up::<8>(p, ninf));
        p = _mm512_max_ps(p, carry);
        // The maximum before each position.
        let prev = lanes_up::<1>(p, carry);
        let grow = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, prev);
        let arg = _mm512_mask_blend_ps(grow, _mm512_sub_ps(x, prev), _mm512_sub_ps(prev, x));
        let e = exp16(arg);
        // SAFETY: positions 16b..16b + 16 of the padded rows.
        unsafe {
            _mm512_storeu_ps(sc.ex.as_mut_ptr().add(16 * b), e);
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(e);
            _mm512_storeu_ps(sc.ex16.as_mut_ptr().add(16 * b), _mm512_cvtph_ps(h));
            _mm256_storeu_si256(sc.ex16h.as_mut_ptr().add(16 * b).cast(), h);
        }
        sc.grow[b] = grow & live;
        carry = _mm512_permutexvar_ps(_mm512_set1_epi32(15), p);
    }
}

impl Rows<'_> {
    /// Row `j` (`16 * CH` values, rows `stride` apart) as f32.
    #[inline(always)]
    fn row<const CH: usize>(self, j: usize, stride: usize) -> [__m512; CH] {
        // A loop, not `array::from_fn`: a closure would not share the callers' features, and
        // the intrinsics would stay calls.
        // SAFETY: AVX-512 F and F16C (the callers' features); 16 CH values of row j.
        unsafe {
            let mut x = [_mm512_setzero_ps(); CH];
            match self {
                Rows::F32(r) => {
                    let r = &r[j * stride..][..16 * CH];
                    for (c, x) in x.iter_mut().enumerate() {
                        *x = _mm512_loadu_ps(r.as_ptr().add(16 * c));
                    }
                }
                Rows::F16(r) => {
                    let r = &r[j * stride..][..16 * CH];
                    for (c, x) in x.iter_mut().enumerate() {
                        *x = _mm512_cvtph_ps(_mm256_loadu_si256(r.as_ptr().add(16 * c).cast()));
                    }
                }
            }
            x
        }
    }
}

/// Position `j` of a head of [`values`] (its value row `x`; the first `simd` values take
/// ggml's F16 path): its accumulator `acc` and sum.
#[inline(always)]
fn step_f32<const CH: usize>(
    acc: &mut [__m512; CH],
    sum: &mut f32,
    sc: &HeadScratch,
    j: usize,
    x: &[__m512; CH],
    simd: usize,
) {
    let (e, e16) = (sc.ex[j], sc.ex16[j]);
    let grow = sc.grow[j / 16] >> (j % 16) & 1 != 0;
    let (ms, vs, vs16) = if grow { (e, 1.0, 1.0) } else { (1.0, e, e16) };
    if grow {
        for (c, a) in acc.iter_mut().enumerate() {
            // SAFETY: AVX-512 F and F16C (the callers' features).
            unsafe {
                let f = _mm512_set1_ps(if 16 * c < simd { e16 } else { e });
                *a = round_f16_zmm(_mm512_mul_ps(*a, f));
            }
        }
    }
    add_row(acc, sum, ms, vs, vs16, x, simd);
}

/// The rest of [`step_f32`], after the rescale where the maximum grows: the row `x` times the
/// weight `vs` (`vs16` rounded to F16) into the accumulator, and `sum * ms + vs` the sum.
#[inline(always)]
fn add_row<const CH: usize>(
    acc: &mut [__m512; CH],
    sum: &mut f32,
    ms: f32,
    vs: f32,
    vs16: f32,
    x: &[__m512; CH],
    simd: usize,
) {
    // SAFETY: AVX-512 F, F16C and FMA (the callers' features).
    unsafe {
        // Two loops of known length (the branch inside one loop kept it from being unrolled,
        // and the accumulators went to the stack).
        let (b16, b32) = (_mm512_set1_ps(vs16), _mm512_set1_ps(vs));
        for c in 0..simd / 16 {
            acc[c] = round_f16_zmm(fma_for_f16_zmm(x[c], b16, acc[c]));
        }
        for c in simd / 16..CH {
            acc[c] = round_f16_zmm(_mm512_fmadd_ps(x[c], b32, acc[c]));
        }
    }
    // ggml's C is compiled with contraction: this is one fused multiply-add there.
    *sum = sum.mul_add(ms, vs);
}

/// The loop of [`values`]: each head's accumulator a variable of its own, and the loop over
/// heads written out, so that the accumulators stay in registers; with `SHARED`, every head
/// reads the same rows (from the same first row, each head as far as it sees), each row
/// loaded once for the heads that see it.
#[inline(always)]
fn value_pass<const CH: usize, const N: usize, const SHARED: bool>(
    scratch: &[HeadScratch],
    rows: &[Rows; 4],
    n_pos: [usize; 4],
    simd: usize,
) -> ([[__m512; CH]; 4], [f32; 4]) {
    let hd = 16 * CH;
    // SAFETY: AVX-512 F (the callers' features).
    let [mut a0, mut a1, mut a2, mut a3] = [[unsafe { _mm512_setzero_ps() }; CH]; 4];
    let [mut s0, mut s1, mut s2, mut s3] = [0.0f32; 4];
    // Head `i`'s step at position `j` on value row `x`, for the heads there are and where `go`
    // (the loop over heads written out: one expansion per head, each on its own variables).
    macro_rules! step {
        ($i:literal, $a:ident, $s:ident, $go:expr, $j:expr, $x:expr) => {
            if N > $i && $go {
                step_f32(&mut $a, &mut $s, &scratch[$i], $j, $x, simd);
            }
        };
    }
    // Head `i`'s step at a position of a block where no maximum grows: its weight `ex[$i][p]`.
    macro_rules! plain {
        ($i:literal, $a:ident, $s:ident, $ex:expr, $ex16:expr, $p:expr, $x:expr) => {
            if N > $i {
                add_row(&mut $a, &mut $s, 1.0, $ex[$i][$p], $ex16[$i][$p], $x, simd);
            }
        };
    }
    let most = n_pos.iter().copied().max().unwrap_or(0);
    let least = n_pos[..N].iter().copied().min().unwrap_or(0);
    // The rows of a head that sees them all: with `SHARED`, the others' are its first rows.
    let longest = rows[(0..N).max_by_key(|&i| n_pos[i]).unwrap_or(0)];
    let mut j = 0;
    while j < most {
        if j % 16 == 0 && j + 16 <= least && (0..N).all(|i| scratch[i].grow[j / 16] == 0) {
            // Sixteen positions every head sees, and where no head's maximum grows (most
            // blocks past the first few): the steps without the checks of each.
            let ex: [&[f32]; 4] = std::array::from_fn(|i| &scratch[i.min(N - 1)].ex[j..][..16]);
            let ex16: [&[f32]; 4] = std::array::from_fn(|i| &scratch[i.min(N - 1)].ex16[j..][..16]);
            for p in 0..16 {
                if SHARED {
                    longest.prefetch(j + p, hd, hd);
                    let x = longest.row::<CH>(j + p, hd);
                    plain!(0, a0, s0, ex, ex16, p, &x);
                    plain!(1, a1, s1, ex, ex16, p, &x);
                    plain!(2, a2, s2, ex, ex16, p, &x);
                    plain!(3, a3, s3, ex, ex16, p, &x);
                } else {
                    for r in &rows[..N] {
                        r.prefetch(j + p, hd, hd);
                    }
                    plain!(0, a0, s0, ex, ex16, p, &rows[0].row(j + p, hd));
                    plain!(1, a1, s1, ex, ex16, p, &rows[1].row(j + p, hd));
                    plain!(2, a2, s2, ex, ex16, p, &rows[2].row(j + p, hd));
                    plain!(3, a3, s3, ex, ex16, p, &rows[3].row(j + p, hd));
                }
            }
            j += 16;
            continue;
        }
        if SHARED {
            // Every head reads the same rows: one load a position, for the heads that see it.
            longest.prefetch(j, hd, hd);
            let x = longest.row::<CH>(j, hd);
            step!(0, a0, s0, j < n_pos[0], j, &x);
            step!(1, a1, s1, j < n_pos[1], j, &x);
            step!(2, a2, s2, j < n_pos[2], j, &x);
            step!(3, a3, s3, j < n_pos[3], j, &x);
        } else {
            for r in &rows[..N] {
                r.prefetch(j, hd, hd);
            }
            step!(0, a0, s0, j < n_pos[0], j, &rows[0].row(j, hd));
            step!(1, a1, s1, j < n_pos[1], j, &rows[1].row(j, hd));
            step!(2, a2, s2, j < n_pos[2], j, &rows[2].row(j, hd));
            step!(3, a3, s3, j < n_pos[3], j, &rows[3].row(j, hd));
        }
        j += 1;
    }
    ([a0, a1, a2, a3], [s0, s1, s2, s3])
}

/// The online softmax's pass over the value rows of `N` heads side by side (their
/// [`weights`] done), each head's accumulator in `CH` registers, into each job's output.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn values<const CH: usize, const N: usize>(
    jobs: &mut [HeadJob],
    scratch: &[HeadScratch],
    staged: Option<&Staged>,
) {
    let hd = 16 * CH;
    let simd = hd / F16_STEP * F16_STEP;
    let n_pos: [usize; 4] = std::array::from_fn(|i| jobs.get(i).map_or(0, |j| j.n_pos));
    // Each head's value rows: staged as f32 from its first position, or the cache's F16.
    let rows: [Rows; 4] = std::array::from_fn(|i| match (jobs.get(i), staged) {
        (None, _) => Rows::F16(&[]),
        (
            Some(job),
            Some(Staged {
                base,
                n_pos,
                vf: Some(vf),
                ..
            }),
        ) => Rows::F32(&vf[(job.kv_head * n_pos + job.first - base) * hd..]),
        (Some(job), _) => Rows::F16(job.values),
    });
    // Heads of one KV head from the same first position (a token's GQA group, or the tokens
    // of one head) read the same rows.
    let shared = rows[..N].iter().all(|r| r.same(rows[0]));
    let (acc, sum) = if shared {
        value_pass::<CH, N, true>(scratch, &rows, n_pos, simd)
    } else {
        value_pass::<CH, N, false>(scratch, &rows, n_pos, simd)
    };
    for i in 0..N {
        let (ms, inv) = finish(&jobs[i], &scratch[i], sum[i]);
        let (ms, inv) = (_mm512_set1_ps(ms), _mm512_set1_ps(inv));
        let out = &mut jobs[i].out[..hd];
        for (c, a) in acc[i].iter().enumerate() {
            let o = _mm512_mul_ps(_mm512_mul_ps(*a, ms), inv);
            // SAFETY: values 16c..16c + 16 of the output (hd of them).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * c), o) };
        }
    }
}

/// A layer's keys and values for the positions `base..` that a batch's heads see, laid out for
/// [`staged_scores`] and [`values`] once per layer and batch instead of widened by every head
/// of every token: the keys transposed in blocks of sixteen positions (`kt[kv head][block]
/// [dim][16]`, f32, zero past the last position), so that one register holds one dimension of
/// sixteen positions; the values widened to f32 (`vf[kv head][position][head_dim]`) where the
/// heads accumulate them in f32 (ggml's F16 path takes them as F16).
pub(super) struct Staged<'a> {
    base: usize,
    n_pos: usize,
    blocks: usize,
    kt: &'a [f32],
    vf: Option<&'a [f32]>,
}

impl<'a> Staged<'a> {
    /// Stage a layer's keys and values (`rows`, from cache position `base`) into `buf`, for a
    /// head width [`takes`] accepts.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn new(
        s: &AttnShape,
        rows: LayerRows,
        base: usize,
        buf: &'a mut Vec<f32>,
    ) -> Staged<'a> {
        let hd = s.head_dim;
        let n_pos = rows.n_pos;
        let blocks = n_pos.div_ceil(16);
        let kt_len = s.n_head_kv * blocks * hd * 16;
        let f32_values = hd < F16_STEP || !has_avx512fp16();
        // Every value is written below (the padding of each KV head's last block as zeros),
        // so the buffer is only grown, never cleared.
        let len = kt_len
            + if f32_values {
                s.n_head_kv * n_pos * hd
            } else {
                0
            };
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        let (kt, vf) = buf[..len].split_at_mut(kt_len);
        for kvh in (0..s.n_head_kv).filter(|_| blocks > 0) {
            let last = &mut kt[(kvh * blocks + blocks - 1) * hd * 16..][..hd * 16];
            for dim in last.chunks_exact_mut(16) {
                dim[n_pos - (blocks - 1) * 16..].fill(0.0);
            }
        }
        let mut row = [0.0f32; 16];
        for kvh in 0..s.n_head_kv {
            let (keys, values) = rows.head_rows(kvh, hd);
            for p in 0..n_pos {
                let (b, l) = (p / 16, p % 16);
                let block = &mut kt[(kvh * blocks + b) * hd * 16..][..hd * 16];
                for c in 0..hd / 16 {
                    // SAFETY: 16 keys of the row (hd of them, 16 | hd); 16 floats.
                    unsafe {
                        let k = keys.as_ptr().add(p * hd + 16 * c);
                        let k = _mm512_cvtph_ps(_mm256_loadu_si256(k.cast()));
                        _mm512_storeu_ps(row.as_mut_ptr(), k);
                    }
                    for (e, &x) in row.iter().enumerate() {
                        block[(16 * c + e) * 16 + l] = x;
                    }
                }
            }
            if f32_values {
                values.convert_to_f32_slice(&mut vf[kvh * n_pos * hd..][..n_pos * hd]);
            }
        }
        Staged {
            base,
            n_pos,
            blocks,
            kt,
            vf: f32_values.then_some(&*vf),
        }
    }
}

//! The attention paths against the scalar reference: the F16 rounding helpers, each tier's head
//! operations and fast paths, and the vector exponential against libm's.
use super::*;
#[cfg(target_arch = "x86_64")]
use super::{exp::exp_agrees, heads::LayerRows};

/// The F16 value nearest to `x` (ties to even), by search: the reference for [`fma_for_f16`].
fn nearest_f16(x: f64) -> f32 {
    let guess = half::f16::from_f64(x);
    let mut best = guess;
    for d in -2i32..=2 {
        let c = half::f16::from_bits((guess.to_bits() as i32 + d) as u16);
        let (ec, eb) = ((c.to_f64() - x).abs(), (best.to_f64() - x).abs());
        if ec < eb || (ec == eb && c.to_bits().is_multiple_of(2)) {
            best = c;
        }
    }
    best.to_f32()
}

#[test]
fn f16_ties_are_found_exactly() {
    for bits in 0..0x7bffu16 {
        let (lo, hi) = (
            half::f16::from_bits(bits).to_f32(),
            half::f16::from_bits(bits + 1).to_f32(),
        );
        let mid = lo + (hi - lo) * 0.5;
        for x in [mid, -mid] {
            assert!(is_f16_tie(x), "{x}");
            assert!(
                !is_f16_tie(x.next_up()) && !is_f16_tie(x.next_down()),
                "{x}"
            );
        }
        assert!(!is_f16_tie(lo) && !is_f16_tie(hi), "{lo}");
    }
}

#[test]
fn fma_for_f16_rounds_once() {
    let round = |x: f32| half::f16::from_f32(x).to_f32();
    let tiny = 2f32.powi(-24); // the smallest F16 subnormal
    let cs = [
        1.0,
        1.0 + 1.0 / 1024.0,
        1.0 + 3.0 / 1024.0,
        1.999,
        0.0,
        tiny,
        7.0 * tiny,
    ];
    let (mut n, mut ties) = (0, 0);
    for i in 0..64 {
        for j in 0..64 {
            for k in [0, 3, 11, 12, 13, 20, 24, 26, 30] {
                for &c in &cs {
                    let a = 1.0 + i as f32 / 1024.0;
                    let b = round(-(1.0 - j as f32 / 2048.0) * 0.5f32.powi(k));
                    let exact = a as f64 * b as f64 + c as f64;
                    let got = round(fma_for_f16(a, b, c));
                    assert_eq!(got, nearest_f16(exact), "{a} * {b} + {c}");
                    let twice = round(a * b + c);
                    ties += (twice != got) as usize;
                    n += 1;
                }
            }
        }
    }
    assert!(
        ties > 0,
        "no case where rounding the f32 sum twice differs ({n} cases)"
    );
}

/// The vector F16 multiply-adds, once rounded to F16, give the exact sum's F16 rounding:
/// AVX2's ([`fma_for_f16_ymm`]: a test for possible ties, then the exact path) and
/// AVX-512's ([`fma_for_f16_zmm`]: the sum rounded to odd), on `fma_for_f16_rounds_once`'s
/// cases (ties where rounding the f32 sum twice errs), on random F16 operands of every sign
/// and magnitude, half of them near cancellation, and on sums among the F16 subnormals.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_fma_for_f16_rounds_once() {
    use rand::{Rng, SeedableRng};
    use std::arch::x86_64::*;
    let round = |x: f32| half::f16::from_f32(x).to_f32();
    let mut cases = Vec::new();
    let tiny = 2f32.powi(-24);
    for i in 0..64 {
        for j in 0..64 {
            for k in [0, 3, 11, 12, 13, 20, 24, 26, 30] {
                for c in [1.0, 1.0 + 1.0 / 1024.0, 1.999, 0.0, tiny, 7.0 * tiny] {
                    let a = 1.0 + i as f32 / 1024.0;
                    let b = round(-(1.0 - j as f32 / 2048.0) * 0.5f32.powi(k));
                    cases.push((a, b, c));
                    cases.push((a, -b, -c));
                }
            }
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let f16_val = |rng: &mut rand::rngs::StdRng| loop {
        let h = half::f16::from_bits(rng.gen());
        if h.is_finite() {
            return h.to_f32();
        }
    };
    for _ in 0..200_000 {
        let a = f16_val(&mut rng);
        let b = f16_val(&mut rng);
        let c = if rng.gen() {
            f16_val(&mut rng)
        } else {
            round(-a * b)
        };
        cases.push((a, b, c));
    }
    // Sums among the F16 subnormals: small normal operands (2^-14..2^-9) and a subnormal
    // accumulator, where the product's low bits reach below f32's last place (about one
    // case in forty thousand is a tie that rounding twice gets wrong).
    for _ in 0..1_000_000 {
        let small = |rng: &mut rand::rngs::StdRng| {
            half::f16::from_bits(rng.gen_range(0x0400..0x1800)).to_f32()
        };
        let (a, b) = (small(&mut rng), small(&mut rng));
        let c = half::f16::from_bits(rng.gen_range(0..0x0400)).to_f32();
        cases.push((a, b, if rng.gen() { c } else { -c }));
    }
    // What each case must give: F16 rounds to infinity from halfway past 65504 on.
    let want: Vec<f32> = cases
        .iter()
        .map(|&(a, b, c)| {
            let exact = a as f64 * b as f64 + c as f64;
            if exact.abs() >= 65520.0 {
                f32::INFINITY.copysign(exact as f32)
            } else {
                nearest_f16(exact)
            }
        })
        .collect();
    // The cases must hold ties that rounding the f32 sum twice gets wrong, among F16
    // normals and among subnormals (whose halfway bit the tests for ties find apart).
    let wrong_twice = |sub: bool| {
        cases.iter().zip(&want).any(|(&(a, b, c), &w)| {
            round(a.mul_add(b, c)) != w && (w.abs() < 2f32.powi(-14)) == sub
        })
    };
    assert!(wrong_twice(false), "no ties among F16 normals in the cases");
    assert!(
        wrong_twice(true),
        "no ties among F16 subnormals in the cases"
    );
    // Every case through `f`, `n` lanes at a time (a, b, c in, the rounded sums out).
    type Lanes<'a> = dyn Fn([&[f32]; 3], &mut [f32]) + 'a;
    let each = |n: usize, f: &Lanes| {
        for (at, part) in cases.chunks_exact(n).enumerate().map(|(i, p)| (i * n, p)) {
            let lane = |k: fn(&(f32, f32, f32)) -> f32| part.iter().map(k).collect::<Vec<_>>();
            let mut got = vec![0.0f32; n];
            f([&lane(|x| x.0), &lane(|x| x.1), &lane(|x| x.2)], &mut got);
            for (l, &g) in got.iter().enumerate() {
                let (a, b, c) = part[l];
                assert_eq!(g.to_bits(), want[at + l].to_bits(), "{a} * {b} + {c}");
            }
        }
    };
    if synapse_quant::cpu().avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked); eight floats each way.
        each(8, &|[a, b, c], got| unsafe {
            let s = fma_for_f16_ymm(
                _mm256_loadu_ps(a.as_ptr()),
                _mm256_loadu_ps(b.as_ptr()),
                _mm256_loadu_ps(c.as_ptr()),
            );
            _mm256_storeu_ps(got.as_mut_ptr(), round_f16_ymm(s));
        });
    } else {
        eprintln!(
            "not run: no AVX2, FMA and F16C (CPU or SYNAPSE_ISA): fma_for_f16_ymm is never used"
        );
    }
    if synapse_quant::cpu().avx512f() {
        // SAFETY: the CPU has AVX-512 F, FMA and F16C (checked); sixteen floats each way.
        each(16, &|[a, b, c], got| unsafe {
            let s = fma_for_f16_zmm(
                _mm512_loadu_ps(a.as_ptr()),
                _mm512_loadu_ps(b.as_ptr()),
                _mm512_loadu_ps(c.as_ptr()),
            );
            _mm512_storeu_ps(got.as_mut_ptr(), round_f16_zmm(s));
        });
    } else {
        eprintln!("not run: no AVX-512 F (CPU or SYNAPSE_ISA): fma_for_f16_zmm is never used");
    }
}

/// `V3`'s vector F16 arithmetic gives `Scalar`'s bits: the multiply-add on the cases of
/// `fma_for_f16_rounds_once` (ties included) and on random F16 operands of every sign and
/// magnitude, and the widening and rounding on every F16 value and random f32s.
#[cfg(target_arch = "x86_64")]
#[test]
fn v3_head_ops_match_scalar() {
    use rand::{Rng, SeedableRng};
    if !synapse_quant::cpu().avx2() {
        eprintln!("skipped: no AVX2/FMA/F16C (CPU or SYNAPSE_ISA): Scalar is the only path here");
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    let f16_val = |rng: &mut rand::rngs::StdRng| loop {
        let h = half::f16::from_bits(rng.gen());
        if h.is_finite() {
            return h.to_f32();
        }
    };
    let round = |x: f32| half::f16::from_f32(x).to_f32();
    let (mut fixed, n) = (0usize, 1 << 18);
    for _ in 0..n / 64 {
        let vs16 = f16_val(&mut rng);
        let row: Vec<f32> = (0..67).map(|_| f16_val(&mut rng)).collect();
        let acc: Vec<f32> = (0..67)
            .map(|i| match i % 3 {
                0 => f16_val(&mut rng),
                // Near the product, so that sums are small and ties frequent.
                _ => round(-row[i] * vs16 * (1.0 + rng.gen_range(-0.01f32..0.01))),
            })
            .collect();
        let (mut a, mut b) = (acc.clone(), acc.clone());
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        unsafe {
            Scalar::mad_f16(&mut a, &row, vs16);
            V3::mad_f16(&mut b, &row, vs16);
        }
        for i in 0..67 {
            assert_eq!(
                a[i].to_bits(),
                b[i].to_bits(),
                "{} * {vs16} + {}",
                row[i],
                acc[i]
            );
            fixed += (a[i] != row[i] * vs16 + acc[i]) as usize;
        }
    }
    assert!(fixed > 0, "no tie was corrected in {n} random cases");
    // Widening every F16 value, and rounding random f32s (subnormal F16 results included).
    let all: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
    let (mut w1, mut w2) = (vec![0.0; all.len()], vec![0.0; all.len()]);
    let xs: Vec<f32> = (0..4099)
        .map(|_| {
            f32::from_bits(rng.gen_range(0x3000_0000u32..0x4800_0000))
                * if rng.gen() { 1.0 } else { -1.0 }
        })
        .collect();
    let (mut r1, mut r2) = (xs.clone(), xs.clone());
    let mut h16 = vec![half::f16::ZERO; xs.len()];
    // SAFETY: as above.
    unsafe {
        Scalar::widen(&all, &mut w1);
        V3::widen(&all, &mut w2);
        Scalar::round_f16(&mut r1, &mut h16);
        V3::round_f16(&mut r2, &mut h16);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&w1), bits(&w2));
    assert_eq!(bits(&r1), bits(&r2));
    // The dot product, with and without tails.
    for n in [1, 63, 64, 100, 128, 200, 256] {
        let q: Vec<f32> = (0..n).map(|_| f16_val(&mut rng) / 256.0).collect();
        let k: Vec<f32> = (0..n).map(|_| f16_val(&mut rng) / 256.0).collect();
        // SAFETY: as above.
        let (a, b) = unsafe { (Scalar::dot(&q, &k), V3::dot(&q, &k)) };
        assert_eq!(a.to_bits(), b.to_bits(), "dot of {n}");
        // And against F16 keys, widened in the register (V3) or first (Scalar).
        let k16: Vec<half::f16> = (0..n)
            .map(|_| half::f16::from_f32(f16_val(&mut rng)))
            .collect();
        let kf: Vec<f32> = k16.iter().map(|h| h.to_f32()).collect();
        // SAFETY: as above.
        let (c, d, e) = unsafe {
            (
                Scalar::dot(&q, &kf),
                Scalar::dot_h(&q, &k16),
                V3::dot_h(&q, &k16),
            )
        };
        assert_eq!(c.to_bits(), d.to_bits(), "dot_h (scalar) of {n}");
        assert_eq!(c.to_bits(), e.to_bits(), "dot_h (v3) of {n}");
    }
}

/// [`V4`]'s passes give [`Scalar`]'s bits: the multiply-add and rescale one position at a
/// time on random F16 operands near ties (with and without the native-F16 part, with and
/// without a tail), the key's dot product, and whole heads over random caches.
#[cfg(target_arch = "x86_64")]
#[test]
fn v4_head_ops_match_scalar() {
    use rand::{Rng, SeedableRng};
    if !synapse_quant::cpu().avx512f() {
        eprintln!("skipped: no AVX-512 F (CPU or SYNAPSE_ISA): V4 is never used here");
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let f16_val = |rng: &mut rand::rngs::StdRng| loop {
        let h = half::f16::from_bits(rng.gen());
        if h.is_finite() {
            return h.to_f32();
        }
    };
    let round = |x: f32| half::f16::from_f32(x).to_f32();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut fixed = 0usize;
    for (n, simd) in [
        (256, 256),
        (256, 128),
        (64, 0),
        (67, 0),
        (131, 128),
        (16, 0),
    ] {
        for _ in 0..2000 {
            let vs16 = f16_val(&mut rng);
            let vs = vs16 * (1.0 + rng.gen_range(-1e-3f32..1e-3));
            let v: Vec<half::f16> = (0..n)
                .map(|_| half::f16::from_f32(f16_val(&mut rng)))
                .collect();
            let acc: Vec<f32> = (0..n)
                .map(|i| match i % 3 {
                    0 => f16_val(&mut rng),
                    _ => round(-v[i].to_f32() * vs16 * (1.0 + rng.gen_range(-0.01f32..0.01))),
                })
                .collect();
            let (mut a, mut b) = (acc.clone(), acc.clone());
            let (mut row, mut h16) = (vec![0.0; n], vec![half::f16::ZERO; n]);
            // SAFETY: the CPU has AVX-512 F (checked above), hence V3's features too.
            unsafe {
                Scalar::accumulate(&mut a, &v, simd, vs16, vs, &mut row, &mut h16);
                V4::accumulate(&mut b, &v, simd, vs16, vs, &mut row, &mut h16);
            }
            assert_eq!(bits(&a), bits(&b), "accumulate, n {n}, simd {simd}");
            fixed += (0..simd.min(n))
                .filter(|&i| a[i] != round(v[i].to_f32() * vs16 + acc[i]))
                .count();
            let ms16 = round(rng.gen_range(0.0f32..1.0));
            let ms = ms16 * (1.0 + rng.gen_range(-1e-3f32..1e-3));
            // SAFETY: as above.
            unsafe {
                Scalar::rescale(&mut a, simd, ms16, ms, &mut h16);
                V4::rescale(&mut b, simd, ms16, ms, &mut h16);
            }
            assert_eq!(bits(&a), bits(&b), "rescale, n {n}, simd {simd}");
        }
    }
    assert!(fixed > 0, "no F16 tie was corrected");
    for n in [1, 63, 64, 100, 128, 200, 256] {
        let q: Vec<f32> = (0..n).map(|_| f16_val(&mut rng) / 256.0).collect();
        let k: Vec<half::f16> = (0..n)
            .map(|_| half::f16::from_f32(f16_val(&mut rng) / 256.0))
            .collect();
        // SAFETY: as above.
        let (a, b) = unsafe { (Scalar::dot_h(&q, &k), V4::dot_h(&q, &k)) };
        assert_eq!(a.to_bits(), b.to_bits(), "dot_h of {n}");
    }
    // Whole heads: GQA groups, every head width the F16 split treats differently.
    for (hd, n_head, n_head_kv, n_pos) in [(64, 9, 3, 300), (256, 4, 1, 97), (80, 2, 2, 50)] {
        let s = AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            softcap: None,
        };
        let len = n_head_kv * n_pos * hd;
        let f16s = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<half::f16> {
            (0..n)
                .map(|_| half::f16::from_f32(rng.gen_range(-4.0f32..4.0)))
                .collect()
        };
        let (keys, values) = (f16s(&mut rng, len), f16s(&mut rng, len));
        let q: Vec<f32> = (0..n_head * hd).map(|_| rng.gen_range(-4.0..4.0)).collect();
        let mut scratch = HeadScratch::new();
        let mut nonzero = false;
        for h in 0..n_head {
            let mut o = [vec![0.0; hd], vec![0.0; hd], vec![0.0; hd]];
            // V3 and V4 run only because the CPU has their features (checked above).
            let (k, v, head) = (&keys[..], &values[..], n_pos * hd);
            attend_head::<Scalar>(&s, h, &q, k, v, head, n_pos, &mut o[0], &mut scratch);
            attend_head::<V3>(&s, h, &q, k, v, head, n_pos, &mut o[1], &mut scratch);
            attend_head::<V4>(&s, h, &q, k, v, head, n_pos, &mut o[2], &mut scratch);
            assert_eq!(bits(&o[0]), bits(&o[1]), "V3 head {h} of width {hd}");
            assert_eq!(bits(&o[0]), bits(&o[2]), "V4 head {h} of width {hd}");
            nonzero |= o[0].iter().any(|&x| x != 0.0);
        }
        assert!(nonzero);
    }
}

/// A fast path gives [`Scalar`]'s bits for whole heads: `run` computes the heads of each
/// case (every way the path can: it fills the jobs' outputs, and returns each way's, named),
/// from the keys and values of the cache positions `base..` (for staging). The cases: every
/// width the paths take, GQA groups, heads side by side that see different numbers of
/// positions (1 to a few hundred, not multiples of 8 or 16), and scores whose maximum grows
/// late.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
fn fast_heads_match_scalar(
    seed: u64,
    mut run: impl FnMut(
        &AttnShape,
        LayerRows,
        usize,
        &mut [HeadJob],
        &mut [HeadScratch],
    ) -> Vec<(String, Vec<f32>)>,
) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // `one`: every head sees the same positions, as a token's heads do in decode (the
    // heads of a GQA group then share their rows' widening). `ends`: the heads see the
    // same first position but different numbers of them, as the tokens of a batch do
    // (they then share their rows where they overlap; the first of them is not the one
    // that sees the most, as in a batch, where it is the earliest token).
    for (hd, n_head, n_head_kv, n_pos, one, ends, ties) in [
        (64, 9, 3, 300, false, false, false),
        (64, 7, 7, 17, false, false, false),
        (128, 4, 2, 129, false, false, false),
        (128, 3, 1, 70, false, false, false),
        (256, 4, 1, 97, false, false, false),
        (64, 4, 1, 1, false, false, false),
        (64, 8, 2, 300, true, false, false),
        (64, 9, 3, 77, true, false, false),
        (128, 4, 1, 129, true, false, false),
        (256, 4, 1, 97, true, false, false),
        (64, 8, 2, 203, false, true, false),
        (128, 6, 1, 150, false, true, false),
        (256, 3, 1, 61, false, true, false),
        // `ties`: values far from zero and scores that fall from the first position on, so
        // the accumulator outgrows each step's product and is never rescaled: many f32
        // sums are inexact, some of those are F16 ties (ggml's F16 path rounds them by
        // the exact sum, not to even), and a tie rounded the wrong way stays in the output.
        (128, 4, 1, 300, false, false, true),
        (256, 2, 1, 200, false, true, true),
    ] {
        let s = AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            softcap: None,
        };
        // The cache's layout: KV head `g`'s row of position `p` at `(g * n_pos + p) * hd`.
        let (head, len) = (n_pos * hd, n_head_kv * n_pos * hd);
        let pos_of = |i: usize| i % head / hd;
        let f16s = |rng: &mut rand::rngs::StdRng, n: usize, r: f32| -> Vec<half::f16> {
            (0..n)
                .map(|j| half::f16::from_f32(rng.gen_range(-r..r) * (1 + pos_of(j) / 50) as f32))
                .collect()
        };
        let (keys, values, q): (Vec<half::f16>, Vec<half::f16>, Vec<f32>) = if ties {
            let n = len;
            let keys = (0..n)
                .map(|i| {
                    let fall = 1.0 - pos_of(i) as f32 / n_pos as f32;
                    half::f16::from_f32(2.0 * fall + rng.gen_range(-0.01..0.01))
                })
                .collect();
            let values = (0..n)
                .map(|_| half::f16::from_f32(rng.gen_range(200.0..260.0)))
                .collect();
            let q = (0..n_head * hd).map(|_| rng.gen_range(0.4..0.6)).collect();
            (keys, values, q)
        } else {
            let q = (0..n_head * hd).map(|_| rng.gen_range(-4.0..4.0)).collect();
            (f16s(&mut rng, len, 2.0), f16s(&mut rng, len, 4.0), q)
        };
        // Head h sees positions first(h)..last(h): starts off a block boundary (past the
        // first block for some, as a sliding window does), uneven ends. Staged from `base`.
        let uneven = n_pos > 40 && !one && !ends;
        let base = if uneven { 5 } else { 0 };
        let first = |h: usize| {
            if uneven {
                base + [0, 1, 2, 19][h % 4]
            } else {
                0
            }
        };
        let seen = |h: usize| {
            n_pos
                - first(h)
                - match (one, ends) {
                    (true, _) => 0,
                    (_, true) => [17, 1, 0, 5][h % 4],
                    _ if n_pos > 4 => h % 2,
                    _ => 0,
                }
        };
        // Heads with a sink below and above their scores, and none.
        let sink = |h: usize| [None, Some(-5.0), Some(8.0)][h % 3];
        let mut want = vec![0.0; n_head * hd];
        let mut scratch = [HeadScratch::new()];
        let group = n_head / n_head_kv;
        for (h, out) in want.chunks_exact_mut(hd).enumerate() {
            let job = HeadJob {
                q: &q[h * hd..][..hd],
                keys: &keys[(h / group) * head + first(h) * hd..],
                values: &values[(h / group) * head + first(h) * hd..],
                n_pos: seen(h),
                out,
                kv_head: h / group,
                first: first(h),
                sink: sink(h),
            };
            attend_heads::<Scalar, 1>(&s, [job], &mut scratch);
        }
        let mut got = vec![0.0; n_head * hd];
        let mut jobs: Vec<HeadJob> = got
            .chunks_exact_mut(hd)
            .enumerate()
            .map(|(h, out)| HeadJob {
                q: &q[h * hd..][..hd],
                // Each head's rows end where its positions do, as the engine's slices of
                // the cache do.
                keys: &keys[(h / group) * head + first(h) * hd..][..seen(h) * hd],
                values: &values[(h / group) * head + first(h) * hd..][..seen(h) * hd],
                n_pos: seen(h),
                out,
                kv_head: h / group,
                first: first(h),
                sink: sink(h),
            })
            .collect();
        let mut scratch: Vec<HeadScratch> = (0..n_head).map(|_| HeadScratch::new()).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let rows = LayerRows {
            keys: &keys[base * hd..],
            values: &values[base * hd..],
            head,
            n_pos: n_pos - base,
        };
        let ways = run(&s, rows, base, &mut jobs, &mut scratch);
        assert!(!ways.is_empty());
        for (way, got) in ways {
            assert_eq!(
                bits(&want),
                bits(&got),
                "{way}: width {hd}, {n_head} heads, {n_pos} positions, same positions {one}, \
                 same first {ends}"
            );
        }
        assert!(want.iter().any(|&x| x != 0.0));
    }
}

/// The AVX-512 fast path gives [`Scalar`]'s bits for whole heads, with and without
/// AVX512-FP16, staged or not ([`fast_heads_match_scalar`]'s cases).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_heads_match_scalar() {
    if !synapse_quant::cpu().avx512f() || !avx512::takes(64) {
        eprintln!("skipped: no AVX-512 F (CPU or SYNAPSE_ISA): the fast path is never used here");
        return;
    }
    fast_heads_match_scalar(18, |s, rows, base, jobs, scratch| {
        let mut buf = Vec::new();
        // SAFETY: the CPU has AVX-512 F and x86-64-v3 (checked above).
        let staged = unsafe { avx512::Staged::new(s, rows, base, &mut buf) };
        let mut ways = Vec::new();
        for (fp16, stage) in [(false, false), (true, false), (false, true), (true, true)] {
            if fp16 && !avx512::has_avx512fp16() {
                eprintln!("not run: this CPU lacks AVX512-FP16");
                continue;
            }
            jobs.iter_mut().for_each(|j| j.out.fill(0.0));
            // SAFETY: the CPU has AVX-512 F and x86-64-v3 (checked above), and
            // AVX512-FP16 when `fp16`; `staged` holds every position.
            unsafe { avx512::heads_with(s, jobs, scratch, fp16, stage.then_some(&staged)) };
            let got = jobs.iter().flat_map(|j| j.out.iter().copied()).collect();
            ways.push((format!("fp16 {fp16}, staged {stage}"), got));
        }
        ways
    });
}

/// The AVX2 fast path gives [`Scalar`]'s bits for whole heads, staged or not
/// ([`fast_heads_match_scalar`]'s cases).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_heads_match_scalar() {
    if !synapse_quant::cpu().avx2() || !avx2::takes(64) {
        eprintln!("skipped: no AVX2/FMA/F16C (CPU or SYNAPSE_ISA): the path is never used");
        return;
    }
    fast_heads_match_scalar(19, |s, rows, base, jobs, scratch| {
        let mut buf = Vec::new();
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        let staged = unsafe { avx2::Staged::new(s, rows, base, &mut buf) };
        let mut ways = Vec::new();
        for stage in [false, true] {
            jobs.iter_mut().for_each(|j| j.out.fill(0.0));
            // SAFETY: as above; `staged` holds every position.
            unsafe { avx2::heads(s, jobs, scratch, stage.then_some(&staged)) };
            let got = jobs.iter().flat_map(|j| j.out.iter().copied()).collect();
            ways.push((format!("staged {stage}"), got));
        }
        ways
    });
}

/// Each vector `expf` (AVX2, AVX-512) gives libm's bits: the sweep its first use makes,
/// every f32 of the range attention uses (`-104 < x <= 0`, below which all give 0), and
/// every 7th of the others. (Fusing one multiply-add fewer than glibc does differs on two inputs of
/// 2^32, one of them negative.)
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp_is_libm_expf() {
    type Exp = fn(&mut [f32; 16]);
    let mut paths: Vec<(&str, Exp)> = Vec::new();
    if synapse_quant::cpu().avx2() {
        assert!(avx2::vector_exp_matches_libm());
        // SAFETY: the CPU has AVX2, FMA and F16C (just checked).
        paths.push(("exp8 (AVX2)", |x| unsafe { avx2::exp_16(x) }));
    }
    if synapse_quant::cpu().avx512f() {
        assert!(avx512::vector_exp_matches_libm());
        // SAFETY: the CPU has AVX-512 F and x86-64-v3 (just checked).
        paths.push(("exp16 (AVX-512)", |x| unsafe { avx512::exp_16(x) }));
    }
    if paths.is_empty() {
        eprintln!("skipped: no AVX2 (CPU or SYNAPSE_ISA): no vector expf is used here");
        return;
    }
    let ranges = [
        (0x8000_0000, 0xa000_0000, 1),
        (0xa000_0001, 0xc2d0_0000, 1),
        (0, 0x7fff_ffff, 7),
        (0xc2d0_0001, u32::MAX, 7),
    ];
    std::thread::scope(|s| {
        for (name, exp) in paths {
            for (first, last, step) in ranges {
                s.spawn(move || assert!(exp_agrees(exp, first, last, step), "{name}"));
            }
        }
    });
}

/// A sink joins the softmax as a position without a value: the weights of the real positions
/// are `e^(s_j) / (Σ e^(s_i) + e^(sink))`, whether the sink is above every score or below.
#[test]
fn a_sink_takes_its_share_of_the_softmax() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(44);
    let (hd, n_pos) = (64, 9);
    let s = AttnShape {
        n_head: 1,
        n_head_kv: 1,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        softcap: None,
    };
    let f16s = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<half::f16> {
        (0..n)
            .map(|_| half::f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect()
    };
    let (keys, values) = (f16s(&mut rng, n_pos * hd), f16s(&mut rng, n_pos * hd));
    let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let scores: Vec<f64> = (0..n_pos)
        .map(|j| {
            let k = &keys[j * hd..][..hd];
            q.iter()
                .zip(k)
                .map(|(a, b)| *a as f64 * b.to_f64())
                .sum::<f64>()
                * s.scale as f64
        })
        .collect();
    let top = scores.iter().cloned().fold(f64::MIN, f64::max);
    for sink in [None, Some(top as f32 - 2.0), Some(top as f32 + 1.5)] {
        let mut out = vec![0.0f32; hd];
        let job = HeadJob {
            q: &q,
            keys: &keys,
            values: &values,
            n_pos,
            out: &mut out,
            kv_head: 0,
            first: 0,
            sink,
        };
        attend_heads::<Scalar, 1>(&s, [job], &mut [HeadScratch::new()]);
        let z: f64 =
            scores.iter().map(|x| x.exp()).sum::<f64>() + sink.map_or(0.0, |x| (x as f64).exp());
        for (d, &got) in out.iter().enumerate() {
            let want: f64 = (0..n_pos)
                .map(|j| scores[j].exp() / z * values[j * hd + d].to_f64())
                .sum();
            assert!(
                (got as f64 - want).abs() < 2e-3,
                "sink {sink:?}, value {d}: {got} vs {want}"
            );
        }
    }
}

//! The AVX2 and AVX-512 VNNI kernels against the reference, bit for bit, on random blocks, odd
//! block and row counts, each where this CPU can run it. (The property tests check only the
//! kernel the dispatch picks; on an AVX-512 machine that hides the AVX2 ones.)

use super::*;
use crate::test_util::{check, reference, reference_rows8, Case};

fn has_v3() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[test]
fn avx2_kernels_are_bit_identical_to_the_reference() {
    if !has_v3() {
        eprintln!("no AVX2/FMA/F16C on this CPU: the AVX2 kernels cannot run here");
        return;
    }
    use GgmlType as T;
    let cases: Vec<Case> = vec![
        (T::Q4_0, q4_0, q4_0_gemv, reference(T::Q4_0)),
        (T::Q4_1, q4_1, q4_1_gemv, reference(T::Q4_1)),
        (T::Q5_0, q5_0, q5_0_gemv, reference(T::Q5_0)),
        (T::Q5_1, q5_1, q5_1_gemv, reference(T::Q5_1)),
        (T::Q8_0, q8_0, q8_0_gemv, reference(T::Q8_0)),
        (T::Q2_K, q2_k, q2_k_gemv, reference(T::Q2_K)),
        (T::IQ4_NL, iq4_nl, iq4_nl_gemv, reference(T::IQ4_NL)),
        (T::Q3_K, q3_k, q3_k_gemv, reference(T::Q3_K)),
        (T::Q4_K, q4_k, q4_k_gemv, reference(T::Q4_K)),
        (T::Q5_K, q5_k, q5_k_gemv, reference(T::Q5_K)),
        (T::Q6_K, q6_k, q6_k_gemv, reference(T::Q6_K)),
        (T::IQ4_XS, iq4_xs, iq4_xs_gemv, reference(T::IQ4_XS)),
        (
            T::Q4_0,
            q4_0_rows8,
            q4_0_rows8_gemv,
            reference_rows8(T::Q4_0),
        ),
        (
            T::IQ4_NL,
            iq4_nl_rows8,
            iq4_nl_rows8_gemv,
            reference_rows8(T::IQ4_NL),
        ),
        (
            T::Q4_K,
            q4_k_rows8,
            q4_k_rows8_gemv,
            reference_rows8(T::Q4_K),
        ),
        (
            T::Q2_K,
            q2_k_rows8,
            q2_k_rows8_gemv,
            reference_rows8(T::Q2_K),
        ),
    ];
    for seed in 0..20 {
        check(seed, &cases);
    }
}

#[test]
fn avx512_vnni_kernels_are_bit_identical_to_the_reference() {
    if !has_avx512_vnni() {
        eprintln!("no AVX-512 VNNI on this CPU: the AVX-512 kernels cannot run here");
        assert!(avx512_vec_dot(GgmlType::Q6_K).is_none());
        return;
    }
    let mut cases: Vec<Case> = Vec::new();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q6_K,
    ] {
        let (f, g) = avx512_vec_dot(ty).unwrap();
        cases.push((ty, f, g, reference(ty)));
    }
    let (f, g) = avx512_rows8(GgmlType::Q4_0).unwrap();
    cases.push((GgmlType::Q4_0, f, g, reference_rows8(GgmlType::Q4_0)));
    for seed in 100..120 {
        check(seed, &cases);
    }
}

#[test]
fn avxvnni_kernels_are_bit_identical_to_the_reference() {
    if !has_avxvnni() {
        eprintln!("no AVX-VNNI on this CPU: the AVX-VNNI kernels cannot run here");
        assert!(avxvnni_vec_dot(GgmlType::Q4_0).is_none());
        return;
    }
    let mut cases: Vec<Case> = Vec::new();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let (f, g) = avxvnni_vec_dot(ty).unwrap();
        cases.push((ty, f, g, reference(ty)));
    }
    let (f, g) = avxvnni_rows8(GgmlType::Q4_0).unwrap();
    cases.push((GgmlType::Q4_0, f, g, reference_rows8(GgmlType::Q4_0)));
    for seed in 200..220 {
        check(seed, &cases);
    }
}

/// The float kernels (AVX2, AVX-512 by one and by four rows, the AVX-512 tiles) against the
/// reference, bit for bit: lengths around the 64-value step (every tail shape), past one
/// 2048-value chunk of the tiles, 1..9 rows, 1..11 tokens.
#[test]
fn float_kernels_are_bit_identical_to_the_reference() {
    if !has_v3() {
        eprintln!("no AVX2/FMA/F16C on this CPU: the float kernels cannot run here");
        return;
    }
    float_kernels::<half::f16>(
        GgmlType::F16,
        2,
        (f16_avx2, f16_avx2_gemv),
        (f16_512, f16_512_gemv),
    );
    float_kernels::<f32>(
        GgmlType::F32,
        4,
        (f32_avx2, f32_avx2_gemv),
        (f32_512, f32_512_gemv),
    );
}

fn float_kernels<E: f16::Elem>(
    ty: GgmlType,
    size: usize,
    avx2: (DotFn, GemvFn),
    avx512: (DotFn, GemvFn),
) {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let reference = reference(ty);
    let mut rng = StdRng::seed_from_u64(16);
    for n in [
        1, 7, 8, 15, 16, 23, 24, 63, 64, 65, 88, 127, 128, 200, 256, 1000, 4100, 8200,
    ] {
        for n_rows in [1, 3, 4, 5, 9, 37] {
            let wf: Vec<f32> = (0..n * n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let wb = crate::quantize(ty, &wf).unwrap();
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let mut a = vec![0u8; size * n];
            crate::quantize_act_row(ty, &x, &mut a).unwrap();
            assert_eq!(a, crate::quantize(ty, &x).unwrap(), "{ty} rounding, n {n}");
            let row_bytes = size * n;
            let mut kernels: Vec<(DotFn, GemvFn)> = vec![avx2];
            let mut gemms: Vec<crate::GemmFn> = vec![f16::gemm_avx2::<E>];
            if f16::has_avx512() {
                kernels.push(avx512);
                gemms.push(f16::gemm_512::<E>);
            }
            for gemm in gemms {
                for n_tok in [1, 2, 3, 4, 5, 8, 11] {
                    let xs: Vec<f32> = (0..n * n_tok)
                        .map(|_| rng.gen_range(-3.0f32..3.0))
                        .collect();
                    let mut at = vec![0u8; size * n * n_tok];
                    crate::quantize_act_row(ty, &xs, &mut at).unwrap();
                    let mut out = vec![f32::NAN; n_rows * n_tok];
                    gemm(&wb, row_bytes, &at, n_tok, &mut out).unwrap();
                    for t in 0..n_tok {
                        for (r, wr) in wb.chunks_exact(row_bytes).enumerate() {
                            let want = reference(wr, &at[t * size * n..][..size * n]).unwrap();
                            let got = out[t * n_rows + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{ty} n {n}: row {r}, token {t}"
                            );
                        }
                    }
                }
            }
            for (f, gemv) in kernels {
                let mut out = vec![f32::NAN; n_rows];
                gemv(&wb, row_bytes, &a, &mut out).unwrap();
                for (r, wr) in wb.chunks_exact(row_bytes).enumerate() {
                    let want = reference(wr, &a).unwrap();
                    assert_eq!(f(wr, &a).unwrap().to_bits(), want.to_bits(), "{ty} n {n}");
                    assert_eq!(out[r].to_bits(), want.to_bits(), "{ty} n {n} row {r}");
                }
            }
        }
    }
}

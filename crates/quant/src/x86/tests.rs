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

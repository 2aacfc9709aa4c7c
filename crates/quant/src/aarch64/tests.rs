//! Both integer paths (widening multiplies, and `sdot` where the CPU has it: qemu's `-cpu max`
//! does) against the reference, bit for bit, on random blocks, odd block and row counts.

use super::*;
use crate::test_util::{check, reference, reference_rows8, Case};

fn cases<D: Dot>() -> Vec<Case> {
    let mut out = Vec::new();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ] {
        let (f, g) = vec_dot_with::<D>(ty).unwrap();
        out.push((ty, f, g, reference(ty)));
    }
    for ty in [
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::Q4_K,
        GgmlType::Q2_K,
    ] {
        let (f, g) = rows8_with::<D>(ty).unwrap();
        out.push((ty, f, g, reference_rows8(ty)));
    }
    out
}

#[test]
fn widening_kernels_are_bit_identical_to_the_reference() {
    for seed in 0..20 {
        check(seed, &cases::<Widen>());
    }
}

#[test]
fn dotprod_kernels_are_bit_identical_to_the_reference() {
    // CI runs it under qemu-user's `-cpu max`, which has FEAT_DotProd, with
    // SYNAPSE_EXPECT_DOTPROD set. On a CPU without it the dispatch never hands these kernels
    // out, and the entries refuse.
    let expected = std::env::var_os("SYNAPSE_EXPECT_DOTPROD").is_some();
    assert!(
        !expected || DotProd::detect().is_some(),
        "SYNAPSE_EXPECT_DOTPROD is set but this CPU has no FEAT_DotProd"
    );
    let Some(_) = DotProd::detect() else {
        let err = q4_0::<DotProd>(&[0; 18], &[0; 34]).unwrap_err();
        assert!(matches!(err, QuantError::Unsupported { .. }), "{err}");
        eprintln!("no FEAT_DotProd on this CPU: only the refusal was checked");
        return;
    };
    for seed in 100..120 {
        check(seed, &cases::<DotProd>());
    }
}

/// Bad lengths through the entries are errors, not panics.
#[test]
fn entries_check_lengths() {
    let (w, a) = (vec![0u8; 2 * 144], vec![0u8; 292]);
    let (f, gemv) = vec_dot_with::<Widen>(GgmlType::Q4_K).unwrap();
    assert!(f(&w, &a).is_err());
    assert!(gemv(&w, 144, &a, &mut [0.0f32; 3]).is_err());
    assert!(f(&w[..143], &a).is_err());
}

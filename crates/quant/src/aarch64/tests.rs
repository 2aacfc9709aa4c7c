//! Both integer paths (widening multiplies, and `sdot` where the CPU has it: qemu's `-cpu max`
//! does) against the reference, bit for bit, on random blocks, odd block and row counts.

use super::*;
use crate::kernels::{Isa, Order};
use crate::test_util::{check, reference, reference_rows8, Case};

/// The table's NEON row kernels that need `isa`.
fn cases(isa: Isa) -> Vec<Case> {
    let rows = crate::kernels::table().iter().filter(|k| k.isa() == isa);
    let cases: Vec<Case> = rows
        .filter_map(|k| {
            let (f, g) = k.row()?;
            let reference = match k.order() {
                Order::VecDot => reference(k.ty()),
                Order::Rows8 => reference_rows8(k.ty()),
            };
            (k.ty() != GgmlType::BF16).then_some((k.ty(), f, g, reference))
        })
        .collect();
    assert_eq!(
        cases.len(),
        18,
        "{isa:?}: every quantized format in both orders"
    );
    cases
}

#[test]
fn widening_kernels_are_bit_identical_to_the_reference() {
    for seed in 0..20 {
        check(seed, &cases(Isa::Neon));
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
        check(seed, &cases(Isa::NeonDotProd));
    }
}

/// Bad lengths through the entries are errors, not panics.
#[test]
fn entries_check_lengths() {
    let (w, a) = (vec![0u8; 2 * 144], vec![0u8; 292]);
    let (f, gemv) = (q4_k::<Widen>, q4_k_gemv::<Widen>);
    assert!(f(&w, &a).is_err());
    assert!(gemv(&w, 144, &a, &mut [0.0f32; 3]).is_err());
    assert!(f(&w[..143], &a).is_err());
}

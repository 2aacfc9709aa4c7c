//! Both integer paths (widening multiplies, and `sdot` where the CPU has it: qemu's `-cpu max`
//! does) against the reference, bit for bit, on random blocks, odd block and row counts.

use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

use super::*;
use crate::codec::cast_blocks;
use crate::reference::dot as r;

/// Byte offsets of the f16 scale fields of a block of `ty`, which random bits would make
/// NaN or huge.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::Q2_K => &[80, 82],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        _ => unreachable!("{ty}"),
    }
}

fn random_weights(rng: &mut StdRng, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
    let mut w = vec![0u8; n_blocks * ty.block_bytes()];
    rng.fill_bytes(&mut w);
    for b in w.chunks_exact_mut(ty.block_bytes()) {
        for &at in f16_fields(ty) {
            let v = rng.gen_range(-2.0f32..2.0) * 10f32.powi(rng.gen_range(-4..1));
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    w
}

/// (type, NEON entry, NEON gemv, reference) for every kernel, both orders.
type Case = (GgmlType, DotFn, GemvFn, DotFn);

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
        let reference = crate::codec(ty).unwrap().vec_dot.unwrap().f;
        out.push((ty, f, g, reference));
    }
    fn q4_0_r(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockQ4_0>(w, a, r::vec_dot_q4_0_q8_0_rows8)
    }
    fn iq4_nl_r(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockIQ4NL>(w, a, r::vec_dot_iq4_nl_q8_0_rows8)
    }
    fn q4_k_r(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockQ4K>(w, a, r::vec_dot_q4_k_q8_k_rows8)
    }
    fn q2_k_r(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockQ2K>(w, a, r::vec_dot_q2_k_q8_k_rows8)
    }
    let refs: [(GgmlType, DotFn); 4] = [
        (GgmlType::Q4_0, q4_0_r),
        (GgmlType::IQ4_NL, iq4_nl_r),
        (GgmlType::Q4_K, q4_k_r),
        (GgmlType::Q2_K, q2_k_r),
    ];
    for (ty, reference) in refs {
        let (f, g) = rows8_with::<D>(ty).unwrap();
        out.push((ty, f, g, reference));
    }
    out
}

fn check<D: Dot>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (ty, f, gemv, reference) in cases::<D>() {
        let act = crate::vec_dot_type(ty).unwrap();
        for n_blocks in [1, 2, 3, 5, 8] {
            // Whole activation blocks: 32-value formats get odd counts of their own blocks.
            let n = n_blocks * ty.block_len();
            let n_rows = rng.gen_range(1..6);
            let w = random_weights(&mut rng, ty, n_blocks * n_rows);
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let mut a = vec![0u8; n / act.block_len() * act.block_bytes()];
            crate::quantize_act_row(act, &x, &mut a).unwrap();
            let row_bytes = n_blocks * ty.block_bytes();
            let mut out = vec![f32::NAN; n_rows];
            gemv(&w, row_bytes, &a, &mut out).unwrap();
            for (row, (wr, o)) in w.chunks_exact(row_bytes).zip(&out).enumerate() {
                let want = reference(wr, &a).unwrap();
                let got = f(wr, &a).unwrap();
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} x {n}: {got:e} vs {want:e}"
                );
                assert_eq!(o.to_bits(), want.to_bits(), "{ty} x {n}, gemv row {row}");
            }
        }
    }
}

#[test]
fn widening_kernels_are_bit_identical_to_the_reference() {
    for seed in 0..20 {
        check::<Widen>(seed);
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
        check::<DotProd>(seed);
    }
}

/// The blocks were cast through the entries' own checks: bad lengths are errors, not panics.
#[test]
fn entries_check_lengths() {
    let w = vec![0u8; 2 * 144];
    let a = vec![0u8; 292];
    for (ty, f, gemv, _) in cases::<Widen>() {
        if ty == GgmlType::Q4_K {
            assert!(f(&w, &a).is_err());
            let mut out = [0.0f32; 3];
            assert!(gemv(&w, 144, &a, &mut out).is_err());
        }
    }
    assert!(cast_blocks::<BlockQ4K>(&w[..143]).is_err());
}

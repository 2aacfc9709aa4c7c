//! Helpers shared by the per-ISA kernel tests.

use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

use crate::blocks::*;
use crate::codec::{dot_row, GemvFn};
use crate::reference::dot as r;
use crate::{GgmlType, QuantError};

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
        T::MXFP4 => &[],
        _ => unreachable!("{ty}"),
    }
}

pub(crate) fn random_weights(rng: &mut StdRng, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
    let mut w = vec![0u8; n_blocks * ty.block_bytes()];
    rng.fill_bytes(&mut w);
    for b in w.chunks_exact_mut(ty.block_bytes()) {
        for &at in f16_fields(ty) {
            let v = rng.gen_range(-2.0f32..2.0) * 10f32.powi(rng.gen_range(-4..1));
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        if ty == GgmlType::MXFP4 {
            // An E8M0 exponent of 2^-14 to 2^2, the scales' range in real files.
            b[0] = rng.gen_range(114..=130);
        }
    }
    w
}

/// A dot product on row bytes, as the type-erased entries take them.
pub(crate) type DotFn = fn(&[u8], &[u8]) -> Result<f32, QuantError>;

/// (type, kernel entry, its gemv entry, the reference it must match bit for bit).
pub(crate) type Case = (GgmlType, DotFn, GemvFn, DotFn);

/// The reference in `vec_dot` order for `ty`.
pub(crate) fn reference(ty: GgmlType) -> DotFn {
    crate::codec(ty).unwrap().vec_dot.unwrap().f
}

/// The reference in the order of llama.cpp's repacked gemv for `ty`.
pub(crate) fn reference_rows8(ty: GgmlType) -> DotFn {
    fn q4_0(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockQ4_0>(w, a, r::vec_dot_q4_0_q8_0_rows8)
    }
    fn iq4_nl(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockIQ4NL>(w, a, r::vec_dot_iq4_nl_q8_0_rows8)
    }
    fn mxfp4(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockMXFP4>(w, a, r::vec_dot_mxfp4_q8_0_rows8)
    }
    fn q4_k(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockQ4K>(w, a, r::vec_dot_q4_k_q8_k_rows8)
    }
    fn q2_k(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
        dot_row::<BlockQ2K>(w, a, r::vec_dot_q2_k_q8_k_rows8)
    }
    match ty {
        GgmlType::Q4_0 => q4_0,
        GgmlType::IQ4_NL => iq4_nl,
        GgmlType::MXFP4 => mxfp4,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q2_K => q2_k,
        _ => unreachable!("{ty}"),
    }
}

/// Every case against its reference, bit for bit: random blocks, 1, 2, 3, 5 and 8 blocks (of
/// the weight format: odd counts of 32-value blocks), 1..6 rows through the gemv entry.
pub(crate) fn check(seed: u64, cases: &[Case]) {
    let mut rng = StdRng::seed_from_u64(seed);
    for &(ty, f, gemv, reference) in cases {
        let act = crate::vec_dot_type(ty).unwrap();
        for n_blocks in [1, 2, 3, 5, 8] {
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

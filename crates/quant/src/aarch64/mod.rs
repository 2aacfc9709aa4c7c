//! aarch64 kernels, chosen at run time by [`crate::vec_dot_kernel`] and
//! [`crate::matrix_kernel`]: NEON (the aarch64 baseline) with FEAT_DotProd's `sdot` for the
//! integer dot products where the CPU has it, widening multiplies where it does not.
//!
//! Every kernel does the reference's float operations in the reference's order
//! ([`crate::reference::dot`], which is ggml's x86 order): the eight float lanes as two
//! `float32x4_t`, `vfmaq_f32` where the reference fuses, its horizontal-sum tree. Integer sums are
//! exact whatever instruction makes them. So the bits are the reference's, and llama.cpp's x86
//! ones: synapse gives the same logits on an ARM host (tested under qemu-user in CI,
//! `scripts/test-aarch64.sh`). F32, F16 and BF16 keep the reference (F32 and F16 in ggml's
//! AVX-512 order: four 16-lane accumulators, fused multiply-adds), which the compiler builds
//! with NEON, the aarch64 baseline.

mod kquants;
mod legacy;
mod neon;

use neon::{Dot, DotProd, Widen};

use crate::blocks::*;
use crate::codec::{dot_row, gemv_rows, Block, GemvFn};
use crate::{GgmlType, QuantError};

type DotFn = fn(&[u8], &[u8]) -> Result<f32, QuantError>;

macro_rules! entries {
    ($( $name:ident, $gemv:ident: $block:ty => $kernel:path; )*) => {$(
        /// Type-erased entry to the NEON kernel, with the integer dot product `D`.
        fn $name<D: Dot>(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            let isa = D::detect().ok_or(QuantError::Unsupported {
                ty: <$block as Block>::TYPE,
                what: D::NEEDS,
            })?;
            // SAFETY: NEON is part of the aarch64 baseline (every aarch64 target Rust builds for
            // enables it), and `isa` exists only where the CPU has `D`'s instructions.
            dot_row::<$block>(w, a, |x, y| unsafe { $kernel(isa, x, y) })
        }

        /// Type-erased entry to the NEON kernel, over consecutive rows.
        fn $gemv<D: Dot>(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            let isa = D::detect().ok_or(QuantError::Unsupported {
                ty: <$block as Block>::TYPE,
                what: D::NEEDS,
            })?;
            // SAFETY: as above.
            gemv_rows::<$block>(w, row_bytes, a, out, |x, y| unsafe { $kernel(isa, x, y) })
        }
    )*};
}

entries! {
    q4_0, q4_0_gemv: BlockQ4_0 => legacy::vec_dot_q4_0_q8_0;
    q4_1, q4_1_gemv: BlockQ4_1 => legacy::vec_dot_q4_1_q8_1;
    q5_0, q5_0_gemv: BlockQ5_0 => legacy::vec_dot_q5_0_q8_0;
    q5_1, q5_1_gemv: BlockQ5_1 => legacy::vec_dot_q5_1_q8_1;
    q8_0, q8_0_gemv: BlockQ8_0 => legacy::vec_dot_q8_0_q8_0;
    iq4_nl, iq4_nl_gemv: BlockIQ4NL => legacy::vec_dot_iq4_nl_q8_0;
    q4_0_rows8, q4_0_rows8_gemv: BlockQ4_0 => legacy::vec_dot_q4_0_q8_0_rows8;
    iq4_nl_rows8, iq4_nl_rows8_gemv: BlockIQ4NL => legacy::vec_dot_iq4_nl_q8_0_rows8;
    q2_k, q2_k_gemv: BlockQ2K => kquants::vec_dot_q2_k_q8_k;
    q3_k, q3_k_gemv: BlockQ3K => kquants::vec_dot_q3_k_q8_k;
    q4_k, q4_k_gemv: BlockQ4K => kquants::vec_dot_q4_k_q8_k;
    q5_k, q5_k_gemv: BlockQ5K => kquants::vec_dot_q5_k_q8_k;
    q6_k, q6_k_gemv: BlockQ6K => kquants::vec_dot_q6_k_q8_k;
    iq4_xs, iq4_xs_gemv: BlockIQ4XS => kquants::vec_dot_iq4_xs_q8_k;
    q4_k_rows8, q4_k_rows8_gemv: BlockQ4K => kquants::vec_dot_q4_k_q8_k_rows8;
    q2_k_rows8, q2_k_rows8_gemv: BlockQ2K => kquants::vec_dot_q2_k_q8_k_rows8;
}

/// The `vec_dot`-order kernel for weights of type `ty` on this CPU, if there is a NEON one.
pub(crate) fn vec_dot(ty: GgmlType) -> Option<(DotFn, GemvFn)> {
    match DotProd::detect() {
        Some(_) => vec_dot_with::<DotProd>(ty),
        None => vec_dot_with::<Widen>(ty),
    }
}

/// The kernel in the order of llama.cpp's repacked gemv (see [`crate::llama_cpp_repacks`]) for
/// weights of type `ty` on this CPU, if there is a NEON one.
pub(crate) fn rows8(ty: GgmlType) -> Option<(DotFn, GemvFn)> {
    match DotProd::detect() {
        Some(_) => rows8_with::<DotProd>(ty),
        None => rows8_with::<Widen>(ty),
    }
}

fn vec_dot_with<D: Dot>(ty: GgmlType) -> Option<(DotFn, GemvFn)> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => (q4_0::<D> as DotFn, q4_0_gemv::<D> as GemvFn),
        T::Q4_1 => (q4_1::<D> as DotFn, q4_1_gemv::<D> as GemvFn),
        T::Q5_0 => (q5_0::<D> as DotFn, q5_0_gemv::<D> as GemvFn),
        T::Q5_1 => (q5_1::<D> as DotFn, q5_1_gemv::<D> as GemvFn),
        T::Q8_0 => (q8_0::<D> as DotFn, q8_0_gemv::<D> as GemvFn),
        T::IQ4_NL => (iq4_nl::<D> as DotFn, iq4_nl_gemv::<D> as GemvFn),
        T::Q2_K => (q2_k::<D> as DotFn, q2_k_gemv::<D> as GemvFn),
        T::Q3_K => (q3_k::<D> as DotFn, q3_k_gemv::<D> as GemvFn),
        T::Q4_K => (q4_k::<D> as DotFn, q4_k_gemv::<D> as GemvFn),
        T::Q5_K => (q5_k::<D> as DotFn, q5_k_gemv::<D> as GemvFn),
        T::Q6_K => (q6_k::<D> as DotFn, q6_k_gemv::<D> as GemvFn),
        T::IQ4_XS => (iq4_xs::<D> as DotFn, iq4_xs_gemv::<D> as GemvFn),
        _ => return None,
    })
}

fn rows8_with<D: Dot>(ty: GgmlType) -> Option<(DotFn, GemvFn)> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => (q4_0_rows8::<D> as DotFn, q4_0_rows8_gemv::<D> as GemvFn),
        T::IQ4_NL => (iq4_nl_rows8::<D> as DotFn, iq4_nl_rows8_gemv::<D> as GemvFn),
        T::Q4_K => (q4_k_rows8::<D> as DotFn, q4_k_rows8_gemv::<D> as GemvFn),
        T::Q2_K => (q2_k_rows8::<D> as DotFn, q2_k_rows8_gemv::<D> as GemvFn),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;

//! aarch64 kernels, chosen at run time from the kernel table ([`crate::kernels`]): NEON (the
//! aarch64 baseline) with FEAT_DotProd's `sdot` for the integer dot products where the CPU has
//! it, widening multiplies where it does not.
//!
//! Every kernel does the reference's float operations in the reference's order
//! ([`crate::reference::dot`], which is ggml's x86 order): the eight float lanes as two
//! `float32x4_t`, `vfmaq_f32` where the reference fuses, its horizontal-sum tree. Integer sums are
//! exact whatever instruction makes them. So the bits are the reference's, and llama.cpp's x86
//! ones: synapse gives the same logits on an ARM host (tested under qemu-user in CI,
//! `scripts/test-aarch64.sh`). BF16 emulates x86's `vdpbf16ps` in f32 lanes ([`bf16`]). F32
//! and F16 keep the reference (ggml's AVX-512 order: four 16-lane accumulators, fused
//! multiply-adds), which the compiler builds with NEON, the aarch64 baseline.

pub(crate) mod bf16;
mod kquants;
mod legacy;
mod neon;
mod tile;

use neon::Dot;
pub(crate) use neon::{DotProd, Widen};

use crate::blocks::*;
use crate::codec::{dot_row, gemm_operands, gemv_rows};
use crate::{GgmlType, QuantError};

/// `D`, if this CPU has its instructions; else the error an entry for weights of type `ty`
/// gives.
fn detect<D: Dot>(ty: GgmlType) -> Result<D, QuantError> {
    D::detect().ok_or(QuantError::Unsupported { ty, what: D::NEEDS })
}

macro_rules! entries {
    ($( $name:ident, $gemv:ident, $gemm:ident: $block:ty => $k:ty; )*) => {$(
        /// Type-erased entry to the NEON kernel, with the integer dot product `D`.
        pub(crate) fn $name<D: Dot>(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            let isa = detect::<D>(<$block as crate::codec::Block>::TYPE)?;
            // SAFETY: NEON is part of the aarch64 baseline (every aarch64 target Rust builds for
            // enables it), and `isa` exists only where the CPU has `D`'s instructions.
            dot_row::<$block>(w, a, |x, y| unsafe { tile::dot::<$k, D>(isa, x, y) })
        }

        /// Type-erased entry to the NEON kernel, over consecutive rows.
        pub(crate) fn $gemv<D: Dot>(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            let isa = detect::<D>(<$block as crate::codec::Block>::TYPE)?;
            // SAFETY: as above.
            gemv_rows::<$block>(w, row_bytes, a, out, |x, y| unsafe { tile::dot::<$k, D>(isa, x, y) })
        }

        /// Type-erased entry to the NEON tile: weight rows times a batch of tokens (see
        /// [`crate::GemmFn`]).
        pub(crate) fn $gemm<D: Dot>(
            w: &[u8],
            row_bytes: usize,
            a: &[u8],
            n_tok: usize,
            out: &mut [f32],
        ) -> Result<(), QuantError> {
            let isa = detect::<D>(<$block as crate::codec::Block>::TYPE)?;
            let (x, y, per_row) = gemm_operands::<$block>(w, row_bytes, a, n_tok, out)?;
            // SAFETY: as above.
            unsafe { tile::gemm::<$k, D>(isa, x, y, per_row, out) };
            Ok(())
        }
    )*};
}

entries! {
    q4_0, q4_0_gemv, q4_0_gemm: BlockQ4_0 => legacy::Q4_0;
    q4_1, q4_1_gemv, q4_1_gemm: BlockQ4_1 => legacy::Q4_1;
    q5_0, q5_0_gemv, q5_0_gemm: BlockQ5_0 => legacy::Q5_0;
    q5_1, q5_1_gemv, q5_1_gemm: BlockQ5_1 => legacy::Q5_1;
    q8_0, q8_0_gemv, q8_0_gemm: BlockQ8_0 => legacy::Q8_0;
    iq4_nl, iq4_nl_gemv, iq4_nl_gemm: BlockIQ4NL => legacy::IQ4NL;
    q4_0_rows8, q4_0_rows8_gemv, q4_0_rows8_gemm: BlockQ4_0 => legacy::Q4_0Rows8;
    iq4_nl_rows8, iq4_nl_rows8_gemv, iq4_nl_rows8_gemm: BlockIQ4NL => legacy::IQ4NLRows8;
    mxfp4, mxfp4_gemv, mxfp4_gemm: BlockMXFP4 => legacy::MXFP4;
    mxfp4_rows8, mxfp4_rows8_gemv, mxfp4_rows8_gemm: BlockMXFP4 => legacy::MXFP4Rows8;
    q2_k, q2_k_gemv, q2_k_gemm: BlockQ2K => kquants::Q2K;
    q3_k, q3_k_gemv, q3_k_gemm: BlockQ3K => kquants::Q3K;
    q4_k, q4_k_gemv, q4_k_gemm: BlockQ4K => kquants::Q4K;
    q5_k, q5_k_gemv, q5_k_gemm: BlockQ5K => kquants::Q5K;
    q6_k, q6_k_gemv, q6_k_gemm: BlockQ6K => kquants::Q6K;
    iq4_xs, iq4_xs_gemv, iq4_xs_gemm: BlockIQ4XS => kquants::IQ4XS;
    q4_k_rows8, q4_k_rows8_gemv, q4_k_rows8_gemm: BlockQ4K => kquants::Q4KRows8;
    q2_k_rows8, q2_k_rows8_gemv, q2_k_rows8_gemm: BlockQ2K => kquants::Q2KRows8;
}

/// Type-erased entry to the NEON BF16 kernel ([`bf16::dot_bf16`]).
pub(crate) fn bf16_dot(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    dot_row::<half::bf16>(w, a, bf16::dot_bf16_row)
}

/// Type-erased entry to the NEON BF16 kernel, over consecutive rows.
pub(crate) fn bf16_gemv(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    gemv_rows::<half::bf16>(w, row_bytes, a, out, bf16::dot_bf16_row)
}

#[cfg(test)]
mod tests;

//! aarch64 kernels, chosen at run time by [`crate::vec_dot_kernel`] and
//! [`crate::matrix_kernel`]: NEON (the aarch64 baseline) with FEAT_DotProd's `sdot` for the
//! integer dot products where the CPU has it, widening multiplies where it does not.
//!
//! Every kernel does the reference's float operations in the reference's order
//! ([`crate::reference::dot`], which is ggml's x86 order): the eight float lanes as two
//! `float32x4_t`, `vfmaq_f32` where the reference fuses, its horizontal-sum tree. Integer sums are
//! exact whatever instruction makes them. So the bits are the reference's, and llama.cpp's x86
//! ones: synapse gives the same logits on an ARM host (tested under qemu-user in CI,
//! `scripts/test-aarch64.sh`). BF16 emulates x86's `vdpbf16ps` in f32 lanes ([`bf16`]). F32
//! and F16 keep the reference (ggml's AVX-512 order: four 16-lane accumulators, fused
//! multiply-adds), which the compiler builds with NEON, the aarch64 baseline.

mod bf16;
mod kquants;
mod legacy;
mod neon;
mod tile;

use neon::{Dot, DotProd, Widen};

use crate::blocks::*;
use crate::codec::{dot_row, gemm_operands, gemv_rows, GemmFn, GemvFn};
use crate::{GgmlType, QuantError};

type DotFn = fn(&[u8], &[u8]) -> Result<f32, QuantError>;

/// `D`, if this CPU has its instructions; else the error an entry for weights of type `ty`
/// gives.
fn detect<D: Dot>(ty: GgmlType) -> Result<D, QuantError> {
    D::detect().ok_or(QuantError::Unsupported { ty, what: D::NEEDS })
}

macro_rules! entries {
    ($( $name:ident, $gemv:ident, $gemm:ident: $block:ty => $k:ty; )*) => {$(
        /// Type-erased entry to the NEON kernel, with the integer dot product `D`.
        fn $name<D: Dot>(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            let isa = detect::<D>(<$block as crate::codec::Block>::TYPE)?;
            // SAFETY: NEON is part of the aarch64 baseline (every aarch64 target Rust builds for
            // enables it), and `isa` exists only where the CPU has `D`'s instructions.
            dot_row::<$block>(w, a, |x, y| unsafe { tile::dot::<$k, D>(isa, x, y) })
        }

        /// Type-erased entry to the NEON kernel, over consecutive rows.
        fn $gemv<D: Dot>(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            let isa = detect::<D>(<$block as crate::codec::Block>::TYPE)?;
            // SAFETY: as above.
            gemv_rows::<$block>(w, row_bytes, a, out, |x, y| unsafe { tile::dot::<$k, D>(isa, x, y) })
        }

        /// Type-erased entry to the NEON tile: weight rows times a batch of tokens (see
        /// [`crate::GemmFn`]).
        fn $gemm<D: Dot>(
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
fn bf16_dot(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    dot_row::<half::bf16>(w, a, bf16::dot_bf16_row)
}

/// Type-erased entry to the NEON BF16 kernel, over consecutive rows.
fn bf16_gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    gemv_rows::<half::bf16>(w, row_bytes, a, out, bf16::dot_bf16_row)
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
        T::BF16 => (bf16_dot as DotFn, bf16_gemv as GemvFn),
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

/// The NEON tile for weights of type `ty` (`repacked`: in the order of llama.cpp's repacked gemv)
/// on this CPU, if there is one: the same kernel as [`vec_dot`] or [`rows8`] gives, run over a
/// batch with each weight block unpacked once for several tokens.
pub(crate) fn gemm(ty: GgmlType, repacked: bool) -> Option<GemmFn> {
    match DotProd::detect() {
        Some(_) => gemm_with::<DotProd>(ty, repacked),
        None => gemm_with::<Widen>(ty, repacked),
    }
}

fn gemm_with<D: Dot>(ty: GgmlType, repacked: bool) -> Option<GemmFn> {
    use GgmlType as T;
    Some(match (ty, repacked) {
        (T::Q4_0, false) => q4_0_gemm::<D> as GemmFn,
        (T::Q4_0, true) => q4_0_rows8_gemm::<D>,
        (T::IQ4_NL, false) => iq4_nl_gemm::<D>,
        (T::IQ4_NL, true) => iq4_nl_rows8_gemm::<D>,
        (T::Q4_K, false) => q4_k_gemm::<D>,
        (T::Q4_K, true) => q4_k_rows8_gemm::<D>,
        (T::Q2_K, false) => q2_k_gemm::<D>,
        (T::Q2_K, true) => q2_k_rows8_gemm::<D>,
        (T::Q4_1, _) => q4_1_gemm::<D>,
        (T::Q5_0, _) => q5_0_gemm::<D>,
        (T::Q5_1, _) => q5_1_gemm::<D>,
        (T::Q8_0, _) => q8_0_gemm::<D>,
        (T::Q3_K, _) => q3_k_gemm::<D>,
        (T::Q5_K, _) => q5_k_gemm::<D>,
        (T::Q6_K, _) => q6_k_gemm::<D>,
        (T::IQ4_XS, _) => iq4_xs_gemm::<D>,
        (T::BF16, _) => bf16::gemm_bf16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;

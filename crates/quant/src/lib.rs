//! The ggml block formats: how quantized weights are laid out, what they mean, and how to take
//! dot products with them.
//!
//! - [`blocks`]: each format's byte layout as a `#[repr(C)]` struct, cast in place from file
//!   bytes (length and alignment checked).
//! - [`reference`](mod@reference): plain scalar dequantizers, activation quantizers (Q8_0,
//!   Q8_1, Q8_K, matching ggml's reference quantizers bit for bit) and dot products of every
//!   weight format with its activation format. They are the oracle for the fast kernels and
//!   their fallback.
//! - [`codec`](mod@codec): one table from [`GgmlType`] to those entry points, on raw bytes.
//!
//! This crate knows nothing of models: it turns bytes into numbers and rows into dot products.

#[cfg(target_arch = "aarch64")]
mod aarch64;
pub mod blocks;
pub mod codec;
pub mod config;
pub mod cpu;
pub mod encode;
mod error;
mod kernel;
pub mod kernels;
pub mod packed;
pub mod pages;
pub mod reference;
#[cfg(test)]
mod test_util;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use codec::{
    codec, llama_cpp_repacks, supported_types, Block, Codec, DotBlock, GemmFn, GemvFn,
    QuantizeBlock, VecDot,
};
pub use config::{config, configure, KernelConfig, PrefetchDistances, Tier};
pub use cpu::{cpu, Cpu, Vnni256};
pub use error::QuantError;
pub use kernels::{
    act_quantizer, decode_tile_kernel, gemm_kernel, gemm_kernels, kernel_isa, matrix_kernel,
    vec_dot_kernel,
};
pub use packed::{pack_matrix, PackedMatrix, PACK_GROUP_ROWS};
pub use synapse_gguf::GgmlType;

/// Two variants of the code compared inside one process, on machines too noisy for separate
/// runs to show a difference of a few percent: code under study reads [`ab::variant`] (a change
/// made for the experiment, not kept), and `synapse bench --ab A,B` sets it to `A` and `B` in
/// turn, prefill by prefill or token by token, and reports each half's time. With no code
/// reading it, the two halves run the same code, and the ratio shows how far this machine's
/// noise moves it (an A/A run).
pub mod ab {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    static VARIANT: AtomicUsize = AtomicUsize::new(0);

    /// The variant to take (0 unless `synapse bench --ab` set another).
    #[inline]
    pub fn variant() -> usize {
        VARIANT.load(Relaxed)
    }

    /// Take variant `v` from now on.
    pub fn set_variant(v: usize) {
        VARIANT.store(v, Relaxed)
    }
}

/// Decode `dst.len()` values of type `ty` from `src`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use half::slice::HalfFloatSliceExt;
    // The float types as whole slices (vectorised conversions), when the bytes are aligned
    // for them; the codec's per-value decoders otherwise.
    match ty {
        GgmlType::F32 if src.len() == 4 * dst.len() => {
            for (y, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes(c.try_into().unwrap());
            }
            return Ok(());
        }
        GgmlType::F16 if src.len() == 2 * dst.len() => {
            if let Ok(x) = bytemuck::try_cast_slice::<u8, half::f16>(src) {
                x.convert_to_f32_slice(dst);
                return Ok(());
            }
        }
        GgmlType::BF16 if src.len() == 2 * dst.len() => {
            if let Ok(x) = bytemuck::try_cast_slice::<u8, half::bf16>(src) {
                x.convert_to_f32_slice(dst);
                return Ok(());
            }
        }
        _ => {}
    }
    (codec(ty)?.dequantize)(src, dst)
}

/// Decode a whole tensor's bytes into a new vector.
pub fn dequantize(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>, QuantError> {
    let blocks = src.len() / ty.block_bytes();
    if blocks * ty.block_bytes() != src.len() {
        return Err(QuantError::ByteLength {
            ty,
            bytes: src.len(),
        });
    }
    let mut out = vec![0.0; blocks * ty.block_len()];
    dequantize_row(ty, src, &mut out)?;
    Ok(out)
}

/// Encode `src` as type `ty` into `dst`, for the types synapse can encode.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let q = codec(ty)?.quantize.ok_or(QuantError::Unsupported {
        ty,
        what: "quantizer",
    })?;
    q(src, dst)
}

/// Encode activations `src` as type `ty` the way llama.cpp does at inference (for Q8_0 and
/// Q8_1 that is ggml-cpu's rounding, not the reference quantizer's).
pub fn quantize_act_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let q = codec(ty)?.quantize_act.ok_or(QuantError::Unsupported {
        ty,
        what: "quantizer",
    })?;
    q(src, dst)
}

/// Encode `src` as type `ty` into a new vector.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let blocks = src.len() / ty.block_len();
    let mut out = vec![0u8; blocks * ty.block_bytes()];
    quantize_row(ty, src, &mut out)?;
    Ok(out)
}

/// The activation type weights of type `ty` are dotted with.
pub fn vec_dot_type(ty: GgmlType) -> Result<GgmlType, QuantError> {
    Ok(dot_of(ty)?.act)
}

/// Reference dot product of a weight row of type `ty` with an activation row of its
/// [`vec_dot_type`].
pub fn vec_dot(ty: GgmlType, weights: &[u8], activations: &[u8]) -> Result<f32, QuantError> {
    (dot_of(ty)?.f)(weights, activations)
}

fn dot_of(ty: GgmlType) -> Result<VecDot, QuantError> {
    codec(ty)?.vec_dot.ok_or(QuantError::Unsupported {
        ty,
        what: "dot product",
    })
}

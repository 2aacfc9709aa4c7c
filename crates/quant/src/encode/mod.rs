//! Weight quantizers: the encoders that write model files, equal byte for byte to what ggml's
//! `ggml_quantize_chunk` writes (and so `llama-quantize`), with or without an importance matrix.
//!
//! They are ggml's algorithms, which are searches over candidate scales: a value that ends a
//! sum one ulp apart can choose another candidate. So every encoder here does ggml's float
//! operations in ggml's order, with no fused multiply-add, and each format is tested against
//! bytes written by ggml (`tests/encode.rs`).

mod iq4;
mod kquants;
mod legacy;
mod mxfp4;
mod search;

use synapse_gguf::GgmlType;

use crate::blocks::*;
use crate::codec::{cast_blocks, cast_blocks_mut, Block};
use crate::QuantError;

/// The types [`quantize_rows`] writes.
pub const ENCODABLE: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

/// Whether [`quantize_rows`] can write `ty`.
pub fn can_encode(ty: GgmlType) -> bool {
    ENCODABLE.contains(&ty)
}

/// Whether `ty` uses an importance matrix when one is given (the floats, Q8_0 and MXFP4 do not).
pub fn uses_importance(ty: GgmlType) -> bool {
    can_encode(ty)
        && !matches!(
            ty,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0 | GgmlType::MXFP4
        )
}

/// An encoder of one row into its blocks, given the row's importance per column.
type RowEncoder<B> = fn(&[f32], Option<&[f32]>, &mut [B]);

/// Encode the rows of `src` (each `n_per_row` values) as `ty` into `dst`, which holds exactly
/// their bytes. `importance`, one weight per column (an importance matrix's entry for this
/// matrix), steers the search of the formats that take one; rows are independent, so any
/// split of a matrix into runs of rows gives the same bytes.
pub fn quantize_rows(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    importance: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    if !can_encode(ty) {
        return Err(QuantError::Unsupported {
            ty,
            what: "file quantizer",
        });
    }
    if n_per_row == 0
        || !n_per_row.is_multiple_of(ty.block_len())
        || !src.len().is_multiple_of(n_per_row)
    {
        return Err(QuantError::NotBlockMultiple {
            ty,
            values: n_per_row,
        });
    }
    let expected = src.len() / ty.block_len() * ty.block_bytes();
    if dst.len() != expected {
        return Err(QuantError::SizeMismatch {
            ty,
            values: src.len(),
            bytes: dst.len(),
            expected,
        });
    }
    if let Some(w) = importance {
        if w.len() != n_per_row {
            return Err(QuantError::ImportanceLength {
                ty,
                columns: n_per_row,
                weights: w.len(),
            });
        }
    }
    match ty {
        GgmlType::Q4_0 => rows::<BlockQ4_0>(src, n_per_row, importance, dst, legacy::q4_0),
        GgmlType::Q4_1 => rows::<BlockQ4_1>(src, n_per_row, importance, dst, legacy::q4_1),
        GgmlType::Q5_0 => rows::<BlockQ5_0>(src, n_per_row, importance, dst, legacy::q5_0),
        GgmlType::Q5_1 => rows::<BlockQ5_1>(src, n_per_row, importance, dst, legacy::q5_1),
        GgmlType::Q2_K => rows::<BlockQ2K>(src, n_per_row, importance, dst, kquants::q2_k),
        GgmlType::Q3_K => rows::<BlockQ3K>(src, n_per_row, importance, dst, kquants::q3_k),
        GgmlType::Q4_K => rows::<BlockQ4K>(src, n_per_row, importance, dst, kquants::q4_k),
        GgmlType::Q5_K => rows::<BlockQ5K>(src, n_per_row, importance, dst, kquants::q5_k),
        GgmlType::Q6_K => rows::<BlockQ6K>(src, n_per_row, importance, dst, kquants::q6_k),
        GgmlType::IQ4_NL => rows::<BlockIQ4NL>(src, n_per_row, importance, dst, iq4::iq4_nl),
        GgmlType::IQ4_XS => rows::<BlockIQ4XS>(src, n_per_row, importance, dst, iq4::iq4_xs),
        GgmlType::MXFP4 => rows::<BlockMXFP4>(src, n_per_row, importance, dst, mxfp4::mxfp4),
        // Per-value or per-block formats that take no importance: the codec's encoder.
        _ => crate::quantize_row(ty, src, dst),
    }
}

fn rows<B: Block>(
    src: &[f32],
    n_per_row: usize,
    importance: Option<&[f32]>,
    dst: &mut [u8],
    encode: RowEncoder<B>,
) -> Result<(), QuantError> {
    let blocks = cast_blocks_mut::<B>(dst)?;
    let per_row = n_per_row / B::TYPE.block_len();
    for (row, out) in src
        .chunks_exact(n_per_row)
        .zip(blocks.chunks_exact_mut(per_row))
    {
        encode(row, importance, out);
    }
    Ok(())
}

/// ggml's check of encoded data (`ggml_validate_row_data`, which llama-quantize runs on what it
/// writes): every float of a float type, and every block's f16 scales, finite. A weight that is
/// NaN or infinite, or a scale that overflows f16, fails it.
pub fn check_finite(ty: GgmlType, bytes: &[u8]) -> Result<(), QuantError> {
    use half::{bf16, f16};
    fn first_bad<B: Block>(
        bytes: &[u8],
        scales: impl Fn(&B) -> [f16; 2],
    ) -> Result<Option<usize>, QuantError> {
        Ok(cast_blocks::<B>(bytes)?
            .iter()
            .position(|b| scales(b).iter().any(|s| !s.is_finite())))
    }
    let bad = match ty {
        GgmlType::F32 => bytes
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes(c.try_into().unwrap()).is_finite()),
        GgmlType::F16 => bytes
            .chunks_exact(2)
            .position(|c| !f16::from_le_bytes(c.try_into().unwrap()).is_finite()),
        GgmlType::BF16 => bytes
            .chunks_exact(2)
            .position(|c| !bf16::from_le_bytes(c.try_into().unwrap()).is_finite()),
        GgmlType::Q4_0 => first_bad::<BlockQ4_0>(bytes, |b| [b.d; 2])?,
        GgmlType::Q5_0 => first_bad::<BlockQ5_0>(bytes, |b| [b.d; 2])?,
        GgmlType::Q8_0 => first_bad::<BlockQ8_0>(bytes, |b| [b.d; 2])?,
        GgmlType::IQ4_NL => first_bad::<BlockIQ4NL>(bytes, |b| [b.d; 2])?,
        GgmlType::IQ4_XS => first_bad::<BlockIQ4XS>(bytes, |b| [b.d; 2])?,
        GgmlType::Q3_K => first_bad::<BlockQ3K>(bytes, |b| [b.d; 2])?,
        GgmlType::Q6_K => first_bad::<BlockQ6K>(bytes, |b| [b.d; 2])?,
        GgmlType::Q4_1 => first_bad::<BlockQ4_1>(bytes, |b| [b.d, b.m])?,
        GgmlType::Q5_1 => first_bad::<BlockQ5_1>(bytes, |b| [b.d, b.m])?,
        GgmlType::Q2_K => first_bad::<BlockQ2K>(bytes, |b| [b.d, b.dmin])?,
        GgmlType::Q4_K => first_bad::<BlockQ4K>(bytes, |b| [b.d, b.dmin])?,
        // E8M0's NaN; no encoded maximum reaches it.
        GgmlType::MXFP4 => cast_blocks::<BlockMXFP4>(bytes)?
            .iter()
            .position(|b| b.e == 0xFF),
        GgmlType::Q5_K => first_bad::<BlockQ5K>(bytes, |b| [b.d, b.dmin])?,
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                what: "check of encoded data",
            })
        }
    };
    match bad {
        None => Ok(()),
        Some(block) => Err(QuantError::NonFinite { ty, block }),
    }
}

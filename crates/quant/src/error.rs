//! The crate's one error type.

use synapse_gguf::GgmlType;

/// What can go wrong when decoding or encoding blocks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    #[error("{ty}: synapse has no {what} for this type")]
    Unsupported { ty: GgmlType, what: &'static str },
    #[error("{ty}: {values} values are not a whole number of {}-value blocks", ty.block_len())]
    NotBlockMultiple { ty: GgmlType, values: usize },
    #[error("{ty}: {values} values take {expected} bytes, got {bytes}")]
    SizeMismatch {
        ty: GgmlType,
        values: usize,
        bytes: usize,
        expected: usize,
    },
    #[error("{ty}: {bytes} bytes are not a whole number of {}-byte blocks", ty.block_bytes())]
    ByteLength { ty: GgmlType, bytes: usize },
    #[error("{ty}: data at address {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        ty: GgmlType,
        addr: usize,
        align: usize,
    },
    #[error("{ty}: no memory for a packed copy of {bytes} bytes: {reason}")]
    NoMemory {
        ty: GgmlType,
        bytes: usize,
        reason: String,
    },
    #[error("{ty}: block {block} (or value, for a float type) holds a NaN or infinite scale")]
    NonFinite { ty: GgmlType, block: usize },
    #[error("{ty}: an importance matrix row of {weights} weights for rows of {columns} columns")]
    ImportanceLength {
        ty: GgmlType,
        columns: usize,
        weights: usize,
    },
    #[error("{ty} dot {act}: {weights} weights against {activations} activations")]
    DotLength {
        ty: GgmlType,
        act: GgmlType,
        weights: usize,
        activations: usize,
    },
}

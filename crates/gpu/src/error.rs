//! The crate's one error type.

use synapse_gguf::GgmlType;

/// What can go wrong on the GPU path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    #[error("no GPU adapter found ({tried}); on Linux without a GPU, install Mesa's lavapipe (mesa-vulkan-drivers) and point VK_DRIVER_FILES at its ICD")]
    NoAdapter { tried: String },
    #[error("no GPU adapter named like {wanted:?}; found: {found}")]
    AdapterNotFound { wanted: String, found: String },
    #[error("the GPU device could not be opened: {0}")]
    Device(String),
    #[error("{ty}: no GPU kernel for this type")]
    Unsupported { ty: GgmlType },
    #[error("{what}: {detail}")]
    Shape { what: String, detail: String },
    #[error("{what} takes {bytes} bytes, more than this adapter binds at once ({limit})")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    #[error("the GPU reported an error: {0}")]
    Validation(String),
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
}

//! GGUF files: the container llama.cpp, Ollama and LM Studio keep quantized models in.
//!
//! This crate reads GGUF versions 2 and 3 through a read-only memory map and hands out tensor
//! data as borrowed byte slices: the weights are never copied. Every offset, count and size in
//! the header is checked against the file before use, so a malformed or hostile file yields a
//! [`GgufError`] naming the field, tensor and byte offset at fault. It also writes GGUF files,
//! for tests and tools.
//!
//! It knows the ggml tensor types only as far as the container needs them (id, name, block
//! length and bytes, in [`GgmlType`]); decoding blocks is the business of `synapse-quant`.

#[cfg(target_endian = "big")]
compile_error!(
    "synapse reads little-endian GGUF files in place and supports little-endian hosts only"
);

mod error;
pub mod files;
mod reader;
mod types;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use reader::{
    parse_header, tensor_size, GgufFile, Header, Metadata, TensorInfo, TensorView, ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
};
pub use types::{GgmlType, TypeTraits};
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, StreamWriter, TensorSpec};

//! Quantizing a model file: `synapse quantize IN OUT MIX`, equal to llama.cpp's `llama-quantize`.

pub mod collect;
pub mod file;
pub mod imatrix;
pub mod rules;
pub(crate) mod sums;

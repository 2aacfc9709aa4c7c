//! Running models: the tokenizer, the architectures, the forward pass with its KV cache, the
//! sampler and the chat template.
//!
//! It reads weights from a [`synapse_gguf::GgufFile`] in place and does its arithmetic through
//! `synapse-quant`; it knows nothing of the command line or of HTTP.

pub mod tokenizer;

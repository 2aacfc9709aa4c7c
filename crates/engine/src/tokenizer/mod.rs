//! Tokenizers built from GGUF metadata (to be written).

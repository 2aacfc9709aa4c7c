//! `qwen3moe`: Qwen3's mixtures of experts (Qwen3-30B-A3B, Qwen3-235B-A22B), as llama.cpp's
//! `src/models/qwen3moe.cpp` runs them.
//!
//! Qwen3's layer (`super::qwen3`: QK-norm, NeoX RoPE over whole heads) with every feed-forward
//! block a mixture (`model/moe.rs`): softmax routing to `expert_used_count` of `expert_count`
//! SwiGLU experts, their weights normalised to sum to one.

use synapse_gguf::GgufFile;

use super::decoder::Decoder;
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    super::qwen2::load_qwen(file, "qwen3moe", true, 40960, true)
}

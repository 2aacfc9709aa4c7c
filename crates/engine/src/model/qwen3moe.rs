//! `qwen3moe`: Qwen3's mixtures of experts (Qwen3-30B-A3B, Qwen3-235B-A22B), as llama.cpp's
//! `src/models/qwen3moe.cpp` runs them.
//!
//! Qwen3's layer (`super::qwen3`: QK-norm, NeoX RoPE over whole heads) with every feed-forward
//! block a mixture (`model/moe.rs`): softmax routing to `expert_used_count` of `expert_count`
//! SwiGLU experts, their weights normalised to sum to one.

use synapse_gguf::GgufFile;

use super::decoder::Decoder;
use super::hparams::MoeParams;
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let arch = "qwen3moe";
    // Without `expert_feed_forward_length`, llama.cpp splits `feed_forward_length` among the
    // experts a token uses.
    let n_ff = file
        .metadata()
        .u64(&format!("{arch}.feed_forward_length"))
        .unwrap_or(0) as usize;
    let moe = MoeParams::read(file, arch, |n_used| n_ff / n_used)?.ok_or_else(|| {
        ModelError::Hparams(format!(
            "{arch} needs experts: `{arch}.expert_count` is absent or 0"
        ))
    })?;
    super::qwen2::load_qwen(file, arch, true, 40960, Some(moe))
}

//! `qwen2`: Qwen2 and Qwen2.5 (dense), as llama.cpp's `src/models/qwen2.cpp` runs them.
//!
//! The llama layer (`super::decoder`) with biases on the Q, K and V projections (and on the
//! output head if the file has one) and RoPE over halves (NeoX style) of the whole head.

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, DecoderSpec};
use super::hparams::{Arch, Common, MoeParams};
use crate::ops::RopeStyle;
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    load_qwen(file, "qwen2", false, 32768, false)
}

/// The Qwen decoders (qwen2, and qwen3 with `qk_norm`; qwen3moe with experts): the llama layer
/// with NeoX RoPE over whole heads; biases are taken wherever the file has them.
pub(super) fn load_qwen<'a>(
    file: &'a GgufFile,
    arch: &'static str,
    qk_norm: bool,
    n_ctx_train_default: usize,
    experts: bool,
) -> Result<Decoder<'a>, ModelError> {
    let hp = Common::read(
        file,
        &Arch {
            name: arch,
            eps: None,
            n_ctx_train: n_ctx_train_default,
            rope_scalings: &["linear", "yarn"],
            yarn_keys: false,
            whole_head_rope: true,
            q_rows_per_dim: 1,
            experts,
            fused_up: false,
        },
    )?;
    // Without `expert_feed_forward_length`, llama.cpp splits `feed_forward_length` among the
    // experts a token uses.
    let moe = match experts {
        true => Some(
            MoeParams::read(file, arch, |n_used| hp.dims.n_ff / n_used)?.ok_or_else(|| {
                ModelError::Hparams(format!(
                    "{arch} needs experts: `{arch}.expert_count` is absent or 0"
                ))
            })?,
        ),
        false => None,
    };
    let rope = hp.rope(RopeStyle::Neox, None);
    let spec = DecoderSpec::llama_layer(arch, hp, rope, qk_norm, moe);
    Decoder::load(file, spec)
}

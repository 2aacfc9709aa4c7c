//! `qwen2`: Qwen2 and Qwen2.5 (dense), as llama.cpp's `src/models/qwen2.cpp` runs them.
//!
//! The llama layer (`super::decoder`) with biases on the Q, K and V projections (and on the
//! output head if the file has one) and RoPE over halves (NeoX style) of the whole head.

use synapse_gguf::GgufFile;

use super::blocks::Dims;
use super::decoder::{Decoder, DecoderSpec};
use super::HParams;
use crate::ops::{Rope, RopeStyle};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    load_qwen(file, "qwen2", false, 32768)
}

/// The Qwen dense decoders (qwen2, and qwen3 with `qk_norm`): the llama layer with NeoX RoPE
/// over whole heads; biases are taken wherever the file has them.
pub(super) fn load_qwen<'a>(
    file: &'a GgufFile,
    arch: &'static str,
    qk_norm: bool,
    n_ctx_train_default: usize,
) -> Result<Decoder<'a>, ModelError> {
    let hp = HParams {
        md: file.metadata(),
        arch,
    };
    let dims = Dims::read(&hp)?;
    if dims.n_rot != dims.head_dim {
        return Err(ModelError::Hparams(format!(
            "{arch} rotates whole heads: RoPE over {} of {} dims",
            dims.n_rot, dims.head_dim
        )));
    }
    let spec = DecoderSpec {
        arch,
        eps: hp.f32("attention.layer_norm_rms_epsilon")?,
        rope: Rope {
            style: RopeStyle::Neox,
            n_rot: dims.n_rot,
            base: hp.f32_or("rope.freq_base", 10000.0)?,
            freq_factors: None,
        },
        qk_norm,
        n_ctx_train: hp.usize_or("context_length", n_ctx_train_default)?,
        dims,
    };
    super::reject_rope_scaling(&hp)?;
    Decoder::load(file, spec)
}

//! `qwen2`: Qwen2 and Qwen2.5 (dense), as llama.cpp's `src/models/qwen2.cpp` runs them.
//!
//! The llama layer ([`super::decoder`]) with biases on the Q, K and V projections (and on the
//! output head if the file has one) and RoPE over halves (NeoX style) of the whole head.

use synapse_gguf::GgufFile;

use super::blocks::Dims;
use super::decoder::{Decoder, DecoderSpec};
use super::HParams;
use crate::ops::{Rope, RopeStyle};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let hp = HParams {
        md: file.metadata(),
        arch: "qwen2",
    };
    let dims = Dims::read(&hp)?;
    if dims.n_rot != dims.head_dim {
        return Err(ModelError::Hparams(format!(
            "qwen2 rotates whole heads: RoPE over {} of {} dims",
            dims.n_rot, dims.head_dim
        )));
    }
    let spec = DecoderSpec {
        arch: "qwen2",
        eps: hp.f32("attention.layer_norm_rms_epsilon")?,
        rope: Rope {
            style: RopeStyle::Neox,
            n_rot: dims.n_rot,
            base: hp.f32_or("rope.freq_base", 10000.0)?,
            freq_factors: None,
        },
        qk_norm: false,
        n_ctx_train: hp.usize_or("context_length", 32768)?,
        dims,
    };
    super::reject_rope_scaling(&hp)?;
    Decoder::load(file, spec)
}

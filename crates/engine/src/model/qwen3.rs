//! `qwen3`: Qwen3 (dense), as llama.cpp's `src/models/qwen3.cpp` runs it.
//!
//! The llama layer ([`super::decoder`]) without biases, with QK-norm (RMSNorm of each query and
//! key head, before RoPE) and RoPE over halves (NeoX style) of the whole head. Heads may be wider
//! than `n_embd / n_head`: their width is `attention.key_length`.

use synapse_gguf::GgufFile;

use super::blocks::Dims;
use super::decoder::{Decoder, DecoderSpec};
use super::HParams;
use crate::ops::{Rope, RopeStyle};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let hp = HParams {
        md: file.metadata(),
        arch: "qwen3",
    };
    let dims = Dims::read(&hp)?;
    if dims.n_rot != dims.head_dim {
        return Err(ModelError::Hparams(format!(
            "qwen3 rotates whole heads: RoPE over {} of {} dims",
            dims.n_rot, dims.head_dim
        )));
    }
    let spec = DecoderSpec {
        arch: "qwen3",
        eps: hp.f32("attention.layer_norm_rms_epsilon")?,
        rope: Rope {
            style: RopeStyle::Neox,
            n_rot: dims.n_rot,
            base: hp.f32_or("rope.freq_base", 10000.0)?,
            freq_factors: None,
        },
        qk_norm: true,
        n_ctx_train: hp.usize_or("context_length", 40960)?,
        dims,
    };
    super::reject_rope_scaling(&hp)?;
    Decoder::load(file, spec)
}

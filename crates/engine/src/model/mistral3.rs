//! `mistral3`: Ministral 3 and Mistral 3's dense text models, as llama.cpp's
//! `src/models/mistral3.cpp` runs them: the llama layer (`super::llama`) with YaRN RoPE (its
//! `rope.scaling.yarn_*` keys read) and Llama 4's attention temperature: past the original
//! context, the queries of position `p` are multiplied after RoPE by
//! `1 + attention.temperature_scale * ln(1 + floor(p / original_context_length))`.
//! Biases and mixtures of experts are refused by name.

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, Extras};
use super::hparams::{attn_temperature, Common};
use super::llama::{llama_arch, llama_decoder};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let arch = "mistral3";
    // Biases are tensors this does not read, which the registry refuses by name.
    let name = "blk.0.ffn_gate_inp.weight";
    if file.tensor(name).is_ok() {
        return Err(ModelError::Hparams(format!(
            "tensor `{name}`: Mistral 3's mixtures of experts are not supported"
        )));
    }
    let hp = Common::read(file, &llama_arch(arch, None, true))?;
    let extras = Extras {
        q_temp: attn_temperature(file, arch, hp.rope_scaling.n_ctx_orig)?,
        ..Extras::default()
    };
    llama_decoder(file, arch, hp, extras)
}

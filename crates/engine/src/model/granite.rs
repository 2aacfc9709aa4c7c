//! `granite`: IBM Granite 3.x (dense), as llama.cpp's `src/models/granite.cpp` runs it: the llama
//! layer (`super::llama`) with four scales: the token embeddings times `embedding_scale`, each
//! block's output times `residual_scale` before its residual add, `q . k` times
//! `attention.scale`, and the logits divided by `logit_scale`; without RoPE where
//! `rope.scaling.finetuned` is false. Experts (Granite MoE) are not supported here; biases are
//! tensors it does not read, which the registry refuses by name.

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, Extras};
use super::hparams::GraniteParams;
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let arch = "granite";
    let g = GraniteParams::read(file, arch)?;
    if file
        .metadata()
        .get(&format!("{arch}.expert_count"))
        .is_some()
    {
        return Err(ModelError::Hparams(format!(
            "`{arch}.expert_count`: granite mixtures of experts are not supported"
        )));
    }
    let extras = Extras {
        no_rope: !g.rope,
        embd_scale: g.embd_scale,
        residual_scale: g.residual_scale,
        attn_scale: g.attn_scale,
        logit_scale: Some(g.logit_scale),
        ..Extras::default()
    };
    super::llama::load_llama_like(file, arch, None, extras)
}

//! `smollm3`: SmolLM3, as llama.cpp's `src/models/smollm3.cpp` runs it: the llama layer
//! (`super::llama`) with every fourth layer's queries and keys left without RoPE ("NoPE").

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, Extras};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let extras = Extras {
        // llama.cpp's fixed step: layers 4, 8, 12, ... (counting from 1) take no RoPE.
        nope_every: Some(4),
        ..Extras::default()
    };
    super::llama::load_llama_like(file, "smollm3", None, extras)
}

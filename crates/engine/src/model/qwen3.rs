//! `qwen3`: Qwen3 (dense), as llama.cpp's `src/models/qwen3.cpp` runs it.
//!
//! The llama layer (`super::decoder`) without biases, with QK-norm (RMSNorm of each query and
//! key head, before RoPE) and RoPE over halves (NeoX style) of the whole head. Heads may be wider
//! than `n_embd / n_head`: their width is `attention.key_length`.

use synapse_gguf::GgufFile;

use super::decoder::Decoder;
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    super::qwen2::load_qwen(file, "qwen3", true, 40960, false)
}

//! `phi3`: Phi-3 (dense), as llama.cpp's `src/models/phi3.cpp` runs it: the llama layer
//! (`super::decoder`) with fused projections (`attn_qkv` holds the query, key and value rows,
//! `ffn_up` the gate's then the up's), RoPE over halves (NeoX style) of the first
//! `rope.dimension_count` dims of each head, and the queries scaled by `1 / sqrt(head_dim)` after
//! RoPE, before attention of scale 1. LongRoPE (`rope_factors_long`/`_short`, Phi-3.5 and Phi-4
//! mini) and Phi's mixtures are refused by name; a sliding window is ignored, as llama.cpp
//! ignores it.

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, DecoderSpec, Extras};
use super::hparams::{Arch, Common};
use crate::ops::{Rope, RopeStyle};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let arch = "phi3";
    for name in [
        "rope_factors_long.weight",
        "rope_factors_short.weight",
        "blk.0.rope_factors_long.weight",
        "blk.0.ffn_gate_inp.weight",
    ] {
        if file.tensor(name).is_ok() {
            return Err(ModelError::Hparams(format!(
                "tensor `{name}`: Phi-3's LongRoPE and mixtures are not supported"
            )));
        }
    }
    let hp = Common::read(
        file,
        &Arch {
            name: arch,
            eps: None,
            n_ctx_train: 4096,
            linear_rope_scaling: false,
            whole_head_rope: false,
            q_rows_per_dim: 1,
            experts: false,
            fused_up: true,
        },
    )?;
    let head_dim = hp.dims.head_dim;
    let spec = DecoderSpec {
        arch,
        rope: Rope {
            style: RopeStyle::Neox,
            n_rot: hp.dims.n_rot,
            base: hp.rope_base,
            freq_factors: None,
        },
        qk_norm: false,
        moe: None,
        extras: Extras {
            q_scale: Some(1.0 / (head_dim as f32).sqrt()),
            ..Extras::default()
        },
        hp,
    };
    Decoder::load(file, spec)
}

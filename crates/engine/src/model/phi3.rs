//! `phi3`: Phi-3 (dense), as llama.cpp's `src/models/phi3.cpp` runs it: the llama layer
//! (`super::decoder`) with fused projections (`attn_qkv` holds the query, key and value rows,
//! `ffn_up` the gate's then the up's), RoPE over halves (NeoX style) of the first
//! `rope.dimension_count` dims of each head, and the queries scaled by `1 / sqrt(head_dim)` after
//! RoPE, before attention of scale 1. LongRoPE (Phi-3.5, Phi-4 mini): the angles divided by
//! `rope_factors_short`, or by `rope_factors_long` in a state of more positions than
//! `rope.scaling.original_context_length`, and every cosine and sine multiplied by
//! `rope.scaling.attn_factor`. Phi's mixtures are refused by name; a sliding window is ignored,
//! as llama.cpp ignores it.

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, DecoderSpec, Extras, LongRope};
use super::hparams::{factors, Arch, Common};
use crate::ops::RopeStyle;
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let arch = "phi3";
    let name = "blk.0.ffn_gate_inp.weight";
    if file.tensor(name).is_ok() {
        return Err(ModelError::Hparams(format!(
            "tensor `{name}`: Phi-3's mixtures of experts are not supported"
        )));
    }
    let hp = Common::read(
        file,
        &Arch {
            name: arch,
            eps: None,
            n_ctx_train: 4096,
            rope_scalings: &[],
            yarn_keys: false,
            whole_head_rope: false,
            q_rows_per_dim: 1,
            experts: false,
            fused_up: true,
        },
    )?;
    let head_dim = hp.dims.head_dim;
    let half = hp.dims.n_rot / 2;
    let short = factors(file, "rope_factors_short.weight", half)?;
    let long = factors(file, "rope_factors_long.weight", half)?;
    let rope_long = (short.is_some() || long.is_some()).then(|| LongRope {
        rope: hp.rope(RopeStyle::Neox, long),
        n_ctx_orig: hp.rope_scaling.n_ctx_orig,
    });
    let rope = hp.rope(RopeStyle::Neox, short);
    let spec = DecoderSpec {
        rope_long,
        extras: Extras {
            q_scale: Some(1.0 / (head_dim as f32).sqrt()),
            ..Extras::default()
        },
        ..DecoderSpec::llama_layer(arch, hp, rope, false, None)
    };
    Decoder::load(file, spec)
}

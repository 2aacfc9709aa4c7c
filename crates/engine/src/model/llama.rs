//! `llama`: Llama 2/3.x, SmolLM2, Mistral-style models, and Mixtral-style mixtures of experts
//! (`expert_count` > 0: every layer's FFN routed, `model/moe.rs`).
//!
//! ```text
//! x = token_embd[token]
//! per layer:  x += Wo · attn(rope(Wq · norm(x)), rope(Wk · norm(x)), Wv · norm(x))
//!             x += Wdown · (silu(Wgate · norm(x)) * (Wup · norm(x)))
//! logits = Woutput · norm(x)          (Woutput = token_embd when the file has no output.weight)
//! ```
//! RMSNorm, adjacent-pair RoPE (with Llama 3's per-frequency factors from `rope_freqs.weight`, or
//! linear scaling), grouped-query attention over an F16 cache, SwiGLU.

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, DecoderSpec, Extras};
use super::hparams::{rope_factors, Arch, Common, MoeParams};
use crate::ops::{Rope, RopeStyle};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    load_llama_like(file, "llama", Some(1e-5), Extras::default())
}

/// A llama layer under another architecture's name and keys, with what it adds (`extras`);
/// `eps`: the norm epsilon where the file has none (`None`: required).
pub(super) fn load_llama_like<'a>(
    file: &'a GgufFile,
    arch: &'static str,
    eps: Option<f32>,
    extras: Extras,
) -> Result<Decoder<'a>, ModelError> {
    let hp = Common::read(
        file,
        &Arch {
            name: arch,
            eps,
            n_ctx_train: 2048,
            linear_rope_scaling: true,
            whole_head_rope: false,
            q_rows_per_dim: 1,
            experts: false,
            fused_up: false,
        },
    )?;
    let n_rot = hp.dims.n_rot;
    let mut freq_factors = rope_factors(file, n_rot / 2)?;
    // Linear scaling divides every angle by the factor (ggml's freq_scale = 1 / factor).
    if let Some(factor) = hp.rope_linear {
        let ff = freq_factors.get_or_insert_with(|| vec![1.0; n_rot / 2]);
        ff.iter_mut().for_each(|f| *f *= factor);
    }
    let spec = DecoderSpec {
        arch,
        rope: Rope {
            style: RopeStyle::Adjacent,
            n_rot,
            base: hp.rope_base,
            freq_factors,
        },
        qk_norm: false,
        extras,
        // Mixtral-style files: every expert as wide as `feed_forward_length`.
        moe: MoeParams::read(file, arch, |_| hp.dims.n_ff)?,
        hp,
    };
    Decoder::load(file, spec)
}

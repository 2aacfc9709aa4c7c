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
use crate::ops::RopeStyle;
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
    let hp = Common::read(file, &llama_arch(arch, eps, false))?;
    llama_decoder(file, arch, hp, extras)
}

/// The keys a llama layer reads under another architecture's name; `yarn_keys`: YaRN's own
/// keys too (Mistral 3).
pub(super) fn llama_arch(name: &'static str, eps: Option<f32>, yarn_keys: bool) -> Arch {
    Arch {
        name,
        eps,
        n_ctx_train: 2048,
        rope_scalings: &["linear", "yarn"],
        yarn_keys,
        whole_head_rope: false,
        q_rows_per_dim: 1,
        experts: false,
        fused_up: false,
    }
}

/// The llama decoder of a file whose keys `hp` holds, with what `extras` adds.
pub(super) fn llama_decoder<'a>(
    file: &'a GgufFile,
    arch: &'static str,
    hp: Common,
    extras: Extras,
) -> Result<Decoder<'a>, ModelError> {
    let freq_factors = rope_factors(file, hp.dims.n_rot / 2)?;
    let rope = hp.rope(RopeStyle::Adjacent, freq_factors);
    // Mixtral-style files: every expert as wide as `feed_forward_length`.
    let moe = MoeParams::read(file, arch, |_| hp.dims.n_ff)?;
    let spec = DecoderSpec {
        extras,
        ..DecoderSpec::llama_layer(arch, hp, rope, false, moe)
    };
    Decoder::load(file, spec)
}

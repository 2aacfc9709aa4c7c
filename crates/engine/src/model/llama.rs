//! `llama`: Llama 2/3.x, SmolLM2, Mistral-style models.
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

use super::blocks::Dims;
use super::decoder::{Decoder, DecoderSpec};
use super::{vector, HParams};
use crate::ops::{Rope, RopeStyle};
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let md = file.metadata();
    let hp = HParams { md, arch: "llama" };
    let dims = Dims::read(&hp)?;
    let n_rot = dims.n_rot;
    let mut freq_factors = match file.tensor("rope_freqs.weight") {
        Ok(_) => Some(vector(file, "rope_freqs.weight", n_rot / 2)?),
        Err(_) => None,
    };
    match md.str(&hp.key("rope.scaling.type")).unwrap_or("none") {
        "none" => {}
        // Linear scaling divides every angle by the factor (ggml's freq_scale = 1 / factor).
        "linear" => {
            let factor = hp.f32_or("rope.scaling.factor", 1.0)?;
            if factor > 0.0 && factor != 1.0 {
                let ff = freq_factors.get_or_insert_with(|| vec![1.0; n_rot / 2]);
                ff.iter_mut().for_each(|f| *f *= factor);
            }
        }
        other => {
            return Err(ModelError::Hparams(format!(
                "RoPE scaling `{other}` is not supported (none, linear)"
            )))
        }
    }
    let spec = DecoderSpec {
        arch: "llama",
        eps: hp.f32_or("attention.layer_norm_rms_epsilon", 1e-5)?,
        rope: Rope {
            style: RopeStyle::Adjacent,
            n_rot,
            base: hp.f32_or("rope.freq_base", 10000.0)?,
            freq_factors,
        },
        qk_norm: false,
        n_ctx_train: hp.usize_or("context_length", 2048)?,
        dims,
    };
    Decoder::load(file, spec)
}

//! `gpt-oss`: OpenAI's gpt-oss-20b and gpt-oss-120b, as llama.cpp's `src/models/openai-moe.cpp`
//! runs them.
//!
//! ```text
//! x = token_embd[token]
//! per layer:  x += Wo · attn(rope(Wq · norm(x) + bq), rope(Wk · norm(x) + bk), Wv · norm(x) + bv,
//!                            sinks) + bo
//!             x += moe(post_norm(x))
//! logits = Woutput · norm(x)
//! ```
//! The llama layer (`super::decoder`) with NeoX RoPE under YaRN scaling, biases on every
//! attention projection, a sink logit per head that joins each softmax without a value
//! (`LayerAttn::sinks`), a sliding window on every other layer (the even ones), and a mixture
//! of experts in every layer (`super::moe`): the router's logits biased, the four largest
//! chosen and weighted by a softmax over those four, each expert's products biased, and the
//! clamped SwiGLU `swiglu_oai`. Its experts are MXFP4 in the files OpenAI publishes.

use synapse_gguf::GgufFile;

use super::decoder::{Decoder, DecoderSpec};
use super::ffn::Activation;
use super::hparams::{bad, local_layers, Arch, Common, Gating, Keys, MoeParams};
use crate::ops::RopeStyle;
use crate::ModelError;

pub fn load(file: &GgufFile) -> Result<Decoder<'_>, ModelError> {
    let arch = "gpt-oss";
    let hp = Common::read(
        file,
        &Arch {
            name: arch,
            eps: None,
            n_ctx_train: 131072,
            rope_scalings: &["linear", "yarn"],
            yarn_keys: false,
            whole_head_rope: true,
            q_rows_per_dim: 1,
            experts: true,
            fused_up: false,
        },
    )?;
    let k = Keys {
        md: file.metadata(),
        arch,
    };
    // llama.cpp requires both: the experts' width and the window.
    k.nonzero("expert_feed_forward_length", None)?;
    let window = k.nonzero("attention.sliding_window", None)?;
    let local = local_layers(&k, hp.dims.n_layer, window, 2)?;
    let base_swa = k.positive("rope.freq_base_swa", Some(hp.rope_base))?;
    if base_swa != hp.rope_base {
        return Err(bad(
            &k.key("rope.freq_base_swa"),
            base_swa,
            format!(
                "a RoPE base on the sliding-window layers other than the others' ({}) is not \
                 supported",
                hp.rope_base
            ),
        ));
    }
    let moe = MoeParams::read(file, arch, |_| 0)?.ok_or_else(|| {
        ModelError::Hparams(format!(
            "{arch} needs experts: `{arch}.expert_count` is absent or 0"
        ))
    })?;
    let moe = MoeParams {
        gating: Gating::SoftmaxOfChosen,
        biases: true,
        ..moe
    };
    // The output matrix is its own: llama.cpp does not fall back to the embeddings here.
    if file.tensor("output.weight").is_err() {
        return Err(ModelError::MissingTensor {
            tensor: "output.weight".into(),
        });
    }
    let rope = hp.rope(RopeStyle::Neox, None);
    let spec = DecoderSpec {
        act: Activation::SwigluOai,
        window: Some((window, local)),
        out_bias_and_sinks: true,
        ffn_norm: "post_attention_norm",
        ..DecoderSpec::llama_layer(arch, hp, rope, false, Some(moe))
    };
    Decoder::load(file, spec)
}

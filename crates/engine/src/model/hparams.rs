//! Every hyperparameter a model reads from its file, read and checked in one pass before
//! anything is allocated by it: the architectures build from the structs made here and read no
//! `{arch}.*` key themselves.
//!
//! What is checked, so that a hostile or broken file is a clear error naming the key and its
//! value, never an abort on an allocation, a panic or garbage logits:
//! - counts and dimensions are integers that fit in a `usize`, and their products (heads times
//!   head width, the delta net's channels times its taps) are computed with checked arithmetic;
//! - `block_count` against the layers the file holds tensors for (`blk.N.*` for every `N` below
//!   it, none past it), before anything is sized by it;
//! - the embedding length and the vocabulary against `token_embd.weight`, whose rows must also
//!   number the tokenizer's tokens (`tokenizer.ggml.tokens`) and `{arch}.vocab_size` where the
//!   file has them; the feed-forward length and the head counts and widths against the first
//!   layer that has those projections (every layer's shapes are checked again as it loads);
//! - floats (norm epsilon, RoPE bases and scaling factors, logit soft-capping) are finite and in
//!   range.

use std::collections::BTreeSet;
use std::fmt::Display;

use synapse_gguf::{GgufFile, Metadata, Value};

use crate::attention::MAX_HEAD_DIM;
use crate::delta_net::DeltaNetShape;
use crate::ops::{AttnTemp, Rope, RopeScaling, RopeStyle};
use crate::ModelError;

/// The error of a hyperparameter: its key, its value and what is wrong with it.
pub(crate) fn bad(key: &str, value: impl Display, why: impl Into<String>) -> ModelError {
    ModelError::BadHparam {
        key: key.to_string(),
        value: value.to_string(),
        why: why.into(),
    }
}

/// Reads the `{arch}.*` keys of a file, with errors that name the key.
pub(crate) struct Keys<'a> {
    pub md: &'a Metadata,
    pub arch: &'a str,
}

impl Keys<'_> {
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn get(&self, suffix: &str) -> Option<&Value> {
        self.md.get(&self.key(suffix))
    }

    /// A count or a dimension.
    pub fn usize(&self, suffix: &str) -> Result<usize, ModelError> {
        let key = self.key(suffix);
        let v = self.md.u64(&key)?;
        usize::try_from(v).map_err(|_| bad(&key, v, "does not fit in a machine word"))
    }

    pub fn usize_or(&self, suffix: &str, default: usize) -> Result<usize, ModelError> {
        match self.get(suffix) {
            None => Ok(default),
            Some(_) => self.usize(suffix),
        }
    }

    /// A count that must be at least 1.
    pub fn nonzero(&self, suffix: &str, default: Option<usize>) -> Result<usize, ModelError> {
        let v = match default {
            Some(d) => self.usize_or(suffix, d)?,
            None => self.usize(suffix)?,
        };
        if v == 0 {
            return Err(bad(&self.key(suffix), v, "must be at least 1"));
        }
        Ok(v)
    }

    /// A float, rounded to the f32 the arithmetic uses; `default` where the file has none (a
    /// required key without one).
    fn f32(&self, suffix: &str, default: Option<f32>) -> Result<f32, ModelError> {
        match (self.get(suffix), default) {
            (None, Some(d)) => Ok(d),
            _ => Ok(self.md.f64(&self.key(suffix))? as f32),
        }
    }

    /// A float that must be finite and above 0: norm epsilons, RoPE bases, scaling factors.
    pub fn positive(&self, suffix: &str, default: Option<f32>) -> Result<f32, ModelError> {
        let v = self.f32(suffix, default)?;
        if !(v.is_finite() && v > 0.0) {
            return Err(bad(&self.key(suffix), v, "must be a finite number above 0"));
        }
        Ok(v)
    }

    /// An optional string key (an error if it is there but not a string).
    fn str(&self, suffix: &str) -> Result<Option<&str>, ModelError> {
        match self.get(suffix) {
            None => Ok(None),
            Some(_) => Ok(Some(self.md.str(&self.key(suffix))?)),
        }
    }

    /// An array of bools, if the key holds one.
    fn bools(&self, suffix: &str) -> Option<Option<Vec<bool>>> {
        match self.get(suffix) {
            Some(Value::Array(a)) => Some((0..a.len()).map(|i| a.get(i)?.as_bool()).collect()),
            _ => None,
        }
    }
}

/// The shape of a decoder whose attention layers share one attention shape.
#[derive(Debug, Clone)]
pub(crate) struct Dims {
    pub n_embd: usize,
    /// `block_count`: every block the file holds (Qwen 3.5's prediction blocks included).
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// `attention.key_length`, `n_embd / n_head` when absent.
    pub head_dim: usize,
    /// `rope.dimension_count`, `head_dim` when absent.
    pub n_rot: usize,
    /// `n_head * head_dim`, `n_head_kv * head_dim`: known not to overflow.
    pub q_dim: usize,
    pub kv_dim: usize,
}

impl Dims {
    /// `experts`: a mixture, whose `feed_forward_length` may be absent (0: no dense FFN).
    fn read(k: &Keys, experts: bool) -> Result<Dims, ModelError> {
        let n_embd = k.nonzero("embedding_length", None)?;
        let n_layer = k.usize("block_count")?;
        let n_ff = match experts {
            true => k.usize_or("feed_forward_length", 0)?,
            false => k.nonzero("feed_forward_length", None)?,
        };
        let n_head = k.nonzero("attention.head_count", None)?;
        let n_head_kv = k.usize_or("attention.head_count_kv", n_head)?;
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(
                &k.key("attention.head_count_kv"),
                n_head_kv,
                format!(
                    "{n_head} query heads (`{}`) cannot share {n_head_kv} KV heads",
                    k.key("attention.head_count")
                ),
            ));
        }
        let head_dim = k.usize_or("attention.key_length", n_embd / n_head)?;
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            let supported = format!("head widths of 1 to {MAX_HEAD_DIM} are supported");
            return Err(match k.get("attention.key_length") {
                Some(_) => bad(&k.key("attention.key_length"), head_dim, supported),
                // The width is the embedding's share of each head.
                None => bad(
                    &k.key("attention.head_count"),
                    n_head,
                    format!("{n_embd} wide embeddings make heads of {head_dim}: {supported}"),
                ),
            });
        }
        let v_dim = k.usize_or("attention.value_length", head_dim)?;
        if v_dim != head_dim {
            return Err(bad(
                &k.key("attention.value_length"),
                v_dim,
                format!("value heads as wide as key heads ({head_dim}) are supported"),
            ));
        }
        let n_rot = k.usize_or("rope.dimension_count", head_dim)?;
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(
                &k.key("rope.dimension_count"),
                n_rot,
                format!("RoPE over {n_rot} of {head_dim} dims"),
            ));
        }
        // n_head_kv divides n_head: the KV width is at most the query width.
        let q_dim = n_head.checked_mul(head_dim).ok_or_else(|| {
            bad(
                &k.key("attention.head_count"),
                n_head,
                format!("{n_head} heads of {head_dim} overflow"),
            )
        })?;
        Ok(Dims {
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            q_dim,
            kv_dim: n_head_kv * head_dim,
        })
    }
}

/// What an architecture's keys default to, and what it supports.
pub(crate) struct Arch {
    pub name: &'static str,
    /// `attention.layer_norm_rms_epsilon` when absent; `None`: the key is required.
    pub eps: Option<f32>,
    /// `context_length` when absent.
    pub n_ctx_train: usize,
    /// The `rope.scaling.type`s supported besides `none`: `linear`, `yarn`.
    pub rope_scalings: &'static [&'static str],
    /// Whether YaRN's `rope.scaling.yarn_*` keys are read (llama.cpp reads them for few
    /// architectures; the others take its defaults).
    pub yarn_keys: bool,
    /// RoPE over whole heads only (`rope.dimension_count` = the head width).
    pub whole_head_rope: bool,
    /// Rows of the query projection per query dimension: 2 where each head carries its gate
    /// (Qwen 3.5).
    pub q_rows_per_dim: usize,
    /// A mixture of experts only: `feed_forward_length` may be absent.
    pub experts: bool,
    /// `ffn_up` holds the gate and up halves (Phi-3): twice `feed_forward_length` rows.
    pub fused_up: bool,
}

/// The hyperparameters every architecture has, checked.
pub(crate) struct Common {
    pub dims: Dims,
    /// The rows of `token_embd.weight`, the tokenizer's tokens where the file has them.
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub eps: f32,
    pub rope_base: f32,
    /// How the file scales its RoPE (`rope.scaling.*`).
    pub rope_scaling: ScalingKeys,
}

/// How a file scales its RoPE (`rope.scaling.*`), as llama.cpp reads the keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ScalingKeys {
    /// `1 / rope.scaling.factor` under linear or YaRN scaling; 1 without.
    pub freq_scale: f32,
    /// `rope.scaling.type = yarn`.
    pub yarn: bool,
    /// `rope.scaling.original_context_length`, else the training context.
    pub n_ctx_orig: usize,
    /// YaRN's ramp (`yarn_beta_fast`, `yarn_beta_slow`: 32 and 1 by default).
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// `yarn_log_multiplier` (0: none).
    pub log_mul: f32,
    /// `rope.scaling.attn_factor` (1 where absent): multiplies every cosine and sine.
    pub attn_factor: f32,
}

impl ScalingKeys {
    /// ggml's parameters for a RoPE of `n_rot` dims over `base`, as llama.cpp's context sets
    /// them up from the keys, in its f32 arithmetic (unfused: it is compiled without FMA).
    /// `scaled`: false for layers that keep a frequency scale of 1 (Gemma's local layers).
    pub fn rope(&self, n_rot: usize, base: f32, scaled: bool) -> RopeScaling {
        let mut attn_factor = 1.0f32;
        if self.yarn {
            let mscale = |scale: f32, m: f32| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let factor = 1.0 / self.freq_scale;
            attn_factor = if self.log_mul != 0.0 {
                mscale(factor, 1.0) / mscale(factor, self.log_mul)
            } else {
                mscale(factor, 1.0)
            };
            // ggml multiplies this magnitude in again for every angle: cancelled here.
            attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        attn_factor *= self.attn_factor;
        RopeScaling {
            freq_scale: if scaled { self.freq_scale } else { 1.0 },
            ext_factor: if self.yarn { 1.0 } else { 0.0 },
            corr_dims: RopeScaling::corr_dims(
                n_rot,
                self.n_ctx_orig,
                base,
                self.beta_fast,
                self.beta_slow,
            ),
            attn_factor,
        }
    }
}

impl Common {
    /// The RoPE of the model's layers: `style` over `rope.dimension_count` dims at
    /// `rope.freq_base`, scaled as the file asks.
    pub fn rope(&self, style: RopeStyle, freq_factors: Option<Vec<f32>>) -> Rope {
        let n_rot = self.dims.n_rot;
        Rope {
            style,
            n_rot,
            base: self.rope_base,
            freq_factors,
            scaling: self.rope_scaling.rope(n_rot, self.rope_base, true),
        }
    }

    pub fn read(file: &GgufFile, arch: &Arch) -> Result<Common, ModelError> {
        let k = Keys {
            md: file.metadata(),
            arch: arch.name,
        };
        let dims = Dims::read(&k, arch.experts)?;
        check_layers(file, &k.key("block_count"), dims.n_layer)?;
        if arch.whole_head_rope && dims.n_rot != dims.head_dim {
            return Err(bad(
                &k.key("rope.dimension_count"),
                dims.n_rot,
                format!("{} rotates whole heads of {}", arch.name, dims.head_dim),
            ));
        }
        let n_vocab = vocabulary(file, &k, dims.n_embd)?;
        check_layer_shapes(file, &k, &dims, arch.q_rows_per_dim, arch.fused_up)?;
        let n_ctx_train = k.nonzero("context_length", Some(arch.n_ctx_train))?;
        let eps = k.positive("attention.layer_norm_rms_epsilon", arch.eps)?;
        let rope_base = k.positive("rope.freq_base", Some(10000.0))?;
        let rope_scaling = ScalingKeys::read(&k, arch, n_ctx_train)?;
        Ok(Common {
            dims,
            n_vocab,
            n_ctx_train,
            eps,
            rope_base,
            rope_scaling,
        })
    }
}

impl ScalingKeys {
    /// `rope.scaling.type` (`linear` where absent but a factor is there, as llama.cpp reads it)
    /// and the keys that type reads, checked.
    fn read(k: &Keys, arch: &Arch, n_ctx_train: usize) -> Result<ScalingKeys, ModelError> {
        // The old name of the factor's key, as llama.cpp still reads it.
        let factor_key = match k.get("rope.scaling.factor") {
            None if k.get("rope.scale_linear").is_some() => "rope.scale_linear",
            _ => "rope.scaling.factor",
        };
        let factor = k.f32(factor_key, Some(0.0))?;
        if !(factor.is_finite() && factor >= 0.0) {
            return Err(bad(
                &k.key(factor_key),
                factor,
                "must be a finite number, 0 (none) or above",
            ));
        }
        let kind = match k.str("rope.scaling.type")? {
            Some(kind) => kind,
            None if factor != 0.0 && factor != 1.0 => "linear",
            None => "none",
        };
        if kind != "none" && !arch.rope_scalings.contains(&kind) {
            let mut supported = vec!["none"];
            supported.extend_from_slice(arch.rope_scalings);
            return Err(bad(
                &k.key("rope.scaling.type"),
                format!("`{kind}`"),
                format!(
                    "RoPE scaling is not supported for {} ({})",
                    arch.name,
                    supported.join(", ")
                ),
            ));
        }
        let yarn = kind == "yarn";
        let yarn_key = |suffix: &str, default: f32| -> Result<f32, ModelError> {
            if !(yarn && arch.yarn_keys) {
                return Ok(default);
            }
            let v = k.f32(suffix, Some(default))?;
            if !v.is_finite() {
                return Err(bad(&k.key(suffix), v, "must be a finite number"));
            }
            Ok(v)
        };
        Ok(ScalingKeys {
            freq_scale: if kind == "none" || factor == 0.0 {
                1.0
            } else {
                1.0 / factor
            },
            yarn,
            n_ctx_orig: k.nonzero("rope.scaling.original_context_length", Some(n_ctx_train))?,
            beta_fast: yarn_key("rope.scaling.yarn_beta_fast", 32.0)?,
            beta_slow: yarn_key("rope.scaling.yarn_beta_slow", 1.0)?,
            log_mul: yarn_key("rope.scaling.yarn_log_multiplier", 0.0)?,
            attn_factor: k.positive("rope.scaling.attn_factor", Some(1.0))?,
        })
    }
}

/// Llama 4's attention temperature (`{arch}.attention.temperature_scale`; 0 or absent: none),
/// stepping every `n_ctx_orig` positions.
pub(crate) fn attn_temperature(
    file: &GgufFile,
    arch: &str,
    n_ctx_orig: usize,
) -> Result<Option<AttnTemp>, ModelError> {
    let k = Keys {
        md: file.metadata(),
        arch,
    };
    let scale = k.f32("attention.temperature_scale", Some(0.0))?;
    if !scale.is_finite() {
        return Err(bad(
            &k.key("attention.temperature_scale"),
            scale,
            "must be a finite number",
        ));
    }
    Ok((scale != 0.0).then_some(AttnTemp {
        scale,
        floor: n_ctx_orig,
    }))
}

/// Granite's scales (`{arch}.logit_scale`, required; `residual_scale`, `embedding_scale`,
/// `attention.scale`, where present and not 0) and whether it takes RoPE at all
/// (`rope.scaling.finetuned`, true where absent).
pub(crate) struct GraniteParams {
    pub logit_scale: f32,
    pub residual_scale: Option<f32>,
    pub embd_scale: Option<f32>,
    pub attn_scale: Option<f32>,
    pub rope: bool,
}

impl GraniteParams {
    pub fn read(file: &GgufFile, arch: &str) -> Result<GraniteParams, ModelError> {
        let k = Keys {
            md: file.metadata(),
            arch,
        };
        // llama.cpp takes 0 for "no such scale".
        let optional = |suffix: &str| -> Result<Option<f32>, ModelError> {
            let v = k.f32(suffix, Some(0.0))?;
            if !v.is_finite() {
                return Err(bad(&k.key(suffix), v, "must be a finite number"));
            }
            Ok((v != 0.0).then_some(v))
        };
        let rope = match k.get("rope.scaling.finetuned") {
            None => true,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| bad(&k.key("rope.scaling.finetuned"), v, "must be a bool"))?,
        };
        Ok(GraniteParams {
            logit_scale: k.positive("logit_scale", None)?,
            residual_scale: optional("residual_scale")?,
            embd_scale: optional("embedding_scale")?,
            attn_scale: optional("attention.scale")?,
            rope,
        })
    }
}

/// The most experts a layer may have (llama.cpp's `LLAMA_MAX_EXPERTS`).
const MAX_EXPERTS: usize = 512;

/// A mixture of experts' shape: every layer's feed-forward block routes each token to
/// `n_used` of `n_expert` expert FFNs, each `n_ff_exp` wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeParams {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    /// The width of a shared expert every token also goes through, where the model has one.
    pub n_ff_shared: Option<usize>,
    /// How a token's experts and their weights are chosen from the router's logits.
    pub gating: Gating,
    /// Biases on the router's logits and on each expert's three products (gpt-oss).
    pub biases: bool,
}

/// How a mixture routes a token (llama.cpp's `expert_gating_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gating {
    /// A softmax over every expert's logit, the `n_used` most probable chosen, their
    /// probabilities divided by their sum where `norm` (Qwen3's, Mixtral's).
    Softmax { norm: bool },
    /// The `n_used` largest logits chosen, their weights a softmax over those alone
    /// (gpt-oss's `SOFTMAX_WEIGHT`).
    SoftmaxOfChosen,
}

impl MoeParams {
    /// `{arch}.expert_count`, `expert_used_count` and `expert_feed_forward_length` (the
    /// experts' width, `width_default` where absent); `None` where the file has no experts
    /// (`expert_count` absent or 0).
    pub fn read(
        file: &GgufFile,
        arch: &str,
        width_default: impl Fn(usize) -> usize,
    ) -> Result<Option<MoeParams>, ModelError> {
        let k = Keys {
            md: file.metadata(),
            arch,
        };
        let n_expert = k.usize_or("expert_count", 0)?;
        if n_expert == 0 {
            return Ok(None);
        }
        if n_expert > MAX_EXPERTS {
            return Err(bad(
                &k.key("expert_count"),
                n_expert,
                format!("at most {MAX_EXPERTS} experts are supported"),
            ));
        }
        let n_used = k.nonzero("expert_used_count", None)?;
        if n_used > n_expert {
            return Err(bad(
                &k.key("expert_used_count"),
                n_used,
                format!("a token cannot use more than the {n_expert} experts"),
            ));
        }
        let n_ff_exp = k.nonzero("expert_feed_forward_length", Some(width_default(n_used)))?;
        Ok(Some(MoeParams {
            n_expert,
            n_used,
            n_ff_exp,
            n_ff_shared: None,
            gating: Gating::Softmax { norm: true },
            biases: false,
        }))
    }

    /// With a shared expert of `expert_shared_feed_forward_length` (`default` where absent).
    pub fn with_shared(
        self,
        file: &GgufFile,
        arch: &str,
        default: usize,
    ) -> Result<Self, ModelError> {
        let k = Keys {
            md: file.metadata(),
            arch,
        };
        let n = k.nonzero("expert_shared_feed_forward_length", Some(default))?;
        Ok(MoeParams {
            n_ff_shared: Some(n),
            ..self
        })
    }
}

/// The layer index of a tensor named `blk.{N}.*`.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// `block_count` against the layers the file holds tensors for: each of `blk.0` to
/// `blk.{n_layer - 1}` has some, and no layer past them has any (llama.cpp refuses a file with
/// tensors it does not use). Nothing sized by `block_count` is allocated before this.
fn check_layers(file: &GgufFile, key: &str, n_layer: usize) -> Result<(), ModelError> {
    let held: BTreeSet<usize> = file
        .tensors()
        .filter_map(|t| layer_of(&t.info.name))
        .collect();
    // The first layer missing is at most the number held: the search is short.
    if let Some(missing) = (0..n_layer).find(|i| !held.contains(i)) {
        return Err(bad(
            key,
            n_layer,
            format!(
                "the file has no tensors of layer {missing} (`blk.{missing}.*`); it holds {} layers",
                held.len()
            ),
        ));
    }
    if let Some(past) = held.range(n_layer..).next() {
        return Err(bad(
            key,
            n_layer,
            format!("the file holds tensors of layer {past} (`blk.{past}.*`) past the last"),
        ));
    }
    Ok(())
}

/// The vocabulary: the rows of `token_embd.weight` (whose rows must be `embedding_length`
/// wide), which must number the tokens of the file's tokenizer and `{arch}.vocab_size` where
/// the file has them (as llama.cpp sizes the embedding by the tokenizer's tokens).
fn vocabulary(file: &GgufFile, k: &Keys, n_embd: usize) -> Result<usize, ModelError> {
    let name = "token_embd.weight";
    let t = file.tensor(name).map_err(|_| ModelError::MissingTensor {
        tensor: name.into(),
    })?;
    let shape = &t.info.shape;
    if shape.len() != 2 || shape[1] == 0 {
        return Err(ModelError::Shape {
            tensor: name.into(),
            shape: shape.clone(),
            expected: format!("[{n_embd}, n_vocab]"),
        });
    }
    if shape[0] != n_embd as u64 {
        return Err(bad(
            &k.key("embedding_length"),
            n_embd,
            format!("tensor `{name}` has rows of {} (shape {shape:?})", shape[0]),
        ));
    }
    let n_vocab = usize::try_from(shape[1]).map_err(|_| ModelError::Shape {
        tensor: name.into(),
        shape: shape.clone(),
        expected: "rows that fit in a machine word".into(),
    })?;
    if let Some(Value::Array(tokens)) = k.md.get("tokenizer.ggml.tokens") {
        if tokens.len() != n_vocab {
            return Err(bad(
                "tokenizer.ggml.tokens",
                format!("{} tokens", tokens.len()),
                format!("the token embedding `{name}` has {n_vocab} rows, one a token"),
            ));
        }
    }
    if k.get("vocab_size").is_some() {
        let v = k.usize("vocab_size")?;
        if v != n_vocab {
            return Err(bad(
                &k.key("vocab_size"),
                v,
                format!("the token embedding `{name}` has {n_vocab} rows, one a token"),
            ));
        }
    }
    Ok(n_vocab)
}

/// The rows of the first layer's tensor `blk.{i}.{suffix}` that has one, and its name.
fn first_rows(file: &GgufFile, n_layer: usize, suffix: &str) -> Option<(String, u64)> {
    (0..n_layer).find_map(|i| {
        let name = format!("blk.{i}.{suffix}");
        let t = file.tensor(&name).ok()?;
        Some((name, *t.info.shape.get(1)?))
    })
}

/// The feed-forward length and the head counts and widths against the first layer's tensors
/// that hold them, for an error that names the key (each layer's shapes are checked again as it
/// loads, and a missing tensor is named there).
fn check_layer_shapes(
    file: &GgufFile,
    k: &Keys,
    d: &Dims,
    q_rows_per_dim: usize,
    fused_up: bool,
) -> Result<(), ModelError> {
    let n = d.n_layer;
    if let Some((name, rows)) = first_rows(file, n, "ffn_up.weight") {
        if rows as u128 != d.n_ff as u128 * if fused_up { 2 } else { 1 } {
            return Err(bad(
                &k.key("feed_forward_length"),
                d.n_ff,
                format!("tensor `{name}` has {rows} rows"),
            ));
        }
    }
    let heads = |key: &str, value: usize, dim: usize, rows: u64, name: &str, per: usize| {
        bad(
            &k.key(key),
            value,
            format!(
                "{value} heads of {} (`{}`) make {} rows, tensor `{name}` has {rows}",
                d.head_dim,
                k.key("attention.key_length"),
                dim as u128 * per as u128
            ),
        )
    };
    if let Some((name, rows)) = first_rows(file, n, "attn_q.weight") {
        if rows as u128 != d.q_dim as u128 * q_rows_per_dim as u128 {
            let e = heads(
                "attention.head_count",
                d.n_head,
                d.q_dim,
                rows,
                &name,
                q_rows_per_dim,
            );
            return Err(e);
        }
    }
    if let Some((name, rows)) = first_rows(file, n, "attn_k.weight") {
        if rows != d.kv_dim as u64 {
            let e = heads(
                "attention.head_count_kv",
                d.n_head_kv,
                d.kv_dim,
                rows,
                &name,
                1,
            );
            return Err(e);
        }
    }
    Ok(())
}

/// Gemma 3's own hyperparameters, besides the [`Common`] ones.
pub(crate) struct Gemma3Params {
    pub common: Common,
    /// Keys a local layer's query sees, itself included (`attention.sliding_window`).
    pub window: usize,
    /// Which layers are local (sliding-window).
    pub local: Vec<bool>,
    /// The local layers' RoPE base (`rope.freq_base_swa`).
    pub rope_base_local: f32,
    /// `final_logit_softcapping`, where it is not 0.
    pub softcap: Option<f32>,
    /// Gemma 2's attention logit soft-capping (`attn_logit_softcapping`); none for Gemma 3.
    pub attn_softcap: Option<f32>,
}

impl Gemma3Params {
    /// The keys of `arch`: `gemma3`, or `gemma2` with its defaults (llama.cpp's): a window of
    /// 4096 on every other layer, the global RoPE base on the local layers too, logits soft-capped
    /// at 30 and attention scores at 50.
    pub fn read(file: &GgufFile, arch: &'static str) -> Result<Gemma3Params, ModelError> {
        let gemma2 = arch == "gemma2";
        let common = Common::read(
            file,
            &Arch {
                name: arch,
                eps: Some(1e-6),
                n_ctx_train: if gemma2 { 8192 } else { 32768 },
                rope_scalings: if gemma2 { &[] } else { &["linear"] },
                yarn_keys: false,
                whole_head_rope: false,
                q_rows_per_dim: 1,
                experts: false,
                fused_up: false,
            },
        )?;
        let k = Keys {
            md: file.metadata(),
            arch,
        };
        let n_layer = common.dims.n_layer;
        let window = k.usize_or("attention.sliding_window", if gemma2 { 4096 } else { 0 })?;
        let local = local_layers(&k, n_layer, window, if gemma2 { 2 } else { 6 })?;
        let base_local = if gemma2 { common.rope_base } else { 10000.0 };
        let rope_base_local = k.positive("rope.freq_base_swa", Some(base_local))?;
        let cap = |key: &str, default: f32| -> Result<Option<f32>, ModelError> {
            let cap = k.f32(key, Some(default))?;
            if !(cap.is_finite() && cap >= 0.0) {
                return Err(bad(
                    &k.key(key),
                    cap,
                    "must be a finite number, 0 (none) or above",
                ));
            }
            Ok(Some(cap).filter(|&c| c != 0.0))
        };
        Ok(Gemma3Params {
            common,
            window,
            local,
            rope_base_local,
            softcap: cap("final_logit_softcapping", if gemma2 { 30.0 } else { 0.0 })?,
            attn_softcap: if gemma2 {
                cap("attn_logit_softcapping", 50.0)?
            } else {
                None
            },
        })
    }
}

/// Which of a Gemma's layers are local: `attention.sliding_window_pattern` as one flag per
/// layer, or as a period `p` (layer `i` is local unless `i % p == p - 1`), `default_period`
/// when absent (6 for Gemma 3, 2 for Gemma 2); none without a window.
pub(crate) fn local_layers(
    k: &Keys,
    n_layer: usize,
    window: usize,
    default_period: usize,
) -> Result<Vec<bool>, ModelError> {
    if window == 0 {
        return Ok(vec![false; n_layer]);
    }
    let key = k.key("attention.sliding_window_pattern");
    if let Some(flags) = k.bools("attention.sliding_window_pattern") {
        return match flags {
            Some(f) if f.len() == n_layer => Ok(f),
            _ => Err(ModelError::Hparams(format!(
                "`{key}` must hold {n_layer} bools"
            ))),
        };
    }
    let period = k.usize_or("attention.sliding_window_pattern", default_period)?;
    Ok((0..n_layer)
        .map(|i| period == 0 || i % period < period - 1)
        .collect())
}

/// Qwen 3.5's own hyperparameters, besides the [`Common`] ones.
pub(crate) struct Qwen35Params {
    pub common: Common,
    /// The trunk's layers: `block_count` less the prediction blocks stored after it.
    pub n_layer: usize,
    /// `rope.dimension_sections`: each fits llama.cpp's `int`, and so does their sum, which is
    /// not 0.
    pub sections: [usize; 4],
    pub dn: DeltaNetShape,
    /// Which of the trunk's layers are recurrent (delta net).
    pub recurrent: Vec<bool>,
    /// `qwen35moe`'s experts.
    pub moe: Option<MoeParams>,
}

/// The widest delta-net head (`ssm.state_size`) accepted: its state is `S x S` per head.
const MAX_DELTA_NET_HEAD: usize = 512;

impl Qwen35Params {
    /// The keys of `arch`: `qwen35`, or `qwen35moe` (which adds its experts').
    pub fn read(file: &GgufFile, arch: &'static str) -> Result<Qwen35Params, ModelError> {
        let common = Common::read(
            file,
            &Arch {
                name: arch,
                eps: None,
                n_ctx_train: 262144,
                rope_scalings: &[],
                yarn_keys: false,
                whole_head_rope: false,
                q_rows_per_dim: 2,
                experts: arch != "qwen35",
                fused_up: false,
            },
        )?;
        let k = Keys {
            md: file.metadata(),
            arch,
        };
        let n_blocks = common.dims.n_layer;
        // `block_count` includes the multi-token-prediction blocks stored after the trunk
        // (`nextn_predict_layers`); llama.cpp's main pass, and synapse's, runs the trunk only.
        let n_nextn = k.usize_or("nextn_predict_layers", 0)?;
        if n_nextn >= n_blocks {
            return Err(ModelError::Hparams(format!(
                "{n_nextn} prediction blocks of {n_blocks} leave no trunk"
            )));
        }
        let n_layer = n_blocks - n_nextn;
        let sections = sections(&k)?;
        let dn = delta_net_shape(file, &k, n_layer)?;
        let recurrent = recurrent_layers(&k, n_layer)?;
        let moe = match arch {
            "qwen35" => None,
            _ => {
                // As llama.cpp: without the widths, the FFN's split among the experts a token
                // uses, and the FFN's for the shared expert.
                let n_ff = common.dims.n_ff;
                let p = MoeParams::read(file, arch, |n_used| n_ff / n_used)?.ok_or_else(|| {
                    ModelError::Hparams(format!(
                        "{arch} needs experts: `{arch}.expert_count` is absent or 0"
                    ))
                })?;
                Some(p.with_shared(file, arch, n_ff)?)
            }
        };
        Ok(Qwen35Params {
            common,
            n_layer,
            sections,
            dn,
            recurrent,
            moe,
        })
    }
}

/// `rope.dimension_sections`: four sizes (more are ignored), each and their sum within
/// llama.cpp's `int`, the sum not 0 (the sections divide the pairs by it).
fn sections(k: &Keys) -> Result<[usize; 4], ModelError> {
    let key = k.key("rope.dimension_sections");
    let value = k.get("rope.dimension_sections");
    let show = || value.map_or(String::new(), |v| v.to_string());
    let s: Option<Vec<u64>> = match value {
        Some(Value::Array(a)) if a.len() >= 4 => {
            (0..4).map(|i| a.get(i).and_then(|v| v.as_u64())).collect()
        }
        _ => None,
    };
    let s = match s {
        Some(s) => s,
        None => {
            return Err(ModelError::Hparams(format!(
                "`{key}` must hold 4 section sizes"
            )))
        }
    };
    let max = i32::MAX as u64;
    let sum = s.iter().try_fold(0u64, |a, &v| a.checked_add(v));
    if s.iter().any(|&v| v > max) || sum.is_none_or(|sum| sum > max) {
        return Err(bad(
            &key,
            show(),
            format!("the sections and their sum must be at most {max}"),
        ));
    }
    if s[..3].iter().all(|&v| v == 0) {
        return Err(bad(&key, show(), "there is no t, h or w section"));
    }
    Ok([s[0], s[1], s[2], s[3]].map(|v| v as usize))
}

/// The delta net's shape, its products checked, against the first recurrent layer's
/// convolution.
fn delta_net_shape(file: &GgufFile, k: &Keys, n_layer: usize) -> Result<DeltaNetShape, ModelError> {
    let dn = DeltaNetShape {
        n_k_heads: k.usize("ssm.group_count")?,
        n_v_heads: k.usize("ssm.time_step_rank")?,
        head_dim: k.usize("ssm.state_size")?,
        d_conv: k.usize("ssm.conv_kernel")?,
    };
    let d_inner = k.usize("ssm.inner_size")?;
    if dn.head_dim == 0 || dn.head_dim > MAX_DELTA_NET_HEAD {
        return Err(bad(
            &k.key("ssm.state_size"),
            dn.head_dim,
            format!("delta-net heads of 1 to {MAX_DELTA_NET_HEAD} are supported"),
        ));
    }
    let Some(conv_dim) = dn.conv_dim_checked() else {
        return Err(bad(
            &k.key("ssm.time_step_rank"),
            dn.n_v_heads,
            format!(
                "{} key heads and {} value heads of {} overflow",
                dn.n_k_heads, dn.n_v_heads, dn.head_dim
            ),
        ));
    };
    if dn.n_k_heads == 0 || dn.n_v_heads % dn.n_k_heads != 0 || d_inner != dn.value_dim() {
        return Err(ModelError::Hparams(format!(
            "delta net of {} key heads, {} value heads of {} (inner size {d_inner}), {} taps",
            dn.n_k_heads, dn.n_v_heads, dn.head_dim, dn.d_conv
        )));
    }
    let taps_key = k.key("ssm.conv_kernel");
    if dn.d_conv < 2 {
        return Err(bad(&taps_key, dn.d_conv, "must be at least 2"));
    }
    if conv_dim.checked_mul(dn.d_conv).is_none() {
        return Err(bad(
            &taps_key,
            dn.d_conv,
            format!("{} taps over {conv_dim} channels overflow", dn.d_conv),
        ));
    }
    // The convolution's weights, `(conv_dim, d_conv)`, of the first recurrent layer.
    if let Some((name, shape)) = (0..n_layer).find_map(|i| {
        let name = format!("blk.{i}.ssm_conv1d.weight");
        Some((name.clone(), file.tensor(&name).ok()?.info.shape.clone()))
    }) {
        if shape.first() != Some(&(dn.d_conv as u64)) {
            return Err(bad(
                &taps_key,
                dn.d_conv,
                format!("tensor `{name}` has shape {shape:?}"),
            ));
        }
    }
    Ok(dn)
}

/// Which of Qwen 3.5's layers are recurrent: `attention.recurrent_layers` (one flag per layer),
/// or every layer but each `full_attention_interval`-th (4 when absent).
fn recurrent_layers(k: &Keys, n_layer: usize) -> Result<Vec<bool>, ModelError> {
    let key = k.key("attention.recurrent_layers");
    if let Some(flags) = k.bools("attention.recurrent_layers") {
        return match flags {
            Some(f) if f.len() >= n_layer => Ok(f[..n_layer].to_vec()),
            _ => Err(ModelError::Hparams(format!(
                "`{key}` must hold {n_layer} bools"
            ))),
        };
    }
    let interval = k.usize_or("full_attention_interval", 4)?;
    if interval == 0 {
        return Err(bad(
            &k.key("full_attention_interval"),
            0,
            "must be at least 1",
        ));
    }
    Ok((0..n_layer).map(|i| (i + 1) % interval != 0).collect())
}

/// Llama 3's per-frequency RoPE factors (`rope_freqs.weight`, `n` of them) where the file has
/// them, each finite and above 0 (they divide the angles).
pub(crate) fn rope_factors(file: &GgufFile, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
    factors(file, "rope_freqs.weight", n)
}

/// The RoPE frequency factors of tensor `name` (`n` of them), checked, if the file has it.
pub(crate) fn factors(
    file: &GgufFile,
    name: &str,
    n: usize,
) -> Result<Option<Vec<f32>>, ModelError> {
    let factors = super::common::optional_vector(file, name, n)?;
    if let Some((i, f)) = factors
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, f)| !(f.is_finite() && **f > 0.0))
    {
        return Err(ModelError::Hparams(format!(
            "tensor `{name}` holds {f} at {i}: RoPE frequency factors must be finite and above 0"
        )));
    }
    Ok(factors)
}

//! Running models: the tokenizer, the architectures, the forward pass with its KV cache, the
//! sampler and the chat template.
//!
//! It reads weights from a [`synapse_gguf::GgufFile`] in place and does its arithmetic through
//! `synapse-quant`; it knows nothing of the command line or of HTTP.

pub mod attention;
pub mod chat;
pub mod delta_net;
pub mod generate;
mod kl_base;
pub mod kl_divergence;
pub mod kv;
pub mod matmul;
pub mod membw;
pub mod model;
pub mod ops;
pub mod perplexity;
pub mod pool;
pub mod profile;
pub mod quantize;
pub mod sampler;
pub mod speculate;
pub mod tokenizer;

pub use matmul::Threads;
pub use model::{
    load, shared_prefix, supported_architectures, Batch, Checkpoint, Logits, Model, ModelInfo, Seq,
    State,
};

/// Dumps named intermediates (`attn_norm-3`, `l_out-3`, ...) per position as raw f32 files into
/// the directory [`set_dump_dir`] names (the binary's `SYNAPSE_DUMP_DIR`), with llama.cpp's
/// graph names, so that a layer's activations can be diffed against the reference
/// (`scripts/golden/llama_golden.c dump`). Off, it costs one branch per layer.
#[derive(Debug, Clone, Default)]
pub struct Tap(Option<std::path::PathBuf>);

static DUMP_DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();

/// Have the models loaded from now on dump their intermediates into `dir` (see [`Tap`]). For
/// debugging; once a process.
pub fn set_dump_dir(dir: std::path::PathBuf) {
    let _ = DUMP_DIR.set(Some(dir));
}

impl Tap {
    /// The tap of a model being loaded: on where [`set_dump_dir`] named a directory.
    pub fn configured() -> Tap {
        Tap(DUMP_DIR.get().cloned().flatten())
    }

    /// Write each of the `n` rows of `x` as `{name}-{layer}.{pos}.f32`, positions from `pos0`.
    pub fn rows(&self, name: &str, layer: usize, pos0: usize, x: &[f32], n: usize) {
        let Some(dir) = &self.0 else { return };
        for (t, row) in x.chunks(x.len() / n.max(1)).enumerate() {
            let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
            let path = dir.join(format!("{name}-{layer}.{}.f32", pos0 + t));
            if let Err(e) = std::fs::write(&path, bytes) {
                eprintln!("synapse: dump: {}: {e}", path.display());
            }
        }
    }
}

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] synapse_gguf::GgufError),
    #[error("architecture `{arch}` is not supported (supported: {supported})")]
    UnsupportedArchitecture { arch: String, supported: String },
    #[error("tensor `{tensor}` is missing")]
    MissingTensor { tensor: String },
    #[error(
        "tensor `{tensor}`{more} is not supported by synapse's `{arch}`: it would be left \
         unread, and llama.cpp either uses such a tensor or refuses the file"
    )]
    UnreadTensor {
        tensor: String,
        arch: String,
        /// " (and N more)" where there are.
        more: String,
    },
    #[error("tensor `{tensor}` has shape {shape:?}, expected {expected}")]
    Shape {
        tensor: String,
        shape: Vec<u64>,
        expected: String,
    },
    #[error("tensor `{tensor}`: {source}")]
    Tensor {
        tensor: String,
        #[source]
        source: synapse_quant::QuantError,
    },
    #[error("bad hyperparameters: {0}")]
    Hparams(String),
    /// A hyperparameter out of range, or at odds with the tensors or the other keys.
    #[error("bad hyperparameter `{key}` = {value}: {why}")]
    BadHparam {
        key: String,
        value: String,
        why: String,
    },
    /// A [`State`] passed to the forward pass of a model other than the one that made it.
    #[error(
        "this state was made for another model: a state belongs to the model whose \
         `new_state` made it"
    )]
    ForeignState,
    /// A state whose buffers would not fit in memory (or overflow the sizes they are counted
    /// in).
    #[error("a state for {n_ctx} positions in batches of {n_batch}: {why}")]
    StateSize {
        n_ctx: usize,
        n_batch: usize,
        why: String,
    },
    #[error(
        "the context is full: {pos} tokens in it and {n} more do not fit in {n_ctx} \
         (use a larger context, -c, or a shorter prompt)"
    )]
    ContextFull { pos: usize, n: usize, n_ctx: usize },
    #[error("{n} tokens in one batch, but the state was made for batches of {n_batch}")]
    BatchTooLarge { n: usize, n_batch: usize },
    #[error("token id {id} is out of range (vocabulary of {n_vocab})")]
    BadToken { id: u32, n_vocab: usize },
    #[error("logits buffer holds {have} values, {need} needed")]
    LogitsBuffer { have: usize, need: usize },
    #[error("the last token's logits were asked of a batch of no tokens")]
    NoTokens,
    #[error("the prompt is empty: there is nothing to generate from")]
    EmptyPrompt,
    /// A checkpoint given to [`Model::take_back`] that was not taken of the state before the
    /// tokens fed since.
    #[error("the checkpoint is not of this state before the tokens fed since")]
    StaleCheckpoint,
    /// A draft model for speculative decoding whose vocabulary is not the target's.
    #[error("the draft model's vocabulary is not the target's: {0}")]
    DraftVocabulary(String),
    /// A joint pass over states that rotate by different RoPEs: LongRoPE's factors are each
    /// state's, chosen by its context.
    #[error(
        "states of {a} and {b} positions cannot share a pass: LongRoPE rotates contexts above \
         {n_ctx_orig} positions by other factors"
    )]
    MixedRopes {
        a: usize,
        b: usize,
        n_ctx_orig: usize,
    },
    /// A failure of, or a refusal by, the backend running the model (the GPU's).
    #[error("{0}")]
    Backend(String),
}

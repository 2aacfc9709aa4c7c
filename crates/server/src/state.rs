//! What the HTTP handlers and the engine thread share: the server's settings and, once the
//! model is loaded, what the handlers need of it.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use synapse_engine::chat::ChatTemplate;
use synapse_engine::tokenizer::Tokenizer;

use crate::metrics::Metrics;
use crate::scheduler::Queue;

/// The server's settings (the binary reads them from its flags).
#[derive(Debug, Clone)]
pub struct Config {
    pub model: PathBuf,
    pub host: String,
    /// 0: any free port (the address is printed, and given to `on_listen`).
    pub port: u16,
    /// Sequences served at once.
    pub slots: usize,
    /// Context of each slot; `None`: the model's training context, at most 4096.
    pub n_ctx: Option<usize>,
    pub threads: usize,
    /// Tokens per batched step, all sequences together.
    pub step_tokens: usize,
    /// Prompt lookup's guesses a decode pass at most (0: off); the output is the same.
    pub lookup: usize,
    /// Required as `Authorization: Bearer KEY` on the API's routes, when set.
    pub api_key: Option<String>,
    /// Requests waiting for a slot before new ones are refused (503).
    pub max_queue: usize,
    /// Largest request body, in bytes (413 past it).
    pub max_body: usize,
}

/// What the handlers need once the model is loaded.
pub(crate) struct Ready {
    pub tok: Arc<Tokenizer>,
    /// The chat template, or why the model has none that works.
    pub template: Result<ChatTemplate, String>,
    pub queue: Queue,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub model_id: String,
    pub created: u64,
}

/// The state the handlers share.
pub(crate) struct App {
    pub cfg: Config,
    pub ready: OnceLock<Ready>,
    /// Why the model could not be loaded, once that is known.
    pub failed: OnceLock<String>,
    pub metrics: Arc<Metrics>,
}

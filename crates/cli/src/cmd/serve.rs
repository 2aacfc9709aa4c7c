//! `synapse serve`: the OpenAI-compatible server (crates/server), configured from flags.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use super::common::ModelArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// GGUF model file [default: models/SmolLM2-135M-Instruct.Q4_1.gguf].
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences served at once (`-np` as llama-server spells it), each with its own context
    /// of -c tokens.
    #[arg(long = "parallel", default_value_t = 4)]
    pub slots: usize,
    /// Context of each sequence [default: the model's training context, at most 4096].
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    /// Threads for the matrix products, by default one per physical core (results do not
    /// depend on it).
    #[arg(short = 't', long = "threads", default_value_t = synapse_engine::pool::default_threads())]
    pub threads: usize,
    /// Tokens per batched step, all sequences together: decode tokens, then chunks of prompts
    /// (results do not depend on it).
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    pub batch: usize,
    /// Guess up to N tokens a decode pass from each sequence's text so far (prompt lookup); the
    /// answers are the same, bit for bit (0: off).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lookup: usize,
    /// Require `Authorization: Bearer KEY` on the API's routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests waiting for a slot before new ones get 503.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Largest request body in bytes (413 past it).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body: usize,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    // The same checks and default model as the other commands.
    let m = ModelArgs {
        model: args.model.clone(),
        threads: args.threads,
        batch: args.batch,
        ctx: args.ctx,
        device: Default::default(),
    };
    let model = m.path()?;
    m.threads()?;
    let step_tokens = m.batch()?;
    let n_ctx = args.ctx.map(|_| m.ctx_or(0)).transpose()?;
    if args.slots == 0 || args.slots > 1024 {
        bail!("-np {}: between 1 and 1024 sequences", args.slots);
    }
    super::speculate::check_guesses("--lookup", args.lookup)?;
    if args.max_queue == 0 {
        bail!("--max-queue 0: no request could ever wait");
    }
    // A client that goes away mid-answer is an error on its socket, not a signal that ends
    // the server (the other commands die quietly on a closed pipe).
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition before the server's threads exist.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let cfg = synapse_server::Config {
        model,
        host: args.host.clone(),
        port: args.port,
        slots: args.slots,
        n_ctx,
        threads: args.threads,
        step_tokens,
        lookup: args.lookup,
        api_key: args.api_key.clone(),
        max_queue: args.max_queue,
        max_body: args.max_body,
    };
    synapse_server::run(cfg, |addr| {
        eprintln!("synapse serve: listening on http://{addr}");
    })
}

//! `synapse perplexity`: a model's perplexity over a text, as llama-perplexity computes and
//! prints it (the running value after each window, then the estimate and its uncertainty).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use synapse_engine::perplexity::{perplexity, PerplexityConfig};

use super::common::{self, ModelArgs};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Windows to score at most [default: all the text holds].
    #[arg(long)]
    pub chunks: Option<usize>,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let n_batch = args.model.batch()?;
    // llama-perplexity's window unless asked (its -c default).
    let n_ctx = args.model.ctx_or(512)?;
    let text = common::read_text(&args.file)?;
    let file = common::open_model(&path)?;
    let model = synapse_engine::load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    // As llama-perplexity tokenizes: the vocabulary's BOS, special-token texts as text.
    let tokens = tok.tokenize(&text, true, false);
    let bos = tok.bos().filter(|_| tok.add_bos_token());
    let cfg = PerplexityConfig {
        n_ctx,
        n_batch,
        chunks: args.chunks,
    };
    eprintln!(
        "perplexity: {} tokens, windows of {n_ctx}, the second half of each scored",
        tokens.len()
    );
    let mut out = std::io::stdout();
    let mut failed = None;
    let est = perplexity(model.as_ref(), &tokens, bos, &cfg, &threads, |i, ppl| {
        if failed.is_none() {
            failed = write!(out, "[{i}]{ppl:.4},")
                .and_then(|()| out.flush())
                .err();
        }
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    writeln!(out)?;
    writeln!(
        out,
        "Final estimate: PPL = {:.4} +/- {:.5}",
        est.ppl, est.uncertainty
    )?;
    Ok(())
}

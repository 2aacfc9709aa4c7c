//! `synapse run`: generate text from a prompt, streamed to stdout; speeds to stderr.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use synapse_engine::generate::Request;

use super::common::{self, n_predict, ModelArgs, SamplingArgs};
use super::speculate::{self, SpecArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most; -1: until an end-of-generation token or a full context.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Do not add the BOS token even if the model asks for one.
    #[arg(long)]
    pub no_bos: bool,
    /// Stop before this text (repeatable); it is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub fn run(args: &RunArgs) -> Result<()> {
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let batch = args.model.batch()?;
    let n_predict = n_predict(args.n_predict)?;
    let text = common::prompt_text(&args.prompt, &args.file)?;
    let file = common::open_model(&path)?;
    let model = args.model.device.load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    let n_ctx = args.model.ctx(model.info().n_ctx_train)?;
    let sampling = args.sampling.config(n_ctx)?;

    let prompt = tok.encode(&text, tok.add_bos_token() && !args.no_bos, true);
    if prompt.is_empty() {
        bail!("the prompt is empty (no text and no BOS token)");
    }
    common::check_fits(prompt.len(), n_ctx)?;
    // Scratch for the batches this prompt needs, not for the largest -b allows.
    let batch = batch.min(prompt.len());
    let req = Request {
        prompt: &prompt,
        max_tokens: n_predict,
        stop: &args.stop,
        sampling,
    };
    let outcome = args
        .spec
        .generator(model.as_ref(), &tok, n_ctx, batch, |gen| {
            let mut out = std::io::stdout().lock();
            let mut g = gen.start(&req, &threads)?;
            while let Some(text) = g.next_piece()? {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            writeln!(out)?;
            Ok(g.finish())
        })?;
    let t = &outcome.timings;
    eprintln!(
        "prefill: {} tokens in {:.3} s, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | stop: {} | threads {}, batch {batch}",
        t.prompt_tokens,
        t.prefill.as_secs_f64(),
        t.prompt_tokens as f64 / t.prefill.as_secs_f64(),
        t.generated,
        (t.decode_steps + t.accepted).max(1) as f64 / t.decode.as_secs_f64(),
        outcome.stop,
        threads.n(),
    );
    if let Some(line) = speculate::summary(t) {
        eprintln!("{line}");
    }
    Ok(())
}

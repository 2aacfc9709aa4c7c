//! `synapse run`: generate text from a prompt, streamed to stdout; speeds to stderr.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use synapse_engine::generate::{Generator, Request};
use synapse_engine::sampler::SamplerConfig;

use super::common::{self, ModelArgs};

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
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 (or less) is greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep the K most likely tokens (0 or less: all).
    #[arg(long, default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i64,
    /// Nucleus sampling threshold (1: off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the most likely one's probability (0: off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty on recently seen tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty considers (0: off, -1: the whole context).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub repeat_last_n: i64,
    /// RNG seed [default, or -1: random, printed to stderr].
    #[arg(short = 's', long, allow_negative_numbers = true)]
    pub seed: Option<i64>,
}

/// `-n`: a count of tokens, or -1 for no limit but the context.
pub fn n_predict(n: i64) -> Result<usize> {
    match n {
        -1 => Ok(usize::MAX),
        n if n >= 0 => Ok(n as usize),
        n => bail!("-n {n}: give a number of tokens, or -1 for until the end of the text"),
    }
}

impl SamplingArgs {
    /// The sampler's settings, every value checked: finite, in its documented range.
    pub fn config(&self, n_ctx: usize) -> Result<SamplerConfig> {
        if !self.temp.is_finite() {
            bail!(
                "--temp {}: the temperature must be a finite number",
                self.temp
            );
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            bail!("--top-p {}: must be between 0 and 1", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("--min-p {}: must be between 0 and 1", self.min_p);
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            bail!(
                "--repeat-penalty {}: must be a positive finite number (1: off)",
                self.repeat_penalty
            );
        }
        let repeat_last_n = match self.repeat_last_n {
            -1 => n_ctx,
            n if n >= 0 => (n as u64).min(n_ctx as u64) as usize,
            n => bail!(
                "--repeat-last-n {n}: give a number of tokens, 0 for off or -1 for the context"
            ),
        };
        let seed = match self.seed {
            Some(s) if s >= 0 => s as u64,
            Some(-1) | None => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let s = t.as_nanos() as u64 ^ (std::process::id() as u64) << 32;
                if self.temp > 0.0 {
                    eprintln!("seed: {s}");
                }
                s
            }
            Some(s) => bail!("--seed {s}: give a non-negative seed, or -1 for a random one"),
        };
        Ok(SamplerConfig {
            temp: self.temp,
            top_k: self.top_k.max(0).try_into().unwrap_or(usize::MAX),
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n,
            seed,
        })
    }
}

pub fn run(args: &RunArgs) -> Result<()> {
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let batch = args.model.batch()?;
    let n_predict = n_predict(args.n_predict)?;
    let text = common::prompt_text(&args.prompt, &args.file)?;
    let file = common::open_model(&path)?;
    let model = synapse_engine::load(&file)?;
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
    let mut gen = Generator::new(model.as_ref(), &tok, n_ctx, batch)?;
    let req = Request {
        prompt: &prompt,
        max_tokens: n_predict,
        stop: &args.stop,
        sampling,
    };
    let mut out = std::io::stdout().lock();
    let mut g = gen.start(&req, &threads)?;
    while let Some(text) = g.next_piece()? {
        out.write_all(text.as_bytes())?;
        out.flush()?;
    }
    let outcome = g.finish();
    writeln!(out)?;
    let t = &outcome.timings;
    eprintln!(
        "prefill: {} tokens in {:.3} s, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | stop: {} | threads {}, batch {batch}",
        t.prompt_tokens,
        t.prefill.as_secs_f64(),
        t.prompt_tokens as f64 / t.prefill.as_secs_f64(),
        t.generated,
        t.decode_steps.max(1) as f64 / t.decode.as_secs_f64(),
        outcome.stop,
        threads.n(),
    );
    Ok(())
}

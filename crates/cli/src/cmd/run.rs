//! `synapse run`: generate text from a prompt, streamed to stdout; speeds to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use synapse_engine::sampler::{Sampler, SamplerConfig};
use synapse_engine::tokenizer::StreamDecoder;
use synapse_engine::Logits;

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
    /// Tokens to generate at most (generation also stops at an end-of-generation token).
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Do not add the BOS token even if the model asks for one.
    #[arg(long)]
    pub no_bos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the most likely one's probability (0: off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty on recently seen tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty considers.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed [default: random, printed to stderr].
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn config(&self) -> Result<SamplerConfig> {
        if !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            bail!("--top-p and --min-p must be between 0 and 1");
        }
        if !self.temp.is_finite() || self.repeat_penalty <= 0.0 {
            bail!("--temp must be finite and --repeat-penalty positive");
        }
        let seed = self.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let s = t.as_nanos() as u64 ^ (std::process::id() as u64) << 32;
            if self.temp > 0.0 {
                eprintln!("seed: {s}");
            }
            s
        });
        Ok(SamplerConfig {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        })
    }
}

pub fn run(args: &RunArgs) -> Result<()> {
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let batch = args.model.batch()?;
    let text = common::prompt_text(&args.prompt, &args.file)?;
    let sampler_cfg = args.sampling.config()?;
    let file = common::open_model(&path)?;
    let model = synapse_engine::load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    let info = model.info();
    let n_ctx = args.model.ctx(info.n_ctx_train)?;

    let prompt = tok.encode(&text, tok.add_bos_token() && !args.no_bos, true);
    if prompt.is_empty() {
        bail!("the prompt is empty (no text and no BOS token)");
    }
    let mut state = model.new_state(n_ctx, batch)?;
    let mut sampler = Sampler::new(sampler_cfg, info.n_vocab);
    prompt.iter().for_each(|&t| sampler.accept(t));

    let t0 = Instant::now();
    let mut logits = model.prefill(&mut state, &prompt, batch, Logits::Last, &threads)?;
    let t_prefill = t0.elapsed();

    let mut out = std::io::stdout().lock();
    let mut stream = StreamDecoder::new(&tok);
    let t1 = Instant::now();
    let mut generated = 0usize;
    let mut stop = "length";
    for _ in 0..args.n_predict {
        let next = sampler.sample(&logits);
        if tok.is_eog(next) {
            stop = "end of generation";
            break;
        }
        out.write_all(stream.push(next).as_bytes())?;
        out.flush()?;
        sampler.accept(next);
        generated += 1;
        if state.pos >= state.n_ctx() {
            stop = "context full";
            break;
        }
        model.forward(&mut state, &[next], Logits::Last, &mut logits, &threads)?;
    }
    out.write_all(stream.finish().as_bytes())?;
    writeln!(out)?;
    let t_decode = t1.elapsed();
    // The last sampled token is not fed back, so `generated` tokens took `generated - 1` steps.
    let steps = generated.saturating_sub(1).max(1);
    eprintln!(
        "prefill: {} tokens in {:.3} s, {:.1} tok/s | decode: {generated} tokens, {:.1} tok/s | stop: {stop} | threads {}, batch {batch}",
        prompt.len(),
        t_prefill.as_secs_f64(),
        prompt.len() as f64 / t_prefill.as_secs_f64(),
        steps as f64 / t_decode.as_secs_f64(),
        threads.n(),
    );
    Ok(())
}

//! `--lookup` and `--draft` on `run` and `chat`: speculative decoding, checked here once.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use synapse_engine::generate::{Generator, Timings};
use synapse_engine::speculate::{DraftModel, Lookup, Speculation};
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::Model;

use super::common;

/// Speculative decoding: several tokens checked in one pass of the model. The output is the
/// same, bit for bit; only the speed changes.
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Guess up to N tokens a pass from the text so far (prompt lookup: pays where the
    /// output repeats the prompt: code edits, quotes, JSON); 0: off.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lookup: usize,
    /// Guess with this smaller model (its vocabulary must be the model's).
    #[arg(long, value_name = "MODEL")]
    pub draft: Option<PathBuf>,
    /// Tokens the draft model guesses a pass at most.
    #[arg(long, value_name = "K", default_value_t = 8)]
    pub draft_max: usize,
}

/// The most guesses a pass: beyond this a pass costs more than its guesses can save.
const MAX_GUESSES: usize = 64;

/// `flag`'s count of guesses a pass, checked against `MAX_GUESSES`.
pub fn check_guesses(flag: &str, n: usize) -> Result<()> {
    if n > MAX_GUESSES {
        bail!("{flag} {n}: at most {MAX_GUESSES} guesses a pass");
    }
    Ok(())
}

impl SpecArgs {
    /// A generator over `target` (see [`Generator::new`]) speculating as asked, handed to
    /// `f`: the draft model, if any, lives as long.
    pub fn generator<R>(
        &self,
        target: &dyn Model,
        tok: &Tokenizer,
        n_ctx: usize,
        n_batch: usize,
        f: impl FnOnce(&mut Generator<'_>) -> Result<R>,
    ) -> Result<R> {
        check_guesses("--lookup", self.lookup)?;
        check_guesses("--draft-max", self.draft_max)?;
        let Some(path) = &self.draft else {
            let mut gen = Generator::new(target, tok, n_ctx, n_batch)?;
            if self.lookup > 0 {
                gen.speculate(Some(Speculation::lookup(Lookup::default(), self.lookup)))?;
            }
            return f(&mut gen);
        };
        if self.lookup > 0 {
            bail!("--lookup and --draft: choose one source of guesses");
        }
        if self.draft_max == 0 {
            bail!("--draft-max 0: the draft model must guess at least one token a pass");
        }
        let file = common::open_model(path)?;
        let model = synapse_engine::load(&file).with_context(|| path.display().to_string())?;
        let dtok = common::tokenizer(&file, path)?;
        let draft = DraftModel::new(model.as_ref(), &dtok, target, tok, n_ctx, n_batch)
            .with_context(|| format!("--draft {}", path.display()))?;
        let mut gen = Generator::new(target, tok, n_ctx, n_batch)?;
        gen.speculate(Some(Speculation::draft_model(draft, self.draft_max)))?;
        f(&mut gen)
    }
}

/// The speculation line `run` prints with its timings.
pub fn summary(t: &Timings) -> Option<String> {
    (t.drafted > 0).then(|| {
        format!(
            "speculation: {} guessed, {} accepted ({:.0}%), {:.2} tokens a pass",
            t.drafted,
            t.accepted,
            100.0 * t.accepted as f64 / t.drafted as f64,
            (t.decode_steps + t.accepted) as f64 / t.decode_steps.max(1) as f64
        )
    })
}

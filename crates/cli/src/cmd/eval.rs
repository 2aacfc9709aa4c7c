//! `synapse eval`: run a prompt and write the logits of every position, for comparing engines.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use synapse_engine::Logits;

use super::common::{self, ModelArgs};
use super::output::OutputFile;

#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the text from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Take token ids (whitespace-separated) from a file instead of tokenizing text.
    #[arg(long, conflicts_with_all = ["prompt", "file"])]
    pub ids: Option<PathBuf>,
    /// Do not add the BOS token even if the model asks for one.
    #[arg(long)]
    pub no_bos: bool,
    /// Where to write the logits: n_tokens x n_vocab little-endian f32 (`-`: standard output,
    /// and the token ids to standard error). Written whole or not at all.
    #[arg(long)]
    pub logits: PathBuf,
}

pub fn run(args: &EvalArgs) -> Result<()> {
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let batch = args.model.batch()?;
    let file = common::open_model(&path)?;
    let model = args.model.device.load(&file)?;
    let n_vocab = model.info().n_vocab;
    let tokens: Vec<u32> = match &args.ids {
        Some(p) => {
            let text = common::read_text(p)?;
            text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
                .filter(|s| !s.is_empty())
                .map(|s| match s.parse::<u32>() {
                    Ok(id) if (id as usize) < n_vocab => Ok(id),
                    Ok(id) => bail!(
                        "{}: token id {id} is out of range (vocabulary of {n_vocab})",
                        p.display()
                    ),
                    Err(_) => bail!("{}: `{s}` is not a token id", p.display()),
                })
                .collect::<Result<_>>()?
        }
        None => {
            let text = common::prompt_text(&args.prompt, &args.file)?;
            let tok = common::tokenizer(&file, &path)?;
            tok.encode(&text, tok.add_bos_token() && !args.no_bos, true)
        }
    };
    if tokens.is_empty() {
        bail!("nothing to evaluate: no tokens");
    }
    // By default, a context of exactly the tokens evaluated.
    let n_ctx = args.model.ctx_or(tokens.len())?;
    common::check_fits(tokens.len(), n_ctx)?;
    // Every input is checked: only now is the output opened (the target is replaced only
    // once every row is written).
    let batch = batch.min(tokens.len());
    let mut state = model.new_state(n_ctx, batch)?;
    let mut out = OutputFile::create(&args.logits)?;
    let mut logits = vec![0.0f32; batch * n_vocab];
    let mut bytes = Vec::with_capacity(batch * n_vocab * 4);
    for chunk in tokens.chunks(batch) {
        let rows = chunk.len() * n_vocab;
        model.forward(
            &mut state,
            chunk,
            Logits::All,
            &mut logits[..rows],
            &threads,
        )?;
        bytes.clear();
        bytes.extend(logits[..rows].iter().flat_map(|v| v.to_le_bytes()));
        out.write_all(&bytes)
            .with_context(|| args.logits.display().to_string())?;
    }
    let to_stdout = out.is_stdout();
    out.commit()?;
    let summary = serde_json::json!({ "tokens": tokens, "n_vocab": n_vocab });
    if to_stdout {
        eprintln!("{summary}");
    } else {
        writeln!(std::io::stdout(), "{summary}")?;
    }
    Ok(())
}

//! `synapse tokenize`: the token ids of a text, as a JSON array.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::common;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// GGUF model file whose vocabulary to use [default: the fetched SmolLM2].
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Do not add the BOS token even if the model asks for one.
    #[arg(long)]
    pub no_bos: bool,
    /// Treat special-token text such as `<|im_start|>` as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
}

pub fn run(args: &TokenizeArgs) -> Result<()> {
    let path = common::ModelArgs {
        model: args.model.clone(),
        threads: 1,
        batch: 1,
        ctx: None,
        device: Default::default(),
    }
    .path()?;
    let text = common::prompt_text(&args.prompt, &args.file)?;
    let file = common::open(&path)?;
    let tok = common::tokenizer(&file, &path)?;
    let ids = tok.encode(
        &text,
        tok.add_bos_token() && !args.no_bos,
        !args.no_parse_special,
    );
    writeln!(std::io::stdout(), "{}", serde_json::to_string(&ids)?)?;
    Ok(())
}

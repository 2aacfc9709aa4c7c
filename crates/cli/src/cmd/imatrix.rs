//! `synapse imatrix -m MODEL -f TEXT -o OUT`: the importance matrix of a model over a text
//! (the mean square of each column of each product's input), in the GGUF format llama-imatrix
//! writes and `synapse quantize --imatrix` / `llama-quantize --imatrix` read, with the same
//! sums bit for bit.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use synapse_engine::quantize::collect::{collect_over, Chunking, Collector};
use synapse_engine::quantize::imatrix::to_gguf;

use super::common;

#[derive(Args, Debug)]
pub struct ImatrixArgs {
    /// GGUF model file [default: models/SmolLM2-135M-Instruct.Q4_1.gguf].
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// The calibration text.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// The importance matrix to write.
    #[arg(short = 'o', long = "output", default_value = "imatrix.gguf")]
    pub output: PathBuf,
    /// Tokens a chunk, each evaluated from an empty context (llama-imatrix's -c).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Tokens a decode call: whole chunks side by side (llama-imatrix's -b).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch: usize,
    /// Tokens a forward pass (llama-imatrix's -ub).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch: usize,
    /// Chunks to evaluate at most [default: all the text holds].
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Also collect the output projection's input.
    #[arg(long)]
    pub process_output: bool,
    /// Threads (the sums do not depend on it).
    #[arg(short = 't', long = "threads", default_value_t = synapse_engine::pool::default_threads())]
    pub threads: usize,
}

pub fn run(args: &ImatrixArgs) -> Result<()> {
    let margs = common::ModelArgs {
        model: args.model.clone(),
        threads: args.threads,
        batch: args.ubatch,
        ctx: Some(args.ctx),
        device: Default::default(),
    };
    let path = margs.path()?;
    let threads = margs.threads()?;
    margs.ctx_or(512)?;
    if args.ubatch == 0 || args.ubatch > 65536 {
        bail!("--ubatch-size {}: between 1 and 65536", args.ubatch);
    }
    let text = common::read_text(&args.file)?;
    let file = common::open_model(&path)?;
    let model = synapse_engine::load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    // As llama-imatrix tokenizes: the vocabulary's BOS, special-token texts as text.
    let tokens = tok.tokenize(&text, true, false);
    let chunking = Chunking {
        n_ctx: args.ctx,
        n_batch: args.batch,
        n_ubatch: args.ubatch,
        max_chunks: args.chunks,
        bos: tok.bos().filter(|_| tok.add_bos_token()),
    };
    eprintln!(
        "imatrix: {} tokens, chunks of {}, {} threads",
        tokens.len(),
        args.ctx,
        threads.n()
    );
    let start = Instant::now();
    let collector = Collector {
        process_output: args.process_output,
        ..Collector::default()
    };
    let (collected, chunks) = collect_over(
        model.as_ref(),
        &tokens,
        &chunking,
        collector,
        &threads,
        &mut |done, total| eprint!("\rimatrix: chunk {done}/{total}"),
    )?;
    eprintln!();
    // The dataset is recorded as given, as llama-imatrix records it.
    let datasets = [args.file.display().to_string()];
    let w = to_gguf(&collected.stats, &datasets, args.ctx)?;
    w.write_file(&args.output)
        .with_context(|| args.output.display().to_string())?;
    eprintln!(
        "imatrix: wrote {} ({} matrices, {chunks} chunks) in {:.1} s",
        args.output.display(),
        collected.stats.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

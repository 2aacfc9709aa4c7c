//! `synapse`: run, inspect and convert GGUF models.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use synapse_cli::cmd;

#[derive(Parser)]
#[command(
    name = "synapse",
    version,
    about = "LLM inference for GGUF models, bit-reproducible"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF file's metadata and a table of its tensors.
    Info {
        /// The GGUF file.
        model: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// With --json, include the full contents of arrays (the tokenizer's vocabulary, say)
        /// rather than their type and length.
        #[arg(long, requires = "json")]
        json_array: bool,
        /// List the kernels each weight matrix runs on this CPU (with SYNAPSE_ISA's cap and
        /// SYNAPSE_PACK applied), and why.
        #[arg(long, conflicts_with = "json")]
        kernels: bool,
    },
    /// Generate text from a prompt (streamed to stdout; speeds on stderr).
    Run(cmd::run::RunArgs),
    /// Serve the model over HTTP: OpenAI's chat and completions API with continuous batching,
    /// a chat page at /, and the same bits for a request whatever else is served.
    Serve(cmd::serve::ServeArgs),
    /// Talk to the model through its chat template.
    Chat(cmd::chat::ChatArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// Write the logits of every position of a prompt (n_tokens x n_vocab f32) for comparisons.
    Eval(cmd::eval::EvalArgs),
    /// Perplexity over a text, as llama-perplexity computes and prints it.
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Prompt-processing and generation speed (llama-bench's tests and fields), with the
    /// achieved weight bandwidth against this machine's measured read bandwidth.
    Bench(cmd::bench::BenchArgs),
    /// Quantize a model to one of llama-quantize's mixes (Q4_K_M, Q8_0, ...), byte for byte
    /// the file llama-quantize writes.
    Quantize(cmd::quantize::QuantizeArgs),
    /// The importance matrix of a model over a text, as llama-imatrix computes and writes it
    /// (for `quantize --imatrix`).
    Imatrix(cmd::imatrix::ImatrixArgs),
    /// Write a copy of a GGUF file with every tensor decoded to F32 (metadata kept).
    Dequantize {
        /// The GGUF file to read.
        input: PathBuf,
        /// The GGUF file to write.
        output: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    synapse_cli::start();
    // llama-server's `-np N` for `serve`, whose arguments hold no free text (clap's short
    // flags are one letter).
    let serve = std::env::args_os().nth(1).is_some_and(|a| a == "serve");
    let args = std::env::args_os().map(|a| {
        if serve && a == "-np" {
            "--parallel".into()
        } else {
            a
        }
    });
    let cli = Cli::parse_from(args);
    let gpu = match &cli.command {
        Command::Run(a) => a.model.device.gpu(),
        Command::Chat(a) => a.model.device.gpu(),
        Command::Eval(a) => a.model.device.gpu(),
        Command::Bench(a) => a.device.gpu(),
        _ => false,
    };
    synapse_cli::configure(gpu);
    synapse_cli::exit_code(run(cli))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Info {
            model,
            json,
            json_array,
            kernels,
        } => cmd::info::run(&model, json, json_array, kernels),
        Command::Dequantize { input, output } => cmd::dequantize::run(&input, &output),
        Command::Run(args) => cmd::run::run(&args),
        Command::Chat(args) => cmd::chat::run(&args),
        Command::Serve(args) => cmd::serve::run(&args),
        Command::Tokenize(args) => cmd::tokenize::run(&args),
        Command::Eval(args) => cmd::eval::run(&args),
        Command::Perplexity(args) => cmd::perplexity::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Quantize(args) => cmd::quantize::run(&args),
        Command::Imatrix(args) => cmd::imatrix::run(&args),
    }
}

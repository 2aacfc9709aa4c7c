//! `synapse`: run, inspect and convert GGUF models.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

mod cmd;

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
    /// Write a random-weight GGUF with the shapes of a named model (for speed comparisons).
    Synth(cmd::synth::SynthArgs),
    /// Time the matrix-vector kernels of every format against the measured read bandwidth.
    BenchKernels(cmd::bench_kernels::BenchKernelsArgs),
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
    quiet_on_closed_pipe();
    configure_from_env();
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
    match run(Cli::parse_from(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A closed pipe (`synapse info x.gguf | head`) is the reader saying it has enough.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Errors quote the file's strings (keys, names): no terminal escapes from them.
            eprintln!("error: {}", cmd::common::printable(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The environment variables synapse reads (README, "Environment"), handed to the libraries
/// as values before anything is loaded: the kernel tier cap and the kernels' forms
/// (`SYNAPSE_ISA`, `SYNAPSE_PACK`, `SYNAPSE_PAIRED`, `SYNAPSE_PREFETCH`), how the bandwidth
/// probe reads (`SYNAPSE_MEMBW_STREAMS`, `SYNAPSE_MEMBW_NO_HUGEPAGES`), and where models dump
/// their intermediates (`SYNAPSE_DUMP_DIR`). None changes a bit of any output.
fn configure_from_env() {
    let var = |k: &str| std::env::var(k).ok();
    let (kernels, notes) = synapse_quant::KernelConfig::from_vars(var);
    for n in notes {
        eprintln!("synapse: {n}");
    }
    // Nothing has chosen a kernel yet: this cannot be refused.
    let _ = synapse_quant::configure(kernels);
    let one_stream = match var("SYNAPSE_MEMBW_STREAMS") {
        None => false,
        Some(v) if v.trim() == "1" => true,
        Some(v) if v.trim() == "4" => false,
        Some(v) => {
            eprintln!("synapse: SYNAPSE_MEMBW_STREAMS={v:?} is not 1 or 4; four streams");
            false
        }
    };
    let probe = synapse_engine::membw::ProbeOptions {
        one_stream,
        huge_pages: var("SYNAPSE_MEMBW_NO_HUGEPAGES").is_none(),
    };
    let _ = synapse_engine::membw::configure(probe);
    if let Some(dir) = std::env::var_os("SYNAPSE_DUMP_DIR") {
        synapse_engine::set_dump_dir(dir.into());
    }
}

/// A write to a pipe whose reader has gone (`synapse tokenize ... | head`) ends the process
/// quietly, as it ends `cat`: Rust ignores SIGPIPE, so every `print!` would panic instead, and
/// every other write would have to recognise the error. Outputs are renamed into place only
/// once complete, so dying here loses nothing.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
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
        Command::Synth(args) => cmd::synth::run(&args),
        Command::Quantize(args) => cmd::quantize::run(&args),
        Command::Imatrix(args) => cmd::imatrix::run(&args),
        Command::BenchKernels(args) => cmd::bench_kernels::run(&args),
    }
}

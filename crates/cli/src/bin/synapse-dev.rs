//! `synapse-dev`: the developers' tools, apart from the `synapse` a user runs: random-weight
//! files with real models' shapes, and the matrix-vector kernels (CPU and GPU) timed against
//! the read bandwidth.

use anyhow::Result;
use clap::{Parser, Subcommand};
use synapse_cli::cmd;

#[derive(Parser)]
#[command(
    name = "synapse-dev",
    version,
    about = "synapse's developer tools: synthetic models and kernel benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a random-weight GGUF with the shapes of a named model (for speed comparisons).
    Synth(cmd::synth::SynthArgs),
    /// Time the matrix-vector kernels of every format against the measured read bandwidth.
    BenchKernels(cmd::bench_kernels::BenchKernelsArgs),
    /// Time the GPU's read bandwidth and every format's matrix-vector product on it.
    BenchGpu(cmd::bench_gpu::BenchGpuArgs),
}

fn main() -> std::process::ExitCode {
    synapse_cli::start();
    let cli = Cli::parse();
    synapse_cli::configure(matches!(&cli.command, Command::BenchGpu(a) if a.model.is_some()));
    synapse_cli::exit_code(run(cli))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Synth(args) => cmd::synth::run(&args),
        Command::BenchKernels(args) => cmd::bench_kernels::run(&args),
        Command::BenchGpu(args) => cmd::bench_gpu::run(&args),
    }
}

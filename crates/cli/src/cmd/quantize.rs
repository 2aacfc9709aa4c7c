//! `synapse quantize IN OUT TYPE`: llama-quantize's mixes, written byte for byte as it writes
//! them (the decisions in `synapse_engine::quantize::rules`, the encoders in
//! `synapse_quant::encode`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use synapse_engine::quantize::file::{quantize_file, Request, Written};
use synapse_engine::quantize::imatrix::Imatrix;
use synapse_engine::quantize::rules::{Mix, Options, TensorTypeOverride};
use synapse_gguf::GgmlType;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The model to read: F32, F16 or BF16 (or quantized, with --allow-requantize).
    pub input: PathBuf,
    /// The file to write (replaced only once complete).
    pub output: PathBuf,
    /// The mix, as llama-quantize names it: Q4_K_M, Q5_K_S, Q6_K, Q8_0, Q4_0, IQ4_XS, F16, ...
    /// (or its number).
    #[arg(value_name = "TYPE")]
    pub mix: String,
    /// Threads (the output does not depend on it).
    #[arg(short = 't', long = "threads", default_value_t = synapse_engine::pool::default_threads())]
    pub threads: usize,
    /// Importance matrix (llama-imatrix's GGUF or legacy .dat, or `synapse imatrix`'s).
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// Convert tensors that are already quantized (their errors add up).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Every matrix in the mix's type: none of the mix's per-tensor rules.
    #[arg(long)]
    pub pure: bool,
    /// Copy output.weight unchanged.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// The type of output.weight.
    #[arg(long, value_name = "TYPE")]
    pub output_tensor_type: Option<String>,
    /// The type of token_embd.weight.
    #[arg(long, value_name = "TYPE")]
    pub token_embedding_type: Option<String>,
    /// NAME=TYPE: tensors whose name contains NAME get TYPE (the first match wins; `.`, `^`
    /// and `$` as in a regular expression).
    #[arg(long = "tensor-type", value_name = "NAME=TYPE")]
    pub tensor_types: Vec<String>,
    /// Print each tensor's decision.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

/// A tensor type named as llama-quantize takes it (`q6_k`, `Q8_0`, `f16`).
fn tensor_type(arg: &str, flag: &str) -> Result<GgmlType> {
    GgmlType::from_name(arg)
        .with_context(|| format!("{flag} {arg}: not a ggml type (Q4_K, Q6_K, Q8_0, F16, ...)"))
}

pub fn run(args: &QuantizeArgs) -> Result<()> {
    let mix = Mix::parse(&args.mix)?;
    if args.threads == 0 || args.threads > 1024 {
        bail!(
            "-t {}: the thread count must be between 1 and 1024",
            args.threads
        );
    }
    let mut options = Options {
        pure: args.pure,
        leave_output_tensor: args.leave_output_tensor,
        allow_requantize: args.allow_requantize,
        ..Options::default()
    };
    if let Some(t) = &args.output_tensor_type {
        options.output_tensor_type = Some(tensor_type(t, "--output-tensor-type")?);
    }
    if let Some(t) = &args.token_embedding_type {
        options.token_embedding_type = Some(tensor_type(t, "--token-embedding-type")?);
    }
    for o in &args.tensor_types {
        let (name, ty) = o
            .split_once('=')
            .with_context(|| format!("--tensor-type {o}: expected NAME=TYPE"))?;
        options.tensor_types.push(TensorTypeOverride {
            // llama-quantize lower-cases the pattern.
            pattern: name.to_ascii_lowercase(),
            ty: tensor_type(ty, "--tensor-type")?,
        });
    }
    let imatrix = match &args.imatrix {
        Some(p) => Some(Imatrix::load(p)?),
        None => None,
    };
    let file = super::common::open(&args.input)?;
    let request = Request {
        mix,
        options,
        imatrix: imatrix
            .as_ref()
            .zip(args.imatrix.as_ref())
            .map(|(m, p)| (m, p.display().to_string())),
        threads: args.threads,
    };

    let total: u64 = file.tensors().map(|t| t.data.len() as u64).sum();
    // A bar on a terminal; none in a log.
    let on_terminal = std::io::stderr().is_terminal();
    let bar = if on_terminal {
        ProgressBar::new(total).with_style(
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
                .expect("a valid template"),
        )
    } else {
        ProgressBar::hidden()
    };
    let start = Instant::now();
    let mut report = |w: &Written| {
        bar.inc(w.bytes_in);
        bar.set_message(w.name.to_string());
        if args.verbose {
            let c = &w.choice;
            let what = if !c.converts() {
                "copied".to_string()
            } else if let Some(f) = c.fallback_from {
                format!("{} (for {f}: rows of {} values)", c.to, w.shape[0])
            } else {
                c.to.to_string()
            };
            let line = format!(
                "[{:4}/{:4}] {:36} {:>5} {:?} -> {what}",
                w.index,
                w.total,
                w.name,
                c.from.to_string(),
                w.shape
            );
            if on_terminal {
                bar.println(line);
            } else {
                eprintln!("{line}");
            }
        }
    };
    let summary = quantize_file(&file, &args.output, &request, &mut report)
        .with_context(|| format!("quantize {} to {mix}", args.input.display()))?;
    bar.finish_and_clear();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let values: u64 = file
        .tensor_infos()
        .iter()
        .map(|t| t.shape.iter().product::<u64>())
        .sum();
    eprintln!(
        "wrote {} ({mix}): {} tensors, {} converted{}; {:.2} MiB -> {:.2} MiB ({:.2} bits per weight) in {:.1} s",
        args.output.display(),
        summary.tensors,
        summary.converted,
        if summary.fallbacks > 0 {
            format!(", {} in a fallback type for their row length", summary.fallbacks)
        } else {
            String::new()
        },
        mib(summary.bytes_in),
        mib(summary.bytes_out),
        summary.bytes_out as f64 * 8.0 / values.max(1) as f64,
        start.elapsed().as_secs_f64()
    );
    if summary.without_importance > 0 {
        eprintln!(
            "note: the importance matrix had no entry for {} converted tensors; they were quantized without one",
            summary.without_importance
        );
    }
    Ok(())
}

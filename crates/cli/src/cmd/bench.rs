//! `synapse bench`: prompt-processing and generation speed, as `llama-bench` measures it, with
//! the achieved weight bandwidth against this machine's measured read bandwidth.
//!
//! Tests follow llama-bench's: `ppN` feeds N pseudo-random tokens from an empty cache in batches
//! of `-b` (logits of the last one only); `tgN` decodes N tokens one at a time from an empty
//! cache, each step computing the logits of the token it fed. Every test runs once untimed
//! (warm-up), then `-r` times; rates are the mean and sample standard deviation of the
//! per-repetition rates (tokens / seconds), times of the per-repetition wall times, as in
//! llama-bench's `avg_ts`, `stddev_ts`, `avg_ns`, `stddev_ns`.
//!
//! Weight bandwidth (tg only): the bytes of weights one decode step reads (every matrix once;
//! of the token embedding one row, unless it is also the output projection; of a mixture's
//! stacked experts the share a token is routed to) times the steps per second. KV-cache and activation traffic are not counted, so at long contexts the true traffic
//! is higher. The ceiling is `synapse_engine::membw`'s probe at the same thread count.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{ArgAction, Args, ValueEnum};
use serde::Serialize;
use synapse_engine::{membw, profile, Logits, Threads};
use synapse_gguf::GgufFile;

use super::common;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// GGUF model file(s); repeat -m for several.
    #[arg(short = 'm', long = "model")]
    pub models: Vec<PathBuf>,
    /// Prompt lengths to test (comma list or ranges like 32-128*2, repeatable; 0 skips the pp test).
    #[arg(short = 'p', long = "n-prompt", action = ArgAction::Append, default_value = "64")]
    pub n_prompt: Vec<String>,
    /// Tokens to generate (comma list, repeatable; 0 skips the tg test).
    #[arg(short = 'n', long = "n-gen", action = ArgAction::Append, default_value = "32")]
    pub n_gen: Vec<String>,
    /// Depths: tokens already in the context when a test starts (comma list, repeatable): the
    /// test then runs at positions depth.., after an untimed prefill of that many tokens, as
    /// llama-bench's -d.
    #[arg(short = 'd', long = "n-depth", action = ArgAction::Append, default_value = "0")]
    pub n_depth: Vec<String>,
    /// Thread counts (comma list or range like 1-4, repeatable) [default: 1 up to one per
    /// physical core].
    #[arg(short = 't', long = "threads", action = ArgAction::Append)]
    pub threads: Vec<String>,
    /// Batch sizes for prompt processing (comma list, repeatable).
    #[arg(short = 'b', long = "batch-size", action = ArgAction::Append, default_value = "64")]
    pub batch: Vec<String>,
    /// Timed repetitions of each test (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub reps: usize,
    /// Output format on stdout (progress goes to stderr).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Md)]
    pub output: Output,
    /// Print only the read-bandwidth probe for each thread count of -t.
    #[arg(long)]
    pub membw: bool,
    /// Buffer of the read-bandwidth probe, MiB (must dwarf the last-level cache).
    #[arg(long, default_value_t = membw::DEFAULT_BYTES >> 20)]
    pub membw_mib: usize,
    /// Skip the bandwidth probe (no peak fraction is reported).
    #[arg(long, conflicts_with = "membw")]
    pub no_membw: bool,
    #[command(flatten)]
    pub device: common::DeviceArgs,
    /// Say nothing on stderr.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// For developers: compare variants A and B of the code (`synapse_quant::ab`) inside one
    /// process, alternating prefill by prefill (pp: 2 x max(-r, 8) runs) or token by token (tg),
    /// and print each half's median time and their ratio instead of the usual table. `--ab 0,0`
    /// measures how far this machine's noise moves that ratio.
    #[arg(long, value_name = "A,B", value_parser = parse_ab, conflicts_with = "membw")]
    pub ab: Option<(usize, usize)>,
    /// tg tests against the bandwidth of the same moment: a pass of the probe over a quarter of
    /// its buffer before every timed token and after the last, and each token's weight
    /// bandwidth over the mean of the two passes around it (on a shared host the probe moves
    /// by a quarter from minute to minute). Prints, per test, medians over the tokens of every
    /// repetition instead of the usual table; pp tests are skipped.
    #[arg(long, conflicts_with_all = ["membw", "ab"])]
    pub probe_each_token: bool,
    /// With --probe-each-token: the passes read the model's own weights (a quarter of them a
    /// pass, in turn) instead of the probe's buffer: the bandwidth of the very pages decode
    /// streams.
    #[arg(long, requires = "probe_each_token")]
    pub probe_weights: bool,
    /// After the table, where each test's timed runs spent their time: the forward pass's
    /// parts (norms, each product, attention, ...) by wall time per token, with the weight
    /// bandwidth and multiply-adds a second of each product (on stderr with -o json or csv).
    #[arg(long, conflicts_with_all = ["membw", "ab", "probe_each_token"])]
    pub profile: bool,
}

/// Slices of the probe's buffer that `--probe-each-token` passes over in turn.
const PROBE_PARTS: usize = 4;

/// `"A,B"`: two variant numbers.
fn parse_ab(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not two variant numbers \"A,B\"");
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    Ok((
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    ))
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Md,
    Json,
    Csv,
}

/// The largest thread count accepted: four per available CPU (more only measures the
/// scheduler), at least 4.
fn max_threads() -> usize {
    4 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Parse a llama-bench style list: `1,2,8`, ranges `1-4`, stepped `8-64+8`, multiplied `16-256*2`.
pub fn parse_list(flag: &str, s: &str) -> Result<Vec<usize>> {
    let num = |x: &str| -> Result<usize> {
        x.trim()
            .parse::<usize>()
            .with_context(|| format!("{flag} {s}: `{x}` is not a non-negative integer"))
    };
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        if item.is_empty() {
            bail!("{flag} {s}: empty item in the list");
        }
        match item.split_once('-') {
            None => out.push(num(item)?),
            Some((a, rest)) => {
                let (b, step, mul) = if let Some((b, k)) = rest.split_once('+') {
                    (b, num(k)?, false)
                } else if let Some((b, k)) = rest.split_once('*') {
                    (b, num(k)?, true)
                } else {
                    (rest, 1, false)
                };
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    bail!("{flag} {s}: range {item} runs backwards");
                }
                if (mul && (step < 2 || a == 0)) || (!mul && step == 0) {
                    bail!("{flag} {s}: range {item} never advances");
                }
                let mut v = a;
                while v <= b {
                    out.push(v);
                    if out.len() > 4096 {
                        bail!("{flag} {s}: more than 4096 values");
                    }
                    v = if mul { v * step } else { v + step };
                }
            }
        }
    }
    Ok(out)
}

/// Every occurrence of a repeatable list flag (`-t 1 -t 2` is `-t 1,2`), in order.
fn parse_lists(flag: &str, items: &[String]) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for s in items {
        out.extend(parse_list(flag, s)?);
    }
    Ok(out)
}

/// What the command checks before touching any model.
struct Plan {
    n_prompt: Vec<usize>,
    n_gen: Vec<usize>,
    n_depth: Vec<usize>,
    threads: Vec<usize>,
    batch: Vec<usize>,
}

fn plan(args: &BenchArgs) -> Result<Plan> {
    let threads = if args.threads.is_empty() {
        (1..=synapse_engine::pool::default_threads()).collect()
    } else {
        parse_lists("-t", &args.threads)?
    };
    let max = max_threads();
    if let Some(&t) = threads.iter().find(|&&t| t == 0 || t > max) {
        bail!("-t {t}: thread counts must be between 1 and {max} (four per CPU on this machine)");
    }
    let batch = parse_lists("-b", &args.batch)?;
    if let Some(&b) = batch.iter().find(|&&b| b == 0 || b > 65536) {
        bail!("-b {b}: batch sizes must be between 1 and 65536");
    }
    let n_prompt = parse_lists("-p", &args.n_prompt)?;
    let n_gen = parse_lists("-n", &args.n_gen)?;
    let n_depth = parse_lists("-d", &args.n_depth)?;
    if n_prompt
        .iter()
        .chain(&n_gen)
        .chain(&n_depth)
        .any(|&n| n > 1 << 20)
    {
        bail!("-p/-n/-d: at most {} tokens per test", 1 << 20);
    }
    if !args.membw && n_prompt.iter().chain(&n_gen).all(|&n| n == 0) {
        bail!(
            "-p 0 -n 0: nothing to measure (give a prompt length or a generation length above 0)"
        );
    }
    if args.reps == 0 || args.reps > 1000 {
        bail!("-r {}: repetitions must be between 1 and 1000", args.reps);
    }
    if args.membw_mib == 0 {
        bail!("--membw-mib 0: the probe needs a buffer");
    }
    Ok(Plan {
        n_prompt,
        n_gen,
        n_depth,
        threads,
        batch,
    })
}

/// One test's result, with llama-bench's field names (and ours after them).
#[derive(Serialize, Debug, Clone)]
pub struct Row {
    pub build_commit: String,
    pub build_number: u32,
    pub cpu_info: String,
    pub gpu_info: String,
    pub backends: String,
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub n_threads: usize,
    pub type_k: String,
    pub type_v: String,
    pub n_gpu_layers: u32,
    pub use_mmap: bool,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    pub test_time: String,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    /// Ours: the engine, the kernel path (ISA) the weights run on.
    pub engine: String,
    pub kernel_isa: String,
    /// Ours: bytes of weights one decode step reads.
    pub weight_bytes_per_token: u64,
    /// Ours (tg only; 0 for pp): achieved weight bandwidth, GB/s (1e9 bytes/s).
    pub weight_gbs: f64,
    /// Ours: the read-bandwidth probe at this thread count, GB/s (0 when skipped).
    pub peak_gbs: f64,
    /// Ours: weight_gbs / peak_gbs (0 when unknown).
    pub peak_fraction: f64,
}

/// The kernel path the weights run on (see `synapse_quant::kernel_isa`).
pub fn kernel_isa() -> &'static str {
    synapse_quant::kernel_isa()
}

/// The CPU's model name (lscpu's), or the architecture.
pub fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// What a model file is, for the table.
struct ModelFacts {
    filename: String,
    desc: String,
    size: u64,
    n_params: u64,
    bytes_per_token: u64,
}

/// llama.cpp's `general.file_type` names (`llama_ftype`), for the model description.
fn ftype_name(ft: u64) -> Option<&'static str> {
    Some(match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        21 => "Q2_K - Small",
        25 => "IQ4_NL - 4.5 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        32 => "BF16",
        38 => "MXFP4 MoE",
        _ => return None,
    })
}

fn facts(file: &GgufFile, path: &Path) -> ModelFacts {
    let md = file.metadata();
    let arch = md.str("general.architecture").unwrap_or("?");
    let size: u64 = file.tensor_infos().iter().map(|t| t.size).sum();
    let n_params: u64 = file.tensor_infos().iter().map(|t| t.n_elements()).sum();
    let tied = file.tensor("output.weight").is_err();
    // A mixture's token reads the experts it is routed to: `used` of `n` of each stack.
    let count = |k: &str| md.u64(&format!("{arch}.{k}")).ok().filter(|&n| n > 0);
    let (used, n_expert) = match (count("expert_used_count"), count("expert_count")) {
        (Some(u), Some(n)) => (u.min(n), n),
        _ => (1, 1),
    };
    let bytes_per_token = file
        .tensor_infos()
        .iter()
        .map(|t| {
            if t.name == "token_embd.weight" && !tied {
                t.size / t.n_rows().max(1) // one row looked up
            } else if t.name.ends_with("_exps.weight") {
                t.size / n_expert * used
            } else {
                t.size
            }
        })
        .sum();
    let label = if n_params >= 1_000_000_000 {
        format!("{:.1}B", n_params as f64 / 1e9)
    } else {
        format!("{}M", (n_params as f64 / 1e6).round())
    };
    let ft = md
        .u64("general.file_type")
        .ok()
        .and_then(ftype_name)
        .unwrap_or("?");
    ModelFacts {
        filename: path.display().to_string(),
        desc: format!("{arch} {label} {ft}"),
        size,
        n_params,
        bytes_per_token,
    }
}

/// Deterministic pseudo-random token ids below `n_vocab` (xorshift), as llama-bench feeds.
fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab as u64) as u32
        })
        .collect()
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, sd)
}

fn test_time() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Civil date from days since 1970 (Howard Hinnant's algorithm).
    let days = (secs / 86400) as i64;
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let t = secs % 86400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let plan = plan(args)?;
    let say = |s: String| {
        if !args.quiet {
            eprintln!("{s}");
        }
    };
    // `--probe-each-token` probes between the tokens instead.
    // The CPU's bandwidth says nothing of a GPU's.
    let peaks: Vec<membw::Bandwidth> =
        if args.no_membw || args.probe_each_token || args.device.gpu() {
            Vec::new()
        } else {
            say(format!(
                "bench: read-bandwidth probe ({}, {} MiB buffer, best of 5) for {:?} threads",
                membw::isa(),
                args.membw_mib,
                plan.threads
            ));
            membw::probe(&plan.threads, args.membw_mib << 20, 5)
        };
    if args.membw {
        return print_membw(&peaks, args);
    }
    if args.models.is_empty() {
        bail!("no model: give -m FILE (or --membw for the bandwidth probe alone)");
    }
    let peak_at = |t: usize| peaks.iter().find(|b| b.threads == t).map_or(0.0, |b| b.gbs);

    let probe_buf = (args.probe_each_token && !args.probe_weights)
        .then(|| membw::ProbeBuffer::new(args.membw_mib << 20));
    let mut rows = Vec::new();
    let mut ab_lines = Vec::new();
    let mut paired_lines = Vec::new();
    let mut profiles = Vec::new();
    for path in &args.models {
        if !path.is_file() {
            bail!("{}: no such model file", path.display());
        }
        let file = common::open_model(path)?;
        let (model, gpu) = args
            .device
            .load_on(&file)
            .with_context(|| path.display().to_string())?;
        // llama-bench's columns for where the model ran: the GPU's name and API, all layers
        // on it, its kernels WGSL; else the CPU's kernels.
        let (gpu_info, backends, n_gpu_layers, isa) = match &gpu {
            Some(g) => (
                g.name.clone(),
                g.backend.clone(),
                u32::try_from(model.info().n_layer).unwrap_or(u32::MAX),
                "wgsl",
            ),
            None => (String::new(), "CPU".to_string(), 0, kernel_isa()),
        };
        let facts = facts(&file, path);
        let n_vocab = model.info().n_vocab;
        let max_p = plan.n_prompt.iter().copied().max().unwrap_or(0);
        let max_n = plan.n_gen.iter().copied().max().unwrap_or(0);
        let max_d = plan.n_depth.iter().copied().max().unwrap_or(0);
        let n_ctx = (max_d + max_p.max(max_n)).max(1);
        for &t in &plan.threads {
            let threads = Threads::new(t);
            for &b in &plan.batch {
                let mut state = model.new_state(n_ctx, b)?;
                let mut logits = vec![0.0f32; n_vocab];
                let mut tests: Vec<(usize, usize, usize)> = Vec::new();
                for &d in &plan.n_depth {
                    tests.extend(plan.n_prompt.iter().filter(|&&p| p > 0).map(|&p| (p, 0, d)));
                    tests.extend(plan.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n, d)));
                }
                for (p, n, d) in tests {
                    let mut name = if p > 0 {
                        format!("pp{p}")
                    } else {
                        format!("tg{n}")
                    };
                    if d > 0 {
                        name += &format!(" @ d{d}");
                    }
                    let toks = tokens(p.max(n), n_vocab, 0x5EED ^ (p as u64) << 20 ^ n as u64);
                    let depth = tokens(d, n_vocab, 0xDE97 ^ d as u64);
                    let run = TestRun {
                        model: &*model,
                        threads: &threads,
                        batch: b,
                        depth: &depth,
                        toks: &toks,
                        prefill: p > 0,
                    };
                    if let Some(ab) = args.ab {
                        let halves = run.measure_ab(&mut state, &mut logits, ab, args.reps)?;
                        ab_lines.push(format!(
                            "| {} | {name} | {t} | {:.3} | {:.3} | {:.3} |",
                            facts.filename,
                            halves[0] * 1e3,
                            halves[1] * 1e3,
                            halves[1] / halves[0]
                        ));
                        continue;
                    }
                    if args.probe_each_token {
                        if n == 0 {
                            continue;
                        }
                        let weights = match probe_buf {
                            Some(_) => Vec::new(),
                            None => model.weight_memory(),
                        };
                        let probe = |part: usize| match &probe_buf {
                            Some(buf) => membw::read_part(buf, &threads, part, PROBE_PARTS),
                            None => membw::read_slices_part(&weights, &threads, part, PROBE_PARTS),
                        };
                        say(format!(
                            "bench: {} {name} t={t}: tokens between probe passes",
                            facts.filename
                        ));
                        let [mut probes, mut decode, mut fractions] = run.measure_paired(
                            &mut state,
                            &mut logits,
                            (&probe, facts.bytes_per_token),
                            args.reps,
                        )?;
                        let [p25, med, p75] = quartiles(&mut fractions);
                        paired_lines.push(format!(
                            "| {} | {name} | {t} | {} | {:.1} | {:.1} | {:.1}% | {:.1}-{:.1}% |",
                            facts.filename,
                            decode.len(),
                            quartiles(&mut probes)[1],
                            quartiles(&mut decode)[1],
                            100.0 * med,
                            100.0 * p25,
                            100.0 * p75
                        ));
                        continue;
                    }
                    let mut account: Vec<profile::Part> = Vec::new();
                    let mut one = |timed: bool| -> Result<u64> {
                        state.reset();
                        if d > 0 {
                            model.prefill(&mut state, &depth, b, Logits::Last, &threads)?;
                        }
                        let profiling = timed && args.profile;
                        if profiling {
                            profile::start();
                        }
                        let t0 = Instant::now();
                        if p > 0 {
                            model.prefill(&mut state, &toks, b, Logits::Last, &threads)?;
                        } else {
                            for &tok in &toks {
                                model.forward(
                                    &mut state,
                                    &[tok],
                                    Logits::Last,
                                    &mut logits,
                                    &threads,
                                )?;
                            }
                        }
                        let ns = t0.elapsed().as_nanos() as u64;
                        if profiling {
                            profile::merge(&mut account, profile::stop());
                        }
                        Ok(ns)
                    };
                    say(format!(
                        "bench: {} {name} t={t} b={b}: warm-up",
                        facts.filename
                    ));
                    one(false)?;
                    let mut samples_ns = Vec::with_capacity(args.reps);
                    for r in 0..args.reps {
                        let ns = one(true)?.max(1);
                        say(format!(
                            "bench: {} {name} t={t} b={b}: rep {}/{}: {:.2} tok/s",
                            facts.filename,
                            r + 1,
                            args.reps,
                            (p + n) as f64 * 1e9 / ns as f64
                        ));
                        samples_ns.push(ns);
                    }
                    let samples_ts: Vec<f64> = samples_ns
                        .iter()
                        .map(|&ns| (p + n) as f64 * 1e9 / ns as f64)
                        .collect();
                    let (avg_ns, sd_ns) =
                        mean_sd(&samples_ns.iter().map(|&x| x as f64).collect::<Vec<_>>());
                    let (avg_ts, sd_ts) = mean_sd(&samples_ts);
                    let weight_gbs = if n > 0 {
                        facts.bytes_per_token as f64 * avg_ts / 1e9
                    } else {
                        0.0
                    };
                    if args.profile {
                        let per_token = (args.reps * (p + n)) as f64;
                        profiles.push((
                            format!("{} {name} t={t}", facts.filename),
                            account,
                            per_token,
                        ));
                    }
                    let peak = peak_at(t);
                    rows.push(Row {
                        build_commit: env!("CARGO_PKG_VERSION").to_string(),
                        build_number: 0,
                        cpu_info: cpu_info(),
                        gpu_info: gpu_info.clone(),
                        backends: backends.clone(),
                        model_filename: facts.filename.clone(),
                        model_type: facts.desc.clone(),
                        model_size: facts.size,
                        model_n_params: facts.n_params,
                        n_batch: b,
                        n_ubatch: b,
                        n_threads: t,
                        type_k: "f16".into(),
                        type_v: "f16".into(),
                        n_gpu_layers,
                        use_mmap: true,
                        n_prompt: p,
                        n_gen: n,
                        n_depth: d,
                        test_time: test_time(),
                        avg_ns: avg_ns.round() as u64,
                        stddev_ns: sd_ns.round() as u64,
                        avg_ts,
                        stddev_ts: sd_ts,
                        samples_ns,
                        samples_ts,
                        engine: "synapse".into(),
                        kernel_isa: isa.into(),
                        weight_bytes_per_token: facts.bytes_per_token,
                        weight_gbs,
                        peak_gbs: peak,
                        peak_fraction: if peak > 0.0 && n > 0 {
                            weight_gbs / peak
                        } else {
                            0.0
                        },
                    });
                }
            }
        }
    }
    if let Some((a, b)) = args.ab {
        println!("| model | test | threads | variant {a}: median ms | variant {b}: median ms | {b} / {a} |");
        println!("|---|---|--:|--:|--:|--:|");
        for l in ab_lines {
            println!("{l}");
        }
        return Ok(());
    }
    if args.probe_each_token {
        println!(
            "Probe passes ({}) over {}.\n",
            membw::isa(),
            if args.probe_weights {
                "the model's weights, a quarter a pass".to_string()
            } else {
                format!(
                    "the probe's {} MiB buffer, a quarter a pass",
                    args.membw_mib
                )
            }
        );
        println!(
            "| model | test | threads | tokens | probe GB/s | decode GB/s | decode / probe around it | quartiles |"
        );
        println!("|---|---|--:|--:|--:|--:|--:|--:|");
        for l in paired_lines {
            println!("{l}");
        }
        return Ok(());
    }
    print_rows(&rows, &peaks, args)?;
    if !profiles.is_empty() {
        let text = profiles
            .iter()
            .map(|(test, parts, per_token)| profile_table(test, parts, *per_token))
            .collect::<Vec<_>>()
            .join("\n");
        match args.output {
            Output::Md => print!("\n{text}"),
            Output::Json | Output::Csv => eprint!("{text}"),
        }
    }
    Ok(())
}

/// A markdown table of where one test's timed runs spent their time: each part's calls, wall
/// time and share per token (`per_token`: the tokens of every timed run), and for products
/// the weight bandwidth and the multiply-adds a second while they ran.
fn profile_table(test: &str, parts: &[profile::Part], per_token: f64) -> String {
    let total: u64 = parts.iter().map(|p| p.nanos).sum();
    let products: u64 = parts
        .iter()
        .filter(|p| p.weight_bytes > 0)
        .map(|p| p.nanos)
        .sum();
    let mut s = format!(
        "Profile of {test}: {:.1} us a token, {:.1}% in products\n\n\
         | part | calls a token | us a token | share | weights GB/s | GMAC/s |\n\
         |---|--:|--:|--:|--:|--:|\n",
        total as f64 / per_token / 1e3,
        100.0 * products as f64 / total.max(1) as f64
    );
    for p in parts {
        let rate = |x: u64| match x {
            0 => String::new(),
            x => format!("{:.1}", x as f64 / p.nanos.max(1) as f64),
        };
        let (gbs, gmacs) = (rate(p.weight_bytes), rate(p.macs));
        s += &format!(
            "| {} | {:.2} | {:.1} | {:.1}% | {gbs} | {gmacs} |\n",
            p.name,
            p.calls as f64 / per_token,
            p.nanos as f64 / per_token / 1e3,
            100.0 * p.nanos as f64 / total.max(1) as f64
        );
    }
    s
}

/// The lower quartile, the median and the upper quartile of `v` (nearest rank: the smallest
/// value with at least that share of `v` at or below it; NaN when empty).
fn quartiles(v: &mut [f64]) -> [f64; 3] {
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    v.sort_by(f64::total_cmp);
    [1, 2, 3].map(|q| v[(q * v.len()).div_ceil(4) - 1])
}

/// One test of `--ab` or `--probe-each-token`: what it runs.
struct TestRun<'a> {
    model: &'a dyn synapse_engine::Model,
    threads: &'a Threads,
    batch: usize,
    depth: &'a [u32],
    toks: &'a [u32],
    prefill: bool,
}

impl TestRun<'_> {
    /// An empty cache, then the untimed prefill of the test's depth.
    fn start(&self, state: &mut synapse_engine::State) -> Result<()> {
        state.reset();
        if !self.depth.is_empty() {
            self.model
                .prefill(state, self.depth, self.batch, Logits::Last, self.threads)?;
        }
        Ok(())
    }

    /// The median time of variant `ab.0`'s and of `ab.1`'s halves, in seconds: whole prefills
    /// alternating (at least eight of each), or the tokens of each decode run alternating
    /// (`reps` runs; each half's time a run is the sum over its tokens, per token).
    fn measure_ab(
        &self,
        state: &mut synapse_engine::State,
        logits: &mut [f32],
        ab: (usize, usize),
        reps: usize,
    ) -> Result<[f64; 2]> {
        let variants = [ab.0, ab.1];
        let mut halves: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        if self.prefill {
            let runs = 2 * reps.max(8);
            for i in 0..=runs {
                // Half `h` runs variant `variants[h]` and keeps its own times.
                let h = i % 2;
                self.start(state)?;
                synapse_quant::ab::set_variant(variants[h]);
                let t = Instant::now();
                self.model
                    .prefill(state, self.toks, self.batch, Logits::Last, self.threads)?;
                // Run 0 is the warm-up.
                if i > 0 {
                    halves[h].push(t.elapsed().as_secs_f64());
                }
            }
        } else {
            for r in 0..=reps {
                self.start(state)?;
                let mut sums = [0.0f64; 2];
                for (i, &tok) in self.toks.iter().enumerate() {
                    let h = i % 2;
                    synapse_quant::ab::set_variant(variants[h]);
                    let t = Instant::now();
                    self.model
                        .forward(state, &[tok], Logits::Last, logits, self.threads)?;
                    sums[h] += t.elapsed().as_secs_f64();
                }
                if r > 0 {
                    let per = |h: usize| (self.toks.len() + 1 - h) / 2;
                    halves[0].push(sums[0] / per(0) as f64);
                    halves[1].push(sums[1] / per(1) as f64);
                }
            }
        }
        synapse_quant::ab::set_variant(0);
        Ok(halves.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        }))
    }

    /// `reps` decode runs of the tokens (after a warm-up run), a pass of the probe (`probe(k)`:
    /// the `k`-th pass's GB/s, each over the next slice of its memory) before every token and
    /// after the last: for every timed token, the probe before it, its weight bandwidth, and
    /// that over the mean of the passes around it.
    fn measure_paired(
        &self,
        state: &mut synapse_engine::State,
        logits: &mut [f32],
        (probe, bytes_per_token): (&dyn Fn(usize) -> f64, u64),
        reps: usize,
    ) -> Result<[Vec<f64>; 3]> {
        let mut part = 0;
        let mut pass = || {
            part += 1;
            probe(part)
        };
        let [mut probes, mut decode, mut fractions] = [Vec::new(), Vec::new(), Vec::new()];
        // Run 0 is the warm-up.
        for r in 0..=reps {
            self.start(state)?;
            let mut before = pass();
            for &tok in self.toks {
                let t0 = Instant::now();
                self.model
                    .forward(state, &[tok], Logits::Last, logits, self.threads)?;
                let gbs = bytes_per_token as f64 / t0.elapsed().as_secs_f64().max(1e-9) / 1e9;
                let after = pass();
                if r > 0 {
                    probes.push(before);
                    decode.push(gbs);
                    fractions.push(2.0 * gbs / (before + after));
                }
                before = after;
            }
        }
        Ok([probes, decode, fractions])
    }
}

fn size_str(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    }
}

fn print_membw(peaks: &[membw::Bandwidth], args: &BenchArgs) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Md => {
            writeln!(
                out,
                "read bandwidth ({}, {} MiB buffer, best of 5):",
                membw::isa(),
                args.membw_mib
            )?;
            writeln!(out, "| threads | GB/s |")?;
            writeln!(out, "|---|---|")?;
            for b in peaks {
                writeln!(out, "| {} | {:.1} |", b.threads, b.gbs)?;
            }
        }
        Output::Json => {
            let v: Vec<_> = peaks
                .iter()
                .map(|b| {
                    serde_json::json!({
                        "n_threads": b.threads, "gbs": b.gbs, "isa": membw::isa(),
                        "buffer_bytes": args.membw_mib << 20, "cpu_info": cpu_info(),
                    })
                })
                .collect();
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        }
        Output::Csv => {
            writeln!(out, "n_threads,gbs,isa")?;
            for b in peaks {
                writeln!(out, "{},{:.3},{}", b.threads, b.gbs, membw::isa())?;
            }
        }
    }
    Ok(())
}

fn print_rows(rows: &[Row], peaks: &[membw::Bandwidth], args: &BenchArgs) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(rows)?)?,
        Output::Csv => {
            let v = serde_json::to_value(rows)?;
            let Some(first) = v.as_array().and_then(|a| a.first()) else {
                return Ok(());
            };
            let keys: Vec<String> = first
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            writeln!(out, "{}", keys.join(","))?;
            for r in v.as_array().into_iter().flatten() {
                let cells: Vec<String> = keys
                    .iter()
                    .map(|k| match &r[k] {
                        serde_json::Value::String(s) => format!("\"{}\"", s.replace('"', "\"\"")),
                        serde_json::Value::Array(a) => format!(
                            "\"{}\"",
                            a.iter()
                                .map(|x| x.to_string())
                                .collect::<Vec<_>>()
                                .join(" ")
                        ),
                        x => x.to_string(),
                    })
                    .collect();
                writeln!(out, "{}", cells.join(","))?;
            }
        }
        Output::Md => {
            writeln!(
                out,
                "| model | size | params | backend | isa | threads | n_batch | test | t/s | weights GB/s | of peak |"
            )?;
            writeln!(out, "|---|--:|--:|---|---|--:|--:|--:|--:|--:|--:|")?;
            for r in rows {
                let mut test = if r.n_prompt > 0 {
                    format!("pp{}", r.n_prompt)
                } else {
                    format!("tg{}", r.n_gen)
                };
                if r.n_depth > 0 {
                    test += &format!(" @ d{}", r.n_depth);
                }
                let (gbs, frac) = if r.n_gen > 0 {
                    (
                        format!("{:.1}", r.weight_gbs),
                        if r.peak_gbs > 0.0 {
                            format!("{:.0}%", 100.0 * r.peak_fraction)
                        } else {
                            "-".into()
                        },
                    )
                } else {
                    ("-".into(), "-".into())
                };
                writeln!(
                    out,
                    "| {} | {} | {:.2} M | {} | {} | {} | {} | {} | {:.2} ± {:.2} | {} | {} |",
                    r.model_type,
                    size_str(r.model_size),
                    r.model_n_params as f64 / 1e6,
                    r.backends,
                    r.kernel_isa,
                    r.n_threads,
                    r.n_batch,
                    test,
                    r.avg_ts,
                    r.stddev_ts,
                    gbs,
                    frac
                )?;
            }
            if !peaks.is_empty() {
                let list: Vec<String> = peaks
                    .iter()
                    .map(|b| format!("{} thread(s) {:.1} GB/s", b.threads, b.gbs))
                    .collect();
                writeln!(
                    out,
                    "\npeak read bandwidth ({}): {}",
                    membw::isa(),
                    list.join(", ")
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_like_llama_bench() {
        assert_eq!(parse_list("-t", "1,2").unwrap(), [1, 2]);
        assert_eq!(parse_list("-t", "1-4").unwrap(), [1, 2, 3, 4]);
        assert_eq!(parse_list("-p", "8-32+8").unwrap(), [8, 16, 24, 32]);
        assert_eq!(parse_list("-p", "16-128*2").unwrap(), [16, 32, 64, 128]);
        for bad in ["", "1,,2", "a", "4-1", "1-8+0", "0-8*2", "-3", "1.5"] {
            assert!(parse_list("-t", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quartiles_by_nearest_rank() {
        assert_eq!(quartiles(&mut [3.0, 1.0, 2.0]), [1.0, 2.0, 3.0]);
        assert_eq!(quartiles(&mut [5.0, 1.0, 4.0, 2.0, 3.0]), [2.0, 3.0, 4.0]);
        assert_eq!(quartiles(&mut [7.0]), [7.0; 3]);
        assert!(quartiles(&mut []).iter().all(|q| q.is_nan()));
    }

    #[test]
    fn stddev_is_the_sample_one() {
        let (m, sd) = mean_sd(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert_eq!(sd, 1.0);
        assert_eq!(mean_sd(&[5.0]), (5.0, 0.0));
    }
}

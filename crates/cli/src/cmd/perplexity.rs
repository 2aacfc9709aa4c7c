//! `synapse perplexity`: a model's perplexity over a text, as llama-perplexity computes and
//! prints it (the running value after each window, then the estimate and its uncertainty); with
//! `--kl-divergence-base FILE` the run also saves a base of log-probabilities, and
//! `--kl-divergence` compares a model with such a base and prints llama-perplexity's table and
//! statistics (KL divergence, the ratio of perplexities, top-token agreement, `Δp`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use synapse_engine::kl_divergence::{
    covariance, kl_divergence, mean_and_uncertainty, median, percentile, KldReport, KldStats,
};
use synapse_engine::perplexity::{perplexity, PerplexityConfig};

use super::common::{self, ModelArgs};
use super::output::OutputFile;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text (not needed with `--kl-divergence`: the base holds its tokens).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Windows to score at most [default: all the text holds].
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Save the log-probabilities of this run (the base model's) to FILE, in llama-perplexity's
    /// format; with `--kl-divergence`, the base to compare with.
    #[arg(long, value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare this model with the base in `--kl-divergence-base`, over the base's windows.
    #[arg(long)]
    pub kl_divergence: bool,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    if args.kl_divergence {
        return compare(args);
    }
    let Some(text_path) = &args.file else {
        bail!("-f TEXT is needed (the text to score)");
    };
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let n_batch = args.model.batch()?;
    // llama-perplexity's window unless asked (its -c default).
    let n_ctx = args.model.ctx_or(512)?;
    let text = common::read_text(text_path)?;
    let file = common::open_model(&path)?;
    let model = synapse_engine::load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    // As llama-perplexity tokenizes: the vocabulary's BOS, special-token texts as text.
    let tokens = tok.tokenize(&text, true, false);
    let bos = tok.bos().filter(|_| tok.add_bos_token());
    // A core the pass leaves idle scores the last window while the next one runs.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cfg = PerplexityConfig {
        n_ctx,
        n_batch,
        chunks: args.chunks,
        score_aside: threads.n() < cores,
    };
    eprintln!(
        "perplexity: {} tokens, windows of {n_ctx}, the second half of each scored",
        tokens.len()
    );
    // The base goes to a file beside its target, renamed over it once complete.
    let mut base = match &args.kl_divergence_base {
        Some(p) => Some(OutputFile::create(p)?),
        None => None,
    };
    let mut out = std::io::stdout();
    let mut failed = None;
    let sink = base.as_mut().map(|b| b as &mut dyn Write);
    let est = perplexity(
        model.as_ref(),
        &tokens,
        bos,
        &cfg,
        &threads,
        |i, ppl| {
            if failed.is_none() {
                failed = write!(out, "[{i}]{ppl:.4},")
                    .and_then(|()| out.flush())
                    .err();
            }
        },
        sink,
    );
    let est = match (est, &args.kl_divergence_base) {
        (Err(e), Some(p)) => return Err(e).with_context(|| p.display().to_string()),
        (est, _) => est?,
    };
    if let Some(e) = failed {
        return Err(e.into());
    }
    if let Some(b) = base {
        b.commit()?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "Final estimate: PPL = {:.4} +/- {:.5}",
        est.ppl, est.uncertainty
    )?;
    Ok(())
}

/// `--kl-divergence`: the model against the base, as llama-perplexity prints it.
fn compare(args: &PerplexityArgs) -> Result<()> {
    let Some(base_path) = &args.kl_divergence_base else {
        bail!("--kl-divergence needs --kl-divergence-base FILE (a base saved by a run with it)");
    };
    if args.file.is_some() || args.chunks.is_some() {
        bail!("--kl-divergence takes the base's windows: no -f TEXT or --chunks");
    }
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let n_batch = args.model.batch()?;
    let file = common::open_model(&path)?;
    let model = synapse_engine::load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    let bos = tok.bos().filter(|_| tok.add_bos_token());
    let at = || base_path.display().to_string();
    let f = std::fs::File::open(base_path).with_context(at)?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, f);
    let mut out = std::io::stdout();
    let mut failed = None;
    let report = kl_divergence(
        model.as_ref(),
        &mut reader,
        bos,
        n_batch,
        &threads,
        |i, s| {
            if failed.is_none() {
                let head = if i == 1 { HEADER } else { "" };
                failed = write!(out, "{head}{}", chunk_line(i, s))
                    .and_then(|()| out.flush())
                    .err();
            }
        },
    )
    .with_context(at)?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    writeln!(out)?;
    // llama-perplexity prints no statistics of fewer positions.
    if report.stats.count >= 100 {
        write!(out, "{}", statistics(&report))?;
    }
    // And a blank line, as llama-perplexity ends every run.
    writeln!(out)?;
    Ok(())
}

const HEADER: &str = "\nchunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p\n";

/// The running line after window `i`.
fn chunk_line(i: usize, s: &KldStats) -> String {
    let n = s.count;
    let (lp, lp_unc) = mean_and_uncertainty(s.sum_nll, s.sum_nll2, n);
    let ppl = lp.exp();
    let (lb, lb_unc) = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, n);
    let cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, n);
    let ratio_unc = (lp_unc * lp_unc + lb_unc * lb_unc - 2.0 * cov).sqrt();
    let (kld, kld_unc) = mean_and_uncertainty(s.sum_kld, s.sum_kld2, n);
    let (mse, mse_unc) = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, n);
    let rms = mse.sqrt();
    let rms_unc = 0.5 / rms * mse_unc;
    let top = s.n_same_top as f64 / n as f64;
    let top_unc = (top * (1.0 - top) / (n - 1) as f64).sqrt();
    format!(
        "{i:4}    {ppl:9.4} ± {:9.4}    {:10.5} ± {ratio_unc:10.5}    {kld:10.5} ± {kld_unc:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %\n",
        ppl * lp_unc,
        lp - lb,
        100.0 * rms,
        100.0 * rms_unc,
        100.0 * top,
        100.0 * top_unc,
    )
}

/// The statistics after the last window.
fn statistics(r: &KldReport) -> String {
    let s = &r.stats;
    let n = s.count;
    let mut o = String::new();
    let mut line = |l: String| {
        o.push_str(&l);
        o.push('\n');
    };
    line("====== Perplexity statistics ======".into());
    let (lp, lp_unc) = mean_and_uncertainty(s.sum_nll, s.sum_nll2, n);
    let (ppl, ppl_unc) = (lp.exp(), lp.exp() * lp_unc);
    line(format!(
        "Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"
    ));
    let (lb, lb_unc) = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, n);
    let (pb, pb_unc) = (lb.exp(), lb.exp() * lb_unc);
    line(format!(
        "Mean PPL(base)                : {pb:10.6} ± {pb_unc:10.6}"
    ));
    let cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, n);
    let cor = cov / (lp_unc * lb_unc);
    line(format!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        100.0 * cor
    ));
    let ratio = lp - lb;
    let ratio_unc = (lp_unc * lp_unc + lb_unc * lb_unc - 2.0 * cov).sqrt();
    line(format!(
        "Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6} ± {ratio_unc:10.6}"
    ));
    let (q, q_unc) = (ratio.exp(), ratio.exp() * ratio_unc);
    line(format!(
        "Mean PPL(Q)/PPL(base)         : {q:10.6} ± {q_unc:10.6}"
    ));
    let ppl_cov = ppl * pb * cov;
    let diff_unc = (ppl_unc * ppl_unc + pb_unc * pb_unc - 2.0 * ppl_cov).sqrt();
    line(format!(
        "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
        ppl - pb
    ));
    line(String::new());
    line("====== KL divergence statistics ======".into());
    let (kld, kld_unc) = mean_and_uncertainty(s.sum_kld, s.sum_kld2, n);
    line(format!("Mean    KLD: {kld:10.6} ± {kld_unc:10.6}"));
    let k = &r.kld;
    line(format!("Maximum KLD: {:10.6}", k[k.len() - 1]));
    for (label, f) in [
        ("99.9%", 0.999f32),
        ("99.0%", 0.990),
        ("95.0%", 0.950),
        ("90.0%", 0.900),
    ] {
        line(format!("{label}   KLD: {:10.6}", percentile(k, f)));
    }
    line(format!("Median  KLD: {:10.6}", median(k)));
    for (label, f) in [
        ("10.0%", 0.100f32),
        (" 5.0%", 0.050),
        (" 1.0%", 0.010),
        (" 0.1%", 0.001),
    ] {
        line(format!("{label}   KLD: {:10.6}", percentile(k, f)));
    }
    line(format!("Minimum KLD: {:10.6}", k[0]));
    line(String::new());
    line("====== Token probability statistics ======".into());
    let (pd, pd_unc) = mean_and_uncertainty(s.sum_p_diff, s.sum_p_diff2, n);
    line(format!(
        "Mean    Δp: {:6.3} ± {:5.3} %",
        100.0 * pd,
        100.0 * pd_unc
    ));
    let d = &r.p_diff;
    let pct = |v: f32| 100.0 * v as f64;
    line(format!("Maximum Δp: {:6.3}%", pct(d[d.len() - 1])));
    for (label, f) in [
        ("99.9%", 0.999f32),
        ("99.0%", 0.990),
        ("95.0%", 0.950),
        ("90.0%", 0.900),
        ("75.0%", 0.750),
    ] {
        line(format!("{label}   Δp: {:6.3}%", pct(percentile(d, f))));
    }
    line(format!("Median  Δp: {:6.3}%", pct(median(d))));
    for (label, f) in [
        ("25.0%", 0.250f32),
        ("10.0%", 0.100),
        (" 5.0%", 0.050),
        (" 1.0%", 0.010),
        (" 0.1%", 0.001),
    ] {
        line(format!("{label}   Δp: {:6.3}%", pct(percentile(d, f))));
    }
    line(format!("Minimum Δp: {:6.3}%", pct(d[0])));
    let (mse, mse_unc) = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, n);
    let rms = mse.sqrt();
    line(format!(
        "RMS Δp    : {:6.3} ± {:5.3} %",
        100.0 * rms,
        100.0 * 0.5 / rms * mse_unc
    ));
    let top = s.n_same_top as f64 / n as f64;
    line(format!(
        "Same top p: {:6.3} ± {:5.3} %",
        100.0 * top,
        100.0 * (top * (1.0 - top) / (n - 1) as f64).sqrt()
    ));
    o
}

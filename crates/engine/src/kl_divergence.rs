//! KL divergence against a base model, as `llama-perplexity --kl-divergence-base FILE` saves the
//! base and `--kl-divergence` compares with it: the file format, the quantized log-probabilities
//! it holds, and the statistics, each computed with llama-perplexity's arithmetic (its f32 and
//! f64 steps, its sort, its percentiles), so that the printed digits are its digits.
//!
//! The file: `_logits_`, then `n_ctx`, `n_vocab` and `n_chunk` (32-bit, little-endian), the
//! windows' `n_chunk * n_ctx` token ids, then for each scored position of each window (the second
//! half but its last) a row of `nv = 2 * ((n_vocab + 1) / 2) + 4` u16: an f32 step and an f32
//! least log-probability, then every token's log-probability as a 16-bit step count above it
//! (those more than 16 below the best are 0).
//!
//! Nothing here holds a whole file: a base is written window by window, and read so.

use std::io::Read;

pub use crate::kl_base::{base_row, row_len, write_header, write_rows};
use crate::kl_base::{log_sum_exp, MAGIC};
use crate::matmul::Threads;
use crate::model::Model;
use crate::perplexity::{score_window, PerplexityError};

/// The running sums of a comparison (llama-perplexity's `kl_divergence_result`).
#[derive(Debug, Clone, Default)]
pub struct KldStats {
    pub sum_nll: f64,
    pub sum_nll2: f64,
    pub sum_nll_base: f64,
    pub sum_nll_base2: f64,
    pub sum_nll_nll_base: f64,
    pub sum_kld: f64,
    pub sum_kld2: f64,
    pub sum_p_diff: f64,
    pub sum_p_diff2: f64,
    pub sum_p_diff4: f64,
    pub max_p_diff: f32,
    pub n_same_top: usize,
    pub count: usize,
}

/// A mean and its uncertainty (one standard error) as llama-perplexity computes them.
pub fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// The covariance of two means, as llama-perplexity computes it.
pub fn covariance(sum_a: f64, sum_b: f64, sum_ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let c = count as f64;
    (sum_ab / c - (sum_a / c) * (sum_b / c)) / (c - 1.0)
}

impl KldStats {
    /// Add one position: this model's `logits`, the base's `row`, the text's next token `tok`;
    /// returns its KL divergence and its `p - p_base`.
    pub fn add(&mut self, logits: &[f32], row: &[u16], tok: u32) -> (f32, f32) {
        let mut max = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max {
                max = l;
                imax = i;
            }
        }
        let lse = log_sum_exp(logits, max);
        let f = |k: usize| f32::from_le_bytes(bytes2(row[2 * k], row[2 * k + 1]));
        let (scale, min_log_prob) = (f(0), f(1));
        let q = &row[4..];
        let t = tok as usize;
        let nll = max + lse - logits[t];
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        let nll_base = -(scale * q[t] as f32 + min_log_prob);
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;
        let top = max + lse;
        let mut sum = 0.0f64;
        let (mut imax_base, mut best) = (0, 0.0f32);
        for (i, (&l, &qi)) in logits.iter().zip(q).enumerate() {
            let p_log_base = scale * qi as f32 + min_log_prob;
            if i == 0 || p_log_base > best {
                best = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += (p_base * (p_log_base - l + top)) as f64;
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        self.n_same_top += (imax == imax_base) as usize;
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += p_diff as f64;
        let p_diff2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        (sum as f32, p_diff)
    }
}

fn bytes2(lo: u16, hi: u16) -> [u8; 4] {
    let (a, b) = (lo.to_le_bytes(), hi.to_le_bytes());
    [a[0], a[1], b[0], b[1]]
}

/// A comparison's result: the sums, and every position's KL divergence and `p - p_base`,
/// sorted (for the percentiles).
#[derive(Debug, Clone)]
pub struct KldReport {
    pub stats: KldStats,
    pub kld: Vec<f32>,
    pub p_diff: Vec<f32>,
    pub n_ctx: usize,
    pub n_chunk: usize,
}

/// llama-perplexity's percentile of sorted `values` (f32 interpolation).
pub fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// llama-perplexity's median of sorted `values`.
pub fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n % 2 == 0 {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

fn read_u32(r: &mut dyn Read, what: &str) -> Result<u32, PerplexityError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)
        .map_err(|e| PerplexityError::Base(format!("reading {what}: {e}")))?;
    Ok(u32::from_le_bytes(b))
}

/// Compare `model` with the base `base` holds: each window of the base's tokens run from an
/// empty cache (its first token replaced by `bos` where given), the second half of each
/// compared. `on_chunk(i, stats)` is told the running sums after window `i` (from 1).
pub fn kl_divergence(
    model: &dyn Model,
    base: &mut dyn Read,
    bos: Option<u32>,
    n_batch: usize,
    threads: &Threads,
    mut on_chunk: impl FnMut(usize, &KldStats),
) -> Result<KldReport, PerplexityError> {
    let mut magic = [0u8; 8];
    if base.read_exact(&mut magic).is_err() || &magic != MAGIC {
        return Err(PerplexityError::Base(
            "it does not start with `_logits_`: not a base of log-probabilities".into(),
        ));
    }
    let n_ctx = read_u32(base, "the context")? as usize;
    let n_vocab = read_u32(base, "the vocabulary size")? as usize;
    let n_chunk = read_u32(base, "the window count")? as usize;
    let ours = model.info().n_vocab;
    if n_vocab != ours {
        return Err(PerplexityError::Base(format!(
            "its vocabulary has {n_vocab} tokens, this model's {ours}"
        )));
    }
    if n_ctx < 4 {
        return Err(PerplexityError::ContextTooSmall(n_ctx));
    }
    if n_chunk == 0 {
        return Err(PerplexityError::NoChunks);
    }
    let n_tokens = n_chunk
        .checked_mul(n_ctx)
        .ok_or_else(|| PerplexityError::Base(format!("{n_chunk} windows of {n_ctx} overflow")))?;
    // Read as they come: a header that claims more than the file holds ends in an error.
    let mut tokens = Vec::with_capacity(n_tokens.min(1 << 20));
    for _ in 0..n_tokens {
        let t = read_u32(base, "the tokens")?;
        if t as usize >= n_vocab {
            return Err(PerplexityError::Base(format!(
                "token {t} is outside its vocabulary of {n_vocab}"
            )));
        }
        tokens.push(t);
    }
    let first = n_ctx / 2;
    let scored = n_ctx - 1 - first;
    let nv = row_len(n_vocab);
    let n_batch = n_batch.clamp(1, n_ctx);
    let mut state = model.new_state(n_ctx, n_batch)?;
    let mut stats = KldStats::default();
    let (mut kld, mut p_diff) = (Vec::new(), Vec::new());
    let mut bytes = vec![0u8; scored * nv * 2];
    let mut rows = vec![0u16; scored * nv];
    let mut window = vec![0u32; n_ctx];
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let logits = score_window(model, &mut state, chunk, bos, &mut window, threads)?;
        base.read_exact(&mut bytes).map_err(|e| {
            PerplexityError::Base(format!(
                "reading the log-probabilities of window {}: {e}",
                i + 1
            ))
        })?;
        for (v, b) in rows.iter_mut().zip(bytes.chunks_exact(2)) {
            *v = u16::from_le_bytes([b[0], b[1]]);
        }
        let next = &tokens[i * n_ctx + first + 1..(i + 1) * n_ctx];
        for ((row, base_row), &t) in logits
            .chunks_exact(ours)
            .zip(rows.chunks_exact(nv))
            .zip(next)
        {
            let (k, d) = stats.add(row, base_row, t);
            kld.push(k);
            p_diff.push(d);
        }
        on_chunk(i + 1, &stats);
    }
    kld.sort_by(f32::total_cmp);
    p_diff.sort_by(f32::total_cmp);
    Ok(KldReport {
        stats,
        kld,
        p_diff,
        n_ctx,
        n_chunk,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kl_base::nearest_int;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
        assert_eq!(nearest_int(0.49), 0);
    }

    #[test]
    fn a_row_gives_back_its_log_probabilities_and_no_divergence_from_itself() {
        let logits: Vec<f32> = (0..37).map(|i| ((i * 7) % 11) as f32 * 0.7 - 3.0).collect();
        let mut row = vec![0u16; row_len(37)];
        let nll = base_row(&logits, 5, &mut row);
        let mut s = KldStats::default();
        let (kld, p_diff) = s.add(&logits, &row, 5);
        // The 16-bit steps lose a little: a divergence near 0, probabilities near each other.
        assert!(kld.abs() < 1e-4 && p_diff.abs() < 1e-3, "{kld} {p_diff}");
        assert!((s.sum_nll - nll).abs() < 1e-6 && s.n_same_top == 1);
        assert_eq!(row.len(), 2 * 19 + 4);
    }
}

//! Perplexity over a text as llama.cpp's `llama-perplexity` computes it: the tokens cut into
//! windows of `n_ctx` (the first token of each replaced by BOS where the vocabulary adds one),
//! each window run from an empty cache, and the second half of each scored: the negative log
//! probability of every next token, accumulated in double precision.
//!
//! The logits are llama.cpp's bits, and each score is its arithmetic (a float maximum, a double
//! sum of float exponentials, the logit's float difference from the maximum less the sum's
//! logarithm), summed in token order; llama-perplexity sums its threads' partial sums in the
//! order they finish, so the two can differ in the last bits of the sum, not in the digits
//! either prints.

use crate::kl_base;
use crate::matmul::Threads;
use crate::model::{Logits, Model};
use crate::ModelError;

/// Why a perplexity cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    #[error(
        "the text is {tokens} tokens: a perplexity with a context of {n_ctx} needs at least \
         {need} (two windows)"
    )]
    TooShort {
        tokens: usize,
        need: usize,
        n_ctx: usize,
    },
    #[error("a context of {0} tokens: a window needs at least 4 (half of it is scored)")]
    ContextTooSmall(usize),
    #[error("no window to score (chunks 0)")]
    NoChunks,
    #[error("the base of log-probabilities: {0}")]
    Base(String),
    #[error("writing the base of log-probabilities: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The settings of a run.
#[derive(Debug, Clone)]
pub struct PerplexityConfig {
    /// The window.
    pub n_ctx: usize,
    /// Tokens a forward pass (results do not depend on it).
    pub n_batch: usize,
    /// Windows to score at most (`None`: all the text holds).
    pub chunks: Option<usize>,
    /// Score each window's rows on a thread of its own while the model runs the next window
    /// (for a machine with a core the forward pass leaves idle; llama-perplexity scores on
    /// every core whatever its `-t`). The same sums either way.
    pub score_aside: bool,
}

/// The estimate: `exp` of the mean negative log probability, and its uncertainty (one
/// standard error, carried through the exponential), over `count` scored tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub ppl: f64,
    pub uncertainty: f64,
    pub count: usize,
    pub chunks: usize,
}

/// [`nll`] of each row of `logits` (`n_vocab` wide) and its token in `next`, the rows over the
/// threads (each row's value is its own; its 49152 exponentials for SmolLM2 cost about as much
/// as the row's share of the forward pass).
fn nlls(logits: &[f32], next: &[u32], n_vocab: usize, threads: &Threads) -> Vec<f64> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let values: Vec<AtomicU64> = next.iter().map(|_| AtomicU64::new(0)).collect();
    crate::matmul::parallel_for(threads, next.len(), |range| {
        for j in range {
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            values[j].store(nll(row, next[j]).to_bits(), Relaxed);
        }
    });
    values
        .into_iter()
        .map(|v| f64::from_bits(v.into_inner()))
        .collect()
}

/// The negative log probability of `token` under `logits`, as llama-perplexity computes it.
pub fn nll(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    -(((logits[token as usize] - max) as f64) - sum.ln())
}

/// The logits of the second half of one window of `tokens` (`n_ctx` of them, the first replaced
/// by `bos` where given, copied into `window`), run from an empty cache: what perplexity and
/// KL divergence score.
pub(crate) fn score_window(
    model: &dyn Model,
    state: &mut crate::State,
    tokens: &[u32],
    bos: Option<u32>,
    window: &mut [u32],
    threads: &Threads,
) -> Result<Vec<f32>, ModelError> {
    window.copy_from_slice(tokens);
    if let Some(b) = bos {
        window[0] = b;
    }
    let (first, n_batch) = (window.len() / 2, state.n_batch());
    state.reset();
    model.prefill(state, &window[..first], n_batch, Logits::None, threads)?;
    model.prefill(state, &window[first..], n_batch, Logits::All, threads)
}

/// The perplexity of `model` over `tokens` (the whole text's, BOS first where the vocabulary
/// adds one; `bos` replaces the first token of every window). `on_chunk(i, running)` is told
/// the running perplexity after window `i` (from 1). With `base`, the run also writes a base
/// for [`crate::kl_divergence`] there, window by window, and counts each negative log
/// probability as llama-perplexity does when it saves one (in f32).
pub fn perplexity(
    model: &dyn Model,
    tokens: &[u32],
    bos: Option<u32>,
    cfg: &PerplexityConfig,
    threads: &Threads,
    mut on_chunk: impl FnMut(usize, f64),
    mut base: Option<&mut dyn std::io::Write>,
) -> Result<Estimate, PerplexityError> {
    let n_ctx = cfg.n_ctx;
    if n_ctx < 4 {
        return Err(PerplexityError::ContextTooSmall(n_ctx));
    }
    let need = 2 * n_ctx;
    if tokens.len() < need {
        return Err(PerplexityError::TooShort {
            tokens: tokens.len(),
            need,
            n_ctx,
        });
    }
    let n_vocab = model.info().n_vocab;
    let all = tokens.len() / n_ctx;
    let n_chunk = cfg.chunks.map_or(all, |c| c.min(all));
    if n_chunk == 0 {
        return Err(PerplexityError::NoChunks);
    }
    let first = n_ctx / 2;
    let nv = kl_base::row_len(n_vocab);
    let mut rows = Vec::new();
    if let Some(out) = base.as_deref_mut() {
        kl_base::write_header(out, n_ctx, n_vocab, &tokens[..n_chunk * n_ctx])?;
        rows = vec![0u16; (n_ctx - 1 - first) * nv];
    }
    let n_batch = cfg.n_batch.clamp(1, n_ctx);
    let mut state = model.new_state(n_ctx, n_batch)?;
    let (mut nll_sum, mut nll2_sum, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut window = vec![0u32; n_ctx];
    let scored = n_ctx - first - 1;
    // Added in token order, window after window: the same sums whatever the threads.
    let mut add = |values: Vec<f64>, i: usize| {
        for v in values {
            nll_sum += v;
            nll2_sum += v * v;
        }
        count += scored;
        on_chunk(i + 1, (nll_sum / count as f64).exp());
    };
    std::thread::scope(|scope| -> Result<(), PerplexityError> {
        // The previous window's rows, being scored beside this window's pass.
        let mut aside: Option<(usize, std::thread::ScopedJoinHandle<Vec<f64>>)> = None;
        for i in 0..n_chunk {
            let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
            let logits = score_window(model, &mut state, chunk, bos, &mut window, threads)?;
            // Position `first + j` predicts the text's token after it (not the window's copy,
            // whose first token may be BOS).
            let next = &tokens[i * n_ctx + first + 1..(i + 1) * n_ctx];
            if let Some((k, h)) = aside.take() {
                add(h.join().expect("the scoring thread panicked"), k);
            }
            match base.as_deref_mut() {
                Some(out) => {
                    let pairs = logits.chunks_exact(n_vocab).zip(next).enumerate();
                    let values = pairs
                        .map(|(j, (row, &t))| {
                            kl_base::base_row(row, t, &mut rows[j * nv..(j + 1) * nv])
                        })
                        .collect();
                    kl_base::write_rows(out, &rows)?;
                    add(values, i);
                }
                None if cfg.score_aside => {
                    let one = Threads::new(1);
                    let job = move || nlls(&logits, next, n_vocab, &one);
                    aside = Some((i, scope.spawn(job)));
                }
                None => add(nlls(&logits, next, n_vocab, threads), i),
            }
        }
        if let Some((k, h)) = aside.take() {
            add(h.join().expect("the scoring thread panicked"), k);
        }
        Ok(())
    })?;
    let mean = nll_sum / count as f64;
    let var = nll2_sum / count as f64 - mean * mean;
    let ppl = mean.exp();
    let sd = if var > 0.0 {
        (var / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    Ok(Estimate {
        ppl,
        uncertainty: sd * ppl,
        count,
        chunks: n_chunk,
    })
}

#[cfg(test)]
mod tests {
    use super::nll;

    #[test]
    fn nll_is_minus_the_log_softmax() {
        let l = [1.0f32, 3.0, 2.0];
        let z: f64 = l.iter().map(|&v| (v as f64).exp()).sum();
        for t in 0..3 {
            let want = -(l[t] as f64 - z.ln());
            assert!((nll(&l, t as u32) - want).abs() < 1e-6);
        }
    }
}

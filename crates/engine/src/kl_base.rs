//! The KL-divergence base file as llama-perplexity writes it (the layout is described in
//! [`crate::kl_divergence`]): what `synapse perplexity --kl-divergence-base` writes window by
//! window, and what the comparison reads back.

use std::io::Write;

pub(crate) const MAGIC: &[u8; 8] = b"_logits_";

/// u16 of a base row: the two f32 and the padded log-probabilities.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// ggml's `nearest_int`: round to nearest, ties to even, by the 1.5 * 2^23 trick.
pub(crate) fn nearest_int(x: f32) -> i32 {
    ((x + 12582912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The maximum of `logits` as llama-perplexity finds it (`std::max`, from the first).
pub(crate) fn max_of(logits: &[f32]) -> f32 {
    logits[1..]
        .iter()
        .fold(logits[0], |m, &l| if m < l { l } else { m })
}

/// `ln(sum(e^(l - max)))`: f32 exponentials summed in f64, the logarithm rounded to f32.
pub(crate) fn log_sum_exp(logits: &[f32], max: f32) -> f32 {
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    sum.ln() as f32
}

/// A base row of `logits` into `row` (`row_len` u16), and the negative log probability of `tok`
/// as the base run counts it (f32 arithmetic, unlike a plain perplexity run's f64).
pub fn base_row(logits: &[f32], tok: u32, row: &mut [u16]) -> f64 {
    let max = max_of(logits);
    let min = logits[1..]
        .iter()
        .fold(logits[0], |m, &l| if l < m { l } else { m });
    let min = if min < max - 16.0 { max - 16.0 } else { min };
    let lse = log_sum_exp(logits, max);
    let min_log_prob = min - max - lse;
    let scale = (max - min) / 65535.0;
    let (head, rest) = row.split_at_mut(4);
    for (i, f) in [scale, min_log_prob].iter().enumerate() {
        let b = f.to_le_bytes();
        head[2 * i] = u16::from_le_bytes([b[0], b[1]]);
        head[2 * i + 1] = u16::from_le_bytes([b[2], b[3]]);
    }
    rest.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (q, &l) in rest.iter_mut().zip(logits) {
            *q = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    }
    (max + lse - logits[tok as usize]) as f64
}

/// Write a base file's header: the window, the vocabulary and the windows' tokens.
pub fn write_header(
    out: &mut dyn Write,
    n_ctx: usize,
    n_vocab: usize,
    tokens: &[u32],
) -> std::io::Result<()> {
    let n_chunk = tokens.len() / n_ctx;
    out.write_all(MAGIC)?;
    for v in [n_ctx, n_vocab, n_chunk] {
        out.write_all(&(v as u32).to_le_bytes())?;
    }
    for t in tokens {
        out.write_all(&t.to_le_bytes())?;
    }
    Ok(())
}

/// Write base rows.
pub fn write_rows(out: &mut dyn Write, rows: &[u16]) -> std::io::Result<()> {
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    out.write_all(&bytes)
}

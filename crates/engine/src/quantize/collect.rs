//! Collecting an importance matrix as a model runs (`synapse imatrix`): the text split into
//! llama-imatrix's chunks and passes, run with a [`Collector`] installed (the sums themselves
//! are `quantize::sums`').

pub use super::sums::{collecting, Collector, Stat};

/// How llama-imatrix splits a text into passes.
#[derive(Debug, Clone)]
pub struct Chunking {
    /// Tokens a chunk (`-c`): each is evaluated from an empty context.
    pub n_ctx: usize,
    /// Tokens a decode call (`-b`): as many whole chunks as fit run side by side.
    pub n_batch: usize,
    /// Tokens a pass (llama.cpp's micro-batch): a decode call's tokens go through in passes
    /// of this many, in order.
    pub n_ubatch: usize,
    /// At most this many chunks.
    pub max_chunks: Option<usize>,
    /// The first token of each chunk is replaced by this one (the vocabulary's BOS, when it
    /// adds one).
    pub bos: Option<u32>,
}

/// Errors computing an importance matrix.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("the text is {tokens} tokens; an importance matrix needs at least two chunks of {n_ctx} (-c)")]
    TooShort { tokens: usize, n_ctx: usize },
    #[error(
        "-c {n_ctx} and -b {n_batch}: the batch must be below the context or a multiple of it"
    )]
    Batch { n_ctx: usize, n_batch: usize },
    #[error("-b / -c run {seqs} chunks side by side, more than a pass of {n_ubatch} tokens holds")]
    Ubatch { seqs: usize, n_ubatch: usize },
    #[error(transparent)]
    Model(#[from] crate::ModelError),
}

/// Evaluate `tokens` chunk by chunk as llama-imatrix does (the same chunks, the same passes,
/// all logits asked for, so no layer drops rows), collecting the products' inputs. Returns
/// the collector and the number of chunks evaluated; `progress` hears of each chunk done.
pub fn collect_over(
    model: &dyn crate::Model,
    tokens: &[u32],
    chunking: &Chunking,
    mut collector: Collector,
    threads: &crate::Threads,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Collector, usize), CollectError> {
    use crate::{Logits, Seq};
    let Chunking {
        n_ctx,
        n_batch,
        n_ubatch,
        ..
    } = *chunking;
    if n_ctx == 0 || tokens.len() < 2 * n_ctx {
        return Err(CollectError::TooShort {
            tokens: tokens.len(),
            n_ctx,
        });
    }
    if n_batch == 0 || (n_batch >= n_ctx && n_batch % n_ctx != 0) {
        return Err(CollectError::Batch { n_ctx, n_batch });
    }
    if (n_batch / n_ctx).max(1) > n_ubatch {
        return Err(CollectError::Ubatch {
            seqs: n_batch / n_ctx,
            n_ubatch,
        });
    }
    let n_chunk = (tokens.len() / n_ctx).min(chunking.max_chunks.unwrap_or(usize::MAX));
    let n_seq = (n_batch / n_ctx).max(1);
    let n_vocab = model.info().n_vocab;
    let ubatch = n_ubatch.max(1);
    let mut batch = model.new_batch(ubatch)?;
    let mut logits = vec![0.0f32; ubatch * n_vocab];
    let mut done = 0;
    for first in (0..n_chunk).step_by(n_seq) {
        let seqs = n_seq.min(n_chunk - first);
        let mut states = (0..seqs)
            .map(|_| model.new_state(n_ctx, ubatch))
            .collect::<Result<Vec<_>, _>>()?;
        let mut chunks: Vec<Vec<u32>> = (first..first + seqs)
            .map(|c| tokens[c * n_ctx..(c + 1) * n_ctx].to_vec())
            .collect();
        if let Some(bos) = chunking.bos {
            chunks.iter_mut().for_each(|c| c[0] = bos);
        }
        // Each decode call: `n_batch` tokens of one chunk, or several whole chunks side by
        // side; its tokens, in order, go through in passes of `ubatch`.
        let per_call = n_batch.min(n_ctx);
        for start in (0..n_ctx).step_by(per_call) {
            let len = per_call.min(n_ctx - start);
            // llama.cpp's passes over a call of several sequences take the same number of
            // tokens from each, one run a sequence in sequence order (its `split_equal`); of
            // one sequence, consecutive tokens (`split_simple`): both are runs of
            // `ubatch / seqs` tokens.
            let m = ubatch / seqs;
            let mut off = 0;
            while off < len {
                let take_each = m.min(len - off);
                let take = take_each * seqs;
                let mut list: Vec<Seq> = states
                    .iter_mut()
                    .zip(&chunks)
                    .map(|(state, chunk)| Seq {
                        state,
                        tokens: &chunk[start + off..start + off + take_each],
                        logits: Logits::All,
                    })
                    .collect();
                let out = &mut logits[..take * n_vocab];
                let (c, r) = collecting(collector, || {
                    model.forward_batch(&mut batch, &mut list, out, threads)
                });
                collector = c;
                r?;
                off += take_each;
            }
        }
        done += seqs;
        progress(done, n_chunk);
    }
    Ok((collector, n_chunk))
}

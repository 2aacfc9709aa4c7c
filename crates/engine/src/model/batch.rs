//! Batched passes: the tokens of several sequences in one forward pass, each sequence with its
//! own state (cache and positions). This is what a server's step runs: the next token of every
//! sequence decoding and a chunk of each prompt being read, the weights read once for all.
//!
//! Every row's arithmetic is its own in every product and norm (G1), and attention reads only
//! its own sequence's cache, so each sequence's logits are the bits it gets run alone: a
//! batched pass changes speed, never a result. The llama family and Gemma 3 run a batch's
//! sequences together; Qwen 3.5, whose recurrent layers are not written for runs of several
//! sequences yet, runs them one after another, with the same results.

use super::blocks::{embed, Run};
use super::{
    Batch, ForwardBody, Logits, Matrix, Model, ModelInfo, Scratch, Seq, State, StateBytes,
};
use crate::matmul::Threads;
use crate::ModelError;

/// [`crate::Model::new_batch`].
pub(crate) fn new_batch<M: ForwardBody>(m: &M, n_tokens: usize) -> Result<Batch, ModelError> {
    let s = match m.batch_dims(n_tokens) {
        Some(d) => {
            let mut bytes = StateBytes::new(n_tokens, n_tokens)?;
            d.count(&mut bytes)?;
            bytes.reserve()?;
            Some(Scratch::new(&d))
        }
        None => None,
    };
    Ok(Batch { n_tokens, s })
}

/// [`crate::Model::forward_batch`]: check every sequence, then run them together or one after
/// another.
pub(crate) fn forward_batch<M: ForwardBody>(
    m: &M,
    batch: &mut Batch,
    seqs: &mut [Seq<'_>],
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    let info = m.info();
    let total: usize = seqs.iter().map(|q| q.tokens.len()).sum();
    if total > batch.n_tokens {
        return Err(ModelError::BatchTooLarge {
            n: total,
            n_batch: batch.n_tokens,
        });
    }
    let rows: usize = seqs.iter().map(|q| q.logits.rows(q.tokens.len())).sum();
    let need = rows * info.n_vocab;
    if out.len() < need {
        return Err(ModelError::LogitsBuffer {
            have: out.len(),
            need,
        });
    }
    for q in seqs.iter() {
        // As a single pass checks it, but for the batch size, which is the batch's.
        let (st, n) = (&*q.state, q.tokens.len());
        if st.model != info.id {
            return Err(ModelError::ForeignState);
        }
        if n == 0 && q.logits == Logits::Last {
            return Err(ModelError::NoTokens);
        }
        if st.pos.checked_add(n).is_none_or(|end| end > st.n_ctx()) {
            return Err(ModelError::ContextFull {
                pos: st.pos,
                n,
                n_ctx: st.n_ctx(),
            });
        }
        if let Some(&id) = q.tokens.iter().find(|&&id| id as usize >= info.n_vocab) {
            return Err(ModelError::BadToken {
                id,
                n_vocab: info.n_vocab,
            });
        }
    }
    let Some(s) = &mut batch.s else {
        return one_by_one(m, seqs, out, threads);
    };
    for q in seqs.iter_mut() {
        q.state.make_room(q.state.pos + q.tokens.len())?;
    }
    crate::profile::begin();
    let r = dispatch(m, seqs, s, &mut out[..need], threads);
    crate::profile::mark("other");
    r
}

/// The sequences one after another, each in chunks of its state's batch size (logits only
/// where asked: each chunk's for `All`, the last chunk's for `Last`).
fn one_by_one<M: ForwardBody>(
    m: &M,
    seqs: &mut [Seq<'_>],
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    let n_vocab = m.info().n_vocab;
    let mut written = 0;
    for q in seqs.iter_mut() {
        let chunks: Vec<&[u32]> = q.tokens.chunks(q.state.n_batch.max(1)).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let want = match q.logits {
                Logits::All => Logits::All,
                Logits::Last if i + 1 == chunks.len() => Logits::Last,
                _ => Logits::None,
            };
            let rows = want.rows(chunk.len());
            let o = &mut out[written..written + rows * n_vocab];
            super::forward(m, q.state, chunk, want, o, threads)?;
            written += rows * n_vocab;
        }
    }
    Ok(())
}

/// The joint pass compiled for the best of the CPU's feature levels (as [`super::forward`]'s).
fn dispatch<M: ForwardBody>(
    m: &M,
    seqs: &mut [Seq<'_>],
    s: &mut Scratch,
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx512f() {
        // SAFETY: the CPU has AVX-512 F besides AVX2, FMA and F16C (just checked).
        return unsafe { runs_v4(m, seqs, s, out, threads) };
    }
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (just checked).
        return unsafe { runs_v3(m, seqs, s, out, threads) };
    }
    m.forward_runs_body(seqs, s, out, threads)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn runs_v4<M: ForwardBody>(
    m: &M,
    seqs: &mut [Seq<'_>],
    s: &mut Scratch,
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    m.forward_runs_body(seqs, s, out, threads)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn runs_v3<M: ForwardBody>(
    m: &M,
    seqs: &mut [Seq<'_>],
    s: &mut Scratch,
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    m.forward_runs_body(seqs, s, out, threads)
}

/// The start of a joint pass: every sequence's tokens embedded into the rows of `s.x`, one
/// sequence after another, and the runs the layers take (each sequence's cache and positions).
/// Returns the runs and the rows in all.
#[inline(always)]
pub(crate) fn embed_runs<'k>(
    tok_embd: &Matrix,
    seqs: &'k mut [Seq<'_>],
    s: &mut Scratch,
) -> Result<(Vec<Run<'k>>, usize), ModelError> {
    let d = tok_embd.cols;
    let mut n = 0;
    for q in seqs.iter() {
        embed(tok_embd, q.tokens, &mut s.x[n * d..])?;
        n += q.tokens.len();
    }
    let runs = seqs
        .iter_mut()
        .map(|q| Run {
            kv: &mut q.state.kv,
            pos0: q.state.pos,
            n: q.tokens.len(),
        })
        .collect();
    Ok((runs, n))
}

/// The end of a joint pass's layers: each sequence's position moved past its tokens, and the
/// rows of `s.x` whose logits are asked for moved to its front, in order (each row to a place
/// at or before its own). Returns how many.
#[inline(always)]
pub(crate) fn logit_rows(seqs: &mut [Seq<'_>], s: &mut Scratch, d: usize) -> usize {
    let (mut rows, mut t) = (0, 0);
    for q in seqs.iter_mut() {
        let m = q.tokens.len();
        let want = q.logits.rows(m);
        let from = t + m - want;
        s.x.copy_within(from * d..(from + want) * d, rows * d);
        rows += want;
        t += m;
        q.state.pos += m;
    }
    rows
}

/// Every architecture is a [`Model`] through its `ForwardBody`: the checks and the x86-64-v3
/// dispatch of `forward` are written once, here.
impl<M: ForwardBody + Send + Sync> Model for M {
    fn info(&self) -> &ModelInfo {
        ForwardBody::info(self)
    }

    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError> {
        ForwardBody::new_state(self, n_ctx, n_batch)
    }

    fn forward(
        &self,
        st: &mut State,
        tokens: &[u32],
        logits: Logits,
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError> {
        super::forward(self, st, tokens, logits, out, threads)
    }

    fn new_batch(&self, n_tokens: usize) -> Result<Batch, ModelError> {
        new_batch(self, n_tokens)
    }

    fn forward_batch(
        &self,
        b: &mut Batch,
        seqs: &mut [Seq<'_>],
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError> {
        forward_batch(self, b, seqs, out, threads)
    }

    fn weight_memory(&self) -> Vec<&[u8]> {
        self.matrices()
            .into_iter()
            .flat_map(|m| m.resident())
            .collect()
    }

    fn view(&self) -> Option<super::DecoderView<'_>> {
        ForwardBody::view(self)
    }
}

//! Speculative decoding: guess the next few tokens cheaply, run the model once over the token
//! just drawn and the guesses, and keep the guesses it agrees with.
//!
//! A decode step reads every weight once for one token; a pass over `k + 1` tokens reads
//! them once for all, so a guess the model confirms costs less than a pass of its own. The
//! forward pass gives every position the bits it gets fed alone (G1), so a confirmed guess's
//! logits are those plain decoding computes there, and the tokens drawn from them are too:
//! speculation changes the speed, never a bit of the output ([`crate::generate`] draws and
//! checks; this module only guesses).
//!
//! Two sources of guesses:
//! - [`Lookup`]: the text so far, prompt included. The last few tokens are looked up where
//!   they occurred before, and what followed them there is the guess (code being edited,
//!   a text being quoted or summarised, JSON keys: output that repeats its input).
//! - [`DraftModel`]: a smaller model with the same vocabulary, run ahead token by token with
//!   a copy of the target's sampler. The copy draws from the same random stream as the
//!   target: each generated position takes exactly one draw, so the copy's draw for a
//!   position is the one the target makes there, and a draft whose distribution is close to
//!   the target's guesses its sampled tokens too, not only its greedy ones.

use crate::matmul::Threads;
use crate::model::{shared_prefix, Checkpoint, Logits, Model, State};
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;
use crate::ModelError;

/// Where guesses come from, and how many a pass checks.
pub struct Speculation<'m> {
    drafter: Drafter<'m>,
    length: GuessLength,
}

enum Drafter<'m> {
    Lookup(Lookup),
    Model(Box<DraftModel<'m>>),
}

/// How many guesses the next pass asks for. Doubled (up to the most) after a pass whose
/// guesses were all accepted, one more than those accepted after one that accepted some, and
/// halved after one that accepted none, down to none: a pass costs more with each token it
/// takes, so guessing far pays only while guesses hold, and wrong guesses cost. After
/// [`GuessLength::REST`] passes without guesses it tries one again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuessLength {
    max: usize,
    now: usize,
    resting: usize,
}

impl GuessLength {
    /// Passes without guesses before one is tried again.
    pub const REST: usize = 8;

    /// Up to `max` guesses a pass, starting at one.
    pub fn new(max: usize) -> GuessLength {
        GuessLength {
            max,
            now: max.min(1),
            resting: 0,
        }
    }

    /// The most guesses a pass asks for.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Guesses the next pass asks for (a pass without them counts towards the rest).
    pub fn for_next_pass(&mut self) -> usize {
        if self.now == 0 && self.max > 0 {
            self.resting += 1;
            if self.resting > Self::REST {
                self.resting = 0;
                self.now = 1;
            }
        }
        self.now
    }

    /// What became of the last pass's guesses: `accepted` of `guessed`.
    pub fn observe(&mut self, guessed: usize, accepted: usize) {
        if guessed == 0 {
            return;
        }
        self.now = if accepted == guessed {
            self.now.saturating_mul(2).max(1)
        } else if accepted == 0 {
            self.now / 2
        } else {
            accepted + 1
        }
        .min(self.max);
    }
}

impl<'m> Speculation<'m> {
    /// Prompt lookup, up to `max` guesses a pass.
    pub fn lookup(lookup: Lookup, max: usize) -> Speculation<'m> {
        Speculation {
            drafter: Drafter::Lookup(lookup),
            length: GuessLength::new(max),
        }
    }

    /// A draft model, up to `max` guesses a pass.
    pub fn draft_model(draft: DraftModel<'m>, max: usize) -> Speculation<'m> {
        Speculation {
            drafter: Drafter::Model(Box::new(draft)),
            length: GuessLength::new(max),
        }
    }

    /// The most guesses a pass checks.
    pub fn max(&self) -> usize {
        self.length.max()
    }

    /// Take in a prompt the target was just fed (`ctx`: every token of the sequence), before
    /// the first guess: a draft model feeds it too, as part of the prefill.
    pub(crate) fn prepare(&mut self, ctx: &[u32], threads: &Threads) -> Result<(), ModelError> {
        self.length = GuessLength::new(self.length.max());
        match &mut self.drafter {
            Drafter::Model(d) if !ctx.is_empty() => d.catch_up(ctx, threads),
            _ => Ok(()),
        }
    }

    /// What became of the last pass's guesses: `accepted` of `guessed`.
    pub(crate) fn observe(&mut self, guessed: usize, accepted: usize) {
        self.length.observe(guessed, accepted);
    }

    /// Up to `k` guesses of the tokens after `ctx` (every token of the sequence, the one just
    /// drawn last), appended to `out`. `sampler` is the target's, as it stands before drawing
    /// the token after `ctx`.
    pub(crate) fn draft(
        &mut self,
        ctx: &[u32],
        sampler: &Sampler,
        k: usize,
        threads: &Threads,
        out: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        let k = k.min(self.length.for_next_pass());
        if k == 0 || ctx.is_empty() {
            return Ok(());
        }
        match &mut self.drafter {
            Drafter::Lookup(l) => {
                l.draft(ctx, k, out);
                Ok(())
            }
            Drafter::Model(d) => d.draft(ctx, sampler, k, threads, out),
        }
    }
}

/// Prompt lookup: the longest suffix of the sequence, `max_match` tokens down to
/// `min_match`, that occurred before; its latest earlier occurrence's continuation is the
/// guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    pub min_match: usize,
    pub max_match: usize,
}

impl Default for Lookup {
    /// Matches of 2 to 4 tokens: one token alone (a space, a comma) recurs everywhere and
    /// guesses badly; longer matches than four rarely find what a shorter one misses.
    fn default() -> Self {
        Lookup {
            min_match: 2,
            max_match: 4,
        }
    }
}

impl Lookup {
    /// Up to `k` tokens that followed the latest earlier occurrence of the longest matching
    /// suffix of `ctx`, appended to `out` (nothing where no suffix of `min_match` tokens recurs).
    pub fn draft(&self, ctx: &[u32], k: usize, out: &mut Vec<u32>) {
        let n = ctx.len();
        for m in (self.min_match.max(1)..=self.max_match.min(n.saturating_sub(1))).rev() {
            let suffix = &ctx[n - m..];
            // Occurrences starting at `i < n - m`: the suffix itself is not one.
            if let Some(i) = (0..n - m).rev().find(|&i| &ctx[i..i + m] == suffix) {
                let from = i + m;
                out.extend_from_slice(&ctx[from..(from + k).min(n)]);
                return;
            }
        }
    }
}

/// A smaller model with the target's vocabulary, its own state kept in step with the
/// target's sequence: it rolls back what the target rejected and feeds what it accepted.
pub struct DraftModel<'m> {
    model: &'m dyn Model,
    tok: &'m Tokenizer,
    state: State,
    n_batch: usize,
    /// The tokens the state holds.
    held: Vec<u32>,
    logits: Vec<f32>,
    /// Where the last guesses began: a recurrent state comes back here (it cannot rewind).
    cp: Checkpoint,
}

impl<'m> DraftModel<'m> {
    /// A draft for `target`, its state for `n_ctx` positions, catching up in batches of
    /// `n_batch`. Its vocabulary must be the target's, token for token
    /// ([`ModelError::DraftVocabulary`] names the first difference).
    pub fn new(
        model: &'m dyn Model,
        tok: &'m Tokenizer,
        target: &dyn Model,
        target_tok: &Tokenizer,
        n_ctx: usize,
        n_batch: usize,
    ) -> Result<DraftModel<'m>, ModelError> {
        let (d, t) = (model.info().n_vocab, target.info().n_vocab);
        if d != t {
            return Err(ModelError::DraftVocabulary(format!(
                "the draft's logits cover {d} tokens, the target's {t}"
            )));
        }
        if let Some(why) = tok.vocabulary_difference(target_tok) {
            return Err(ModelError::DraftVocabulary(why));
        }
        let n_batch = n_batch.clamp(1, n_ctx.max(1));
        Ok(DraftModel {
            model,
            tok,
            state: model.new_state(n_ctx, n_batch)?,
            n_batch,
            held: Vec::new(),
            logits: vec![0.0; d],
            cp: Checkpoint::default(),
        })
    }

    fn draft(
        &mut self,
        ctx: &[u32],
        sampler: &Sampler,
        k: usize,
        threads: &Threads,
        out: &mut Vec<u32>,
    ) -> Result<(), ModelError> {
        // Room for the guesses fed after `ctx` (all but the last).
        if ctx.len() + k > self.state.n_ctx() + 1 {
            return Ok(());
        }
        self.catch_up(ctx, threads)?;
        let mut sampler = sampler.fork();
        for i in 0..k {
            let t = sampler.sample(&self.logits);
            sampler.accept(t);
            if self.tok.is_eog(t) {
                break;
            }
            out.push(t);
            if i + 1 == k {
                break;
            }
            self.model.forward(
                &mut self.state,
                &[t],
                Logits::Last,
                &mut self.logits,
                threads,
            )?;
            self.held.push(t);
        }
        Ok(())
    }

    /// Bring the state to hold `ctx` (its last token's logits in `self.logits`): keep the
    /// prefix it shares with what the state holds, feed the rest.
    fn catch_up(&mut self, ctx: &[u32], threads: &Threads) -> Result<(), ModelError> {
        let shared = shared_prefix(&self.held, ctx).min(ctx.len() - 1);
        let kept =
            self.state.rewind(shared) || (self.cp.pos() <= shared && self.state.restore(&self.cp));
        if !kept {
            self.state.reset();
        }
        let from = self.state.pos;
        self.held.truncate(from);
        self.logits = self.model.prefill(
            &mut self.state,
            &ctx[from..],
            self.n_batch,
            Logits::Last,
            threads,
        )?;
        self.held.extend_from_slice(&ctx[from..]);
        self.state.checkpoint(&mut self.cp);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::GuessLength;

    #[test]
    fn guess_length_grows_while_guesses_hold_and_rests_when_none_do() {
        let mut g = GuessLength::new(8);
        assert_eq!(g.for_next_pass(), 1);
        for want in [2, 4, 8, 8] {
            let k = g.for_next_pass();
            g.observe(k, k);
            assert_eq!(g.for_next_pass(), want);
        }
        g.observe(8, 3);
        assert_eq!(g.for_next_pass(), 4);
        g.observe(4, 0);
        assert_eq!(g.for_next_pass(), 2);
        g.observe(2, 0);
        g.observe(1, 0);
        // No guesses for REST passes, then one.
        let rested: Vec<usize> = (0..GuessLength::REST + 2)
            .map(|_| g.for_next_pass())
            .collect();
        assert!(
            rested[..GuessLength::REST].iter().all(|&k| k == 0),
            "{rested:?}"
        );
        assert_eq!(rested[GuessLength::REST], 1, "{rested:?}");
        // Nothing guessed, nothing learnt; no guesses asked, none given.
        g.observe(0, 0);
        assert_eq!(g.for_next_pass(), 1);
        assert_eq!(GuessLength::new(0).for_next_pass(), 0);
    }
}

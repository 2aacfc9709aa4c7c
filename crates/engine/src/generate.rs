//! The generation loop, written once: `synapse run`, `chat`, the tests and the server drive
//! it.
//!
//! A [`Generator`] owns one sequence's state (its KV cache, the tokens it holds). Each request
//! [`Generator::start`]s a [`Generation`]: the prompt is fed after the longest prefix it shares
//! with what the state already holds (a chat's earlier turns are not computed again), then
//! [`Generation::next_piece`] samples one token at a time and hands back its text, whole UTF-8
//! characters only, holding back what could be the start of a stop string. It stops at an
//! end-of-generation token, a stop string, the token limit or a full context, and says which.
//!
//! Each generation has its own sampler, seeded from its request alone, so that its randomness
//! never depends on what else runs.

use std::time::{Duration, Instant};

use crate::matmul::Threads;
use crate::model::{shared_prefix, Checkpoint, Logits, Model, State};
use crate::sampler::{Sampler, SamplerConfig};
use crate::speculate::Speculation;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::ModelError;

/// What to generate after a prompt.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The prompt's tokens (at least one).
    pub prompt: &'a [u32],
    /// Tokens to generate at most (`usize::MAX`: until the end of the text or the context).
    pub max_tokens: usize,
    /// The text ends before the first of these it contains (which is not part of it).
    pub stop: &'a [String],
    pub sampling: SamplerConfig,
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model sampled this end-of-generation token (not part of the text).
    EndOfGeneration(u32),
    /// `max_tokens` were generated.
    Length,
    /// The context holds no more tokens.
    ContextFull,
    /// The text reached one of the request's stop strings.
    StopString,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::EndOfGeneration(_) => "end of generation",
            StopReason::Length => "length",
            StopReason::ContextFull => "context full",
            StopReason::StopString => "stop string",
        })
    }
}

/// Where a generation's time went.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// The prompt's tokens, and how many of them the state already held (not computed again).
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub prefill: Duration,
    /// Tokens generated, and the time from the first sample to the stop.
    pub generated: usize,
    pub decode: Duration,
    /// Forward passes during decode: one a token plainly (one fewer than `generated` when the
    /// last token was not fed back), fewer with speculation.
    pub decode_steps: usize,
    /// Speculation's guesses checked, and those the model agreed with (each a token that
    /// took no pass of its own).
    pub drafted: usize,
    pub accepted: usize,
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The generated tokens (without an end-of-generation token or the text past a stop
    /// string's start: those tokens are here, their text is not).
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub timings: Timings,
}

/// One sequence: its state, and the tokens that state holds.
pub struct Generator<'m> {
    model: &'m dyn Model,
    tok: &'m Tokenizer,
    state: State,
    n_batch: usize,
    held: Vec<u32>,
    spec: Option<Speculation<'m>>,
    /// Where the last pass began: a recurrent state comes back here when guesses fail.
    cp: Checkpoint,
}

impl<'m> Generator<'m> {
    /// A sequence of up to `n_ctx` tokens, prompts fed in batches of up to `n_batch`.
    pub fn new(
        model: &'m dyn Model,
        tok: &'m Tokenizer,
        n_ctx: usize,
        n_batch: usize,
    ) -> Result<Generator<'m>, ModelError> {
        let n_batch = n_batch.clamp(1, n_ctx.max(1));
        Ok(Generator {
            model,
            tok,
            state: model.new_state(n_ctx, n_batch)?,
            n_batch,
            held: Vec::new(),
            spec: None,
            cp: Checkpoint::default(),
        })
    }

    /// Decode speculatively from the next generation on (`None`: plainly). The output is the
    /// same either way, bit for bit; the state grows to take a token and its guesses in one
    /// pass where it cannot yet.
    pub fn speculate(&mut self, spec: Option<Speculation<'m>>) -> Result<(), ModelError> {
        let want = spec.as_ref().map_or(0, |s| s.max()).saturating_add(1);
        let n_ctx = self.state.n_ctx();
        if self.state.n_batch() < want.min(n_ctx) {
            self.state = self.model.new_state(n_ctx, want.min(n_ctx))?;
            self.held.clear();
        }
        self.spec = spec;
        Ok(())
    }

    /// The tokens the state holds: the last prompt and what was fed after it.
    pub fn held(&self) -> &[u32] {
        &self.held
    }

    /// Feed `req.prompt` (after the prefix the state already holds) and start generating.
    pub fn start<'g>(
        &'g mut self,
        req: &Request<'g>,
        threads: &'g Threads,
    ) -> Result<Generation<'g, 'm>, ModelError> {
        let prompt = req.prompt;
        let Some(&last) = prompt.last() else {
            return Err(ModelError::EmptyPrompt);
        };
        let t0 = Instant::now();
        // Keep the shared prefix, but feed at least the last token: its logits are needed.
        let shared = shared_prefix(&self.held, prompt).min(prompt.len() - 1);
        if !self.state.rewind(shared) {
            // A recurrent state cannot go back: start over.
            self.state.reset();
        }
        let keep = self.state.pos;
        self.held.truncate(keep);
        let logits = self.model.prefill(
            &mut self.state,
            &prompt[keep..],
            self.n_batch,
            Logits::Last,
            threads,
        )?;
        self.held.extend_from_slice(&prompt[keep..]);
        if let Some(spec) = &mut self.spec {
            spec.prepare(&self.held, threads)?;
        }
        let tok = self.tok;
        let n_vocab = self.model.info().n_vocab;
        Ok(Generation {
            timings: Timings {
                prompt_tokens: prompt.len(),
                cached_tokens: keep,
                prefill: t0.elapsed(),
                ..Timings::default()
            },
            dec: Decoding::new(tok, n_vocab, req),
            gen: self,
            threads,
            logits,
            pass: vec![last],
            row: 0,
            n_vocab,
            decode_start: None,
        })
    }
}

/// A generation under way: [`Generation::next_piece`] until it returns `None`, then
/// [`Generation::finish`].
///
/// Each pass feeds the token just drawn and the guesses after it (none without speculation),
/// and asks for every row's logits. The token drawn from a row goes on to the next row if it
/// is the guess there (that row's logits are what feeding it alone would give); otherwise
/// the guesses after it are dropped from the state, and the next pass feeds it.
pub struct Generation<'g, 'm> {
    gen: &'g mut Generator<'m>,
    threads: &'g Threads,
    dec: Decoding<'m>,
    /// The last pass's tokens, the last positions of the state (the first the token drawn
    /// before it, the rest guesses), and the logits of each.
    pass: Vec<u32>,
    logits: Vec<f32>,
    /// The row of the pass the next token is drawn from.
    row: usize,
    n_vocab: usize,
    decode_start: Option<Instant>,
    timings: Timings,
}

impl Generation<'_, '_> {
    /// The logits the next token is drawn from: those after the last token accepted.
    pub fn logits(&self) -> &[f32] {
        &self.logits[self.row * self.n_vocab..(self.row + 1) * self.n_vocab]
    }

    /// The next piece of text (possibly empty, while a character's bytes or a possible stop
    /// string are held back), or `None` once the generation has stopped.
    pub fn next_piece(&mut self) -> Result<Option<String>, ModelError> {
        if self.dec.stopped().is_some() {
            return Ok(None);
        }
        self.decode_start.get_or_insert_with(Instant::now);
        // The position the token drawn now takes.
        let at = self.gen.state.pos + self.row + 1 - self.pass.len();
        let room = at < self.gen.state.n_ctx();
        let row = self.row * self.n_vocab;
        let step = self.dec.step(&self.logits[row..row + self.n_vocab], room);
        match step.feed {
            Some(t) if self.pass.get(self.row + 1) == Some(&t) => {
                self.row += 1;
                self.timings.accepted += 1;
            }
            Some(t) => {
                if let Some(spec) = &mut self.gen.spec {
                    spec.observe(self.pass.len() - 1, self.row);
                }
                self.drop_guesses(at)?;
                self.feed(t)?;
            }
            None => {
                self.drop_guesses(at)?;
                if let Some(t0) = self.decode_start {
                    self.timings.decode = t0.elapsed();
                }
            }
        }
        Ok(Some(step.text))
    }

    /// Take the state back to its first `keep` positions, dropping the last pass's guesses
    /// after the row just drawn from.
    fn drop_guesses(&mut self, keep: usize) -> Result<(), ModelError> {
        let g = &mut *self.gen;
        g.model
            .take_back(&mut g.state, &g.cp, &self.pass, keep, self.threads)?;
        g.held.truncate(keep);
        Ok(())
    }

    /// One pass: `t` (just drawn) and the guesses after it.
    fn feed(&mut self, t: u32) -> Result<(), ModelError> {
        let g = &mut *self.gen;
        self.pass.clear();
        self.pass.push(t);
        if let Some(spec) = &mut g.spec {
            // Guesses that fit in the context and in one pass, and whose logits will be drawn
            // from: the last token generated is not fed.
            let k = (g.state.n_ctx() - g.state.pos - 1)
                .min(g.state.n_batch() - 1)
                .min(self.dec.remaining().saturating_sub(1));
            if k > 0 {
                g.held.push(t);
                let drafted =
                    spec.draft(&g.held, self.dec.sampler(), k, self.threads, &mut self.pass);
                g.held.pop();
                drafted?;
            }
        }
        let n = self.pass.len();
        let want = if n > 1 { Logits::All } else { Logits::Last };
        if n > 1 && g.state.is_recurrent() {
            g.state.checkpoint(&mut g.cp);
        }
        self.logits.resize(n * self.n_vocab, 0.0);
        g.model.forward(
            &mut g.state,
            &self.pass,
            want,
            &mut self.logits,
            self.threads,
        )?;
        g.held.extend_from_slice(&self.pass);
        self.row = 0;
        self.timings.decode_steps += 1;
        self.timings.drafted += n - 1;
        Ok(())
    }

    /// Run to the end, handing each piece of text to `on_text`.
    pub fn run(mut self, mut on_text: impl FnMut(&str)) -> Result<Outcome, ModelError> {
        while let Some(text) = self.next_piece()? {
            if !text.is_empty() {
                on_text(&text);
            }
        }
        Ok(self.finish())
    }

    /// The outcome (a generation not run to its stop counts as stopped by length).
    pub fn finish(self) -> Outcome {
        let mut timings = self.timings;
        timings.generated = self.dec.tokens.len();
        Outcome {
            stop: self.dec.stopped().unwrap_or(StopReason::Length),
            tokens: self.dec.tokens,
            timings,
        }
    }
}

/// What a sequence does with the logits after its last token: sample the next one, decide
/// whether to stop, and turn tokens into text. The one place of those decisions, for a
/// [`Generation`] and for a server's sequences alike, which feed the tokens themselves.
pub struct Decoding<'t> {
    tok: &'t Tokenizer,
    sampler: Sampler,
    stream: StreamDecoder<'t>,
    stop_strings: Vec<String>,
    max_tokens: usize,
    /// Text decoded but not yet handed out: a suffix that may begin a stop string.
    pending: String,
    tokens: Vec<u32>,
    stopped: Option<StopReason>,
}

/// One [`Decoding::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The token drawn, if one was (an end-of-generation token included).
    pub token: Option<u32>,
    /// The token to feed next; `None` when the sequence has stopped.
    pub feed: Option<u32>,
    /// Text to hand out (possibly empty).
    pub text: String,
}

impl<'t> Decoding<'t> {
    /// The decisions of `req` after its prompt (which the penalties count).
    pub fn new(tok: &'t Tokenizer, n_vocab: usize, req: &Request<'_>) -> Decoding<'t> {
        let mut sampler = Sampler::new(req.sampling.clone(), n_vocab);
        req.prompt.iter().for_each(|&t| sampler.accept(t));
        Decoding {
            tok,
            sampler,
            stream: StreamDecoder::new(tok),
            stop_strings: req.stop.to_vec(),
            max_tokens: req.max_tokens,
            pending: String::new(),
            tokens: Vec::new(),
            stopped: None,
        }
    }

    /// Why it stopped, once it has.
    pub fn stopped(&self) -> Option<StopReason> {
        self.stopped
    }

    /// The tokens drawn so far (not an end-of-generation token).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many more tokens it may draw.
    pub fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.tokens.len())
    }

    /// The sampler, as it stands before the next draw.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Draw the next token from `logits` (those after the last token fed) and decide: go on
    /// (feed it), or stop at an end-of-generation token, a stop string, the token limit, or a
    /// full context (`room`: the state has a position left for the token).
    pub fn step(&mut self, logits: &[f32], room: bool) -> Step {
        if self.stopped.is_some() {
            return Step {
                token: None,
                feed: None,
                text: String::new(),
            };
        }
        if self.tokens.len() >= self.max_tokens {
            return self.stop(None, StopReason::Length, true);
        }
        let next = self.sampler.sample(logits);
        self.sampler.accept(next);
        if self.tok.is_eog(next) {
            return self.stop(Some(next), StopReason::EndOfGeneration(next), true);
        }
        self.tokens.push(next);
        self.pending.push_str(&self.stream.push(next));
        if let Some(at) = self.first_stop() {
            self.pending.truncate(at);
            return self.stop(Some(next), StopReason::StopString, false);
        }
        if self.tokens.len() >= self.max_tokens {
            return self.stop(Some(next), StopReason::Length, true);
        }
        if !room {
            return self.stop(Some(next), StopReason::ContextFull, true);
        }
        let hold = held_back(&self.pending, &self.stop_strings);
        let text = self.pending.drain(..self.pending.len() - hold).collect();
        Step {
            token: Some(next),
            feed: Some(next),
            text,
        }
    }

    /// Record the stop and hand out the text still held (with the decoder's last bytes where
    /// the text ends with the tokens, not at a stop string).
    fn stop(&mut self, token: Option<u32>, why: StopReason, flush: bool) -> Step {
        self.stopped = Some(why);
        let mut text = std::mem::take(&mut self.pending);
        if flush {
            text.push_str(&self.stream.finish());
        }
        Step {
            token,
            feed: None,
            text,
        }
    }

    /// Where the first stop string begins in the pending text, if one is there whole.
    fn first_stop(&self) -> Option<usize> {
        self.stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
    }
}

/// How many bytes at the end of `text` could begin one of `stops`: the longest such suffix
/// (a proper prefix of a stop string), at a character boundary.
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .map(|s| {
            (1..s.len().min(text.len() + 1))
                .rev()
                .find(|&k| {
                    text.is_char_boundary(text.len() - k)
                        && s.as_bytes().starts_with(&text.as_bytes()[text.len() - k..])
                })
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn held_back_is_the_longest_suffix_that_begins_a_stop_string() {
        let stops = ["</s>".to_string(), "ééx".to_string(), String::new()];
        for (text, want) in [
            ("hello", 0),
            ("hello<", 1),
            ("hello</", 2),
            ("hello</s", 3),
            ("<<", 1),
            ("a é", 2),
            ("aéé", 4),
            ("x", 0),
            ("", 0),
        ] {
            assert_eq!(held_back(text, &stops), want, "{text:?}");
        }
    }
}

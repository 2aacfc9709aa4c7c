//! The engine's side of the server: one thread that owns the model's sequence states and runs
//! continuous batching over them.
//!
//! Each step is one batched pass ([`Model::forward_batch`]): the next token of every sequence
//! that is generating, then chunks of the prompts being read, up to a budget of tokens per
//! step, so that a long prompt is read over several steps while the others keep streaming.
//! Every sequence gets the bits it would get alone (G1), so who else is being served changes
//! speed, never a token or a logprob.
//!
//! The slots' states are the prefix cache: a finished sequence's keys and values stay in its
//! slot, a new request goes to the free slot whose cached tokens share the longest prefix
//! with its prompt (the least recently used among equals: the eviction policy), and a longer
//! prefix cached in any other slot is copied over first. Reused keys and values are the bits
//! the prompt's tokens would compute, so a cache hit changes speed only.
//!
//! With prompt lookup (`serve --lookup`), a generating sequence's part of a step is its next
//! token and guesses of the tokens after it: the token drawn from each row goes on while it is
//! the guess there, and the state goes back past the rest (a recurrent state to a checkpoint
//! taken before the step). The answers are the same bits; only the steps are fewer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use synapse_engine::generate::{Decoding, Request, StopReason};
use synapse_engine::sampler::SamplerConfig;
use synapse_engine::speculate::{GuessLength, Lookup};
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::{shared_prefix, Checkpoint, Logits, Model, Seq, State, Threads};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// What one sequence is asked to generate.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub sampling: SamplerConfig,
    /// Logprobs of each token drawn, with this many most likely alternatives.
    pub logprobs: Option<usize>,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
}

/// What a sequence sends back, in order: tokens, then one `Done` or `Error`.
#[derive(Debug, Clone)]
pub enum Event {
    Token(TokenOut),
    Done(Finish),
    Error(String),
}

/// One step's output: the text to hand out (possibly empty while a character or a possible
/// stop string is held back) and the token drawn, with its logprobs if asked.
#[derive(Debug, Clone)]
pub struct TokenOut {
    pub text: String,
    pub logprob: Option<Logprob>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens and their logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone)]
pub struct Finish {
    pub reason: StopReason,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt lookup's guesses checked, and those accepted.
    pub drafted: usize,
    pub accepted: usize,
}

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences served at once, each with its own state of `n_ctx` positions.
    pub slots: usize,
    pub n_ctx: usize,
    /// Tokens per step, all sequences together (decode tokens first, then prompt chunks).
    pub step_tokens: usize,
    /// Prompt lookup: up to this many guessed tokens checked with a sequence's next token
    /// (0: off). The output is the same, bit for bit.
    pub lookup: usize,
}

/// The handlers' way to the scheduler: a queue of bounded depth.
#[derive(Clone)]
pub struct Queue {
    tx: mpsc::Sender<Job>,
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Full,
    Stopped,
}

impl Queue {
    pub fn new(max_waiting: usize) -> (Queue, mpsc::Receiver<Job>, Arc<AtomicUsize>) {
        let (tx, rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let q = Queue {
            tx,
            waiting: waiting.clone(),
            max_waiting,
        };
        (q, rx, waiting)
    }

    /// Queue `jobs` (a request's choices) together, or none of them.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), Refused> {
        let n = jobs.len();
        let before = self.waiting.fetch_add(n, Ordering::SeqCst);
        if before + n > self.max_waiting {
            self.waiting.fetch_sub(n, Ordering::SeqCst);
            return Err(Refused::Full);
        }
        for (i, job) in jobs.into_iter().enumerate() {
            if self.tx.send(job).is_err() {
                // The scheduler is gone: the jobs not sent never wait.
                self.waiting.fetch_sub(n - i, Ordering::SeqCst);
                return Err(Refused::Stopped);
            }
        }
        Ok(())
    }

    /// Jobs the queue holds at most.
    pub fn capacity(&self) -> usize {
        self.max_waiting
    }

    /// Jobs queued and not yet in a slot.
    pub fn depth(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

/// A sequence state and the tokens its cache holds (`cached.len() == state.pos`).
struct Slot<'t> {
    state: State,
    cached: Vec<u32>,
    last_used: u64,
    active: Option<Active<'t>>,
    /// Where a recurrent state's last speculative pass began, to come back to when guesses
    /// fail (it cannot rewind).
    cp: Checkpoint,
}

/// The request a slot is serving.
struct Active<'t> {
    job: Job,
    dec: Decoding<'t>,
    /// Prompt tokens fed so far (the cached prefix included).
    fed: usize,
    cached_tokens: usize,
    /// The token to feed next once the prompt is in.
    next: Option<u32>,
    /// The tokens of its next or last decode pass: `next`, then guesses of the tokens after.
    pass: Vec<u32>,
    guesses: GuessLength,
    drafted: usize,
    accepted: usize,
    last_token_at: Option<Instant>,
}

/// The scheduler's loop; returns when every [`Queue`] is dropped and no work is left.
pub fn run(
    model: &dyn Model,
    tok: &Tokenizer,
    cfg: &SchedulerConfig,
    threads: &Threads,
    jobs: mpsc::Receiver<Job>,
    waiting: Arc<AtomicUsize>,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    let mut batch = model.new_batch(cfg.step_tokens)?;
    // States of a joint pass use the batch's scratch; the others read prompts in chunks of
    // the step's size in their own.
    let scratch = if batch.is_joint() { 1 } else { cfg.step_tokens };
    let mut slots = (0..cfg.slots)
        .map(|_| {
            Ok(Slot {
                state: model.new_state(cfg.n_ctx, scratch)?,
                cached: Vec::new(),
                last_used: 0,
                active: None,
                cp: Checkpoint::default(),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let n_vocab = model.info().n_vocab;
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut logits: Vec<f32> = Vec::new();
    let mut clock = 0u64;
    loop {
        let busy = slots.iter().any(|s| s.active.is_some());
        if !busy && queue.is_empty() {
            match jobs.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => return Ok(()),
            }
        }
        while let Ok(job) = jobs.try_recv() {
            queue.push_back(job);
        }
        // Sequences whose client has gone stop here, within a step.
        for s in &mut slots {
            if s.active.as_ref().is_some_and(|a| a.job.events.is_closed()) {
                s.active = None;
                metrics.cancelled.inc();
            }
        }
        while slots.iter().any(|s| s.active.is_none()) {
            let Some(job) = queue.pop_front() else { break };
            waiting.fetch_sub(1, Ordering::SeqCst);
            if job.events.is_closed() {
                continue;
            }
            clock += 1;
            admit(&mut slots, job, tok, n_vocab, clock, cfg.lookup, metrics);
        }
        metrics
            .queue_depth
            .set(waiting.load(Ordering::SeqCst) as i64);

        // The step: every generating sequence's next token, then prompt chunks in the order
        // the requests came, within the step's budget.
        let mut budget = cfg.step_tokens;
        let mut plan: Vec<(usize, usize, Logits)> = Vec::new(); // (slot, tokens, logits)
        let decoding = slots
            .iter()
            .filter(|s| s.active.as_ref().is_some_and(|a| a.next.is_some()))
            .count();
        // Guesses share what the decode tokens leave of the step.
        let mut guess_budget = cfg.step_tokens.saturating_sub(decoding);
        for (i, s) in slots.iter_mut().enumerate() {
            if let Some(a) = &mut s.active {
                let Some(t) = a.next else { continue };
                if budget == 0 {
                    continue;
                }
                a.pass.clear();
                a.pass.push(t);
                if cfg.lookup > 0 {
                    let k = a
                        .guesses
                        .for_next_pass()
                        .min(guess_budget)
                        .min(budget - 1)
                        .min(s.state.n_ctx().saturating_sub(s.state.pos + 1))
                        .min(a.dec.remaining().saturating_sub(1));
                    if k > 0 {
                        s.cached.push(t);
                        Lookup::default().draft(&s.cached, k, &mut a.pass);
                        s.cached.pop();
                        guess_budget -= a.pass.len() - 1;
                    }
                }
                let n = a.pass.len();
                if n > 1 && s.state.is_recurrent() {
                    s.state.checkpoint(&mut s.cp);
                }
                plan.push((i, n, if n > 1 { Logits::All } else { Logits::Last }));
                budget -= n;
            }
        }
        let mut reading: Vec<usize> = (0..slots.len())
            .filter(|&i| {
                let a = slots[i].active.as_ref();
                a.is_some_and(|a| a.next.is_none() && a.fed < a.job.prompt.len())
            })
            .collect();
        reading.sort_by_key(|&i| slots[i].active.as_ref().map(|a| a.job.arrived));
        for i in reading {
            if budget == 0 {
                break;
            }
            let a = slots[i].active.as_ref().expect("reading slots are active");
            let n = (a.job.prompt.len() - a.fed).min(budget);
            let last = a.fed + n == a.job.prompt.len();
            plan.push((i, n, if last { Logits::Last } else { Logits::None }));
            budget -= n;
        }
        if plan.is_empty() {
            continue;
        }
        // Decode tokens first, side by side (their attention is one call), then prompt
        // chunks, each in slot order; any order gives the same bits.
        plan.sort_by_key(|&(slot, n, want)| (n > 1 || want == Logits::None, slot));
        let rows: usize = plan.iter().map(|&(_, n, want)| want.rows(n)).sum();
        logits.resize(rows * n_vocab, 0.0);
        let t0 = Instant::now();
        let result = {
            // Each planned slot's state, in the plan's order (a slot is planned once).
            let mut states: Vec<Option<&mut Slot>> = slots.iter_mut().map(Some).collect();
            let mut seqs = Vec::with_capacity(plan.len());
            for &(i, n, want) in &plan {
                let s = states[i].take().expect("a slot is planned once");
                let a = s.active.as_ref().expect("planned slots are active");
                let tokens: &[u32] = match a.next {
                    Some(_) => &a.pass,
                    None => &a.job.prompt[a.fed..a.fed + n],
                };
                seqs.push(Seq {
                    state: &mut s.state,
                    tokens,
                    logits: want,
                });
            }
            model.forward_batch(&mut batch, &mut seqs, &mut logits, threads)
        };
        metrics.step(plan.len(), plan.iter().map(|p| p.1).sum(), t0.elapsed());
        if let Err(e) = result {
            // A pass that fails fails its sequences, whose states are then unknown.
            for &(i, _, _) in &plan {
                let s = &mut slots[i];
                if let Some(a) = s.active.take() {
                    let _ = a.job.events.send(Event::Error(e.to_string()));
                }
                s.state.reset();
                s.cached.clear();
            }
            continue;
        }
        let mut row = 0;
        for &(i, n, want) in &plan {
            let s = &mut slots[i];
            let a = s.active.as_mut().expect("planned slots are active");
            let first = row;
            row += want.rows(n);
            if a.next.take().is_none() {
                s.cached.extend_from_slice(&a.job.prompt[a.fed..a.fed + n]);
                a.fed += n;
                if want == Logits::Last {
                    let l = &logits[first * n_vocab..(first + 1) * n_vocab];
                    let room = s.state.pos < s.state.n_ctx();
                    deliver(a, l, room, tok, metrics);
                }
            } else {
                // A decode pass: the token drawn from each row goes on to the next row while
                // it is the guess there; the guesses after the last row used are dropped.
                let base = s.state.pos - n;
                s.cached.extend_from_slice(&a.pass);
                let mut used = 0;
                for r in 0..n {
                    let l = &logits[(first + r) * n_vocab..(first + r + 1) * n_vocab];
                    used = r + 1;
                    deliver(a, l, base + r + 1 < s.state.n_ctx(), tok, metrics);
                    if a.next.is_none() || a.pass.get(r + 1) != a.next.as_ref() {
                        break;
                    }
                    a.next = None;
                }
                let (guessed, accepted) = (n - 1, used - 1);
                a.guesses.observe(guessed, accepted);
                a.drafted += guessed;
                a.accepted += accepted;
                metrics.speculated(guessed, accepted);
                let keep = base + used;
                let back = model.take_back(&mut s.state, &s.cp, &a.pass, keep, threads);
                if let Err(e) = back {
                    let _ = a.job.events.send(Event::Error(e.to_string()));
                    s.active = None;
                    s.state.reset();
                    s.cached.clear();
                    continue;
                }
                s.cached.truncate(s.state.pos);
            }
            if let Some(reason) = a.dec.stopped() {
                let done = Finish {
                    reason,
                    prompt_tokens: a.job.prompt.len(),
                    cached_tokens: a.cached_tokens,
                    completion_tokens: a.dec.tokens().len(),
                    drafted: a.drafted,
                    accepted: a.accepted,
                };
                metrics.finished();
                let _ = a.job.events.send(Event::Done(done));
                s.active = None;
            }
        }
    }
}

/// Draw a sequence's next token from `l` (the logits after its last token; `room`: the state
/// has a position for the token), send it with its text, and set what to feed next.
fn deliver(a: &mut Active, l: &[f32], room: bool, tok: &Tokenizer, metrics: &Metrics) {
    let step = a.dec.step(l, room);
    let logprob = match (a.job.logprobs, step.token) {
        (Some(k), Some(t)) => Some(logprob(l, t, k)),
        _ => None,
    };
    let now = Instant::now();
    match a.last_token_at {
        None => metrics.first_token(now - a.job.arrived),
        Some(t) => metrics.next_token(now - t),
    }
    a.last_token_at = Some(now);
    if step.token.is_some_and(|t| !tok.is_eog(t)) {
        metrics.generated_tokens.inc();
    }
    if step.token.is_some() || !step.text.is_empty() {
        let out = TokenOut {
            text: step.text,
            logprob,
        };
        let _ = a.job.events.send(Event::Token(out));
    }
    a.next = step.feed;
}

/// Put `job` in a free slot: the one whose cache shares the longest prefix with the prompt
/// (least recently used among equals), after copying a longer prefix from any other slot.
/// At least the prompt's last token is fed again: its logits are needed.
fn admit<'t>(
    slots: &mut [Slot<'t>],
    job: Job,
    tok: &'t Tokenizer,
    n_vocab: usize,
    clock: u64,
    lookup: usize,
    metrics: &Metrics,
) {
    let prompt = &job.prompt;
    let usable = prompt.len() - 1;
    let reuse = |s: &Slot| shared_prefix(&s.cached, prompt).min(usable);
    let target = (0..slots.len())
        .filter(|&i| slots[i].active.is_none())
        .max_by_key(|&i| (reuse(&slots[i]), std::cmp::Reverse(slots[i].last_used)))
        .expect("admit is called with a free slot");
    let have = reuse(&slots[target]);
    let source = (0..slots.len())
        .filter(|&i| i != target)
        .max_by_key(|&i| reuse(&slots[i]))
        .filter(|&i| reuse(&slots[i]) > have);
    if let Some(src) = source {
        let n = reuse(&slots[src]);
        let (a, b) = if src < target {
            let (l, r) = slots.split_at_mut(target);
            (&l[src], &mut r[0])
        } else {
            let (l, r) = slots.split_at_mut(src);
            (&r[0], &mut l[target])
        };
        if b.state.copy_prefix(&a.state, n) {
            b.cached.clear();
            b.cached.extend_from_slice(&a.cached[..n]);
        }
    }
    let s = &mut slots[target];
    let keep = reuse(s);
    if !s.state.rewind(keep) {
        // A recurrent state cannot go back: start over.
        s.state.reset();
    }
    s.cached.truncate(s.state.pos);
    let cached_tokens = s.state.pos;
    metrics.admitted(prompt.len(), cached_tokens);
    s.last_used = clock;
    let dec = Decoding::new(
        tok,
        n_vocab,
        &Request {
            prompt,
            max_tokens: job.max_tokens,
            stop: &job.stop,
            sampling: job.sampling.clone(),
        },
    );
    s.active = Some(Active {
        dec,
        fed: cached_tokens,
        cached_tokens,
        next: None,
        pass: Vec::new(),
        guesses: GuessLength::new(lookup),
        drafted: 0,
        accepted: 0,
        last_token_at: None,
        job,
    });
}

/// The logprob of `token` under `logits` and the `k` most likely tokens' (log-softmax in f64,
/// ties by token id).
pub fn logprob(logits: &[f32], token: u32, k: usize) -> Logprob {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = logits
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    let lp = |t: u32| (logits[t as usize] as f64 - lse) as f32;
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let by = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = k.min(idx.len());
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by);
    }
    idx.truncate(k);
    idx.sort_unstable_by(by);
    Logprob {
        token,
        logprob: lp(token),
        top: idx.into_iter().map(|t| (t, lp(t))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_most_likely_first() {
        let l = [1.0f32, 3.0, 2.0, 3.0];
        let p = logprob(&l, 2, 3);
        let z: f64 = l.iter().map(|&v| (v as f64).exp()).sum();
        assert!((p.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        let top: Vec<u32> = p.top.iter().map(|t| t.0).collect();
        assert_eq!(top, [1, 3, 2]);
        assert_eq!(logprob(&l, 0, 0).top, []);
        assert_eq!(logprob(&l, 0, 9).top.len(), 4);
    }

    #[test]
    fn a_full_queue_refuses_a_request_whole() {
        let (q, _rx, _) = Queue::new(3);
        let job = || {
            let (tx, _) = tokio::sync::mpsc::unbounded_channel();
            Job {
                prompt: vec![1],
                max_tokens: 1,
                stop: vec![],
                sampling: SamplerConfig::greedy(),
                logprobs: None,
                events: tx,
                arrived: Instant::now(),
            }
        };
        assert_eq!(q.submit(vec![job(), job()]), Ok(()));
        assert_eq!(q.submit(vec![job(), job()]), Err(Refused::Full));
        assert_eq!(q.depth(), 2);
        assert_eq!(q.submit(vec![job()]), Ok(()));
    }
}

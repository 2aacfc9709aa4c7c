//! `GET /metrics`: the server's counters and histograms in Prometheus's text format.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub struct Metrics {
    registry: Registry,
    pub requests: Counter,
    pub rejected: Counter,
    pub cancelled: Counter,
    pub prompt_tokens: Counter,
    pub cached_tokens: Counter,
    pub cache_hits: Counter,
    pub generated_tokens: Counter,
    draft_tokens: Counter,
    draft_accepted: Counter,
    pub queue_depth: Gauge,
    batch_sequences: Histogram,
    batch_tokens: Histogram,
    step_seconds: Histogram,
    ttft: Histogram,
    tpot: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("synapse");
        let counts = || Histogram::new(exponential_buckets(1.0, 2.0, 12));
        let seconds = || Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let m = Metrics {
            requests: Counter::default(),
            rejected: Counter::default(),
            cancelled: Counter::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            cache_hits: Counter::default(),
            generated_tokens: Counter::default(),
            draft_tokens: Counter::default(),
            draft_accepted: Counter::default(),
            queue_depth: Gauge::default(),
            batch_sequences: counts(),
            batch_tokens: counts(),
            step_seconds: seconds(),
            ttft: seconds(),
            tpot: seconds(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "requests_finished",
            "Sequences generated to their end",
            m.requests.clone(),
        );
        r.register(
            "requests_rejected",
            "Requests refused with a full queue",
            m.rejected.clone(),
        );
        r.register(
            "requests_cancelled",
            "Sequences stopped because their client went away",
            m.cancelled.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of sequences given a slot",
            m.prompt_tokens.clone(),
        );
        r.register(
            "prompt_tokens_cached",
            "Prompt tokens taken from the prefix cache instead of computed",
            m.cached_tokens.clone(),
        );
        r.register(
            "prefix_cache_hits",
            "Sequences that reused a cached prefix",
            m.cache_hits.clone(),
        );
        r.register(
            "generated_tokens",
            "Tokens generated (cancelled sequences' included)",
            m.generated_tokens.clone(),
        );
        r.register(
            "draft_tokens",
            "Tokens guessed by prompt lookup and checked (--lookup)",
            m.draft_tokens.clone(),
        );
        r.register(
            "draft_accepted_tokens",
            "Guessed tokens the model agreed with, each a token without a pass of its own",
            m.draft_accepted.clone(),
        );
        r.register(
            "queue_depth",
            "Sequences waiting for a slot",
            m.queue_depth.clone(),
        );
        r.register(
            "batch_sequences",
            "Sequences per batched step",
            m.batch_sequences.clone(),
        );
        r.register(
            "batch_tokens",
            "Tokens per batched step",
            m.batch_tokens.clone(),
        );
        r.register(
            "step_seconds",
            "Time of a batched step",
            m.step_seconds.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "From a request's arrival to its first token",
            m.ttft.clone(),
        );
        r.register(
            "time_per_output_token_seconds",
            "Between a sequence's tokens",
            m.tpot.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn step(&self, sequences: usize, tokens: usize, took: Duration) {
        self.batch_sequences.observe(sequences as f64);
        self.batch_tokens.observe(tokens as f64);
        self.step_seconds.observe(took.as_secs_f64());
    }

    /// A sequence given a slot, with `cached` of its `prompt` tokens from the prefix cache.
    pub fn admitted(&self, prompt: usize, cached: usize) {
        self.prompt_tokens.inc_by(prompt as u64);
        self.cached_tokens.inc_by(cached as u64);
        if cached > 0 {
            self.cache_hits.inc();
        }
    }

    pub fn first_token(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    pub fn next_token(&self, d: Duration) {
        self.tpot.observe(d.as_secs_f64());
    }

    /// A decode pass checked `guessed` guesses and accepted `accepted`.
    pub fn speculated(&self, guessed: usize, accepted: usize) {
        self.draft_tokens.inc_by(guessed as u64);
        self.draft_accepted.inc_by(accepted as u64);
    }

    pub fn finished(&self) {
        self.requests.inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

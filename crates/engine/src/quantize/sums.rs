//! The sums of an importance matrix: the sum of squares of every column of every product's
//! input, as llama-imatrix sums them.
//!
//! The forward pass reports each product's input here (`dense`, `routed`); nothing is done
//! unless a [`Collector`] is installed on the thread running the pass ([`collecting`]), so the
//! cost elsewhere is one thread-local read a product.
//!
//! llama-imatrix's rules, followed so that the sums are its sums bit for bit: a dense product
//! counts only for matrices of the layers (`blk.*`, and `output.weight` if asked) and only in
//! passes of 16 tokens or more; each column adds the squares of its rows in token order, in
//! f32. A mixture's expert product counts always: the rows go slot by slot (every token's first
//! expert, then every token's second, ...), each to its expert's sums.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// Passes of fewer tokens are not counted (llama-imatrix's rule for dense products).
const MIN_TOKENS: usize = 16;

/// The sums of one matrix: `values` (one run of columns per expert; one run for a dense
/// matrix) and the rows added into each run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stat {
    pub values: Vec<f32>,
    pub counts: Vec<i64>,
}

/// What has been collected.
#[derive(Debug, Clone, Default)]
pub struct Collector {
    /// Also collect the output projection's input.
    pub process_output: bool,
    pub stats: BTreeMap<String, Stat>,
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static ACTIVE: RefCell<Option<Collector>> = const { RefCell::new(None) };
}

/// Run `f` with `collector` taking the inputs of the products this thread's passes compute,
/// and return it with `f`'s result.
pub fn collecting<R>(collector: Collector, f: impl FnOnce() -> R) -> (Collector, R) {
    ACTIVE.with(|a| *a.borrow_mut() = Some(collector));
    ON.with(|on| on.set(true));
    // Taken back even if `f` unwinds, so that a later pass on this thread collects nothing.
    struct Off;
    impl Drop for Off {
        fn drop(&mut self) {
            ON.with(|on| on.set(false));
        }
    }
    let off = Off;
    let r = f();
    drop(off);
    let c = ACTIVE.with(|a| a.borrow_mut().take()).unwrap_or_default();
    (c, r)
}

fn with_active(f: impl FnOnce(&mut Collector)) {
    if ON.with(Cell::get) {
        ACTIVE.with(|a| {
            if let Some(c) = a.borrow_mut().as_mut() {
                f(c)
            }
        });
    }
}

fn entry<'c>(c: &'c mut Collector, name: &str, cols: usize, runs: usize) -> &'c mut Stat {
    let s = c.stats.entry(name.to_string()).or_default();
    if s.values.is_empty() {
        s.values = vec![0.0; cols * runs];
        s.counts = vec![0; runs];
    }
    s
}

fn add_squares(acc: &mut [f32], x: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v * v;
    }
}

/// The input of a dense product of matrix `name`: `n` rows of `cols` values.
pub(crate) fn dense(name: &str, x: &[f32], n: usize, cols: usize) {
    with_active(|c| {
        let wanted = name.starts_with("blk.") || (c.process_output && name == "output.weight");
        if !wanted || n < MIN_TOKENS {
            return;
        }
        let s = entry(c, name, cols, 1);
        if s.values.len() != cols {
            return;
        }
        for row in x[..n * cols].chunks_exact(cols) {
            add_squares(&mut s.values, row);
        }
        s.counts[0] += n as i64;
    })
}

/// The input of a mixture's expert product `name` (its `n_expert` experts stacked): `n`
/// tokens with `k` experts each; `expert(t, i)` is token `t`'s `i`-th expert and `row(t, i)`
/// the `cols` values it multiplies.
pub(crate) fn routed<'x>(
    name: &str,
    n_expert: usize,
    cols: usize,
    (n, k): (usize, usize),
    expert: impl Fn(usize, usize) -> usize,
    row: impl Fn(usize, usize) -> &'x [f32],
) {
    with_active(|c| {
        let s = entry(c, name, cols, n_expert);
        if s.values.len() != cols * n_expert {
            return;
        }
        for i in 0..k {
            for t in 0..n {
                let e = expert(t, i);
                s.counts[e] += 1;
                add_squares(&mut s.values[e * cols..(e + 1) * cols], row(t, i));
            }
        }
    })
}

//! Time of causal attention over a filled KV cache, per head and position: a batch of `n`
//! tokens at positions `depth..depth + n` over one layer (`attend_batch`), as prefill at depth
//! runs it. Shapes default to SmolLM2-135M's (9 query heads, 3 KV heads, 64 values a head).
//!
//! `cargo run --release -p synapse-engine --example attnbench -- [depth] [n] [threads]
//! [n_head] [n_head_kv] [head_dim]`

use std::time::Instant;

use synapse_engine::attention::{attend_batch, AttnShape};
use synapse_engine::kv::KvCache;
use synapse_engine::Threads;

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .map_or(d, |a| a.parse().expect("a number"))
    };
    let (depth, n, threads) = (arg(1, 2048), arg(2, 64), arg(3, 1));
    let (n_head, n_head_kv, head_dim) = (arg(4, 9), arg(5, 3), arg(6, 64));
    let s = AttnShape {
        n_head,
        n_head_kv,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let kv_dim = n_head_kv * head_dim;
    let n_pos = depth + n;
    // `ATTNBENCH_LAYERS`: that many layers, attended one after the other in each timed run, so
    // that the cache is read cold as a decode step reads it (default one layer, hot).
    let layers: usize = std::env::var("ATTNBENCH_LAYERS").map_or(1, |r| r.parse().unwrap_or(1));
    let mut kv = KvCache::new(layers, n_pos, n_head_kv, head_dim);
    // A deterministic spread of values: scores of a few units, as in a trained model.
    let mut x = 0x2545_f491_u32;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x as f32 / u32::MAX as f32 - 0.5) * 4.0
    };
    for p in 0..n_pos {
        let k: Vec<f32> = (0..kv_dim).map(|_| next()).collect();
        let v: Vec<f32> = (0..kv_dim).map(|_| next()).collect();
        for l in 0..layers {
            kv.store(l, p, &k, &v);
        }
    }
    let q: Vec<f32> = (0..n * n_head * head_dim).map(|_| next()).collect();
    let mut out = vec![0.0f32; q.len()];
    let threads = Threads::new(threads);
    let run = |out: &mut [f32]| {
        for l in 0..layers {
            attend_batch(&s, &q, &kv, l, depth, None, out, &threads);
        }
    };
    run(&mut out);
    // More for a profile (`ATTNBENCH_REPS`); the best is reported.
    let reps: usize = std::env::var("ATTNBENCH_REPS").map_or(20, |r| r.parse().unwrap_or(20));
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        run(&mut out);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let head_positions = (0..n).map(|t| depth + t + 1).sum::<usize>() * n_head * layers;
    println!(
        "depth {depth} n {n} threads {} heads {n_head}/{n_head_kv}x{head_dim} layers {layers}: \
         {:.3} ms, \
         {:.2} ns a head-position (checksum {:.6})",
        threads.n(),
        best * 1e3,
        best * 1e9 / head_positions as f64,
        out.iter().map(|&v| v as f64).sum::<f64>()
    );
}

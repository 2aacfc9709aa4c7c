//! Perplexity's sums whatever the threads and wherever the rows are scored: on the pool after
//! each window, or on a thread of their own beside the next window's pass.

mod common;

use synapse_engine::perplexity::{perplexity, PerplexityConfig};
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::Threads;
use synapse_gguf::GgufFile;

#[test]
fn scoring_aside_or_on_the_pool_gives_the_same_bits() {
    let file = GgufFile::open(common::data("tiny-F16.gguf")).unwrap();
    let model = synapse_engine::load(&file).unwrap();
    let tok = Tokenizer::from_metadata(file.metadata()).unwrap();
    let text = std::fs::read_to_string(common::data("eval.txt")).unwrap();
    let tokens = tok.tokenize(&text, true, false);
    let run = |aside: bool, threads: usize| {
        let cfg = PerplexityConfig {
            n_ctx: 64,
            n_batch: 16,
            chunks: None,
            score_aside: aside,
        };
        let mut running = Vec::new();
        let est = perplexity(
            model.as_ref(),
            &tokens,
            None,
            &cfg,
            &Threads::new(threads),
            |i, p| running.push((i, p.to_bits())),
            None,
        )
        .unwrap();
        (
            est.ppl.to_bits(),
            est.uncertainty.to_bits(),
            est.count,
            running,
        )
    };
    let want = run(false, 1);
    assert!(want.3.len() >= 30, "{} windows", want.3.len());
    for (aside, threads) in [(true, 1), (true, 3), (false, 5)] {
        assert_eq!(
            run(aside, threads),
            want,
            "aside {aside}, {threads} threads"
        );
    }
}

//! `synapse perplexity` prints what llama-perplexity prints, to every digit, whatever the batch
//! size and the thread count here. The golden output is llama.cpp's: `llama-perplexity -m
//! SmolLM2-135M-Instruct.Q4_1.gguf -f perplexity.txt -c 128 -b 128 -ub 1 -t 2` (the
//! llama-cpp-python 0.3.36 sdist's build). With `-ub 1` llama.cpp runs its one-token arithmetic,
//! which synapse's logits equal at any batch; its default batched arithmetic is another (not
//! batch-invariant), and there it printed `[1]33.1698,...` and a final 41.1239 +/- 6.92970 for
//! these windows (40.7828 +/- 6.84891 here).

mod common;
use common::*;

fn data(name: &str) -> String {
    root()
        .join("crates/cli/tests/data")
        .join(name)
        .to_str()
        .unwrap()
        .to_string()
}

/// `synapse perplexity` of SmolLM2 over the test text, with `args` after it.
fn perplexity(args: &[&str]) -> std::process::Output {
    let model = smollm2();
    let text = data("perplexity.txt");
    let mut all = vec!["perplexity", "-m", model.to_str().unwrap(), "-f", &text];
    all.extend_from_slice(args);
    synapse(&all)
}

#[test]
fn perplexity_prints_llama_perplexitys_numbers() {
    let golden = std::fs::read_to_string(data("perplexity.golden")).unwrap();
    for (b, t) in [("128", "2"), ("37", "3"), ("128", "8")] {
        let out = ok(&perplexity(&["-c", "128", "-b", b, "-t", t]));
        assert_eq!(out, golden, "-b {b} -t {t}");
    }
    // Fewer windows: the running values so far, and an estimate of those alone.
    let out = ok(&perplexity(&["-c", "128", "--chunks", "2"]));
    assert!(out.starts_with("[1]32.5536,[2]40.9379,\n"), "{out}");
}

#[test]
fn a_text_shorter_than_two_windows_or_no_window_is_an_error() {
    let err = error(&perplexity(&["-c", "512"]));
    assert!(err.contains("682 tokens") && err.contains("1024"), "{err}");
    let err = error(&perplexity(&["-c", "128", "--chunks", "0"]));
    assert!(err.contains("no window"), "{err}");
}

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
    for (b, t) in [("128", "2"), ("37", "3"), ("128", "8"), ("64", "1")] {
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

/// A path under `tests/data/kld`.
fn kld(name: &str) -> String {
    data(&format!("kld/{name}"))
}

/// `--kl-divergence-base` writes llama-perplexity's base file byte for byte, and prints what it
/// prints on such a run (its log-probabilities counted in f32), at any batch and thread count:
/// the random-weight tiny llama in Q8_0 over 4 windows of 128 (`scripts/golden/kl_divergence.sh`).
#[test]
fn a_base_run_writes_llama_perplexitys_file() {
    let dir = tempfile::tempdir().unwrap();
    let want = std::fs::read(kld("tiny-Q8_0.base")).unwrap();
    let golden = std::fs::read_to_string(kld("tiny-Q8_0.base.golden")).unwrap();
    for (b, t) in [("128", "2"), ("37", "3"), ("1", "8")] {
        let base = dir.path().join(format!("b{b}.base"));
        let out = ok(&synapse(&[
            "perplexity",
            "-m",
            &s(forward_data("tiny-Q8_0.gguf")),
            "-f",
            &data("perplexity.txt"),
            "-c",
            "128",
            "--chunks",
            "4",
            "-b",
            b,
            "-t",
            t,
            "--kl-divergence-base",
            base.to_str().unwrap(),
        ]));
        assert_eq!(out, golden, "-b {b} -t {t}");
        assert!(
            std::fs::read(&base).unwrap() == want,
            "-b {b} -t {t}: base file"
        );
    }
}

/// `--kl-divergence` against llama.cpp's base prints llama-perplexity's table and statistics,
/// every digit: the same weights in Q4_0, whatever the batch and the threads.
#[test]
fn a_comparison_prints_llama_perplexitys_statistics() {
    let golden = std::fs::read_to_string(kld("tiny-Q4_0.kld.golden")).unwrap();
    for (b, t) in [("128", "2"), ("37", "5"), ("1", "1")] {
        let out = ok(&synapse(&[
            "perplexity",
            "-m",
            &s(forward_data("tiny-Q4_0.gguf")),
            "-c",
            "128",
            "-b",
            b,
            "-t",
            t,
            "--kl-divergence-base",
            &kld("tiny-Q8_0.base"),
            "--kl-divergence",
        ]));
        assert_eq!(out, golden, "-b {b} -t {t}");
    }
}

/// A base of another vocabulary, a file that is no base, a truncated one, and a run that fails
/// before its end (leaving no base behind) are errors that say so.
#[test]
fn bad_bases_are_named_and_none_is_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let compare = |model: &str, base: &str| {
        error(&synapse(&[
            "perplexity",
            "-m",
            model,
            "--kl-divergence-base",
            base,
            "--kl-divergence",
        ]))
    };
    let tiny = s(forward_data("tiny-Q4_0.gguf"));
    let err = compare(&s(smollm2()), &kld("tiny-Q8_0.base"));
    assert!(err.contains("257") && err.contains("49152"), "{err}");
    let err = compare(&tiny, &data("perplexity.txt"));
    assert!(err.contains("_logits_"), "{err}");
    let bytes = std::fs::read(kld("tiny-Q8_0.base")).unwrap();
    let cut = dir.path().join("cut.base");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let err = compare(&tiny, cut.to_str().unwrap());
    assert!(err.contains("window 4"), "{err}");
    let err = error(&synapse(&["perplexity", "-m", &tiny, "--kl-divergence"]));
    assert!(err.contains("--kl-divergence-base"), "{err}");
    // A text too short for two windows of 4096: an error, and no base file.
    let base = dir.path().join("never.base");
    let err = error(&synapse(&[
        "perplexity",
        "-m",
        &tiny,
        "-f",
        &data("perplexity.txt"),
        "-c",
        "4096",
        "--kl-divergence-base",
        base.to_str().unwrap(),
    ]));
    assert!(err.contains("8192"), "{err}");
    assert!(!base.exists(), "a failed run left a base behind");
}

//! The fuzz targets' corpora, replayed on stable without libFuzzer: every file committed under
//! `fuzz/corpus/<target>/` goes through the same check the target runs (`fuzz/checks/`, included
//! here as it is there), so `cargo test` keeps what the fuzzer learned. Run the fuzzers with
//! `scripts/fuzz.sh TARGET MINUTES` (nightly, cargo-fuzz).
//!
//! Inputs that crashed a target stay under `fuzz/artifacts/<target>/` (not committed) until
//! fixed; `cargo test --test fuzz_corpus -- --ignored` replays those too.

#[path = "../../../fuzz/checks/mod.rs"]
mod checks;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

/// Every file of `dir` (sorted; none if it does not exist) through `check`; a panic is
/// collected with the file's name, so one run names every failing input.
fn replay(dir: PathBuf, check: impl Fn(&[u8]), min_files: usize) {
    let t = Instant::now();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(d) => d
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    assert!(
        files.len() >= min_files,
        "{}: {} files, at least {min_files} expected",
        dir.display(),
        files.len()
    );
    let mut failures = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| check(&data))) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {msg}", f.display()));
        }
    }
    eprintln!(
        "{}: {} inputs in {:.2} s",
        dir.display(),
        files.len(),
        t.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn corpus(target: &str) -> PathBuf {
    checks::repo_root().join("fuzz/corpus").join(target)
}

fn artifacts(target: &str) -> PathBuf {
    checks::repo_root().join("fuzz/artifacts").join(target)
}

#[test]
fn parse_gguf_corpus_replays() {
    replay(corpus("parse_gguf"), checks::parse_gguf::check, 100);
}

#[test]
fn tokenize_corpus_replays() {
    checks::tokenize::init();
    replay(corpus("tokenize"), checks::tokenize::check, 1);
}

#[test]
fn imatrix_corpus_replays() {
    replay(corpus("imatrix"), checks::imatrix::check, 5);
}

#[test]
fn chat_template_corpus_replays() {
    replay(corpus("chat_template"), checks::chat_template::check, 1);
}

#[test]
fn load_model_corpus_replays() {
    use checks::load_model::{run, Reached};
    checks::load_model::init();
    // How far the corpus gets: a corpus that never reaches the forward pass tests little.
    let reached = std::sync::Mutex::new(std::collections::BTreeMap::<Reached, usize>::new());
    let verbose = std::env::var_os("FUZZ_CORPUS_VERBOSE").is_some();
    let check = |data: &[u8]| {
        let r = run(data);
        if verbose {
            eprintln!("{:02x?}...: {r:?}", &data[..data.len().min(8)]);
        }
        *reached.lock().unwrap().entry(r).or_insert(0) += 1;
    };
    replay(corpus("load_model"), check, 1);
    let reached = reached.into_inner().unwrap();
    eprintln!("load_model corpus reached: {reached:?}");
    assert!(reached.contains_key(&Reached::Ran));
}

/// The inputs that crashed a target and are not fixed yet (or are, and were not deleted).
#[test]
#[ignore = "known crashes until fixed: run with --ignored"]
fn fuzz_artifacts_replay() {
    checks::tokenize::init();
    checks::load_model::init();
    type Check = fn(&[u8]);
    let targets: [(&str, Check); 5] = [
        ("parse_gguf", checks::parse_gguf::check),
        ("imatrix", checks::imatrix::check),
        ("tokenize", checks::tokenize::check),
        ("chat_template", checks::chat_template::check),
        ("load_model", checks::load_model::check),
    ];
    for (name, check) in targets {
        replay(artifacts(name), check, 0);
    }
}

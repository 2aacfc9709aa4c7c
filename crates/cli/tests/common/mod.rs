//! What the binary's tests share: where the repository and its models are, running the
//! binary, and reading its success or its clean failure.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod server;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn smollm2() -> PathBuf {
    let p = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

pub fn forward_data(name: &str) -> PathBuf {
    root().join("crates/engine/tests/data/forward").join(name)
}

pub fn synapse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_synapse"))
        .args(args)
        .output()
        .expect("run synapse")
}

pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "synapse failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

pub fn error(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean failure: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// A path as the `&str` an argument list takes.
pub fn s(p: PathBuf) -> String {
    p.to_str().unwrap().to_string()
}

//! Fuzz the importance-matrix reader: hostile GGUF and legacy files.
//! The property: `fuzz/checks/imatrix.rs`, shared with the stable replay test
//! (`crates/engine/tests/fuzz_corpus.rs`).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| checks::imatrix::check(data));

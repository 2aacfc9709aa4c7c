//! Fuzz model loading and the forward pass with lying metadata.
//! The property: `fuzz/checks/load_model.rs`, shared with the stable replay test
//! (`crates/engine/tests/fuzz_corpus.rs`).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: checks::load_model::init(), |data: &[u8]| checks::load_model::check(data));

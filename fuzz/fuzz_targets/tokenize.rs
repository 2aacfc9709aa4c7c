//! Fuzz the tokenizers of the real vocabularies: encode, decode and stream round trips.
//! The property: `fuzz/checks/tokenize.rs`, shared with the stable replay test
//! (`crates/engine/tests/fuzz_corpus.rs`).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: checks::tokenize::init(), |data: &[u8]| checks::tokenize::check(data));

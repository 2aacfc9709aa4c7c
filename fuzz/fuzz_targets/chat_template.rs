//! Fuzz chat templates: hostile template sources and messages.
//! The property: `fuzz/checks/chat_template.rs`, shared with the stable replay test
//! (`crates/engine/tests/fuzz_corpus.rs`).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| checks::chat_template::check(data));

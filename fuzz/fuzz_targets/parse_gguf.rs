//! Fuzz the GGUF parser, and the block decoders on whatever tensors a parsed file holds: see
//! `fuzz/checks/parse_gguf.rs` (shared with the stable replay test).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| checks::parse_gguf::check(data));

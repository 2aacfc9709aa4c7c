//! The properties the fuzz targets check, one module per target.
//!
//! Each module's `check(data)` is the whole body of its target: the fuzz targets
//! (`fuzz/fuzz_targets/*.rs`, nightly and libFuzzer) and the replay test of the main workspace
//! (`crates/engine/tests/fuzz_corpus.rs`, stable, every file of `fuzz/corpus/<target>/`) both
//! include this directory with `#[path]`, so the two run the same code. A check fails by
//! panicking; it depends on nothing but the synapse crates and std.
#![allow(dead_code)] // each includer uses its own subset

pub mod chat_template;
pub mod imatrix;
pub mod load_model;
pub mod parse_gguf;
pub mod tokenize;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The repository's root, found upwards from the including crate (`fuzz/` or
/// `crates/engine/`): the first ancestor holding `crates/engine/tests/data`.
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        here.ancestors()
            .find(|p| p.join("crates/engine/tests/data").is_dir())
            .unwrap_or_else(|| panic!("no repository root above {}", here.display()))
            .to_path_buf()
    })
}

/// Fuzz bytes read front to back; past the end every read gives zeros, so any input decodes.
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn take(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }

    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let got = self.take(N);
        out[..got.len()].copy_from_slice(got);
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

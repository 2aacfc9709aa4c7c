//! Helpers shared by the forward-pass tests: golden-file readers and the arithmetic of the
//! comparisons.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

use synapse_engine::{Logits, Model, Threads};
use synapse_gguf::{GgmlType, GgufFile};

/// A file under `tests/data/forward`.
pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/forward")
        .join(name)
}

/// A model the fetch script brings; a missing one fails the test with the command to run.
pub fn model_path(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

pub fn ints(f: &GgufFile, name: &str) -> Vec<u32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.info.ggml_type, GgmlType::I32);
    t.data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

pub fn floats(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.info.ggml_type, GgmlType::F32);
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x.iter().map(|&v| v as f64 - lse).collect()
}

pub fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

/// Logits of every position, feeding `ids` in batches of `batch` on `threads` threads.
pub fn run(model: &dyn Model, ids: &[u32], batch: usize, threads: usize) -> Vec<f32> {
    let mut st = model.new_state(ids.len(), batch);
    model
        .prefill(&mut st, ids, batch, Logits::All, &Threads::new(threads))
        .unwrap()
}

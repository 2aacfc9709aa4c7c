//! Qwen2, Qwen3 and Qwen 3.5 (hybrid gated delta net + gated attention) against llama.cpp, on
//! small random-weight files with the real layer structure, and the batch (G1) and thread (D1)
//! invariance contracts on each. Golden data: `scripts/golden/forward_qwen.py` (llama.cpp run
//! token by token, one thread).

mod common;
use common::*;

use synapse_engine::{load, supported_architectures, Logits, Threads};
use synapse_gguf::{GgufFile, GgufWriter, Value};

#[test]
fn qwen2_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-qwen2-Q8_0", "qwen2");
}

#[test]
fn qwen3_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-qwen3-Q4_K", "qwen3");
}

#[test]
fn qwen35_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-qwen35-Q4_K", "qwen35");
}

/// The unsupported-architecture error lists every supported one, the Qwens included.
#[test]
fn the_qwen_architectures_are_listed_as_supported() {
    let archs = supported_architectures();
    let src = GgufFile::open(data("tiny-qwen2-Q8_0.gguf")).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    w.set("general.architecture", Value::String("qwen99".into()));
    for t in src.tensors() {
        w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
            .unwrap();
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let e = load(&f).err().unwrap().to_string();
    assert!(e.contains("qwen99"), "{e}");
    for arch in ["llama", "gemma3", "qwen2", "qwen3", "qwen35"] {
        assert!(archs.contains(&arch), "{arch} missing from {archs:?}");
        assert!(e.contains(arch), "{arch} missing from: {e}");
    }
}

/// A state reused after `reset` gives the logits of a fresh one: the recurrent state (conv and
/// delta-rule states) is cleared with the position.
#[test]
fn a_reset_state_starts_over() {
    for name in ["tiny-qwen2-Q8_0", "tiny-qwen3-Q4_K", "tiny-qwen35-Q4_K"] {
        let file = GgufFile::open(data(&format!("{name}.gguf"))).unwrap();
        let model = load(&file).unwrap();
        let threads = Threads::new(1);
        let ids: Vec<u32> = (10..30).collect();
        let mut st = model.new_state(64, 8).unwrap();
        let first = model
            .prefill(&mut st, &ids, 8, Logits::All, &threads)
            .unwrap();
        st.reset();
        let again = model
            .prefill(&mut st, &ids, 8, Logits::All, &threads)
            .unwrap();
        assert!(first == again, "{name}");
    }
}

/// A Qwen 3.5 file's `block_count` counts its multi-token-prediction blocks, which the main pass
/// does not run (llama.cpp's `n_layer()`): they are left out.
#[test]
fn qwen35_leaves_out_prediction_blocks() {
    let src = GgufFile::open(data("tiny-qwen35-Q4_K.gguf")).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    w.set("qwen35.nextn_predict_layers", Value::U32(1));
    for t in src.tensors() {
        w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
            .unwrap();
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let model = load(&f).unwrap();
    assert_eq!(model.info().n_layer, 3);
    // Its last layer is then a delta-net one (attention every second layer): a prefill for the
    // last logits alone runs its state over every row and its output for the last.
    let ids: Vec<u32> = (10..110).collect();
    let all = run(model.as_ref(), &with_next(model.as_ref(), &ids), 1, 1);
    last_logits_match_all("tiny-qwen35, 3 layers", model.as_ref(), &ids, &all);
    w.set("qwen35.nextn_predict_layers", Value::U32(4));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let e = load(&f).err().unwrap().to_string();
    assert!(e.contains("prediction blocks"), "{e}");
}

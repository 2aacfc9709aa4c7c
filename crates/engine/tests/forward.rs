//! The forward pass against llama.cpp, and the batch (G1) and thread (D1) invariance contracts.
//! Golden data: `scripts/golden/forward.py` (llama.cpp run token by token, one thread).
//!
//! Debugging aids (no effect on what is asserted by default): `SYNAPSE_EVAL_POSITIONS=N` limits
//! the SmolLM2 comparison to its first N positions, `SYNAPSE_SHOW_KL=1` prints each position's
//! KL, and `SYNAPSE_DUMP_DIR` makes the engine write its intermediates (see `synapse_engine::Tap`).

mod common;
use common::*;

use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::{load, Logits, ModelError, Threads};
use synapse_gguf::{GgufFile, GgufWriter, Value};

#[test]
fn smollm2_matches_llama_cpp_token_by_token() {
    let file = GgufFile::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let model = load(&file).unwrap();
    let golden = GgufFile::open(data("smollm2.logits.gguf")).unwrap();
    let ids = ints(&golden, "ids");
    let top_ids = ints(&golden, "top_ids");
    let top_logp = floats(&golden, "top_logp");
    let k = top_ids.len() / ids.len();
    let n_vocab = model.info().n_vocab;
    assert!(ids.len() >= 500);

    let n_eval: usize =
        std::env::var("SYNAPSE_EVAL_POSITIONS").map_or(ids.len(), |v| v.parse().unwrap());
    let ids = &ids[..n_eval];
    let logits = run(model.as_ref(), ids, 1, 2);
    let a = agreement("smollm2", &logits, n_vocab, &top_ids, &top_logp, k);
    assert!(a.top1 >= 0.99, "top-1 agreement {:.4}", a.top1);
    assert!(a.mean_kl <= 1e-3, "mean KL {:.3e}", a.mean_kl);

    // G1 on the real model: batched prefill gives the same bits as token by token.
    let prefix = &ids[..160.min(ids.len())];
    let one = &logits[..prefix.len() * n_vocab];
    for batch in [7, 64, 93] {
        let b = run(model.as_ref(), prefix, batch, 2);
        assert!(b == one, "batch {batch}: logits differ from token-by-token");
    }
    let prefix = &ids[..100.min(ids.len())];
    let all = run(model.as_ref(), &with_next(model.as_ref(), prefix), 64, 2);
    last_logits_match_all("smollm2", model.as_ref(), prefix, &all);
}

#[test]
fn smollm2_greedy_continuations_match_llama_cpp() {
    let threads_2 = Threads::new(2);
    let file = GgufFile::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let model = load(&file).unwrap();
    let tok = Tokenizer::from_metadata(file.metadata()).unwrap();
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("smollm2.greedy.json")).unwrap())
            .unwrap();
    let cases = cases.as_array().unwrap();
    let mut equal = 0;
    for case in cases {
        let (ids, want) = (id_list(&case["ids"]), id_list(&case["greedy"]));
        let got = greedy(model.as_ref(), &tok, &ids, want.len(), &threads_2);
        if got == want {
            equal += 1;
        } else {
            let first = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len());
            eprintln!(
                "prompt {:?}: diverges at generated token {first}",
                case["prompt"].as_str().unwrap()
            );
        }
    }
    eprintln!(
        "greedy: {equal} of {} continuations equal llama.cpp's",
        cases.len()
    );
    assert!(
        cases.len() >= 10 && equal >= 9,
        "{equal} of {} equal",
        cases.len()
    );
}

const TINY: &[&str] = &[
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
    "IQ4_XS", "F16", "BF16", "F32",
];

/// The formats llama.cpp repacks on x86, in files with a tied output (no `output.weight`, 264
/// tokens): llama.cpp loads the embedding again for the output and repacks that copy, so the
/// output sums in the repacked order while the lookups read the plain rows.
const TIED: &[&str] = &["Q4_0", "Q2_K", "Q4_K", "IQ4_NL"];

#[test]
fn every_weight_format_matches_llama_cpp_and_keeps_g1_and_d1() {
    let files = TINY
        .iter()
        .map(|name| (format!("tiny-{name}"), name))
        .chain(TIED.iter().map(|name| (format!("tiny-tied-{name}"), name)));
    for (stem, name) in files {
        let file = GgufFile::open(data(&format!("{stem}.gguf"))).unwrap();
        let ty = file.tensor("blk.0.attn_q.weight").unwrap().info.ggml_type;
        assert_eq!(ty.name(), *name);
        if stem.starts_with("tiny-tied-") {
            assert!(file.tensor("output.weight").is_err(), "{stem}: not tied");
            let embd = file.tensor("token_embd.weight").unwrap().info.ggml_type;
            assert_eq!(embd.name(), *name);
        }
        let model = load(&file).unwrap();
        let golden = GgufFile::open(data(&format!("{stem}.logits.gguf"))).unwrap();
        let ids = ints(&golden, "ids");
        let want = floats(&golden, "logits");
        let n_vocab = model.info().n_vocab;

        let got = run(model.as_ref(), &ids, 1, 1);
        let mut kl_sum = 0.0;
        let mut agree = 0;
        for (g, w) in got.chunks(n_vocab).zip(want.chunks(n_vocab)) {
            let (lg, lw) = (log_softmax(g), log_softmax(w));
            kl_sum += lw
                .iter()
                .zip(&lg)
                .map(|(a, b)| a.exp() * (a - b))
                .sum::<f64>();
            agree += (argmax(g) == argmax(w)) as usize;
        }
        let mean_kl = kl_sum / ids.len() as f64;
        eprintln!("{stem}: mean KL {mean_kl:.2e}, top-1 {agree}/{}", ids.len());
        assert!(mean_kl <= 1e-3, "{stem}: mean KL {mean_kl:.3e}");
        // Stronger than the bound: synapse does llama.cpp's arithmetic in its order (its
        // x86 AVX-512 build, repacked matrices included), so the logits are its, to the bit.
        assert!(got == want, "{stem}: logits differ from llama.cpp's");

        // G1: any batch size gives the bits of token by token.
        for batch in [7, 64, 93] {
            assert!(
                run(model.as_ref(), &ids, batch, 1) == got,
                "{stem}: batch {batch} differs"
            );
        }
        // D1: any thread count gives the same bits.
        assert_d1(&stem, model.as_ref(), &ids, &got);
        let all = run(model.as_ref(), &with_next(model.as_ref(), &ids), 1, 1);
        last_logits_match_all(&stem, model.as_ref(), &ids, &all);
    }
}

#[test]
fn a_prompt_longer_than_the_context_is_an_error() {
    let threads_1 = Threads::new(1);
    let file = GgufFile::open(data("tiny-Q8_0.gguf")).unwrap();
    let model = load(&file).unwrap();
    let mut st = model.new_state(16, 8).unwrap();
    let ids: Vec<u32> = (0..20).collect();
    let e = model
        .prefill(&mut st, &ids, 8, Logits::Last, &threads_1)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::ContextFull { n_ctx: 16, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("context is full"), "{e}");
    let mut st = model.new_state(16, 8).unwrap();
    let e = model
        .prefill(&mut st, &[5, 300, 7], 8, Logits::Last, &threads_1)
        .unwrap_err();
    assert!(matches!(e, ModelError::BadToken { id: 300, .. }), "{e}");
}

#[test]
fn weight_memory_is_every_matrix_a_decode_step_reads_once() {
    for (path, tied) in [
        (data("tiny-Q4_K.gguf"), false),
        (data("tiny-tied-Q4_K.gguf"), true),
        (data("tiny-qwen35-Q4_K.gguf"), false),
        (model_path("gemma-3-270m-q4_k_m.gguf"), true),
    ] {
        let name = path.display();
        let file = GgufFile::open(&path).unwrap();
        let model = load(&file).unwrap();
        // Every 2-D weight but the embedding (unless it is the output too) and the delta
        // net's convolution (read into floats at load), in the file's encoding: packing moves
        // bytes, it adds none.
        let want: usize = file
            .tensors()
            .filter(|t| t.info.shape.len() == 2 && !t.info.name.ends_with("ssm_conv1d.weight"))
            .filter(|t| tied || t.info.name != "token_embd.weight")
            .map(|t| t.data.len())
            .sum();
        let got: usize = model.weight_memory().iter().map(|s| s.len()).sum();
        assert_eq!(got, want, "{name}");
    }
}

/// A copy of the tiny model with one metadata value replaced or one tensor dropped.
fn altered(set: Option<(&str, Value)>, drop: Option<&str>) -> GgufFile {
    let src = GgufFile::open(data("tiny-Q8_0.gguf")).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    if let Some((k, v)) = set {
        w.set(k, v);
    }
    for t in src.tensors().filter(|t| Some(t.info.name.as_str()) != drop) {
        w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
            .unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn unknown_architectures_and_missing_tensors_are_named() {
    let f = altered(
        Some(("general.architecture", Value::String("mamba9".into()))),
        None,
    );
    let e = load(&f).err().unwrap().to_string();
    assert!(e.contains("mamba9") && e.contains("llama"), "{e}");
    let f = altered(None, Some("blk.1.ffn_up.weight"));
    let e = load(&f).err().unwrap().to_string();
    assert!(
        e.contains("blk.1.ffn_up.weight") && e.contains("missing"),
        "{e}"
    );
    let f = altered(Some(("llama.embedding_length", Value::U32(320))), None);
    let e = load(&f).err().unwrap().to_string();
    assert!(e.contains("token_embd.weight"), "{e}");
}

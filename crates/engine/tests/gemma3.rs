//! Gemma 3 (270M, Q4_K_M) against llama.cpp, and the batch (G1) and thread (D1) invariance
//! contracts on it. Golden data: `scripts/golden/forward_gemma3.py` (llama.cpp run token by
//! token, one thread, over a text longer than the 512-token sliding window).

mod common;
use common::*;

use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::{load, Threads};
use synapse_gguf::GgufFile;

fn model_file() -> GgufFile {
    GgufFile::open(model_path("gemma-3-270m-q4_k_m.gguf")).unwrap()
}

#[test]
fn gemma3_matches_llama_cpp_token_by_token_and_keeps_g1_and_d1() {
    let file = model_file();
    let model = load(&file).unwrap();
    assert_eq!(model.info().arch, "gemma3");
    let golden = GgufFile::open(data("gemma3.logits.gguf")).unwrap();
    let ids = ints(&golden, "ids");
    let top_ids = ints(&golden, "top_ids");
    let top_logp = floats(&golden, "top_logp");
    let k = top_ids.len() / ids.len();
    let n_vocab = model.info().n_vocab;
    assert!(
        ids.len() >= 600,
        "the golden text must outrun the 512-token window"
    );

    let n_eval: usize =
        std::env::var("SYNAPSE_EVAL_POSITIONS").map_or(ids.len(), |v| v.parse().unwrap());
    let ids = &ids[..n_eval];
    let logits = run(model.as_ref(), ids, 1, 2);
    let a = agreement("gemma3", &logits, n_vocab, &top_ids, &top_logp, k);
    assert!(a.top1 >= 0.99, "top-1 agreement {:.4}", a.top1);
    assert!(a.mean_kl <= 1e-3, "mean KL {:.3e}", a.mean_kl);

    // G1: batched prefill gives the bits of token by token.
    let n_g1 = 160.min(ids.len());
    let one = &logits[..n_g1 * n_vocab];
    for batch in [7, 64, 93] {
        let b = run(model.as_ref(), &ids[..n_g1], batch, 2);
        assert!(b == one, "batch {batch}: logits differ from token by token");
    }
    // The last layer for the last row alone, past the sliding window.
    let n_last = 560.min(ids.len() - 1);
    let all = run(
        model.as_ref(),
        &with_next(model.as_ref(), &ids[..n_last]),
        64,
        2,
    );
    last_logits_match_all("gemma3", model.as_ref(), &ids[..n_last], &all);
    // D1: any thread count gives the same bits.
    let n_d1 = 40.min(ids.len());
    let one = run(model.as_ref(), &ids[..n_d1], 64, 1);
    assert!(
        one == logits[..n_d1 * n_vocab],
        "1 thread: logits differ from 2 threads"
    );
    assert_d1("gemma3", model.as_ref(), &ids[..n_d1], &one);
}

/// Greedy continuations of prompts.txt against llama.cpp's (prompt fed one token at a time;
/// continuations that reach an end-of-generation token are shorter than 64).
#[test]
fn gemma3_greedy_continuations_match_llama_cpp() {
    let file = model_file();
    let model = load(&file).unwrap();
    let tok = Tokenizer::from_metadata(file.metadata()).unwrap();
    let threads = Threads::new(2);
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("gemma3.greedy.json")).unwrap())
            .unwrap();
    let cases = cases.as_array().unwrap();
    let (mut equal, mut equal_batched) = (0, 0);
    for case in cases {
        let (ids, want) = (id_list(&case["ids"]), id_list(&case["greedy"]));
        let got = greedy(model.as_ref(), &tok, &ids, want.len(), &threads);
        // llama.cpp's continuation when it prefills the prompt in one batch (its batched kernels
        // round differently): for information only.
        equal_batched += (got == id_list(&case["greedy_batched"])) as usize;
        if got == want {
            equal += 1;
        } else {
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            eprintln!(
                "prompt {:?}: diverges at generated token {}",
                case["prompt"].as_str().unwrap(),
                first.unwrap_or(got.len())
            );
        }
    }
    eprintln!(
        "greedy: {equal} of {} continuations equal llama.cpp's token-by-token ones, \
         {equal_batched} its batched-prefill ones",
        cases.len()
    );
    assert!(
        cases.len() >= 10 && equal >= 9,
        "{equal} of {} equal",
        cases.len()
    );
}

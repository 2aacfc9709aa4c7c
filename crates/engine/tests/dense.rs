//! The dense architectures beyond llama and Gemma 3 against llama.cpp: `smollm3` (a layer in four
//! without RoPE), `granite` (embedding, residual, attention and logit scales), `gemma2`
//! (soft-capped attention), `olmo2` (post-norms, whole-vector QK-norm) and `phi3` (fused
//! projections, partial RoPE, queries scaled after it; LongRoPE's long and short factors),
//! `mistral3` (YaRN, attention temperature) and Qwen 3 with YaRN: small random-weight files with
//! the real metadata, and G1 and D1 on each. Golden data:
//! `scripts/golden/forward_dense.py` (llama.cpp token by token, one thread).

mod common;
use common::*;
use synapse_engine::{Logits, Model, Seq, Threads};
use synapse_gguf::GgufFile;

#[test]
fn smollm3_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-smollm3-Q5_K", "smollm3");
}

#[test]
fn granite_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-granite-Q6_K", "granite");
}

#[test]
fn gemma2_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-gemma2-Q4_0", "gemma2");
}

#[test]
fn olmo2_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-olmo2-IQ4_NL", "olmo2");
}

#[test]
fn phi3_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-phi3-Q4_K", "phi3");
}

#[test]
fn phi3_longrope_matches_llama_cpp_with_either_factors() {
    // An original context of 4, which every state here outruns: the long factors.
    check_golden("tiny-phi3-longrope-Q4_0", "phi3");
    // One of 4096, which none reaches: the short ones.
    check_golden("tiny-phi3-shortrope-Q4_0", "phi3");
}

/// The factors are the state's choice: a state of at most the original context's 4 positions
/// takes the short ones, so its logits are the short-factor file's, bit for bit, and not the
/// long-factor state's.
#[test]
fn phi3_longrope_chooses_its_factors_by_the_states_context() {
    let open = |name: &str| GgufFile::open(data(&format!("{name}.gguf"))).unwrap();
    let (long_file, short_file) = (
        open("tiny-phi3-longrope-Q4_0"),
        open("tiny-phi3-shortrope-Q4_0"),
    );
    let long = synapse_engine::load(&long_file).unwrap();
    let short = synapse_engine::load(&short_file).unwrap();
    let ids = [5u32, 77, 130, 2];
    let at = |model: &dyn Model, n_ctx: usize| {
        let mut st = model.new_state(n_ctx, 4).unwrap();
        let threads = Threads::new(1);
        let logits = model.prefill(&mut st, &ids, 4, Logits::All, &threads);
        logits.unwrap()
    };
    assert!(at(long.as_ref(), 4) == at(short.as_ref(), 4));
    assert!(at(long.as_ref(), 5) != at(long.as_ref(), 4));
    // States on both sides cannot share a joint pass; the error says why.
    let (mut a, mut b) = (long.new_state(4, 4).unwrap(), long.new_state(8, 4).unwrap());
    let mut batch = long.new_batch(8).unwrap();
    let mut seqs = [
        Seq {
            state: &mut a,
            tokens: &ids[..2],
            logits: Logits::Last,
        },
        Seq {
            state: &mut b,
            tokens: &ids[..2],
            logits: Logits::Last,
        },
    ];
    let mut out = vec![0.0; 2 * long.info().n_vocab];
    let err = long
        .forward_batch(&mut batch, &mut seqs, &mut out, &Threads::new(1))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("4 and 8 positions") && err.contains("LongRoPE"),
        "{err}"
    );
}

#[test]
fn mistral3_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-mistral3-IQ4_NL", "mistral3");
}

/// YaRN under an architecture that reads none of its `yarn_*` keys (llama.cpp's defaults):
/// Qwen 3 as its long-context files carry it, NeoX pairs.
#[test]
fn qwen3_with_yarn_matches_llama_cpp() {
    check_golden("tiny-qwen3-yarn-Q4_0", "qwen3");
}

//! The dense architectures beyond llama and Gemma 3 against llama.cpp: `smollm3` (a layer in four
//! without RoPE), `granite` (embedding, residual, attention and logit scales), `gemma2`
//! (soft-capped attention), `olmo2` (post-norms, whole-vector QK-norm) and `phi3` (fused
//! projections, partial RoPE, queries scaled after it), small random-weight
//! files with the real metadata, and G1 and D1 on each. Golden data:
//! `scripts/golden/forward_dense.py` (llama.cpp token by token, one thread).

mod common;
use common::*;

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

//! Mixtures of experts against llama.cpp: `qwen3moe` (Qwen3-30B-A3B's layer), a Mixtral-style
//! `llama` file, Qwen 3.5's mixture and `gpt-oss` (MXFP4 experts, attention sinks, a sliding
//! window, biased experts), small random-weight files with the real tensor layout (stacked
//! `ffn_*_exps`, an F32 router), and G1 and D1 on each: a token's output must not depend on
//! which tokens of its batch went to the same experts, nor on the threads (8 to 64, above the
//! expert counts). Golden data: `scripts/golden/forward_moe.py` (llama.cpp token by token, one
//! thread).

mod common;
use common::*;

#[test]
fn qwen3moe_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-qwen3moe-Q4_K", "qwen3moe");
}

#[test]
fn mixtral_style_llama_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-llamamoe-Q8_0", "llama");
}

#[test]
fn qwen35moe_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-qwen35moe-Q4_K", "qwen35moe");
}

#[test]
fn gpt_oss_matches_llama_cpp_and_keeps_g1_and_d1() {
    check_golden("tiny-gpt-oss-MXFP4", "gpt-oss");
}

#!/usr/bin/env python3
"""Make golden data for the dense architectures beyond llama and Gemma 3 (smollm3, granite,
gemma2, olmo2, phi3) under crates/engine/tests/data/forward/ from llama.cpp.

Like forward_qwen.py: small random-weight GGUFs with the real layer structure and metadata,
quantized with llama-quantize --pure, and llama.cpp's full logits for a token-by-token run over
fixed ids. Not run by the test suite (the outputs are committed); run it again only to refresh
them:

    scripts/build-llama.sh
    PYTHONPATH=third_party/llama.cpp/gguf-py .venv/bin/python scripts/golden/forward_dense.py

Outputs:
- tiny-smollm3-Q5_K.gguf: 4 layers (the fourth takes no RoPE, SmolLM3's NoPE step), 4 query / 2
  KV heads of 64, tied output.
- tiny-granite-Q6_K.gguf: 2 layers with Granite 3's scales (embedding 12, residual 0.22,
  attention 1/128, logits 1/8), 4 query / 2 KV heads of 64, separate output matrix.
- tiny-gemma2-Q4_0.gguf: 4 layers, every other one local with a window of 16 (the ids outrun
  it), 2 query / 1 KV heads of 256, attention scores soft-capped at 4 and logits at 3, tied
  output (Q4_0: a repacked format).
- tiny-olmo2-IQ4_NL.gguf: 2 layers without pre-norms, the queries and keys RMS-normed over all
  their heads, post-norms on both blocks, 4 query / 2 KV heads of 64 (IQ4_NL: repacked).
- tiny-phi3-Q4_K.gguf: 2 layers with the fused `attn_qkv` and gate/up `ffn_up`, RoPE over 32 of
  each head's 64 dims, 4 query / 2 KV heads (Q4_K: repacked, the fused matrices by their whole
  rows).
- tiny-phi3-longrope-Q4_0.gguf, tiny-phi3-shortrope-Q4_0.gguf: that layout with LongRoPE's
  long and short factors and an attention factor of 1.19; an original context of 4, which every state
  outruns (the long factors), and of 4096, which none reaches (the short ones).
- tiny-mistral3-IQ4_NL.gguf: 2 llama layers, 4 query / 2 KV heads of 64, YaRN (factor 5 over an
  original context of 16: the ramp spans pairs 0 to 3) and Llama 4's attention temperature (0.1,
  stepping every 16 positions).
- tiny-qwen3-yarn-Q4_0.gguf: forward_qwen.py's qwen3 file with YaRN as Qwen's long-context files
  carry it (type, factor, original context; qwen3 reads no `yarn_*` keys): factor 3 over 8.
- their .logits.gguf: `ids` (96 fixed ids) and `logits` (96 x 257), llama.cpp token by token on one
  thread.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402
from forward_qwen import N_VOCAB, Tiny, qwen3, run  # noqa: E402


def llama_layers(t, n_head, n_head_kv, hd):
    d = t.n_embd
    t.w.add_head_count(n_head)
    t.w.add_head_count_kv(n_head_kv)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.attn_q.weight", t.mat(n_head * hd, d, 0.15))
        t.add(f"blk.{i}.attn_k.weight", t.mat(n_head_kv * hd, d, 0.15))
        t.add(f"blk.{i}.attn_v.weight", t.mat(n_head_kv * hd, d, 0.1))
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        t.add(f"blk.{i}.ffn_norm.weight", t.vec(d))
        t.ffn(i)


def smollm3(path):
    t = Tiny(path, "smollm3", 4003, n_ff=512, n_layer=4)
    llama_layers(t, 4, 2, 64)
    t.finish(tied=True)


def granite(path):
    t = Tiny(path, "granite", 4004, n_ff=512)
    t.w.add_logit_scale(8.0)
    t.w.add_residual_scale(0.22)
    t.w.add_embedding_scale(12.0)
    t.w.add_attention_scale(0.0078125)
    llama_layers(t, 4, 2, 64)
    t.finish()


def gemma2(path):
    t = Tiny(path, "gemma2", 4005, n_ff=512, n_layer=4)
    n_head, n_head_kv, hd, d = 2, 1, 256, t.n_embd
    w = t.w
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    # A window the 96 fixed ids outrun, and caps low enough to bend these weights' scores and
    # logits (the defaults, 50 and 30, barely would).
    w.add_sliding_window(16)
    w.add_attn_logit_softcapping(4.0)
    w.add_final_logit_softcapping(3.0)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.attn_q.weight", t.mat(n_head * hd, d, 0.15))
        t.add(f"blk.{i}.attn_k.weight", t.mat(n_head_kv * hd, d, 0.15))
        t.add(f"blk.{i}.attn_v.weight", t.mat(n_head_kv * hd, d, 0.1))
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        t.add(f"blk.{i}.post_attention_norm.weight", t.vec(d))
        t.add(f"blk.{i}.ffn_norm.weight", t.vec(d))
        t.ffn(i)
        t.add(f"blk.{i}.post_ffw_norm.weight", t.vec(d))
    t.finish(tied=True)


def olmo2(path):
    t = Tiny(path, "olmo2", 4006, n_ff=512)
    n_head, n_head_kv, hd, d = 4, 2, 64, t.n_embd
    t.w.add_head_count(n_head)
    t.w.add_head_count_kv(n_head_kv)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_q.weight", t.mat(n_head * hd, d, 0.15))
        t.add(f"blk.{i}.attn_k.weight", t.mat(n_head_kv * hd, d, 0.15))
        t.add(f"blk.{i}.attn_v.weight", t.mat(n_head_kv * hd, d, 0.1))
        t.add(f"blk.{i}.attn_q_norm.weight", t.vec(n_head * hd))
        t.add(f"blk.{i}.attn_k_norm.weight", t.vec(n_head_kv * hd))
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        t.add(f"blk.{i}.post_attention_norm.weight", t.vec(d))
        t.ffn(i)
        t.add(f"blk.{i}.post_ffw_norm.weight", t.vec(d))
    t.finish()


def phi3(path, orig_ctx=None):
    t = Tiny(path, "phi3", 4007, n_ff=512)
    n_head, n_head_kv, hd, d, f = 4, 2, 64, t.n_embd, t.n_ff
    w = t.w
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(32)  # RoPE over half of each head, as Phi-4-mini's 3/4
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.attn_qkv.weight", t.mat((n_head + 2 * n_head_kv) * hd, d, 0.15))
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        t.add(f"blk.{i}.ffn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.ffn_up.weight", t.mat(2 * f, d, 0.1))
        t.add(f"blk.{i}.ffn_down.weight", t.mat(d, f, 0.05))
    if orig_ctx is not None:
        # LongRoPE as Phi-3.5's converter writes it: both factor sets (16 pairs of the 32 rotated
        # dims), an attention factor, the original context.
        w.add_rope_scaling_orig_ctx_len(orig_ctx)
        w.add_rope_scaling_attn_factors(1.1902380714238083)
        t.add("rope_factors_long.weight", t.vec(16, 1.0, 12.0))
        t.add("rope_factors_short.weight", t.vec(16, 1.0, 1.5))
    t.finish()


def mistral3(path):
    t = Tiny(path, "mistral3", 4008, n_ff=512)
    w = t.w
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(5.0)
    w.add_rope_scaling_orig_ctx_len(16)
    w.add_rope_scaling_yarn_beta_fast(32.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_rope_scaling_yarn_log_mul(1.0)
    w.add_attn_temperature_scale(0.1)
    llama_layers(t, 4, 2, 64)
    t.finish()


FILES = [("smollm3", "Q5_K", "Q5_K_M", smollm3), ("granite", "Q6_K", "Q6_K", granite),
         ("gemma2", "Q4_0", "Q4_0", gemma2), ("olmo2", "IQ4_NL", "IQ4_NL", olmo2),
         ("phi3", "Q4_K", "Q4_K_M", phi3),
         ("phi3", "longrope-Q4_0", "Q4_0", lambda p: phi3(p, 4)),
         ("phi3", "shortrope-Q4_0", "Q4_0", lambda p: phi3(p, 4096)),
         ("mistral3", "IQ4_NL", "IQ4_NL", mistral3),
         ("qwen3", "yarn-Q4_0", "Q4_0", lambda p: qwen3(p, yarn=(3.0, 8)))]


def main():
    run(FILES, set(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())

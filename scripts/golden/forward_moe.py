#!/usr/bin/env python3
"""Make golden data for the mixture-of-experts architectures under crates/engine/tests/data/forward/
from llama.cpp.

Like forward_qwen.py: small random-weight GGUFs with the real layer structure and metadata,
quantized with llama-quantize --pure (which leaves the routers, `ffn_gate_inp`, in F32 as in real
files), and llama.cpp's full logits for a token-by-token run over fixed ids. Not run by the test
suite (the outputs are committed); run it again only to refresh them:

    scripts/build-llama.sh
    PYTHONPATH=third_party/llama.cpp/gguf-py .venv/bin/python scripts/golden/forward_moe.py

Outputs:
- tiny-qwen3moe-Q4_K.gguf: Qwen3-30B-A3B's layer (qwen3's attention with QK-norm, tied output) with
  a routed FFN of 8 experts, 3 used a token, 256 wide (`expert_feed_forward_length`); Q4_K experts
  of 256 rows each, which llama.cpp repacks (its mul_mat_id takes the repacked gemv).
- tiny-llamamoe-Q8_0.gguf: a Mixtral-style `llama` file: 4 experts, 2 used, each as wide as
  `feed_forward_length`; Q8_0 (not repacked).
- tiny-qwen35moe-Q4_K.gguf: forward_qwen.py's Qwen 3.5 hybrid (4 layers) with Qwen3.5-35B-A3B's
  feed-forward block: 4 experts, 2 used, and a shared expert scaled by the sigmoid of its own
  gate (`ffn_gate_inp_shexp`, one row).
- tiny-gpt-oss-MXFP4.gguf: gpt-oss-20b's layer (see `gptoss`): 3 layers, 8 experts, 4 used,
  every matrix MXFP4.
- their .logits.gguf: `ids` (96 fixed ids) and `logits` (96 x 257), llama.cpp token by token on one
  thread.
"""

import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forward_qwen import N_VOCAB, Tiny, qwen35_layers, run  # noqa: E402


def experts(t, i, n_expert, n_ff):
    d = t.n_embd
    # The router's rows far apart enough that the top experts differ from token to token.
    t.add(f"blk.{i}.ffn_gate_inp.weight", t.mat(n_expert, d, 0.2))
    t.add(f"blk.{i}.ffn_gate_exps.weight", (t.rng.standard_normal((n_expert, n_ff, d)) * 0.1).astype(np.float32))
    t.add(f"blk.{i}.ffn_up_exps.weight", (t.rng.standard_normal((n_expert, n_ff, d)) * 0.1).astype(np.float32))
    t.add(f"blk.{i}.ffn_down_exps.weight", (t.rng.standard_normal((n_expert, d, n_ff)) * 0.05).astype(np.float32))


def qwen3moe(path):
    n_expert, n_used, n_ff_exp = 8, 3, 256
    t = Tiny(path, "qwen3moe", 3003, n_ff=768)
    n_head, n_head_kv, hd, d = 4, 2, 64, t.n_embd
    w = t.w
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.attn_q.weight", t.mat(n_head * hd, d, 0.15))
        t.add(f"blk.{i}.attn_k.weight", t.mat(n_head_kv * hd, d, 0.15))
        t.add(f"blk.{i}.attn_v.weight", t.mat(n_head_kv * hd, d, 0.1))
        t.add(f"blk.{i}.attn_q_norm.weight", t.vec(hd))
        t.add(f"blk.{i}.attn_k_norm.weight", t.vec(hd))
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        t.add(f"blk.{i}.ffn_norm.weight", t.vec(d))
        experts(t, i, n_expert, n_ff_exp)
    t.finish(tied=True)


def llamamoe(path):
    n_expert, n_used = 4, 2
    t = Tiny(path, "llama", 3004)
    n_head, d = 4, t.n_embd
    w = t.w
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.attn_q.weight", t.mat(d, d, 0.15))
        t.add(f"blk.{i}.attn_k.weight", t.mat(d, d, 0.15))
        t.add(f"blk.{i}.attn_v.weight", t.mat(d, d, 0.1))
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, d, 0.05))
        t.add(f"blk.{i}.ffn_norm.weight", t.vec(d))
        experts(t, i, n_expert, t.n_ff)
    t.finish()


def qwen35moe(path):
    """forward_qwen.py's Qwen 3.5 hybrid with Qwen3.5-35B-A3B's feed-forward block: routed
    experts plus a shared expert scaled by a sigmoid gate of its own."""
    n_expert, n_used, n_ff_exp, n_ff_shexp = 4, 2, 256, 256
    t = Tiny(path, "qwen35moe", 3035, n_layer=4, n_ff=512)
    d = t.n_embd

    def keys(w):
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_used)
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_expert_shared_feed_forward_length(n_ff_shexp)

    def ffn(i):
        experts(t, i, n_expert, n_ff_exp)
        t.add(f"blk.{i}.ffn_gate_inp_shexp.weight", t.mat(1, d, 0.1)[0])
        t.add(f"blk.{i}.ffn_gate_shexp.weight", t.mat(n_ff_shexp, d, 0.1))
        t.add(f"blk.{i}.ffn_up_shexp.weight", t.mat(n_ff_shexp, d, 0.1))
        t.add(f"blk.{i}.ffn_down_shexp.weight", t.mat(d, n_ff_shexp, 0.05))

    qwen35_layers(t, keys, ffn)
    t.finish()


def gptoss(path):
    """gpt-oss-20b's layer at small widths: biased Q/K/V/O projections, a sink logit per head,
    a sliding window (8 keys here, 128 in the real model) on the even layers, YaRN RoPE, and 8
    experts (4 used) with biased products, the router biased too; all MXFP4 (--pure), so that
    the 256-row matrices take llama.cpp's repacked MXFP4 order and the 257-row output its
    `vec_dot` order."""
    n_expert, n_used, n_ff_exp = 8, 4, 256
    t = Tiny(path, "gpt-oss", 3020, n_layer=3, n_ff=n_ff_exp)
    n_head, n_head_kv, hd, d = 8, 2, 64, t.n_embd
    w = t.w
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_sliding_window(8)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(8.0)
    w.add_rope_scaling_orig_ctx_len(64)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.attn_q.weight", t.mat(n_head * hd, d, 0.15))
        t.add(f"blk.{i}.attn_q.bias", t.mat(1, n_head * hd, 0.3)[0])
        t.add(f"blk.{i}.attn_k.weight", t.mat(n_head_kv * hd, d, 0.15))
        t.add(f"blk.{i}.attn_k.bias", t.mat(1, n_head_kv * hd, 0.3)[0])
        t.add(f"blk.{i}.attn_v.weight", t.mat(n_head_kv * hd, d, 0.1))
        t.add(f"blk.{i}.attn_v.bias", t.mat(1, n_head_kv * hd, 0.1)[0])
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        t.add(f"blk.{i}.attn_output.bias", t.mat(1, d, 0.1)[0])
        # Sinks from far below the scores to far above them: both of ggml's branches.
        t.add(f"blk.{i}.attn_sinks.weight", t.rng.uniform(-3.0, 6.0, n_head).astype(np.float32))
        t.add(f"blk.{i}.post_attention_norm.weight", t.vec(d))
        experts(t, i, n_expert, n_ff_exp)
        t.add(f"blk.{i}.ffn_gate_inp.bias", t.mat(1, n_expert, 0.5)[0])
        t.add(f"blk.{i}.ffn_gate_exps.bias", t.mat(n_expert, n_ff_exp, 0.5))
        t.add(f"blk.{i}.ffn_up_exps.bias", t.mat(n_expert, n_ff_exp, 0.5))
        t.add(f"blk.{i}.ffn_down_exps.bias", t.mat(n_expert, d, 0.1))
    t.finish()


FILES = [("qwen3moe", "Q4_K", "Q4_K_M", qwen3moe), ("llamamoe", "Q8_0", "Q8_0", llamamoe),
         ("qwen35moe", "Q4_K", "Q4_K_M", qwen35moe), ("gpt-oss", "MXFP4", "MXFP4_MOE", gptoss)]


def main():
    run(FILES, set(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())

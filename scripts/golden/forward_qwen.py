#!/usr/bin/env python3
"""Make golden data for the Qwen architectures (qwen2, qwen3, qwen35) under
crates/engine/tests/data/forward/ from llama.cpp.

No real Qwen weights can be fetched here, so this writes small random-weight GGUFs with the real
layer structure and metadata (what llama.cpp's converter writes for Qwen2, Qwen3 and Qwen 3.5),
quantizes them with llama-quantize --pure, and records llama.cpp's full logits for a
token-by-token run over fixed ids. Not run by the test suite (the outputs are committed); run it
again only to refresh them:

    scripts/build-llama.sh
    python3 scripts/golden/forward_qwen.py

Outputs, for ARCH-TYPE in qwen2-Q8_0, qwen3-Q4_K, qwen35-Q4_K (FTYPES):
- tiny-ARCH-TYPE.gguf: the model. All share a byte-level vocabulary of 257 tokens with the `qwen2`
  pre-tokenizer, width 256 (a multiple of 256, so that every K-quant applies).
  - qwen2: 2 layers, 4 query / 2 KV heads of 64, Q/K/V biases, NeoX RoPE, separate output matrix.
  - qwen3: 2 layers, 4 query / 2 KV heads of 128 (`attention.key_length`: the heads are wider than
    width / heads), QK-norm, no biases, tied output (no output.weight).
  - qwen35: 4 layers alternating gated delta-net (recurrent) and gated full attention
    (`full_attention_interval` 2): delta net with 2 key heads and 4 value heads of 64, a 4-tap
    causal convolution; attention with a query gate, QK-norm, partial interleaved M-RoPE (16 of 64
    dims, sections 2/2/1/1).
- tiny-ARCH-TYPE.logits.gguf: `ids` (96 fixed ids) and `logits` (96 x 257), llama.cpp run token by
  token on one thread.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forward import BIN, OUT, TINY_IDS, TOOL, build_tool, gguf_bytes_to_unicode, logits_of, write_gguf  # noqa: E402

# One weight format per architecture (each file is 0.5-1 MB; the formats' kernels are tested on
# every format by the llama files): Q8_0 (Q8_0 activations) and Q4_K (Q8_K activations).
FTYPES = {"qwen2": {"Q8_0": "Q8_0"}, "qwen3": {"Q4_K": "Q4_K_M"}, "qwen35": {"Q4_K": "Q4_K_M"}}
N_VOCAB = 257


def vocab(w):
    byte_chars = gguf_bytes_to_unicode()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([byte_chars[b] for b in range(256)] + ["ab"])
    w.add_token_types([1] * N_VOCAB)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)


class Tiny:
    """A random-weight model writer: the common hyperparameters and tensors."""

    def __init__(self, path, arch, seed, n_embd=256, n_ff=256, n_layer=2):
        self.rng = np.random.default_rng(seed)
        self.n_embd, self.n_ff, self.n_layer = n_embd, n_ff, n_layer
        self.w = gguf.GGUFWriter(str(path), arch=arch)
        w = self.w
        w.add_context_length(512)
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(n_ff)
        w.add_block_count(n_layer)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(1000000.0)
        vocab(w)

    def mat(self, rows, cols, scale):
        return (self.rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def vec(self, n, lo=0.5, hi=1.5):
        return self.rng.uniform(lo, hi, n).astype(np.float32)

    def add(self, name, arr):
        self.w.add_tensor(name, arr)

    def ffn(self, i):
        d, f = self.n_embd, self.n_ff
        self.add(f"blk.{i}.ffn_gate.weight", self.mat(f, d, 0.1))
        self.add(f"blk.{i}.ffn_up.weight", self.mat(f, d, 0.1))
        self.add(f"blk.{i}.ffn_down.weight", self.mat(d, f, 0.05))

    def finish(self, tied=False):
        self.add("output_norm.weight", self.vec(self.n_embd))
        if not tied:
            self.add("output.weight", self.mat(N_VOCAB, self.n_embd, 0.1))
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def qwen2(path):
    t = Tiny(path, "qwen2", 2002)
    n_head, n_head_kv, hd, d = 4, 2, 64, t.n_embd
    t.w.add_head_count(n_head)
    t.w.add_head_count_kv(n_head_kv)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.attn_q.weight", t.mat(n_head * hd, d, 0.15))
        t.add(f"blk.{i}.attn_q.bias", t.mat(1, n_head * hd, 0.5)[0])
        t.add(f"blk.{i}.attn_k.weight", t.mat(n_head_kv * hd, d, 0.15))
        t.add(f"blk.{i}.attn_k.bias", t.mat(1, n_head_kv * hd, 0.5)[0])
        t.add(f"blk.{i}.attn_v.weight", t.mat(n_head_kv * hd, d, 0.1))
        t.add(f"blk.{i}.attn_v.bias", t.mat(1, n_head_kv * hd, 0.2)[0])
        t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        t.add(f"blk.{i}.ffn_norm.weight", t.vec(d))
        t.ffn(i)
    t.finish()


def qwen3(path, yarn=None):
    """`yarn`: (factor, original context) of YaRN scaling, as Qwen's long-context files carry."""
    t = Tiny(path, "qwen3", 2003)
    if yarn is not None:
        t.w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        t.w.add_rope_scaling_factor(yarn[0])
        t.w.add_rope_scaling_orig_ctx_len(yarn[1])
    n_head, n_head_kv, hd, d = 4, 2, 128, t.n_embd
    t.w.add_head_count(n_head)
    t.w.add_head_count_kv(n_head_kv)
    t.w.add_key_length(hd)
    t.w.add_value_length(hd)
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
        t.ffn(i)
    t.finish(tied=True)


def qwen35(path):
    t = Tiny(path, "qwen35", 2035, n_layer=4)
    qwen35_layers(t, lambda w: None, t.ffn)
    t.finish()


def qwen35_layers(t, more_keys, ffn):
    """Qwen 3.5's keys (then `more_keys(writer)`'s), token embedding and layers, each layer's
    feed-forward tensors from `ffn(i)`."""
    d = t.n_embd
    n_head, n_head_kv, hd, n_rot = 4, 2, 64, 16
    d_state, n_k_heads, n_v_heads, d_conv = 64, 2, 4, 4
    d_inner = d_state * n_v_heads
    conv_dim = 2 * d_state * n_k_heads + d_inner
    w = t.w
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(n_rot)
    # Real Qwen 3.5 files say [11, 11, 10, 0] over 64 rotated dims, where every pair follows t, h
    # or w; these sections also leave one pair (the 6th) to the fourth id, which is 0 for text.
    w.add_rope_dimension_sections([2, 2, 1, 1])
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_group_count(n_k_heads)
    w.add_full_attention_interval(2)
    more_keys(w)
    t.add("token_embd.weight", t.mat(N_VOCAB, d, 1.0))
    for i in range(t.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", t.vec(d))
        t.add(f"blk.{i}.post_attention_norm.weight", t.vec(d))
        if (i + 1) % 2 != 0:  # gated delta net
            t.add(f"blk.{i}.attn_qkv.weight", t.mat(conv_dim, d, 0.1))
            t.add(f"blk.{i}.attn_gate.weight", t.mat(d_inner, d, 0.1))
            t.add(f"blk.{i}.ssm_conv1d.weight", t.mat(conv_dim, d_conv, 0.5))
            t.add(f"blk.{i}.ssm_dt.bias", t.mat(1, n_v_heads, 0.5)[0])
            t.add(f"blk.{i}.ssm_a", -t.vec(n_v_heads, 0.2, 1.5))
            t.add(f"blk.{i}.ssm_beta.weight", t.mat(n_v_heads, d, 0.1))
            t.add(f"blk.{i}.ssm_alpha.weight", t.mat(n_v_heads, d, 0.1))
            t.add(f"blk.{i}.ssm_norm.weight", t.vec(d_state))
            t.add(f"blk.{i}.ssm_out.weight", t.mat(d, d_inner, 0.05))
        else:  # gated attention: the query projection also yields a per-head gate
            t.add(f"blk.{i}.attn_q.weight", t.mat(2 * n_head * hd, d, 0.15))
            t.add(f"blk.{i}.attn_k.weight", t.mat(n_head_kv * hd, d, 0.15))
            t.add(f"blk.{i}.attn_v.weight", t.mat(n_head_kv * hd, d, 0.1))
            t.add(f"blk.{i}.attn_q_norm.weight", t.vec(hd))
            t.add(f"blk.{i}.attn_k_norm.weight", t.vec(hd))
            t.add(f"blk.{i}.attn_output.weight", t.mat(d, n_head * hd, 0.05))
        ffn(i)


def golden_file(f32, arch, name, ftype):
    """Quantize the F32 file `f32` to `ftype` (--pure) as tiny-ARCH-NAME.gguf, and record
    llama.cpp's logits of a token-by-token run over the fixed ids beside it."""
    out = OUT / f"tiny-{arch}-{name}.gguf"
    subprocess.run([str(BIN / "llama-quantize"), "--pure", str(f32), str(out), ftype],
                   check=True, capture_output=True)
    logits = logits_of(out, TINY_IDS, N_VOCAB)
    assert np.isfinite(logits).all(), arch
    write_gguf(OUT / f"tiny-{arch}-{name}.logits.gguf", [
        ("ids", np.array(TINY_IDS, np.int32)), ("logits", logits)],
        [("golden.source", "llama.cpp token by token, 1 thread")])
    print(f"  {arch} {name}: {out.stat().st_size} bytes")


def run(files, only):
    """Make each `(arch, name, llama-quantize type, writer)` of `files` (only the archs named in
    `only`, if any) with [`golden_file`]."""
    OUT.mkdir(parents=True, exist_ok=True)
    if not TOOL.exists():
        build_tool()
    with tempfile.TemporaryDirectory() as tmp:
        for arch, name, ftype, make in files:
            if only and arch not in only:
                continue
            f32 = Path(tmp) / f"{arch}-f32.gguf"
            make(f32)
            golden_file(f32, arch, name, ftype)


def main():
    files = [(arch, name, ftype, make)
             for arch, make in [("qwen2", qwen2), ("qwen3", qwen3), ("qwen35", qwen35)]
             for name, ftype in FTYPES[arch].items()]
    run(files, set(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())

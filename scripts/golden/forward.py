#!/usr/bin/env python3
"""Make the forward-pass golden data under crates/engine/tests/data/forward/ from llama.cpp.

Not run by the test suite (the outputs are committed); run it again only to refresh them:

    scripts/fetch-models.sh && scripts/build-llama.sh
    python3 scripts/golden/forward.py
    python3 scripts/golden/forward.py tiny F16 ...   # only these tiny formats
    python3 scripts/golden/forward.py tied Q4_0 ...  # only these tied-output tiny files

Outputs:
- smollm2.logits.gguf: the ids of eval.txt as llama.cpp tokenizes them, and for every position of
  a token-by-token run the reference's top-K token ids and log-probabilities (the full logits are
  49152 floats a position: too big to commit; the tail beyond K is one bucket in the KL).
- smollm2.greedy.json: for each prompt in prompts.txt, its ids and the 64 greedy tokens llama.cpp
  generates (prompt prefilled in one batch, then argmax, as llama-completion --temp 0).
- tiny-<TYPE>.gguf: a random-weight llama (widths multiples of 256, a rope_freqs tensor, separate
  output matrix, a byte-level vocabulary of 257 tokens) quantized with llama-quantize --pure to each weight
  format, and tiny-<TYPE>.logits.gguf: the full logits of a token-by-token run over fixed ids.
- tiny-tied-<TYPE>.gguf and .logits.gguf: the same with a tied output (no output.weight) and 264
  tokens, for the formats llama.cpp repacks (it repacks its copy of the tied output too).
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/engine/tests/data/forward"
LLAMA = ROOT / "third_party/llama.cpp"
BIN = LLAMA / "build/bin"
TOOL = ROOT / "third_party/llama_golden"
SMOLLM2 = ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TOP_K = 64
TINY_FTYPES = {
    "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0",
    "Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q6_K": "Q6_K",
    "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "F16": "F16", "BF16": "BF16", "F32": "F32",
}
TINY_IDS = [int(x) for x in np.random.default_rng(7).integers(0, 256, 96)]


def build_tool():
    subprocess.run(["gcc", "-O2", "-o", str(TOOL), str(ROOT / "scripts/golden/llama_golden.c"),
                    f"-I{LLAMA}/include", f"-I{LLAMA}/ggml/include", f"-L{BIN}", "-lllama", "-lggml-base",
                    f"-Wl,-rpath,{BIN}"], check=True)


def tool(*args):
    return subprocess.run([str(TOOL), *map(str, args)], check=True, capture_output=True, text=True).stdout


def logits_of(model, ids, n_vocab):
    with tempfile.TemporaryDirectory() as tmp:
        idf, out = Path(tmp) / "ids.txt", Path(tmp) / "logits.f32"
        idf.write_text(" ".join(map(str, ids)))
        tool(model, "logits", idf, out)
        return np.fromfile(out, np.float32).reshape(len(ids), n_vocab)


def write_gguf(path, tensors, kv=()):
    w = gguf.GGUFWriter(str(path), arch="golden")
    for k, v in kv:
        w.add_string(k, v)
    for name, arr in tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def smollm2():
    text = OUT / "eval.txt"
    ids = [int(x) for x in tool(SMOLLM2, "tokenize", text).split()]
    assert len(ids) >= 500, len(ids)
    logits = logits_of(SMOLLM2, ids, 49152).astype(np.float64)
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    top = np.argsort(-logp, axis=1, kind="stable")[:, :TOP_K]
    top_logp = np.take_along_axis(logp, top, axis=1)
    write_gguf(OUT / "smollm2.logits.gguf", [
        ("ids", np.array(ids, np.int32)),
        ("top_ids", top.astype(np.int32)),
        ("top_logp", top_logp.astype(np.float32)),
    ], [("golden.model", SMOLLM2.name), ("golden.source", "llama.cpp token by token, 1 thread")])
    print(f"  smollm2: {len(ids)} positions")

    cases = []
    for prompt in (OUT / "prompts.txt").read_text().split("\n---\n"):
        prompt = prompt.strip("\n")
        with tempfile.TemporaryDirectory() as tmp:
            pf, idf = Path(tmp) / "p.txt", Path(tmp) / "ids.txt"
            pf.write_text(prompt)
            pids = tool(SMOLLM2, "tokenize", pf).split()
            idf.write_text(" ".join(pids))
            gen = [int(x) for x in tool(SMOLLM2, "greedy", idf, 64).split()]
        cases.append({"prompt": prompt, "ids": [int(x) for x in pids], "greedy": gen})
    (OUT / "smollm2.greedy.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"  smollm2: {len(cases)} greedy continuations")


def tiny_f32(path, tied=False):
    """The tiny llama; `tied`: no output.weight (the embedding serves), and 264 tokens, a
    multiple of eight, so that llama.cpp repacks the output where its type is repacked."""
    rng = np.random.default_rng(2026)
    n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab = 256, 256, 2, 4, 2, 264 if tied else 257
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    # A byte-level vocabulary: one token per byte, and one merge (llama.cpp wants at least one).
    byte_chars = gguf_bytes_to_unicode()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    extra = ["ab"] + [f"<x{i}>" for i in range(n_vocab - 257)]
    w.add_token_list([byte_chars[b] for b in range(256)] + extra)
    w.add_token_types([1] * n_vocab)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)

    def mat(rows, cols, scale):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, 1.0))
    w.add_tensor("rope_freqs.weight", rng.uniform(1.0, 8.0, head_dim // 2).astype(np.float32))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", rng.uniform(0.5, 1.5, n_embd).astype(np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_head * head_dim, n_embd, 0.15))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_head_kv * head_dim, n_embd, 0.15))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_head_kv * head_dim, n_embd, 0.1))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_head * head_dim, 0.05))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", rng.uniform(0.5, 1.5, n_embd).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd, 0.1))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd, 0.1))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff, 0.05))
    w.add_tensor("output_norm.weight", rng.uniform(0.5, 1.5, n_embd).astype(np.float32))
    if not tied:
        w.add_tensor("output.weight", mat(n_vocab, n_embd, 0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_bytes_to_unicode():
    """GPT-2's byte-to-unicode table (printable bytes stay, the rest map above U+0100)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def quantize_tiny(f32, ftypes, stem, n_vocab, only):
    """`stem`-TYPE.gguf for each of `ftypes` (llama-quantize --pure of `f32`), and beside it
    llama.cpp's token-by-token logits of TINY_IDS."""
    for name, ftype in ftypes.items():
        if only and name not in only:
            continue
        out = OUT / f"{stem}-{name}.gguf"
        subprocess.run([str(BIN / "llama-quantize"), "--pure", str(f32), str(out), ftype],
                       check=True, capture_output=True)
        logits = logits_of(out, TINY_IDS, n_vocab)
        write_gguf(OUT / f"{stem}-{name}.logits.gguf", [
            ("ids", np.array(TINY_IDS, np.int32)), ("logits", logits)],
            [("golden.source", "llama.cpp token by token, 1 thread")])
        print(f"  {stem} {name}: {out.stat().st_size} bytes")


def tiny(only=()):
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "tiny-f32.gguf"
        tiny_f32(f32)
        quantize_tiny(f32, TINY_FTYPES, "tiny", 257, only)


# The formats llama.cpp repacks (x86), with a tied output: tiny-tied-*.gguf.
TIED_FTYPES = {"Q4_0": "Q4_0", "Q2_K": "Q2_K", "Q4_K": "Q4_K_M", "IQ4_NL": "IQ4_NL"}


def tiny_tied(only=()):
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "tiny-tied-f32.gguf"
        tiny_f32(f32, tied=True)
        quantize_tiny(f32, TIED_FTYPES, "tiny-tied", 264, only)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    build_tool()
    if sys.argv[1:2] == ["tiny"]:
        tiny(sys.argv[2:])
        return
    if sys.argv[1:2] == ["tied"]:
        tiny_tied(sys.argv[2:])
        return
    smollm2()
    tiny()
    tiny_tied()


if __name__ == "__main__":
    sys.exit(main())

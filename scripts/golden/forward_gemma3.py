#!/usr/bin/env python3
"""Make the Gemma 3 forward-pass golden data under crates/engine/tests/data/forward/ from llama.cpp.

Not run by the test suite (the outputs are committed); run it again only to refresh them:

    scripts/fetch-models.sh && scripts/build-llama.sh
    python3 scripts/golden/forward_gemma3.py

Outputs:
- gemma3.logits.gguf: the ids of eval.txt followed by gemma3.eval.txt, as llama.cpp tokenizes them
  (with Gemma's BOS), and for every position of a token-by-token run the reference's top-K token ids
  and log-probabilities (the full logits are 262144 floats a position: far too big to commit; the
  tail beyond K is one bucket in the KL).
- gemma3.greedy.json: for each prompt in prompts.txt, its ids and the 64 greedy tokens llama.cpp
  generates with the prompt fed one token at a time (`greedy`), and with the prompt prefilled in
  one batch as llama-completion --temp 0 does (`greedy_batched`, for information: see greedy()).

The text is longer than Gemma's 512-token sliding window, so the local layers' masking is
exercised. llama_golden makes its contexts with llama.cpp's defaults, whose sliding-window cache
is full-size: every position keeps its own cell, so flash attention visits keys in position order,
the order synapse sums them in.
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forward import OUT, TOOL, TOP_K, build_tool, tool, write_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GEMMA3 = ROOT / "models/gemma-3-270m-q4_k_m.gguf"
N_VOCAB = 262144
EOG = {1, 106, 212}  # <eos>, <end_of_turn>, </s>: what llama.cpp stops at


def eval_logits():
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "eval.txt"
        text.write_text((OUT / "eval.txt").read_text() + (OUT / "gemma3.eval.txt").read_text())
        ids = [int(x) for x in tool(GEMMA3, "tokenize", text).split()]
    assert len(ids) >= 600, len(ids)
    tops, top_logps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        idf, out = Path(tmp) / "ids.txt", Path(tmp) / "logits.f32"
        idf.write_text(" ".join(map(str, ids)))
        tool(GEMMA3, "logits", idf, out)
        all_logits = np.memmap(out, np.float32, "r", shape=(len(ids), N_VOCAB))
        for p0 in range(0, len(ids), 64):  # 64 positions at a time: 134 MB in f64
            logits = np.asarray(all_logits[p0:p0 + 64], np.float64)
            logp = logits - logits.max(axis=1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
            top = np.argsort(-logp, axis=1, kind="stable")[:, :TOP_K]
            tops.append(top)
            top_logps.append(np.take_along_axis(logp, top, axis=1))
        del all_logits
    top, top_logp = np.concatenate(tops), np.concatenate(top_logps)
    write_gguf(OUT / "gemma3.logits.gguf", [
        ("ids", np.array(ids, np.int32)),
        ("top_ids", top.astype(np.int32)),
        ("top_logp", top_logp.astype(np.float32)),
    ], [("golden.model", GEMMA3.name), ("golden.source", "llama.cpp token by token, 1 thread")])
    print(f"  gemma3: {len(ids)} positions")


def argmax_rows(ids):
    """The argmax of every position's logits, llama.cpp run token by token over `ids`."""
    with tempfile.TemporaryDirectory() as tmp:
        idf, out = Path(tmp) / "ids.txt", Path(tmp) / "logits.f32"
        idf.write_text(" ".join(map(str, ids)))
        tool(GEMMA3, "logits", idf, out)
        logits = np.memmap(out, np.float32, "r", shape=(len(ids), N_VOCAB))
        best = [int(np.argmax(row)) for row in logits]
        del logits
        return best


def greedy_batched(ids, n):
    """llama_golden's greedy: the prompt prefilled in one batch, then one token at a time."""
    with tempfile.TemporaryDirectory() as tmp:
        idf = Path(tmp) / "ids.txt"
        idf.write_text(" ".join(map(str, ids)))
        return [int(x) for x in tool(GEMMA3, "greedy", idf, n).split()]


def greedy_token_by_token(ids, n):
    """The n greedy tokens llama.cpp picks when it also feeds the prompt one token at a time.

    Guess and verify: a run of the batched greedy gives a guess; one token-by-token run over the
    prompt and the guess gives every position's argmax; the guess is kept up to its first
    disagreement, which is replaced by the argmax, and the rest is guessed again from there."""
    gen = []
    while len(gen) < n:
        guess = gen + greedy_batched(ids + gen, n - len(gen))
        if len(guess) == len(gen):
            break  # the model ended the text
        best = argmax_rows(ids + guess)[len(ids) - 1:]
        k = next((i for i, (g, b) in enumerate(zip(guess, best)) if g != b), len(guess))
        gen = guess[:k] + ([best[k]] if k < len(guess) else [])
        if gen[-1] in EOG:
            break
    return gen[:n]


def greedy():
    """For every prompt: llama.cpp's greedy continuation with the prompt fed one token at a time,
    the reference (synapse's output does not depend on the batch: G1), and with the prompt in one
    batch, as llama-completion runs it; llama.cpp's batched kernels round differently, and on this
    model the two differ on about half of the prompts."""
    cases = []
    for prompt in (OUT / "prompts.txt").read_text().split("\n---\n"):
        prompt = prompt.strip("\n")
        with tempfile.TemporaryDirectory() as tmp:
            pf = Path(tmp) / "p.txt"
            pf.write_text(prompt)
            ids = [int(x) for x in tool(GEMMA3, "tokenize", pf).split()]
        cases.append({"prompt": prompt, "ids": ids, "greedy": greedy_token_by_token(ids, 64),
                      "greedy_batched": greedy_batched(ids, 64)})
    (OUT / "gemma3.greedy.json").write_text(json.dumps(cases, indent=1) + "\n")
    same = sum(c["greedy"] == c["greedy_batched"] for c in cases)
    print(f"  gemma3: {len(cases)} greedy continuations ({same} unchanged by a batched prefill)")


def main():
    if not TOOL.exists():
        build_tool()
    eval_logits()
    greedy()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Make crates/engine/tests/data/quantize/golden.json: what llama.cpp's llama-quantize writes
for each case below, as the SHA-256 of the output's header (everything before the data) and
of each tensor's bytes (its first 16 hex digits), so that tests/quantize.rs can name the first tensor synapse writes
differently.

The importance matrices beside it were made by llama-imatrix (`make_imatrices`, run with
--imatrices): on the tiny llama and the tiny qwen3moe file over tests/data/forward/eval.txt, and on
SmolLM2's F16 copy over crates/cli/tests/data/perplexity.txt, all at -c 128.

Not run by the test suite; to refresh (after scripts/fetch-models.sh and
scripts/build-llama.sh):

    PYTHONPATH=third_party/llama.cpp/gguf-py python3 scripts/golden/quantize.py [--imatrices]
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "third_party/llama.cpp/build/bin"
FORWARD = "crates/engine/tests/data/forward"
DATA = "crates/engine/tests/data/quantize"
SMOLLM2 = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
# The F16 copy of SmolLM2 that the first SmolLM2 case makes; later cases read it.
SMOLLM2_F16 = "@smollm2-f16"

MIXES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
         "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16", "BF16", "MXFP4_MOE"]
ARCH_FILES = ["gemma2-Q4_0", "granite-Q6_K", "llamamoe-Q8_0", "olmo2-IQ4_NL", "phi3-Q4_K",
              "qwen2-Q8_0", "qwen3-Q4_K", "qwen35-Q4_K", "qwen35moe-Q4_K", "qwen3moe-Q4_K",
              "gpt-oss-MXFP4"]
MOE_FILES = ["llamamoe-Q8_0", "qwen35moe-Q4_K", "qwen3moe-Q4_K", "gpt-oss-MXFP4"]


def cases():
    tiny = f"{FORWARD}/tiny-F16.gguf"
    imatrix = f"{DATA}/tiny.imatrix.gguf"
    out = []
    for m in MIXES:
        out.append({"input": tiny, "mix": m})
    for m in MIXES[:16] + ["Q2_K_S"]:
        out.append({"input": tiny, "mix": m, "imatrix": imatrix})
    out += [
        {"input": tiny, "mix": "Q4_K_M", "pure": True},
        {"input": tiny, "mix": "Q3_K_M", "leave_output_tensor": True},
        {"input": tiny, "mix": "Q5_K_S", "output_tensor_type": "q8_0",
         "token_embedding_type": "q4_0"},
        {"input": tiny, "mix": "Q4_K_S", "tensor_types": ["attn_v=q8_0", "ffn_down=iq4_nl"]},
    ]
    for f in ARCH_FILES:
        for m in ["Q4_K_M", "Q3_K_S", "IQ4_XS"]:
            out.append({"input": f"{FORWARD}/tiny-{f}.gguf", "mix": m, "allow_requantize": True})
    # The mix that writes MXFP4: the experts MXFP4, every other matrix Q8_0.
    for f in MOE_FILES:
        out.append({"input": f"{FORWARD}/tiny-{f}.gguf", "mix": "MXFP4_MOE",
                    "allow_requantize": True})
    moe = f"{FORWARD}/tiny-qwen3moe-Q4_K.gguf"
    for m in ["Q4_K_M", "Q2_K_S"]:
        out.append({"input": moe, "mix": m, "allow_requantize": True,
                    "imatrix": f"{DATA}/qwen3moe.imatrix.gguf"})
    out += [
        {"input": SMOLLM2, "mix": "F16", "allow_requantize": True, "makes": SMOLLM2_F16},
        {"input": SMOLLM2_F16, "mix": "Q4_K_M"},
        {"input": SMOLLM2_F16, "mix": "Q4_K_M", "imatrix": f"{DATA}/smollm2.imatrix.gguf"},
    ]
    return out


def llama_quantize(case, inp, out):
    cmd = [str(BIN / "llama-quantize")]
    for flag in ["pure", "allow_requantize", "leave_output_tensor"]:
        if case.get(flag):
            cmd.append("--" + flag.replace("_", "-"))
    # The imatrix by its path from the repository's root, which llama-quantize records in the
    # output's metadata (quantize.imatrix.file) as it was given.
    for flag in ["output_tensor_type", "token_embedding_type", "imatrix"]:
        if case.get(flag):
            cmd += ["--" + flag.replace("_", "-"), case[flag]]
    for t in case.get("tensor_types", []):
        cmd += ["--tensor-type", t]
    cmd += [str(inp), str(out), case["mix"], "2"]
    env = dict(os.environ, LD_LIBRARY_PATH=str(BIN))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def digest(path):
    """The header's hash and each tensor's, in file order."""
    data = path.read_bytes()
    r = gguf.GGUFReader(str(path))
    start = r.data_offset
    tensors = []
    for t in r.tensors:
        off = t.data_offset
        h = hashlib.sha256(data[off:off + t.n_bytes]).hexdigest()[:16]
        tensors.append([t.name, t.tensor_type.name, h])
    return {"bytes": len(data), "header": hashlib.sha256(data[:start]).hexdigest(),
            "file": hashlib.sha256(data).hexdigest(), "tensors": tensors}


def make_imatrices():
    env = dict(os.environ, LD_LIBRARY_PATH=str(BIN))
    with tempfile.TemporaryDirectory() as tmp:
        f16 = Path(tmp) / "smollm2-f16.gguf"
        llama_quantize({"mix": "F16", "allow_requantize": True}, ROOT / SMOLLM2, f16)
        for model, text, out in [
            (ROOT / FORWARD / "tiny-F16.gguf", f"{FORWARD}/eval.txt", "tiny.imatrix.gguf"),
            (ROOT / FORWARD / "tiny-qwen3moe-Q4_K.gguf", f"{FORWARD}/eval.txt",
             "qwen3moe.imatrix.gguf"),
            (f16, "crates/cli/tests/data/perplexity.txt", "smollm2.imatrix.gguf"),
        ]:
            extra = ["--chunks", "4"] if out.startswith("smollm2") else []
            subprocess.run([str(BIN / "llama-imatrix"), "-m", str(model), "-f", text, "-c", "128",
                            "-t", "2", "-o", f"{DATA}/{out}"] + extra,
                           check=True, env=env, cwd=ROOT, capture_output=True)


def main():
    if "--imatrices" in sys.argv:
        make_imatrices()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        made = {}
        for i, case in enumerate(cases()):
            inp = made.get(case["input"]) or ROOT / case["input"]
            out = Path(tmp) / f"case{i}.gguf"
            llama_quantize(case, inp, out)
            results.append(dict(case, **digest(out)))
            if "makes" in case:
                made[case["makes"]] = out
            print(f"{i:3} {case['input']} {case['mix']}", file=sys.stderr)
    path = ROOT / DATA / "golden.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}: {len(results)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()

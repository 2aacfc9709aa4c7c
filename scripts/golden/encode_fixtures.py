#!/usr/bin/env python3
"""Make crates/quant/tests/data/encode.gguf: rows of floats and what ggml's file quantizer
(`ggml_quantize_chunk`, the function llama-quantize calls) writes for them in every type synapse
encodes, with and without an importance vector.

Not run by the test suite (the output is committed); to refresh it:

    scripts/build-llama.sh
    PYTHONPATH=third_party/llama.cpp/gguf-py python3 scripts/golden/encode_fixtures.py

Tensors: `x` (ROWS x COLS f32), `importance` (COLS f32), and for each type T, `plain.T` and
(for the types that take importance) `weighted.T`: the encoded rows, stored as type T.
"""

import ctypes
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/quant/tests/data/encode.gguf"
BIN = ROOT / "third_party/llama.cpp/build/bin"
COLS = 512
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
         "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]


def rows(rng):
    """Rows that take every branch of the searches: ordinary and heavy-tailed weights, one-signed
    rows, outliers, all-zero and nearly-zero groups, constant groups, huge and tiny scales."""
    g = lambda s=1.0: rng.standard_normal(COLS).astype(np.float32) * s
    out = [g(0.02), g(0.05), g(1.0), rng.standard_t(2.5, COLS).astype(np.float32) * 0.03]
    r = g(0.02); r[rng.integers(0, COLS, 6)] *= 60; out.append(r)              # outliers
    out.append(np.abs(g(0.03)))                                                # all positive
    out.append(-np.abs(g(0.03)))                                               # all negative
    r = g(0.02); r[:40] = 0; r[300:340] = 1e-17; out.append(r)                 # zero groups
    out.append(np.zeros(COLS, np.float32))
    r = g(0.02); r[64:128] = 0.015; r[200:216] = -0.3; out.append(r)           # constant runs
    out.append(g(3e4)); out.append(g(1e-6))                                    # far from 1
    out.append(rng.uniform(-0.04, 0.04, COLS).astype(np.float32))
    r = np.round(g(4)).astype(np.float32) * 0.01; out.append(r)                # ties on levels
    return np.stack(out)


def main():
    base = ctypes.CDLL(str(BIN / "libggml-base.so"))
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_void_p]
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    rng = np.random.default_rng(20261207)
    x = np.ascontiguousarray(rows(rng))
    importance = rng.gamma(0.7, 2.0, COLS).astype(np.float32)
    importance[rng.integers(0, COLS, 12)] = 0.0
    importance[:3] = [1e-9, 250.0, 0.0]

    w = gguf.GGUFWriter(str(OUT), arch="fixture")
    w.add_tensor("x", x)
    w.add_tensor("importance", importance)
    for name in TYPES:
        ty = gguf.GGMLQuantizationType[name]
        row = base.ggml_row_size(ty.value, COLS)
        cases = [("plain", None)]
        if name not in ("F32", "F16", "BF16", "Q8_0", "MXFP4"):  # they take no importance
            cases.append(("weighted", importance))
        for label, qw in cases:
            out = np.zeros((x.shape[0], row), np.uint8)
            n = base.ggml_quantize_chunk(ty.value, x.ctypes.data, out.ctypes.data, 0,
                                         x.shape[0], COLS,
                                         None if qw is None else qw.ctypes.data)
            assert n == out.size, (name, n, out.size)
            w.add_tensor(f"{label}.{name}", out, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

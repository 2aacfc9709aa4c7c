#!/usr/bin/env python3
"""Make the block-format fixtures and golden values under crates/quant/tests/data/.

Not run by the test suite (the outputs are committed); run it again only to refresh them:

    scripts/fetch-models.sh && scripts/build-llama.sh
    python3 scripts/golden/quant_fixtures.py

Outputs, each a small GGUF file:
- real_<model>.gguf: a few rows of every quantized type found in the real models, and
  real_<model>.f32.gguf: the same tensors dequantized by the `gguf` package
  (gguf.quants.dequantize, the format's published reference).
- fmt_<TYPE>.gguf: rows of a random-weight llama model quantized by llama.cpp's llama-quantize,
  and fmt_<TYPE>.f32.gguf: their dequantization by the `gguf` package (for Q8_1 and Q8_K, which
  no file stores and the package cannot decode, by ggml's own to_float), plus `<name>.src`, the
  floats that were quantized, for round-trip error budgets.
- act.gguf: float rows `x` and their Q8_0, Q8_1 and Q8_K encodings by ggml's reference
  quantizers (`quantize_row_*_ref`, called through libggml).
- dot.gguf: for every weight type, activation rows in its vec_dot type and the dot products
  ggml's CPU backend computes for them (`ggml_get_type_traits_cpu(type)->vec_dot`).
"""

import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/quant/tests/data"
BIN = ROOT / "third_party/llama.cpp/build/bin"
MODELS = ROOT / "models"
RNG = np.random.default_rng(20261130)
# gguf-py still lists Q8_1 at 40 bytes (its pre-2023 layout with f32 d and s); ggml's block_q8_1
# is 36 bytes (two f16 and 32 int8). Ggml.__init__ checks every size used here against ggml.
gguf.GGML_QUANT_SIZES[T.Q8_1] = (32, 36)

# llama-quantize file types, and the tensor type each gives with --pure.
FTYPES = {
    "Q4_0": T.Q4_0, "Q4_1": T.Q4_1, "Q5_0": T.Q5_0, "Q5_1": T.Q5_1, "Q8_0": T.Q8_0,
    "Q2_K": T.Q2_K, "Q3_K_M": T.Q3_K, "Q4_K_M": T.Q4_K, "Q5_K_M": T.Q5_K, "Q6_K": T.Q6_K,
    "IQ4_NL": T.IQ4_NL, "IQ4_XS": T.IQ4_XS, "F16": T.F16, "BF16": T.BF16, "MXFP4_MOE": T.MXFP4,
}
# Rows of each tensor kept in a fixture.
KEEP_ROWS = 6


def type_size(t):
    return gguf.GGML_QUANT_SIZES[t]


def raw_rows(tensor, rows):
    """The first `rows` rows of a reader tensor, as (bytes as uint8 2-D array, shape ne)."""
    ne0 = int(tensor.shape[0])
    block, size = type_size(tensor.tensor_type)
    row_bytes = ne0 // block * size
    data = np.asarray(tensor.data).view(np.uint8).reshape(-1)[: rows * row_bytes]
    return data.reshape(rows, row_bytes), ne0


def write(path, tensors, kv=()):
    """tensors: list of (name, np array, raw_dtype or None, ne0 for raw)."""
    w = gguf.GGUFWriter(str(path), arch="fixture")
    for k, v in kv:
        w.add_string(k, v)
    for name, arr, raw_dtype in tensors:
        if raw_dtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def real_fixture(model_path, label):
    r = gguf.GGUFReader(str(model_path))
    picked = {}
    for t in r.tensors:
        if t.tensor_type in (T.F32,) or t.tensor_type in picked:
            continue
        if len(t.shape) < 2:
            continue
        picked[t.tensor_type] = t
    q, f = [], []
    for ty, t in sorted(picked.items()):
        rows, ne0 = raw_rows(t, KEEP_ROWS)
        q.append((t.name, rows, ty))
        f.append((t.name, dequantize(rows, ty).astype(np.float32), None))
        print(f"  {label}: {t.name} {ty.name} ne0={ne0}")
    write(OUT / f"real_{label}.gguf", q, [("fixture.source", model_path.name)])
    write(OUT / f"real_{label}.f32.gguf", f, [("fixture.source", model_path.name)])


def source_weights(rows, cols):
    """Weights with the features that stress a quantizer: per-row scales, heavy tails, a block of
    zeros, a constant block, negative-only and positive-only blocks."""
    w = RNG.standard_normal((rows, cols)).astype(np.float32)
    w *= np.exp(RNG.uniform(-3, 1, size=(rows, 1))).astype(np.float32)
    w += (RNG.standard_t(3, size=(rows, cols)) * 0.05).astype(np.float32)
    w[0, :32] = 0.0
    w[1, 32:64] = 0.25
    w[2, 64:96] = -np.abs(w[2, 64:96])
    w[3, 96:128] = np.abs(w[3, 96:128])
    return w


def tiny_llama_f32(path):
    """A one-layer llama with widths that are multiples of 256, in F32."""
    n_embd, n_ff, n_vocab, n_head, n_head_kv = 256, 512, 64, 4, 2
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(128)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(1)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_token_merges([])
    src = {
        "token_embd.weight": source_weights(n_vocab, n_embd),
        "blk.0.attn_norm.weight": np.ones(n_embd, np.float32),
        "blk.0.attn_q.weight": source_weights(n_embd, n_embd),
        "blk.0.attn_k.weight": source_weights(n_embd // 2, n_embd),
        "blk.0.attn_v.weight": source_weights(n_embd // 2, n_embd),
        "blk.0.attn_output.weight": source_weights(n_embd, n_embd),
        "blk.0.ffn_norm.weight": np.ones(n_embd, np.float32),
        "blk.0.ffn_gate.weight": source_weights(n_ff, n_embd),
        "blk.0.ffn_up.weight": source_weights(n_ff, n_embd),
        "blk.0.ffn_down.weight": source_weights(n_embd, n_ff),
        "output_norm.weight": np.ones(n_embd, np.float32),
        "output.weight": source_weights(n_vocab, n_embd),
    }
    for name, arr in src.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return src


def format_fixtures(lib):
    keep = ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"]
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "tiny-f32.gguf"
        src = tiny_llama_f32(f32)
        for ftype, ty in FTYPES.items():
            out = Path(tmp) / f"tiny-{ftype}.gguf"
            subprocess.run([str(BIN / "llama-quantize"), "--pure", str(f32), str(out), ftype],
                           check=True, capture_output=True)
            r = gguf.GGUFReader(str(out))
            q, f = [], []
            for t in r.tensors:
                if t.name not in keep:
                    continue
                assert t.tensor_type == ty, (ftype, t.name, t.tensor_type)
                rows, ne0 = raw_rows(t, KEEP_ROWS)
                q.append((t.name, rows, ty))
                f.append((t.name, dequantize(rows, ty).astype(np.float32), None))
                f.append((t.name + ".src", src[t.name][:KEEP_ROWS].copy(), None))
            write(OUT / f"fmt_{ty.name}.gguf", q, [("fixture.source", f"llama-quantize --pure {ftype}")])
            write(OUT / f"fmt_{ty.name}.f32.gguf", f)
            print(f"  fmt {ty.name}: {len(q)} tensors")
    # Q8_1 and Q8_K are activation formats: no file stores them, so quantize with ggml's reference
    # quantizer and decode with ggml's to_float (the gguf package has no Q8_K decoder and gives
    # Q8_1 a stale 40-byte size).
    for ty in (T.Q8_1, T.Q8_K):
        x = source_weights(KEEP_ROWS, 512)
        q = lib.quantize_ref(ty, x)
        if ty == T.Q8_1:
            # ggml has no to_float for Q8_1; its meaning is d * q (s is a derived sum).
            blocks = q.reshape(-1, 36)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            deq = (blocks[:, 4:].copy().view(np.int8).astype(np.float32) * d).reshape(x.shape)
        else:
            deq = lib.to_float(ty, q, x.shape)
        write(OUT / f"fmt_{ty.name}.gguf", [("x", q, ty)], [("fixture.source", "ggml quantize_row_ref")])
        write(OUT / f"fmt_{ty.name}.f32.gguf", [("x", deq, None), ("x.src", x, None)])
        print(f"  fmt {ty.name}: from ggml")


class Ggml:
    """The few libggml entry points the fixtures need, through ctypes."""

    class Traits(ctypes.Structure):
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    class CpuTraits(ctypes.Structure):
        _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                    ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]

    FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

    def __init__(self):
        self.base = ctypes.CDLL(str(BIN / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(BIN / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        self.base.ggml_get_type_traits.restype = ctypes.POINTER(self.Traits)
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(self.CpuTraits)
        self.base.ggml_type_size.restype = ctypes.c_size_t
        self.cpu.ggml_cpu_init()
        # Every block size the fixtures rely on must be ggml's own.
        for ty in (*FTYPES.values(), T.Q8_1, T.Q8_K):
            assert self.base.ggml_type_size(ty.value) == type_size(ty)[1], ty

    def traits(self, ty):
        return self.base.ggml_get_type_traits(ty.value).contents

    @staticmethod
    def _ggml_name(ty):
        return ty.name.lower().replace("_k", "_K")

    def quantize_ref(self, ty, x):
        """ggml's reference quantizer, `quantize_row_<type>_ref` (exported by ggml-base)."""
        x = np.ascontiguousarray(x, np.float32)
        rows, n = x.shape
        block = type_size(ty)[0]
        size = self.base.ggml_type_size(ty.value)
        out = np.zeros((rows, n // block * size), np.uint8)
        f = self.FROM_FLOAT(ctypes.cast(getattr(self.base, f"quantize_row_{self._ggml_name(ty)}_ref"),
                                        ctypes.c_void_p).value)
        for r in range(rows):
            f(x[r].ctypes.data, out[r].ctypes.data, n)
        return out

    def quantize_cpu(self, ty, x):
        """ggml-cpu's quantizer for the type (`ggml_get_type_traits_cpu(type)->from_float`)."""
        x = np.ascontiguousarray(x, np.float32)
        rows, n = x.shape
        size = self.base.ggml_type_size(ty.value)
        out = np.zeros((rows, n // type_size(ty)[0] * size), np.uint8)
        f = self.FROM_FLOAT(self.cpu.ggml_get_type_traits_cpu(ty.value).contents.from_float)
        for r in range(rows):
            f(x[r].ctypes.data, out[r].ctypes.data, n)
        return out

    def to_float(self, ty, q, shape):
        """ggml's `dequantize_row_<type>`."""
        out = np.zeros(shape, np.float32)
        f = self.TO_FLOAT(ctypes.cast(getattr(self.base, f"dequantize_row_{self._ggml_name(ty)}"),
                                      ctypes.c_void_p).value)
        for r in range(shape[0]):
            f(q[r].ctypes.data, out[r].ctypes.data, shape[1])
        return out

    def vec_dot(self, ty, w, a, n):
        ct = self.cpu.ggml_get_type_traits_cpu(ty.value).contents
        f = self.VEC_DOT(ct.vec_dot)
        s = ctypes.c_float()
        f(n, ctypes.byref(s), 0, w.ctypes.data, 0, a.ctypes.data, 0, 1)
        return s.value

    def vec_dot_type(self, ty):
        return T(self.cpu.ggml_get_type_traits_cpu(ty.value).contents.vec_dot_type)


def activation_fixture(lib):
    n = 512
    x = RNG.standard_normal((8, n)).astype(np.float32) * np.float32(3.0)
    x[1] = 0.0                                    # all zero: scale 0
    x[2, :256] = np.float32(0.5) * RNG.integers(-254, 255, 256)   # exact ties for Q8_0/Q8_1
    x[3] = -np.abs(x[3])                          # negative maximum: Q8_K's sign handling
    x[4] *= np.float32(1e-30)                     # tiny values
    x[5, ::7] = np.float32(1e4)                   # a few large values
    x[6, :256] = np.float32(127.0) / np.arange(1, 257, dtype=np.float32)  # Q8_K round-half-even
    tensors = [("x", x, None)]
    for ty in (T.Q8_0, T.Q8_1, T.Q8_K):
        tensors.append((f"x.{ty.name}", lib.quantize_ref(ty, x), ty))
        # What llama.cpp uses at inference: ggml-cpu's quantizer (vectorised on x86).
        tensors.append((f"x.{ty.name}.cpu", lib.quantize_cpu(ty, x), ty))
    write(OUT / "act.gguf", tensors, [("fixture.source", "ggml quantize_row_*_ref and ggml-cpu from_float")])
    print("  act: Q8_0 Q8_1 Q8_K")


def dot_fixture(lib):
    """Weights: the fmt_ fixtures. Activations: random rows in each weight type's vec_dot type,
    encoded by ggml's reference quantizer. Golden: ggml's CPU vec_dot on those bytes (floats:
    the float64 dot of the decoded values, since ggml dots F16 with F16, not F32)."""
    tensors = []
    for ty in list(FTYPES.values()):
        r = gguf.GGUFReader(str(OUT / f"fmt_{ty.name}.gguf"))
        for t in r.tensors:
            rows, ne0 = raw_rows(t, KEEP_ROWS)
            act = np.ascontiguousarray(RNG.standard_normal((1, ne0)).astype(np.float32))
            tag = f"{ty.name}.{t.name}"
            if ty in (T.F16, T.BF16):
                w = dequantize(rows, ty).astype(np.float64)
                dots = (w @ act[0].astype(np.float64)).astype(np.float32)
                tensors += [(f"{tag}.w", rows, ty), (f"{tag}.a", act, None)]
            else:
                vt = lib.vec_dot_type(ty)
                a = lib.quantize_ref(vt, act)
                dots = np.array([lib.vec_dot(ty, np.ascontiguousarray(rows[i]), a[0], ne0)
                                 for i in range(rows.shape[0])], np.float32)
                tensors += [(f"{tag}.w", rows, ty), (f"{tag}.a", a, vt)]
            tensors.append((f"{tag}.dot", dots, None))
    write(OUT / "dot.gguf", tensors, [("fixture.source", "ggml-cpu vec_dot")])
    print(f"  dot: {len(tensors) // 3} weight tensors")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    lib = Ggml()
    real_fixture(MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")
    real_fixture(MODELS / "gemma-3-270m-q4_k_m.gguf", "gemma3")
    format_fixtures(lib)
    activation_fixture(lib)
    dot_fixture(lib)


if __name__ == "__main__":
    sys.exit(main())

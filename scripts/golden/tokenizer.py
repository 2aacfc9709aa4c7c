#!/usr/bin/env python3
"""Make the tokenizer golden data under crates/engine/tests/data/tokenizer/ with llama.cpp.

Not run by the test suite (the outputs are committed); run it again only to refresh them:

    scripts/fetch-models.sh && scripts/build-llama.sh
    python3 scripts/golden/tokenizer.py            # golden ids (and the Unicode table)
    python3 scripts/golden/tokenizer.py golden     # only the golden ids
    python3 scripts/golden/tokenizer.py unicode    # only crates/engine/src/tokenizer/unicode_data.rs

golden: every corpus/*.txt is tokenized by `llama-tokenize` for each vocabulary set below, once
with special-token parsing (the tool's default) and once without (`--no-parse-special`), BOS as the
model says (the tool's default). Files are read verbatim (`--no-escape`). Each result lands in
golden/<set>/<name>.<mode>.json:

    {"text_file": "corpus/<name>.txt", "model": "<file in models/>",
     "metadata_overrides": {...}, "add_bos": bool, "parse_special": bool,
     "ids": [...], "pieces_hex": ["..", ...]}

`pieces_hex` is what llama.cpp prints for each token (`common_token_to_piece`, special tokens
rendered), hex-encoded. The tool prints pieces with printf("%s"), so a piece holding a NUL byte is
cut at it; the test knows.

Besides the two real models, the sets include the SmolLM2 vocabulary under other BPE
pre-tokenizers (llama-bpe, qwen2, gpt-2, default, tekken, gpt-4o) and the Gemma 3 vocabulary with
add_space_prefix on: vocabulary-only GGUF copies with the metadata overridden (no tensors), made
in a temporary folder and never committed. The test applies the same overrides to the real
model's metadata.

unicode: the code point categories, the white-space set, the lower-case map and the NFD ranges
(WordPiece's normalizer) are taken from llama.cpp's
src/unicode-data.cpp (generated there from the UCD), so that synapse's pre-tokenizers classify
every code point exactly as llama.cpp does, whatever the Unicode version of the machine.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "crates/engine/tests/data/tokenizer"
CORPUS = DATA / "corpus"
GOLDEN = DATA / "golden"
BIN = ROOT / "third_party/llama.cpp/build/bin"
MODELS = ROOT / "models"
UNICODE_SRC = ROOT / "third_party/llama.cpp/src/unicode-data.cpp"
UNICODE_OUT = ROOT / "crates/engine/src/tokenizer/unicode_data.rs"

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"

# (set name, model file, metadata overrides)
SETS = [
    ("smollm2", SMOLLM2, {}),
    ("gemma3", GEMMA3, {}),
    ("smollm2-llama-bpe", SMOLLM2, {"tokenizer.ggml.pre": "llama-bpe"}),
    ("smollm2-qwen2", SMOLLM2, {"tokenizer.ggml.pre": "qwen2"}),
    ("smollm2-gpt2", SMOLLM2, {"tokenizer.ggml.pre": "gpt-2"}),
    ("smollm2-default", SMOLLM2, {"tokenizer.ggml.pre": "default"}),
    ("smollm2-tekken", SMOLLM2, {"tokenizer.ggml.pre": "tekken"}),
    ("smollm2-gpt-4o", SMOLLM2, {"tokenizer.ggml.pre": "gpt-4o"}),
    ("gemma3-space-prefix", GEMMA3, {"tokenizer.ggml.add_space_prefix": True}),
]

MODES = [("special", True), ("nospecial", False)]


def import_gguf():
    try:
        import gguf  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "third_party/llama.cpp/gguf-py"))
    import gguf

    return gguf


def write_variant(src: Path, dst: Path, overrides: dict) -> None:
    """A vocabulary-only copy of `src` (all metadata, no tensors) with `overrides` applied."""
    gguf = import_gguf()
    reader = gguf.GGUFReader(src)
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(dst, arch)
    pending = dict(overrides)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = pending.pop(field.name, field.contents())
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for key, value in pending.items():
        vtype = gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.STRING
        writer.add_key_value(key, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()


def run_tokenize(model: Path, text_file: Path, parse_special: bool, ids: bool) -> bytes:
    cmd = [str(BIN / "llama-tokenize"), "-m", str(model), "-f", str(text_file),
           "--log-disable", "--no-escape"]
    if ids:
        cmd.append("--ids")
    if not parse_special:
        cmd.append("--no-parse-special")
    env = dict(os.environ, LD_LIBRARY_PATH=str(BIN))
    out = subprocess.run(cmd, env=env, check=True, capture_output=True)
    return out.stdout


def parse_pieces(out: bytes, ids: list[int]) -> list[bytes]:
    """Split the tool's `%6d -> '%s'\\n` lines, knowing the ids (a piece may hold newlines)."""
    pieces = []
    pos = 0
    for k, tid in enumerate(ids):
        head = b"%6d -> '" % tid
        if not out.startswith(head, pos):
            raise SystemExit(f"unexpected piece output at byte {pos}: {out[pos:pos + 40]!r}")
        pos += len(head)
        if k + 1 < len(ids):
            end = out.index(b"'\n" + b"%6d -> '" % ids[k + 1], pos)
        else:
            end = len(out) - 2
            if out[end:] != b"'\n":
                raise SystemExit(f"unexpected end of piece output: {out[-40:]!r}")
        pieces.append(out[pos:end])
        pos = end + 2
    return pieces


def golden() -> None:
    tool = BIN / "llama-tokenize"
    if not tool.exists():
        raise SystemExit(f"{tool} is missing: run scripts/build-llama.sh")
    texts = sorted(CORPUS.glob("*.txt"))
    empty = CORPUS / "empty.txt"
    with tempfile.TemporaryDirectory() as tmp:
        for name, model_file, overrides in SETS:
            model = MODELS / model_file
            if not model.exists():
                raise SystemExit(f"{model} is missing: run scripts/fetch-models.sh")
            if overrides:
                variant = Path(tmp) / f"{name}.gguf"
                write_variant(model, variant, overrides)
                model = variant
            # The tool adds BOS when the vocabulary says so: an empty text shows whether it does.
            bos_ids = json.loads(run_tokenize(model, empty, True, True))
            assert len(bos_ids) <= 1, bos_ids
            add_bos = len(bos_ids) == 1
            out_dir = GOLDEN / name
            out_dir.mkdir(parents=True, exist_ok=True)
            for old in out_dir.glob("*.json"):
                old.unlink()
            for text_file in texts:
                for mode, parse_special in MODES:
                    ids = json.loads(run_tokenize(model, text_file, parse_special, True))
                    pieces = parse_pieces(run_tokenize(model, text_file, parse_special, False), ids)
                    record = {
                        "text_file": f"corpus/{text_file.name}",
                        "model": model_file,
                        "metadata_overrides": overrides,
                        "add_bos": add_bos,
                        "parse_special": parse_special,
                        "ids": ids,
                        "pieces_hex": [p.hex() for p in pieces],
                    }
                    path = out_dir / f"{text_file.stem}.{mode}.json"
                    path.write_text(json.dumps(record, ensure_ascii=False) + "\n")
            print(f"{name}: {len(texts)} texts x {len(MODES)} modes", file=sys.stderr)


def unicode_table() -> None:
    src = UNICODE_SRC.read_text()

    def block(name: str) -> str:
        m = re.search(name + r"\s*=\s*\{(.*?)\n\};", src, re.S)
        if not m:
            raise SystemExit(f"{UNICODE_SRC}: no table {name}")
        return m.group(1)

    ranges = [(int(a, 16), int(b, 16)) for a, b in
              re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}", block("unicode_ranges_flags"))]
    assert ranges[0][0] == 0 and ranges[-1] == (0x110000, 0), ranges[-1]
    merged = []
    for start, flags in ranges[:-1]:
        assert flags <= 0xFF, (hex(start), flags)  # category bits only
        if not merged or merged[-1][1] != flags:
            merged.append((start, flags))
    spaces = [int(a, 16) for a in re.findall(r"0x([0-9A-Fa-f]+)", block("unicode_set_whitespace"))]
    # The llama3/qwen2 contractions lower-case one code point; only ASCII letters map onto the
    # letters they test (s t m d r e v l), which the Rust side relies on.
    lower = [(int(a, 16), int(b, 16)) for a, b in
             re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}", block("unicode_map_lowercase"))]
    for upper, low in lower:
        if chr(low) in "stmdrevl":
            assert upper < 0x80, hex(upper)

    lines = [
        "//! Code point categories and white space, as llama.cpp's `src/unicode-data.cpp` has them.",
        "//!",
        "//! Generated by `scripts/golden/tokenizer.py unicode`; do not edit.",
        "",
        "/// `(first code point, category bits)`: each range runs to the next entry's start; the last",
        "/// runs to U+10FFFF. Bits as in [`super::unicode`].",
        "#[rustfmt::skip]",
        "pub(super) static CATEGORY_RANGES: &[(u32, u8)] = &[",
    ]
    row = []
    for start, flags in merged:
        row.append(f"(0x{start:05X}, 0x{flags:02X}),")
        if len(row) == 6:
            lines.append("    " + " ".join(row))
            row = []
    if row:
        lines.append("    " + " ".join(row))
    lines += [
        "];",
        "",
        "/// Code points that match `\\s`, sorted.",
        "#[rustfmt::skip]",
        "pub(super) static WHITESPACE: &[u32] = &[",
    ]
    spaces = sorted(spaces)
    for i in range(0, len(spaces), 8):
        lines.append("    " + " ".join(f"0x{c:04X}," for c in spaces[i:i + 8]))
    lines += ["];", ""]
    # WordPiece's normalizer (BERT vocabularies): llama.cpp's lower-case map and its one-code-point
    # NFD (each range of code points maps to the first code point of its decomposition).
    lines += [
        "/// `(code point, lower case)`, sorted: llama.cpp's `unicode_tolower` map.",
        "#[rustfmt::skip]",
        "pub(super) static LOWERCASE: &[(u32, u32)] = &[",
    ]
    for i in range(0, len(lower), 6):
        lines.append("    " + " ".join(f"(0x{a:05X}, 0x{b:05X})," for a, b in lower[i:i + 6]))
    lines += ["];", ""]
    nfd = [(int(a, 16), int(b, 16), int(c, 16)) for a, b, c in
           re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}",
                      block("unicode_ranges_nfd"))]
    assert nfd == sorted(nfd) and lower == sorted(lower)
    lines += [
        "/// `(first, last, nfd)`, sorted: llama.cpp's `unicode_cpts_normalize_nfd` ranges, each code",
        "/// point of a range mapping to one code point.",
        "#[rustfmt::skip]",
        "pub(super) static NFD_RANGES: &[(u32, u32, u32)] = &[",
    ]
    for i in range(0, len(nfd), 4):
        lines.append("    " + " ".join(f"(0x{a:05X}, 0x{b:05X}, 0x{c:05X})," for a, b, c in nfd[i:i + 4]))
    lines += ["];", ""]
    UNICODE_OUT.write_text("\n".join(lines))
    print(f"{UNICODE_OUT}: {len(merged)} ranges, {len(spaces)} white-space code points",
          file=sys.stderr)


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what not in ("all", "golden", "unicode"):
        raise SystemExit(__doc__)
    if what in ("all", "unicode"):
        unicode_table()
    if what in ("all", "golden"):
        golden()


if __name__ == "__main__":
    main()

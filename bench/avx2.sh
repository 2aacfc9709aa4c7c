#!/usr/bin/env bash
# synapse's AVX2 tier against llama.cpp built for AVX2, on this machine: what a user of a CPU
# without AVX-512 (AMD Zen 2/3, Intel client cores) would see, measured side by side on the same
# files and thread counts, engines alternating. Prints a markdown table (ratios per round).
#
#   bench/avx2.sh                       # the 1B-shaped Q4_K_M, SmolLM2 and Gemma 3, 1 and 2 threads
#   ROUNDS=1 DEPTH=1024 bench/avx2.sh   # with tokens already in the context (-d)
#
# synapse runs with SYNAPSE_ISA=avx2 (its kernels, packing and attention at the AVX2 tier);
# llama.cpp is the same sources built with GGML_NATIVE=OFF and AVX2/FMA/F16C only
# (scripts/build-llama.sh avx2). Run compare.sh first: it makes the 1B-shaped file.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=${ROUNDS:-2}
depth=${DEPTH:-0}
bin="$(scripts/build-llama.sh avx2 | tail -1)"
cargo build --release --locked -q
files=(bench/out/models/llama-3.2-1b-L16-Q4_K_M.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf
    models/gemma-3-270m-q4_k_m.gguf)
for f in "${files[@]}"; do
    [[ -f $f ]] || { echo "missing $f (run bench/compare.sh, scripts/fetch-models.sh)" >&2; exit 1; }
done

# The t/s column of the pp64 and tg32 rows of a markdown table from either engine.
rates() { grep -E '\| *(pp64|tg32)' | awk -F'|' '{ for (i = NF; i > 0; i--) if ($i ~ /±/) { split($i, a, "±"); printf "%s ", a[1] + 0; break } } END { print "" }'; }

echo "| file | threads | round | llama.cpp pp64 | synapse pp64 | ratio | llama.cpp tg32 | synapse tg32 | ratio |"
echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|"
for f in "${files[@]}"; do
    for t in 1 2; do
        for r in $(seq "$rounds"); do
            read -r lp lt < <("$bin/llama-bench" -m "$f" -p 64 -n 32 -d "$depth" -b 64 -t "$t" -r 2 | rates)
            read -r sp st < <(SYNAPSE_ISA=avx2 target/release/synapse bench -m "$f" -p 64 -n 32 \
                -d "$depth" -b 64 -t "$t" -r 2 -q --no-membw | rates)
            awk -v f="$(basename "$f")" -v t="$t" -v r="$r" -v lp="$lp" -v sp="$sp" -v lt="$lt" \
                -v st="$st" 'BEGIN { printf "| %s | %s | %s | %.1f | %.1f | **%.2fx** | %.1f | %.1f | **%.2fx** |\n", f, t, r, lp, sp, sp / lp, lt, st, st / lt }'
        done
    done
done

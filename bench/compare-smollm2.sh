#!/usr/bin/env bash
# Side-by-side prefill and decode speed of synapse and llama.cpp on the same GGUF file and thread
# counts, alternating engines, three repetitions each. Prints a markdown table.
#
#   scripts/build-llama.sh && bench/compare-smollm2.sh [MODEL]
#
# Prefill: a 64-token prompt in one batch; decode: 32 tokens. llama.cpp's numbers come from
# llama-bench (-p 64 -n 32); synapse's from the speeds `synapse run` prints for the same sizes
# (the 64 prompt tokens are made of one repeated sentence; greedy decoding).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model="${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
bin=third_party/llama.cpp/build/bin
[[ -x $bin/llama-bench ]] || { echo "run scripts/build-llama.sh first" >&2; exit 1; }
cargo build --release --locked --bin synapse >&2
prompt="$(python3 -c "print(' '.join(['The history of the Roman Empire spans many centuries, from the founding of the city to the fall of Constantinople.']*3))")"

echo "| engine | threads | prefill tok/s (pp64) | decode tok/s (tg32) |"
echo "|---|---|---|---|"
for t in 1 2; do
    for rep in 1 2 3; do
        read -r pp tg < <(LD_LIBRARY_PATH=$bin $bin/llama-bench -m "$model" -p 64 -n 32 -t "$t" -r 1 -o csv 2>/dev/null |
            python3 -c "
import csv, sys
rows = list(csv.DictReader(sys.stdin))
pp = [r for r in rows if r['n_prompt'] != '0'][0]['avg_ts']
tg = [r for r in rows if r['n_gen'] != '0'][0]['avg_ts']
print(f'{float(pp):.1f} {float(tg):.1f}')")
        echo "| llama.cpp | $t | $pp | $tg |"
        line=$(target/release/synapse run -m "$model" -p "$prompt" -n 32 --temp 0 -t "$t" -b 64 2>&1 >/dev/null | tail -1)
        spp=$(sed -E 's/.*prefill: [0-9]+ tokens in [0-9.]+ s, ([0-9.]+) tok\/s.*/\1/' <<<"$line")
        stg=$(sed -E 's/.*decode: [0-9]+ tokens, ([0-9.]+) tok\/s.*/\1/' <<<"$line")
        echo "| synapse | $t | $spp | $stg |"
    done
done

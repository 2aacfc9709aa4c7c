#!/usr/bin/env bash
# Quantizing, side by side: `synapse quantize` against llama-quantize (built by
# scripts/build-llama.sh from the llama-cpp-python sdist), the 1B-shaped random-weight F16 file
# (llama-3.2-1b's shapes, all 16 layers) to each MIX, at each thread count, the tools
# alternating ROUNDS times. Every output pair is compared byte for byte.
#
#   bench/quantize.sh                         # Q4_K_M, 1 and 2 threads, 2 rounds
#   MIXES=Q4_K_M,Q6_K,IQ4_XS THREADS=2 ROUNDS=1 bench/quantize.sh
#
# Prints one line per run (tool, mix, threads, seconds) and a markdown table of medians.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
rounds=${ROUNDS:-2}
IFS=, read -ra mixes <<<"${MIXES:-Q4_K_M}"
IFS=, read -ra threads <<<"${THREADS:-1,2}"
syn=target/release/synapse
dev=target/release/synapse-dev
bin="$(scripts/build-llama.sh | tail -1)"
out=bench/out/quantize
mkdir -p "$out" bench/out/models
cargo build --release --locked -p synapse-cli >&2
export LD_LIBRARY_PATH="$root/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

src=bench/out/models/llama-3.2-1b-F16.gguf
[[ -f $src ]] || "$dev" synth llama-3.2-1b --type F16 -o "$src" >&2

secs() { /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -1; }
log=$out/runs.txt
: >"$log"
for ((r = 1; r <= rounds; r++)); do
    for m in "${mixes[@]}"; do
        for t in "${threads[@]}"; do
            l=$(secs "$bin/llama-quantize" "$src" "$out/llama.gguf" "$m" "$t")
            s=$(secs "$syn" quantize "$src" "$out/synapse.gguf" "$m" -t "$t")
            cmp -s "$out/llama.gguf" "$out/synapse.gguf" || { echo "$m -t $t: outputs differ" >&2; exit 1; }
            echo "llama $m $t $l" | tee -a "$log"
            echo "synapse $m $t $s" | tee -a "$log"
        done
    done
done
rm -f "$out/llama.gguf" "$out/synapse.gguf"

echo
echo "| mix | threads | llama-quantize s | synapse s | ratio |"
echo "|---|---:|---:|---:|---:|"
python3 - "$log" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    tool, mix, t, s = line.split()
    runs.setdefault((mix, int(t)), {}).setdefault(tool, []).append(float(s))
for (mix, t), r in runs.items():
    l, s = statistics.median(r["llama"]), statistics.median(r["synapse"])
    print(f"| {mix} | {t} | {l:.2f} | {s:.2f} | {l / s:.2f}x |")
PY

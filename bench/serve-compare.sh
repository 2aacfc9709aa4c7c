#!/usr/bin/env bash
# Serving, side by side: synapse serve and llama-server (built by scripts/build-llama.sh from the
# same llama-cpp-python sdist), one after the other on the same file, the same threads and the
# same context per slot, at 1, 4, 8 and 16 concurrent streams of 128-token prompts and
# 128-token answers (bench/serve_bench.py). Prints a markdown table; the raw JSON lines go to
# bench/out/serve/.
#
#   bench/serve-compare.sh [MODEL...]   # default: SmolLM2 and the 1B-shaped Q4_K_M synth file
#   THREADS=2 STREAMS="1 4 8 16" ROUNDS=2 bench/serve-compare.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads=${THREADS:-2}
streams=(${STREAMS:-1 4 8 16})
rounds=${ROUNDS:-2}
ctx=512 # per slot: 128 + 128 tokens and room
syn=target/release/synapse
dev=target/release/synapse-dev
bin="$(scripts/build-llama.sh | tail -1)"
py=.venv/bin/python
[[ -x $py ]] || scripts/test-deps.sh >&2
out=bench/out/serve
mkdir -p "$out" bench/out/models
cargo build --release --locked -p synapse-cli >&2

models=("$@")
if [[ ${#models[@]} == 0 ]]; then
    f1b=bench/out/models/llama-3.2-1b-L16-Q4_K_M.gguf
    [[ -f $f1b ]] || "$dev" synth llama-3.2-1b --layers 16 --type Q4_K_M -o "$f1b" >&2
    models=(models/SmolLM2-135M-Instruct.Q4_1.gguf "$f1b")
fi

pid=""
stop() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true # a killed server exits non-zero
    fi
    pid=""
}
trap stop EXIT
wait_up() { # port
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.2
    done
    echo "server on port $1 did not come up" >&2
    return 1
}

echo "| model | streams | synapse tok/s | llama-server tok/s | ratio | synapse TTFT p50 / p99 ms | llama-server TTFT p50 / p99 ms | synapse / llama-server TPOT p50 ms |"
echo "|---|---|---|---|---|---|---|---|"
for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    for n in "${streams[@]}"; do
        port=18080
        "$syn" serve -m "$m" --port $port -np "$n" -c $ctx -t "$threads" 2>"$out/synapse-$name-$n.log" &
        pid=$!
        wait_up $port
        s=$($py bench/serve_bench.py --base-url "http://127.0.0.1:$port" --streams "$n" --rounds "$rounds")
        stop
        echo "$s" >"$out/synapse-$name-$n.json"
        port=18081
        # llama-server divides -c among its slots: the same context per slot.
        "$bin/llama-server" -m "$m" --port $port -np "$n" -c $((ctx * n)) -t "$threads" -tb "$threads" \
            --no-webui 2>"$out/llama-$name-$n.log" &
        pid=$!
        wait_up $port
        l=$($py bench/serve_bench.py --base-url "http://127.0.0.1:$port" --streams "$n" --rounds "$rounds")
        stop
        echo "$l" >"$out/llama-$name-$n.json"
        $py - "$name" "$n" "$s" "$l" <<'PY'
import json, sys
name, n, s, l = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(f"| {name} | {n} | {s['agg_tok_s']} | {l['agg_tok_s']} | **{s['agg_tok_s'] / l['agg_tok_s']:.2f}x** | "
      f"{s['ttft_p50_ms']} / {s['ttft_p99_ms']} | {l['ttft_p50_ms']} / {l['ttft_p99_ms']} | "
      f"{s['tpot_p50_ms']} / {l['tpot_p50_ms']} |")
PY
    done
done

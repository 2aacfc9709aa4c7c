#!/usr/bin/env bash
# A bounded load test of `synapse serve` (bench/serve_load.py): 8 slots, many streaming clients
# for a fixed time, every answer checked against its prompt's answer alone, with throughput,
# time to first token and the server's memory growth. Builds nothing: it runs
# target/release/synapse as it is (`cargo build --release` first).
#
#   bench/serve_load.sh                                  # SmolLM2, 64 clients, 120 s
#   bench/serve_load.sh FILE --seconds 60 --clients 32   # another model; serve_load.py's options
#
# Needs the virtual environment of scripts/test-deps.sh (the `openai` package).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ $# -gt 0 && $1 != -* ]]; then model=$1; shift; fi
bin=target/release/synapse
[[ -x $bin ]] || { echo "missing $bin: run cargo build --release" >&2; exit 1; }
[[ -x .venv/bin/python ]] || { echo "missing .venv: run scripts/test-deps.sh" >&2; exit 1; }

log=$(mktemp)
"$bin" serve -m "$model" --host 127.0.0.1 --port 0 -np 8 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT

# The port is printed once the socket is bound; the model is loaded once /health says ok.
ready=""
for _ in $(seq 600); do
    base=$(sed -n 's/^synapse serve: listening on //p' "$log")
    if [[ -n $base ]] && .venv/bin/python -c \
        "import urllib.request; urllib.request.urlopen('$base/health', timeout=5)" 2>/dev/null; then
        ready=1
        break
    fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
done
[[ -n $ready ]] || { echo "synapse serve did not get ready:" >&2; cat "$log" >&2; exit 1; }

status=0
.venv/bin/python bench/serve_load.py --base-url "$base" --pid $pid "$@" || status=$?
sed 's/^/[serve] /' "$log" >&2
exit $status

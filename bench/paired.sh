#!/usr/bin/env bash
# Decode against the read bandwidth of the same moment: on a shared host the probe's best
# reading and a decode run taken minutes (or seconds) apart can differ by a quarter or more
# (docs/perf-log.md; two threads' probe read 33 and 63 GB/s within the same hour), so this runs
# `synapse bench --probe-each-token`: a pass of the probe over a quarter of its 1 GiB buffer
# (with the same threads) before every decoded token and after the last, and each token's weight
# bandwidth over the mean of the two passes around it. Prints a markdown table of medians over
# the tokens of every repetition (and the quartiles of the fraction).
#
#   bench/paired.sh                              # the 1B-shaped Q4_K_M file, 1 and 2 threads, 6 x tg32
#   ROUNDS=4 THREADS="1" bench/paired.sh FILE    # another file, thread count, repetition count
#   SYNAPSE_MEMBW_STREAMS=1 bench/paired.sh      # against a probe of one stream a thread (x86-64)
#
# Run compare.sh first: it makes the 1B-shaped file.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=${ROUNDS:-6}
threads=${THREADS:-1 2}
file=${1:-bench/out/models/llama-3.2-1b-L16-Q4_K_M.gguf}
[[ -f $file ]] || { echo "missing $file (run bench/compare.sh)" >&2; exit 1; }
cargo build --release --locked -q

echo "$file, tg32, $(date -u +%FT%TZ)"
echo
target/release/synapse bench -m "$file" -p 0 -n 32 -t "${threads// /,}" -r "$rounds" \
    --probe-each-token -q

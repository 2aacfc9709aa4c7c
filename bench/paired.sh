#!/usr/bin/env bash
# Decode against the read bandwidth of the same minute: on a shared host the probe's best
# reading and a decode run taken minutes apart can differ by a quarter (docs/PERF.md), so this
# alternates them. For each round and thread count: the probe (`synapse bench --membw`, best
# of 5), one decode run (tg32, `-r 1` after a warm-up), the probe again; the decode's weight
# bandwidth over the mean of the two probes around it. Prints a markdown table and, per thread
# count, the median of those fractions.
#
#   bench/paired.sh                              # the 1B-shaped Q4_K_M file, 1 and 2 threads, 6 rounds
#   ROUNDS=4 THREADS="1" bench/paired.sh FILE    # another file, thread count, round count
#
# Run compare.sh first: it makes the 1B-shaped file.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=${ROUNDS:-6}
threads=${THREADS:-1 2}
file=${1:-bench/out/models/llama-3.2-1b-L16-Q4_K_M.gguf}
[[ -f $file ]] || { echo "missing $file (run bench/compare.sh)" >&2; exit 1; }
cargo build --release --locked -q
syn=target/release/synapse

probe() { "$syn" bench --membw -t "$1" -q | awk -F'|' -v t="$1" '$2 + 0 == t { print $3 + 0 }'; }
# The weight GB/s column of a one-run decode (csv: weight_gbs is the last field).
decode() {
    "$syn" bench -m "$file" -p 0 -n 32 -t "$1" -r 1 --no-membw -q -o csv | tail -1 |
        awk -F, '{ print $NF + 0 }'
}

echo "$file, tg32, $(date -u +%FT%TZ)"
echo
echo "| threads | round | probe before | decode GB/s | probe after | decode / mean probe |"
echo "|--:|--:|--:|--:|--:|--:|"
declare -A fractions
for r in $(seq 1 "$rounds"); do
    for t in $threads; do
        before=$(probe "$t")
        got=$(decode "$t")
        after=$(probe "$t")
        f=$(awk -v g="$got" -v a="$before" -v b="$after" 'BEGIN { printf "%.3f", 2 * g / (a + b) }')
        fractions[$t]+="$f "
        printf '| %s | %s | %.1f | %.1f | %.1f | %.0f%% |\n' "$t" "$r" "$before" "$got" "$after" \
            "$(awk -v f="$f" 'BEGIN { print 100 * f }')"
    done
done
echo
for t in $threads; do
    # shellcheck disable=SC2086 # one word a fraction
    median=$(printf '%s\n' ${fractions[$t]} | sort -n | awk '{ v[NR] = $1 } END {
        print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
    printf 'threads %s: median %.0f%% of the probe around it (%s rounds)\n' "$t" \
        "$(awk -v m="$median" 'BEGIN { print 100 * m }')" "$rounds"
done

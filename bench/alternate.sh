#!/usr/bin/env bash
# Two builds of synapse, run alternately on one file: on a shared host the speed a run meets
# changes within minutes, so a change is measured as the ratio within each adjacent pair of
# runs, and the median of those ratios (docs/perf-log.md). Prints each pair and the median.
#
#   bench/alternate.sh OLD NEW FILE [THREADS] [PAIRS] [tg|pp]
#
# OLD, NEW: synapse binaries (copies of target/release/synapse built at two commits);
# tg: tg32 (`-p 0 -n 32`), pp: pp64 (`-p 64 -n 0`); each run `-r 2 --no-membw -q`, tok/s.
# DEPTH=N in the environment: with the context already holding N tokens (`-d N`).
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,10p "$0" >&2; exit 1; }
old=$1 new=$2 file=$3 threads=${4:-1} pairs=${5:-6} test=${6:-tg}
case $test in
    tg) args=(-p 0 -n 32) ;;
    pp) args=(-p 64 -n 0) ;;
    *) echo "alternate: test is tg or pp, not $test" >&2; exit 1 ;;
esac
[[ -z ${DEPTH:-} ]] || args+=(-d "$DEPTH")
rate() { # binary -> tok/s (avg_ts, the csv's second field)
    "$1" bench -m "$file" "${args[@]}" -t "$threads" -r 2 --no-membw -q -o csv | tail -1 |
        awk -F, '{ printf "%.2f\n", $2 }'
}
echo "$file, ${test}${DEPTH:+ at depth $DEPTH}, $threads thread(s), $pairs pairs: $old then $new"
echo
echo "| pair | old tok/s | new tok/s | new / old |"
echo "|--:|--:|--:|--:|"
ratios=()
for i in $(seq 1 "$pairs"); do
    o=$(rate "$old")
    n=$(rate "$new")
    r=$(awk -v o="$o" -v n="$n" 'BEGIN { printf "%.3f", n / o }')
    ratios+=("$r")
    echo "| $i | $o | $n | $r |"
done
echo
printf '%s\n' "${ratios[@]}" | sort -n |
    awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
        printf "median new / old: %.3f (min %.3f, max %.3f)\n", m, v[1], v[NR] }'

#!/usr/bin/env bash
# Does `synapse bench` measure what a user sees? Times `synapse run` from outside with
# /usr/bin/time and sets it against `synapse bench` on the same file, interleaved rep by rep so
# that a machine that drifts (frequency, neighbours) moves both sides alike.
#
#   bench/outside-clock.sh FILE RAW_DIR [REPS] [G] [P]
#
# FILE must make one token of each byte (the generated vocabulary of `synapse-dev synth` does): a
# (P-1)-letter prompt plus BOS is exactly P tokens (default 256: four batches of 64), "a"
# without BOS one. Differences of whole-process wall times cancel loading: decode =
# T(p1, n=1+G) - T(p1, n=1) for G steps (positions 1..G, as the bench's tgG at 0..G-1); prefill
# of P tokens = T(pP, n=1) - T(p1, n=1) plus one decode step. (With P = 64 the prefill took about
# a second here, and run-to-run noise in process wall times was 10-15% of it.)
# Each rep writes outside.jsonl lines and inside-t<T>-k<K>.json; commands go to commands.txt.
# `python3 bench/perf_report.py --outside-only --raw RAW_DIR` prints the comparison.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
f=$1
raw=$2
reps=${3:-7}
g=${4:-64}
np=${5:-256}
syn=target/release/synapse
threads=(${THREADS:-1 2})
mkdir -p "$raw"
rm -f "$raw"/outside.jsonl "$raw"/inside-t*.json
prompt=$(printf 'a%.0s' $(seq 1 $((np - 1))))
for t in "${threads[@]}"; do
    for k in $(seq 1 "$reps"); do
        echo "outside-clock: t=$t rep $k/$reps" >&2
        for spec in "p1:1" "p1:$((1 + g))" "p$np:1"; do
            pr=${spec%%:*}
            n=${spec##*:}
            if [[ $pr == p1 ]]; then args=(-p a --no-bos); else args=(-p "$prompt"); fi
            /usr/bin/time -f '%e' -o "$raw/time.tmp" \
                "$syn" run -m "$f" "${args[@]}" -n "$n" --temp 0 -t "$t" -b 64 >/dev/null 2>&1
            s=$(tail -1 "$raw/time.tmp")
            echo "{\"threads\": $t, \"rep\": $k, \"prompt\": \"$pr\", \"n_predict\": $n, \"wall_s\": $s}" >>"$raw/outside.jsonl"
        done
        "$syn" bench -m "$f" -p "$np" -n "$g" -b 64 -t "$t" -r 1 -o json --no-membw -q >"$raw/inside-t$t-k$k.json"
    done
done
rm -f "$raw/time.tmp"
{
    echo "# outside clock, ${#threads[@]} thread count(s) x $reps reps, interleaved:"
    echo "/usr/bin/time -f %e $syn run -m $f -p <$((np - 1)) letters> -n 1, and -p a --no-bos -n {1,$((1 + g))}; --temp 0 -t {${threads[*]}} -b 64"
    echo "$syn bench -m $f -p $np -n $g -b 64 -t {${threads[*]}} -r 1 -o json --no-membw -q"
} >>"$raw/commands.txt"

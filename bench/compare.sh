#!/usr/bin/env bash
# Write docs/perf-compare.md (and docs/perf-roofline.svg): synapse against llama.cpp on the same
# files and thread counts, engines alternating, with this machine's read bandwidth as the ceiling.
#
#   bench/compare.sh            # the full run (about 30-40 minutes on a quiet 2-core machine)
#   bench/compare.sh --quick    # end-to-end check of the script: small files, one round, minutes
#   ROUNDS=1 bench/compare.sh   # fewer alternations (default 3; REPS, default 2, is -r of each run)
#
# What it does, in order (every command it runs is recorded and printed in the report):
#   1. builds llama.cpp (scripts/build-llama.sh) if llama-bench is missing, and synapse (release);
#   2. synthesizes random-weight files with `synapse-dev synth` (cached in bench/out/models): the
#      Llama-3.2-1B-shaped Q4_K_M, and one file per weight format (Llama-3.2-1B's matrices, 4 of
#      its 16 layers, every tensor in that format: llama-quantize --pure);
#   3. probes the read bandwidth (`synapse bench --membw`) for 1 and 2 threads;
#   4. for each file (plus the real SmolLM2-135M Q4_1 and Gemma-3-270M Q4_K_M of models/) and
#      each thread count, runs llama-bench and `synapse bench` alternately, ROUNDS times each;
#   4b. runs SmolLM2 and Gemma 3 with 2048 tokens already in the context (-d 2048), both engines;
#   5. runs the kernel benchmarks (`synapse-dev bench-kernels`: gemv-bench and kbench);
#   6. checks `synapse bench` against an outside clock (/usr/bin/time over `synapse run`);
#   7. writes docs/perf-compare.md and docs/perf-roofline.svg with bench/perf_report.py (matplotlib,
#      pip-installed if missing). Its tables are what docs/PERF.md quotes.
#
# Numbers are only comparable within one run: run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

quick=0
[[ ${1:-} == --quick ]] && quick=1

out=bench/out
raw=$out/raw
models=$out/models
mkdir -p "$raw" "$models"
rm -f "$raw"/*.json "$raw"/*.jsonl "$raw"/*.txt "$raw"/*.md "$raw"/*.tmp
cmds=$raw/commands.txt
: >"$cmds"

bin=third_party/llama.cpp/build/bin
syn=target/release/synapse
dev=target/release/synapse-dev

# Run a command, recording it (with the environment it needs) for the report.
run() {
    echo "$*" >>"$cmds"
    "$@"
}
say() { echo "compare: $*" >&2; }

if [[ ! -x $bin/llama-bench ]]; then
    say "building llama.cpp (scripts/build-llama.sh)"
    scripts/build-llama.sh >&2
fi
export LD_LIBRARY_PATH="$PWD/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "building synapse"
cargo build --release --locked --bin synapse --bin synapse-dev >&2
python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install --quiet matplotlib >&2

if ((quick)); then
    rounds=1
    reps=1
    p=16
    n=8
    layers_1b=2
    layers_fmt=1
    formats=(Q4_0 Q8_0)
    outside_reps=3
else
    rounds=3
    reps=2
    p=64
    n=32
    layers_1b=16
    layers_fmt=4
    formats=(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS F16 BF16)
    outside_reps=7
fi
rounds=${ROUNDS:-$rounds}
reps=${REPS:-$reps}
threads=(1 2)

# --- files -------------------------------------------------------------------------------------
synth() { # name shape layers type [--pure]
    local f=$models/$1.gguf
    if [[ ! -f $f ]]; then
        say "synthesizing $f"
        run "$dev" synth "$2" --layers "$3" --type "$4" "${@:5}" -o "$f" >&2
    else
        echo "$dev synth $2 --layers $3 --type $4 ${*:5} -o $f   # (cached)" >>"$cmds"
    fi
}
files=()
for real in models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf; do
    if [[ -f $real ]]; then files+=("$real"); else say "missing $real (scripts/fetch-models.sh); skipped"; fi
done
synth "llama-3.2-1b-L$layers_1b-Q4_K_M" llama-3.2-1b "$layers_1b" Q4_K_M
files+=("$models/llama-3.2-1b-L$layers_1b-Q4_K_M.gguf")
for ty in "${formats[@]}"; do
    name="fmt-L$layers_fmt-$ty"
    case $ty in
    F16 | BF16 | Q8_0) synth "$name" llama-3.2-1b "$layers_fmt" "$ty" ;;
    *) synth "$name" llama-3.2-1b "$layers_fmt" "$ty" --pure ;;
    esac
    files+=("$models/$name.gguf")
done

# --- machine -----------------------------------------------------------------------------------
{
    lscpu
    echo "---"
    free -g
    echo "---"
    uptime
} >"$raw/machine.txt"
git rev-parse --short HEAD >"$raw/commit.txt" 2>/dev/null || echo unknown >"$raw/commit.txt"
cat third_party/llama.cpp/SDIST_VERSION >"$raw/llama_version.txt" 2>/dev/null || echo unknown >"$raw/llama_version.txt"
say "read-bandwidth probe"
run "$syn" bench --membw -t 1,2 -o json >"$raw/membw-0.json"

# --- side by side ------------------------------------------------------------------------------
for f in "${files[@]}"; do
    base=$(basename "$f" .gguf)
    for t in "${threads[@]}"; do
        for r in $(seq 1 "$rounds"); do
            say "$base t=$t round $r/$rounds: llama-bench"
            run "$bin/llama-bench" -m "$f" -p "$p" -n "$n" -b 64 -t "$t" -r "$reps" -o json \
                >"$raw/llama--$base--t$t--r$r.json" 2>/dev/null
            say "$base t=$t round $r/$rounds: synapse bench"
            run "$syn" bench -m "$f" -p "$p" -n "$n" -b 64 -t "$t" -r "$reps" -o json --no-membw -q \
                >"$raw/synapse--$base--t$t--r$r.json"
        done
    done
done
# --- at depth ------------------------------------------------------------------------------------
# Attention's share once the context holds a few thousand tokens: SmolLM2 (the smallest model, so
# attention weighs most) and Gemma 3 (heads of 256 values, sliding windows) with 2048 tokens
# already in the context, both engines, both -d.
depth=2048
((quick)) && depth=256
for f in models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf; do
    [[ -f $f ]] || continue
    base=$(basename "$f" .gguf)
    for t in "${threads[@]}"; do
        say "$base at depth $depth, t=$t"
        run "$bin/llama-bench" -m "$f" -p "$p" -n "$n" -d "$depth" -b 64 -t "$t" -r "$reps" -o json \
            >"$raw/depth--llama--$base--t$t.json" 2>/dev/null
        run "$syn" bench -m "$f" -p "$p" -n "$n" -d "$depth" -b 64 -t "$t" -r "$reps" -o json --no-membw -q \
            >"$raw/depth--synapse--$base--t$t.json"
    done
done
# The probe again at the end: the ceiling is the better of the two.
run "$syn" bench --membw -t 1,2 -o json >"$raw/membw-1.json"

# --- kernels -----------------------------------------------------------------------------------
say "kernel benchmarks"
if ((quick)); then
    run "$dev" bench-kernels gemv -r 1 --membw-mib 256 >"$raw/gemv.md"
    run "$dev" bench-kernels kbench -r 1 --formats Q4_K --tokens 1,64 -t 1 --membw-mib 256 >"$raw/kbench.md"
else
    run "$dev" bench-kernels gemv -r 5 >"$raw/gemv.md"
    run "$dev" bench-kernels kbench -r 3 --formats Q4_K,Q6_K,Q8_0 --tokens 1,64,93 -t 1,2 >"$raw/kbench.md"
fi

# --- memory ------------------------------------------------------------------------------------
# Peak resident memory while generating: the weights are read in place (memory-mapped), so the
# peak should be the file plus the KV cache and small buffers; llama.cpp repacks some matrices
# into buffers of its own.
say "peak memory"
f1b=$models/llama-3.2-1b-L$layers_1b-Q4_K_M.gguf
prompt64=$(printf 'a%.0s' $(seq 1 63))
/usr/bin/time -f '%M' -o "$raw/rss-synapse.txt" \
    "$syn" run -m "$f1b" -p "$prompt64" -n 64 -c 4096 -t 2 --temp 0 >/dev/null 2>&1
/usr/bin/time -f '%M' -o "$raw/rss-llama.txt" \
    "$bin/llama-completion" -m "$f1b" -p "$prompt64" -n 64 -c 4096 -t 2 --temp 0 -no-cnv >/dev/null 2>&1
stat -c %s "$f1b" >"$raw/rss-file.txt"
echo "/usr/bin/time -f %M $syn run -m $f1b -p <63 letters> -n 64 -c 4096 -t 2 --temp 0" >>"$cmds"
echo "/usr/bin/time -f %M $bin/llama-completion -m $f1b -p <63 letters> -n 64 -c 4096 -t 2 --temp 0 -no-cnv" >>"$cmds"

# --- outside clock -----------------------------------------------------------------------------
say "outside-clock check"
bench/outside-clock.sh "$models/llama-3.2-1b-L$layers_1b-Q4_K_M.gguf" "$raw" "$outside_reps" "$((n * 2))"

say "writing docs/perf-compare.md"
python3 bench/perf_report.py --raw "$raw" --quick "$quick" --p "$p" --n "$n" \
    --out docs/perf-compare.md --svg docs/perf-roofline.svg
say "done: docs/perf-compare.md, docs/perf-roofline.svg"

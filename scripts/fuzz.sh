#!/usr/bin/env bash
# Run one cargo-fuzz target for MINUTES on one core, then minimize its corpus so that what is
# committed under fuzz/corpus/TARGET stays small (the stable test suite replays every file:
# crates/engine/tests/fuzz_corpus.rs).
#
#   scripts/fuzz.sh TARGET [MINUTES] [libFuzzer args...]
#   scripts/fuzz.sh load_model 30
#   FUZZ_STOP_AT_CRASH=1 scripts/fuzz.sh chat_template 2    # stop at the first crash
#
# Targets: parse_gguf, tokenize, chat_template, load_model, imatrix (fuzz/fuzz_targets/). Needs the
# nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`); tokenize needs the
# real models (scripts/fetch-models.sh).
#
# By default the run goes on past a crash, hang or out-of-memory (libFuzzer's fork mode with
# one job) so an unattended run collects every finding; each is saved under
# fuzz/artifacts/TARGET/ (crash-*, timeout-*, oom-*). Reproduce one with
#   cd fuzz && cargo +nightly fuzz run -O -a TARGET artifacts/TARGET/crash-...
# and replay them all on stable with
#   cargo test -p synapse-engine --test fuzz_corpus -- --ignored
#
# Environment: FUZZ_RSS_MB (4096), FUZZ_TIMEOUT_S (10: an input running longer is a hang),
# FUZZ_STOP_AT_CRASH (0), FUZZ_NO_CMIN (0: 1 keeps the corpus as the run left it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"

usage="usage: scripts/fuzz.sh TARGET [MINUTES] [libFuzzer args...]"
target=${1:?$usage}
minutes=${2:-30}
shift $(($# >= 2 ? 2 : 1))
if [[ ! -f fuzz_targets/$target.rs ]]; then
    echo "fuzz.sh: no target $target; targets: $(cd fuzz_targets && ls | sed 's/\.rs$//' | xargs)" >&2
    exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: needs cargo-fuzz on nightly: cargo install cargo-fuzz --locked" >&2
    exit 2
fi

rss=${FUZZ_RSS_MB:-4096}
timeout=${FUZZ_TIMEOUT_S:-10}
# Release with debug assertions (integer overflow panics: a wrapped size is found where it
# wraps), AddressSanitizer (cargo-fuzz's default).
build=(-O -a)
args=(
    -max_total_time=$((minutes * 60))
    -rss_limit_mb="$rss"
    -malloc_limit_mb="$rss"
    -timeout="$timeout"
    -print_final_stats=1
)
if [[ -f dicts/$target.dict ]]; then
    args+=(-dict="dicts/$target.dict")
fi
if [[ ${FUZZ_STOP_AT_CRASH:-0} != 1 ]]; then
    args+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
fi

mkdir -p "corpus/$target" "artifacts/$target"
n_corpus=$(find "corpus/$target" -type f | wc -l)
before=$(find "artifacts/$target" -type f | sort)
echo "fuzz.sh: $target for $minutes min from $n_corpus corpus files:"
echo "  cargo +nightly fuzz run ${build[*]} $target corpus/$target -- ${args[*]} $*"
start=$(date +%s)
status=0
cargo +nightly fuzz run "${build[@]}" "$target" "corpus/$target" -- "${args[@]}" "$@" || status=$?
elapsed=$(($(date +%s) - start))
echo "fuzz.sh: $target ran $((elapsed / 60)) min $((elapsed % 60)) s, exit status $status"

if [[ ${FUZZ_NO_CMIN:-0} != 1 ]]; then
    # The inputs that reach distinct coverage, and no others (files renamed to their SHA-1).
    echo "fuzz.sh: minimizing corpus/$target ($(find "corpus/$target" -type f | wc -l) files)"
    cargo +nightly fuzz cmin "${build[@]}" "$target" "corpus/$target" -- \
        -rss_limit_mb="$rss" -malloc_limit_mb="$rss" -timeout="$timeout"
    echo "fuzz.sh: corpus/$target now $(find "corpus/$target" -type f | wc -l) files," \
        "$(du -sh "corpus/$target" | cut -f1)"
fi

new=$(comm -13 <(echo "$before") <(find "artifacts/$target" -type f | sort) | sed '/^$/d')
if [[ -n $new ]]; then
    echo "fuzz.sh: new findings:"
    echo "$new" | sed 's/^/  /'
    exit 1
fi
echo "fuzz.sh: no new findings"

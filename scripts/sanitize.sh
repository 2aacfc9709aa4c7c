#!/usr/bin/env bash
# Undefined behaviour, memory errors and data races, on the nightly toolchain:
#
#   miri  Miri over what it can run: synapse-gguf's unit and integration tests (not the
#         memory-mapped files, not the exhaustive corruption loops), synapse-quant's block
#         layouts, and synapse-engine's unit tests of the thread pool, the matmul hand-out,
#         the recurrent (DeltaNet) steps, the RoPE tables, the sampler and the tokenizer, on
#         the reference tier (Miri runs no SIMD intrinsics). What it cannot run, and why, is
#         listed in run_miri.
#   asan  AddressSanitizer: the kernels' tests (every tier this CPU has: AVX2, AVX-VNNI,
#         AVX-512 run their intrinsics here, unlike Miri), the pool and matmul tests, and the
#         forward passes of the tiny models (qwen2, qwen3, qwen35 on 1 to 4 threads).
#   tsan  ThreadSanitizer (std rebuilt instrumented, -Zbuild-std): the pool and matmul tests
#         and the qwen35 forward pass (the hybrid model: attention and recurrent layers over
#         the thread pool).
#
#   scripts/sanitize.sh [miri] [asan] [tsan]     (none named: all three)
#
# Needs: rustup toolchain nightly with the miri and rust-src components
# (`rustup component add miri rust-src --toolchain nightly`), and the test data the suite
# uses (the forward tests' tiny models are committed). Builds go under target/nightly (or
# $CARGO_TARGET_DIR): miri/, address/, thread/, so the stable build's cache is left alone
# and each part keeps its own; CARGO_BUILD_JOBS limits them.
# On a 2-core machine: Miri about 5 min, plus about 13 the first time (its sysroot, the
# engine built for the interpreter); ASan about 14 min and TSan about 8 min from a cold build
# (TSan rebuilds std), most of it building.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

parts=("$@")
if [[ ${#parts[@]} -eq 0 ]]; then
    parts=(miri asan tsan)
fi
# One build directory per instrumentation, so that each keeps its build between runs.
target_dir=${CARGO_TARGET_DIR:-$PWD/target/nightly}
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
failed=()
summary=()

# Run one labelled step, timed; a failure is recorded and the script goes on.
step() {
    local label=$1
    shift
    echo
    echo "sanitize.sh: [$label] $*"
    local start status=0
    start=$(date +%s)
    "$@" || status=$?
    local took=$(($(date +%s) - start))
    local line
    line=$(printf '%-40s %s in %dm%02ds' "$label" "$([[ $status == 0 ]] && echo ok || echo "FAILED ($status)")" $((took / 60)) $((took % 60)))
    echo "sanitize.sh: $line"
    summary+=("$line")
    if [[ $status != 0 ]]; then
        failed+=("$label")
    fi
}

run_miri() {
    rustup component list --toolchain nightly --installed | grep -q '^miri' || {
        echo "sanitize.sh: miri is not installed: rustup component add miri rust-src --toolchain nightly" >&2
        failed+=(miri-missing)
        return
    }
    # Isolation off: the tests read their data files and the engine reads /proc and the
    # environment (SYNAPSE_ISA). Deterministic floats: by default Miri perturbs the last bits
    # of powf, sin, cos, exp at each call (Rust leaves their precision unspecified), which the
    # engine's bit-exactness tests (RoPE tables equal to fresh angles) do not allow; natively
    # libm gives one answer. The reference tier is what Miri runs anyway (it reports no CPU
    # features); saying so keeps the engine's own dispatch on the scalar paths too.
    export CARGO_TARGET_DIR=$target_dir # Miri builds under its miri/ subdirectory
    export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation -Zmiri-deterministic-floats}"
    export SYNAPSE_ISA=reference PROPTEST_CASES=${PROPTEST_CASES:-4}
    # Not run under Miri, and why:
    # - gguf files_on_disk_are_mapped, released_pages_*: file-backed mmap is unsupported;
    #   gguf files::* (outputs over FIFOs and devices) spawns processes, also unsupported.
    # - gguf every_single_byte_corruption_is_handled, truncation_at_every_byte_*,
    #   fuzzer_corpus_*: thousands of parses, hours in the interpreter (the fuzzer and the
    #   native suite cover them).
    # - engine every_thread_count_and_batch_gives_the_same_bits: over 20 minutes in the
    #   interpreter (ASan and TSan run it).
    # - quant pages::* and engine kv::* (its cache pages come from there): madvise is
    #   unsupported.
    # - quant tests/properties.rs and tests/golden.rs: the codecs' byte slices come from
    #   Vec<u8>, whose alignment is 1; Miri places such allocations at any address, so the
    #   block casts refuse them (QuantError::Misaligned) before anything runs. Natively the
    #   allocator's 16-byte alignment hides it (golden.rs also maps its files).
    step "miri: synapse-gguf" cargo +nightly miri test -p synapse-gguf --lib --tests -- \
        --skip files_on_disk_are_mapped --skip released_pages --skip files:: \
        --skip every_single_byte_corruption --skip truncation_at_every_byte --skip fuzzer_corpus
    step "miri: synapse-quant block layouts" cargo +nightly miri test -p synapse-quant --lib -- blocks::
    step "miri: synapse-engine pool, matmul, ..." cargo +nightly miri test -p synapse-engine --lib -- \
        --test-threads 1 --skip every_thread_count_and_batch \
        pool:: matmul:: delta_net:: model:: tokenizer:: sampler::
    unset CARGO_TARGET_DIR MIRIFLAGS SYNAPSE_ISA PROPTEST_CASES
}

# cargo test with a sanitizer; `--target` keeps the flags off build scripts and proc macros.
san_test() {
    local san=$1
    shift
    local extra=()
    if [[ $san == thread ]]; then
        extra=(-Zbuild-std)
    fi
    CARGO_TARGET_DIR="$target_dir/$san" RUSTFLAGS="-Zsanitizer=$san ${RUSTFLAGS:-}" \
        RUSTDOCFLAGS="-Zsanitizer=$san" cargo +nightly test "${extra[@]}" --target "$host" "$@"
}

run_asan() {
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}"
    # The kernels on each x86 tier this CPU has (the tier caps what the dispatch picks).
    local cases=${PROPTEST_CASES:-32}
    for isa in reference avx2 avxvnni; do
        SYNAPSE_ISA=$isa PROPTEST_CASES=$cases step "asan: synapse-quant properties, $isa" \
            san_test address -p synapse-quant --test properties
    done
    PROPTEST_CASES=$cases step "asan: synapse-quant properties, native" \
        san_test address -p synapse-quant --test properties
    step "asan: engine pool, matmul, attention, ops" san_test address -p synapse-engine --lib -- \
        pool:: matmul:: attention:: ops:: kv:: delta_net::
    step "asan: engine forward (qwen2/3/35)" san_test address -p synapse-engine --test qwen
    step "asan: engine forward (every format)" san_test address -p synapse-engine --test forward \
        -- every_weight_format
}

run_tsan() {
    rustup component list --toolchain nightly --installed | grep -q '^rust-src' || {
        echo "sanitize.sh: tsan needs rust-src: rustup component add rust-src --toolchain nightly" >&2
        failed+=(tsan-rust-src-missing)
        return
    }
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
    step "tsan: engine pool, matmul" san_test thread -p synapse-engine --lib -- pool:: matmul::
    step "tsan: engine forward (qwen35)" san_test thread -p synapse-engine --test qwen -- \
        qwen35_matches a_reset_state
}

for p in "${parts[@]}"; do
    case $p in
    miri) run_miri ;;
    asan) run_asan ;;
    tsan) run_tsan ;;
    *)
        echo "sanitize.sh: unknown part $p (miri, asan, tsan)" >&2
        exit 2
        ;;
    esac
done

echo
echo "sanitize.sh: summary"
printf '  %s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "sanitize.sh: failed: ${failed[*]}"
    exit 1
fi

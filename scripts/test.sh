#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this). On a fresh machine it needs
# only what the machine image has (Rust, Python with pip): it fetches the real models and
# installs the server tests' clients itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/fetch-models.sh
# The server's clients: the openai package and selenium in .venv, Chromium (tests/server).
scripts/test-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Every crate's modules import one way: no module imports from one that imports it (the
# checker is checked too, on a made-up crate with cycles and one without).
python3 scripts/check-imports.py
python3 scripts/check-imports.py --crate scripts/check-imports/good >/dev/null
if python3 scripts/check-imports.py --crate scripts/check-imports/bad >/dev/null; then
    echo "test.sh: check-imports.py found no cycle in scripts/check-imports/bad" >&2
    exit 1
fi
# The API docs build without a broken or ambiguous link.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --exclude synapse-gpu --locked
# The GPU backend on Mesa's lavapipe (scripts/test-deps.sh), whatever GPU the machine has, at
# two subgroup widths (4 and 8 lanes; 1024 bits gives wrong sums on this Mesa): every kernel
# against the reference decoders, G1, and whole models against the exact computation. The
# logits must be the same bits at both widths. SmolLM2's and Gemma 3's run at the wider only.
lvp=$(compgen -G "/usr/share/vulkan/icd.d/lvp_icd.*.json" | head -1)
digests=$(mktemp -d)
export XDG_RUNTIME_DIR=$digests
for width in 256 128; do
    echo "test.sh: synapse-gpu tests on lavapipe, LP_NATIVE_VECTOR_WIDTH=$width"
    skip=()
    [[ $width == 128 ]] && skip=(--skip smollm2 --skip gemma3)
    mkdir -p "$digests/$width"
    VK_DRIVER_FILES=$lvp LP_NATIVE_VECTOR_WIDTH=$width SYNAPSE_GPU_DIGESTS=$digests/$width \
        cargo test -p synapse-gpu --locked -- "${skip[@]}"
done
rm "$digests/256/SmolLM2" "$digests/256/Gemma3"
diff -r "$digests/256" "$digests/128"
echo "test.sh: GPU logits of $(ls "$digests/128" | wc -l) files equal at 4 and 8 lanes"
rm -r "$digests"
unset XDG_RUNTIME_DIR
# The lower x86 kernel tiers, which the dispatch hides on a CPU that has a higher one: the
# kernel tests again with the tier capped (SYNAPSE_ISA; tiers this CPU lacks are skipped inside).
for isa in reference avx2 avxvnni; do
    echo "test.sh: synapse-quant tests with SYNAPSE_ISA=$isa"
    SYNAPSE_ISA=$isa cargo test -p synapse-quant --locked
done
# Say which x86 tiers this CPU cannot run, so that their kernels' absence from this run is
# seen (qemu-user's TCG emulates neither AVX-VNNI nor AVX-512: docs/perf-log.md). A CPU with
# AVX-512 VNNI and no AVX-VNNI runs the avxvnni tier's kernels in the EVEX encoding of their
# 256-bit `vpdpbusd` (crates/quant/src/cpu.rs, `Vnni256`): the same source, only the encoding untested.
flags=""
if [[ $(uname -m) == x86_64 ]]; then
    flags=" $(grep -m1 '^flags' /proc/cpuinfo || true) "
    for tier in avx2:avx2 avxvnni:avx_vnni avx512vnni:avx512_vnni; do
        if [[ $flags == *" ${tier#*:} "* ]]; then
            continue
        elif [[ $tier == avxvnni:* && $flags == *" avx512_vnni "* &&
            $flags == *" avx512vl "* ]]; then
            echo "test.sh: this CPU has no avxvnni: its kernels ran in AVX-512's EVEX encoding"
        else
            echo "test.sh: this CPU has no ${tier%%:*}: the ${tier%%:*} kernels were not run"
        fi
    done
fi
# Both forms of the AVX-512 Q5_K batch kernels (the CPU's maker chooses one).
for paired in 0 1; do
    echo "test.sh: packed kernels with SYNAPSE_PAIRED=$paired"
    SYNAPSE_PAIRED=$paired cargo test -p synapse-quant --locked --test properties packed
done
# The engine on the AVX2 tier, which has its own packed kernels and attention path: every
# format's logits against llama.cpp's, G1 and D1, SmolLM2's greedy continuations, Gemma 3's
# and Qwen's (heads of 256 and 128 values, ggml's F16 path, emulated there), the mixtures' and
# Gemma 2's soft-capped attention.
echo "test.sh: synapse-engine forward tests with SYNAPSE_ISA=avx2"
SYNAPSE_ISA=avx2 cargo test -p synapse-engine --test forward --test gemma3 --test qwen \
    --test dense --test moe --locked
# And on the AVX-VNNI tier (its Q4_K and Q3_K batch kernels), where this CPU runs it.
if [[ $flags == *" avx_vnni "* || $flags == *" avx512_vnni "* ]]; then
    echo "test.sh: synapse-engine forward tests with SYNAPSE_ISA=avxvnni"
    SYNAPSE_ISA=avxvnni cargo test -p synapse-engine --test forward --locked
fi
# The NEON kernels and the engine on aarch64, under qemu-user (installs what it needs).
scripts/test-aarch64.sh

#!/usr/bin/env bash
# The NEON tiles against the NEON row kernels, by the instructions they execute under
# qemu-user (no ARM core here to time them on): tilebench built for aarch64, run once with the
# row kernel alone and once with the tile alone (TILEBENCH_ONLY), each less a run that only sets
# up (TILEBENCH_ONLY=none), divided by the multiply-adds. Prints a markdown table.
#
#   bench/neon-insns.sh                  # every quantized format, 128 x 2048 weights, 64 tokens
#   CPU=cortex-a53 bench/neon-insns.sh   # ARMv8.0 (no sdot: the widening path)
#
# An instruction count is not a speed (the cores differ in what an instruction costs, and
# memory is not modelled), but for the same work on the same ISA it says how much each path
# asks of the core. Needs what scripts/test-aarch64.sh installs, and gcc for the plugin.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cpu=${CPU:-max}
rows=${ROWS:-128}
cols=${COLS:-2048}
tokens=${TOKENS:-64}
target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
for tool in qemu-aarch64 aarch64-linux-gnu-gcc gcc; do
    command -v "$tool" >/dev/null || { echo "neon-insns: missing $tool (scripts/test-aarch64.sh installs the cross tools)" >&2; exit 1; }
done

plugin=target/qemu/libinsn-count.so
mkdir -p target/qemu
gcc -shared -fPIC -O2 -Wall -Werror -o "$plugin" bench/qemu/insn-count.c
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
cargo build --release --locked -q --target "$target" -p synapse-quant --example tilebench
bin="target/$target/release/examples/tilebench"

count() { # part, format [repacked]
    TILEBENCH_REPS=1 TILEBENCH_ONLY="$1" qemu-aarch64 -L "$sysroot" -cpu "$cpu" -plugin "$plugin" \
        "$bin" "$2" "$rows" "$cols" "$tokens" ${3:-} 2>&1 >/dev/null | awk '/^insns/ { print $2 }'
}

echo "| format | row kernel, instructions / MAC | tile | tile / row |"
echo "|---|--:|--:|--:|"
for spec in Q4_0 "Q4_0 repacked" Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL "IQ4_NL repacked" Q2_K "Q2_K repacked" \
    Q3_K Q4_K "Q4_K repacked" Q5_K Q6_K IQ4_XS; do
    read -r ty repacked <<<"$spec"
    base=$(count none "$ty" "$repacked")
    row=$(count row "$ty" "$repacked")
    tile=$(count tiles "$ty" "$repacked")
    awk -v f="$spec" -v b="$base" -v r="$row" -v t="$tile" -v m=$((rows * cols * tokens)) \
        'BEGIN { printf "| %s | %.3f | %.3f | %.2f |\n", f, (r - b) / m, (t - b) / m, (t - b) / (r - b) }'
done

#!/usr/bin/env bash
# The GPU's numbers for docs/PERF.md in one command on a machine with a GPU: its read
# bandwidth, every format's matrix-vector product with cold weights (GB/s and the fraction of
# that bandwidth), then decode and prefill on the Llama-3.2-1B- and Llama-3.1-8B-shaped Q4_K_M
# files (`synapse-dev synth`) with decode's fraction of its roofline (the weights' bytes a
# token reads over the measured bandwidth). About five minutes on an H100, most of it synth.
#
#   bench/gpu.sh [BIN]
#
# BIN: a folder with x86-64 builds of synapse and synapse-dev, for a machine without Rust
# (by default they are built here). OUT=DIR: where the files and the report go
# [default: bench/out/gpu].
#
# On the lent NVIDIA machines (see the device tool's README) Vulkan's loader is carried:
# build here, strip and copy the two binaries into an ignored folder (.devbin), download the
# loader's packages into .gl, and run, carrying both:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig;
#   export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json;
#   OUT=$OUT bench/gpu.sh .devbin
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${1:-}
if [[ -z $bin ]]; then
    cargo build --release --locked -p synapse-cli
    bin=target/release
fi
out=${OUT:-bench/out/gpu}
mkdir -p "$out"

"$bin/synapse-dev" bench-gpu | tee "$out/kernels.md"
peak=$(awk '/^read bandwidth:/ { print $3 }' "$out/kernels.md")

echo
echo "| model | file GB | pp512 tok/s | tg128 tok/s | decode GB/s | of read bandwidth |"
echo "|---|--:|--:|--:|--:|--:|"
for shape in llama-3.2-1b llama-3.1-8b; do
    f=$out/$shape-Q4_K_M.gguf
    [[ -f $f ]] || "$bin/synapse-dev" synth "$shape" --type Q4_K_M -o "$f" >&2
    gb=$(stat -c %s "$f" | awk '{ printf "%.3f", $1 / 1e9 }')
    pp=$("$bin/synapse" bench --device gpu -m "$f" -p 512 -n 0 -b 512 -t 1 -r 3 -q -o csv |
        tail -1 | awk -F, '{ print $2 }')
    tg=$("$bin/synapse" bench --device gpu -m "$f" -p 0 -n 128 -t 1 -r 3 -q -o csv |
        tail -1 | awk -F, '{ print $2 }')
    awk -v s="$shape" -v gb="$gb" -v pp="$pp" -v tg="$tg" -v peak="$peak" 'BEGIN {
        printf "| %s Q4_K_M | %s | %.1f | %.1f | %.0f | %.0f%% |\n", s, gb, pp, tg,
            gb * tg, 100 * gb * tg / peak }'
done | tee "$out/models.md"

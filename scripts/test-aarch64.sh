#!/usr/bin/env bash
# The kernels on aarch64, under emulation (scripts/test.sh calls this; so can you).
#
# Cross-builds for aarch64-unknown-linux-gnu and runs, with qemu-user:
#   - clippy for that target (the NEON code is compiled only there);
#   - the quant crate's tests (NEON kernels against the reference, bit for bit) twice: `-cpu max`
#     (NEON + FEAT_DotProd's sdot) and `-cpu cortex-a53` (ARMv8.0 NEON only);
#   - the engine's tiny-model forward tests (every weight format against llama.cpp's logits, G1,
#     D1; and the gpt-oss file, whose experts are MXFP4), which must give llama.cpp's x86 bits on
#     an ARM host too.
# Installs what it needs when missing (Debian: qemu-user, gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross; the rustup target) and fails loudly when it cannot.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu

fail() {
    echo "test-aarch64: $*" >&2
    exit 1
}

packages=()
command -v qemu-aarch64 >/dev/null || packages+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || packages+=(gcc-aarch64-linux-gnu)
[ -e "$sysroot/lib/libc.so.6" ] || packages+=(libc6-dev-arm64-cross)
if ((${#packages[@]})); then
    command -v apt-get >/dev/null || fail "missing ${packages[*]} and no apt-get to install them"
    as_root=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || fail "missing ${packages[*]}: need root or sudo to install"
        as_root=(sudo -n)
    fi
    echo "test-aarch64: installing ${packages[*]}"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
        fail "apt-get update failed"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${packages[@]}" ||
        fail "could not install ${packages[*]}"
fi
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target" || fail "could not add the rust target $target"
fi
command -v qemu-aarch64 >/dev/null || fail "qemu-aarch64 is still missing"
command -v aarch64-linux-gnu-gcc >/dev/null || fail "aarch64-linux-gnu-gcc is still missing"

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
qemu="qemu-aarch64 -L $sysroot"
run_with_cpu() { # cpu, cargo test arguments...
    local cpu="$1"
    shift
    echo "test-aarch64: cargo test $* (qemu -cpu $cpu)"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$qemu -cpu $cpu" \
        cargo test --target "$target" --locked "$@"
}

cargo clippy -p synapse-quant -p synapse-engine --target "$target" --all-targets --locked \
    -- -D warnings
# `max` has FEAT_DotProd: the dotprod kernels must be the ones tested.
SYNAPSE_EXPECT_DOTPROD=1 run_with_cpu max -p synapse-quant
run_with_cpu cortex-a53 -p synapse-quant
run_with_cpu max -p synapse-engine --test forward every_weight_format
# gpt-oss's MXFP4 experts (the NEON MXFP4 kernels in both orders) against llama.cpp's x86 bits.
run_with_cpu max -p synapse-engine --test moe gpt_oss

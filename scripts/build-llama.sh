#!/usr/bin/env bash
# Build the reference llama.cpp (vendored in the llama-cpp-python sdist) into third_party/.
#
# synapse is checked against llama.cpp: golden tokens and logits, files of every block format made
# by llama-quantize, and side-by-side benchmarks. Nothing in the normal test suite needs this build
# (the golden data it produced is committed); tools under scripts/ and bench/ do (llama-server:
# bench/serve-compare.sh; llama-lookup and llama-speculative: bench/speculate.sh).
#
#   scripts/build-llama.sh        # idempotent; prints the bin directory on its last line
#   scripts/build-llama.sh avx2   # llama-bench only, for AVX2 CPUs without AVX-512 (build-avx2/):
#                                 # to set beside synapse's SYNAPSE_ISA=avx2 on one machine
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/third_party"
src="$dest/llama.cpp"
build="$src/build"
targets=(llama-quantize llama-imatrix llama-tokenize llama-completion llama-bench llama-perplexity
    llama-server llama-lookup llama-speculative)
flags=(-DGGML_NATIVE=ON)
# The reference is ggml's AVX-512 build: where the CPU also has AMX, -march=native would add
# ggml's AMX matmuls for the K-quants and Q4_0/Q4_1/Q8_0, another summation order (the golden
# data came out different on such a machine), and on our VMs, which list AMX but do not enable
# its tile state, prompt processing dies of SIGILL in them. Turned off on the compiler's line.
if [[ $(uname -m) == x86_64 ]]; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    flags+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
fi
case "${1:-}" in
    "") ;;
    avx2)
        build="$src/build-avx2"
        targets=(llama-bench)
        flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
            -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
        ;;
    *)
        echo "usage: scripts/build-llama.sh [avx2]" >&2
        exit 2
        ;;
esac

mkdir -p "$dest"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "downloading the llama-cpp-python sdist" >&2
    # The sdist of llama-cpp-python only (--no-binary for it alone): pip prepares its metadata
    # in an isolated environment, whose build tools (cmake, ninja) then come as wheels instead
    # of being compiled from source (--no-binary :all: bootstrapped cmake from its sources, still
    # compiling after five minutes on two cores).
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        --disable-pip-version-check -d "$tmp" llama-cpp-python
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    rm -rf "$src"
    mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$src"
    basename "$tmp"/llama_cpp_python-*.tar.gz > "$src/SDIST_VERSION"
fi

if ! command -v cmake >/dev/null; then
    # Debian's cmake, as scripts/test-aarch64.sh installs its packages (root, or sudo).
    as_root=()
    [[ "$(id -u)" == 0 ]] || as_root=(sudo -n)
    if ! command -v apt-get >/dev/null ||
        ! { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q --no-install-recommends cmake; } >&2; then
        echo "cmake is missing and could not be installed (apt-get install cmake)" >&2
        exit 1
    fi
fi
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "${flags[@]}" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
echo "$build/bin"

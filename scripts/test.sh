#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this). On a fresh machine it needs
# only what the machine image has (Rust, Python with pip): it fetches the real models itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/fetch-models.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# The NEON kernels and the engine on aarch64, under qemu-user (installs what it needs).
scripts/test-aarch64.sh

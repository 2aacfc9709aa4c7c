#!/usr/bin/env bash
# The main job on a fresh machine: fetch the default model and run synapse on it.
# Extra arguments go to `synapse info` (for example --json).
#
# Until the forward pass lands (issue: first light), this describes the model: its metadata and
# the table of its tensors.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/fetch-models.sh smollm2 >&2
cargo build --release --locked --bin synapse >&2
exec target/release/synapse info models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"

#!/usr/bin/env bash
# The main job on a fresh machine: fetch the default model (SmolLM2-135M-Instruct, Q4_1), build
# synapse, and generate text from it. Arguments go to `synapse run` and replace the defaults:
#
#   scripts/run.sh                                  # a short story, sampled
#   scripts/run.sh -p "The capital of France is" -n 16 --temp 0
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/fetch-models.sh smollm2 >&2
cargo build --release --locked --bin synapse >&2
if [[ $# -eq 0 ]]; then
    set -- -p "Once upon a time, in a small village by the sea," -n 96
fi
exec target/release/synapse run -m models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"

#!/usr/bin/env bash
# The server on a fresh machine: fetch the default model (SmolLM2-135M-Instruct, Q4_1), build
# synapse, and serve it on http://127.0.0.1:8080 (the chat page at /, OpenAI's API at /v1).
# Arguments go to `synapse serve`:
#
#   scripts/serve.sh                      # 4 slots on port 8080
#   scripts/serve.sh -np 8 --port 9000 --api-key KEY
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/fetch-models.sh smollm2 >&2
cargo build --release --locked --bin synapse >&2
exec target/release/synapse serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"

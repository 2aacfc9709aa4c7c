#!/usr/bin/env bash
# Mixtures of experts, side by side: `synapse bench` against llama-bench (built by
# scripts/build-llama.sh from the llama-cpp-python sdist) on a random-weight file with
# Qwen3-30B-A3B's full widths (128 experts, 8 used a token, 768 wide; 2048-wide embeddings,
# 32/4 heads of 128, a 151936-token vocabulary) and as many of its 48 layers as LAYERS says,
# Q4_K_M (llama-quantize's mix, as synth makes it). The engines alternate, ROUNDS times,
# same file, same threads.
# Decode's bandwidth counts the bytes a token reads: the routed 8/128 of each expert stack,
# the attention and the output head whole, one row of the embedding.
#
#   bench/moe.sh                                  # 8 layers, pp64 pp256 tg32, 1 and 2 threads
#   LAYERS=4 ROUNDS=1 PROMPTS=64 bench/moe.sh
#
# Prints both engines' markdown tables; raw outputs go to bench/out/moe/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
layers=${LAYERS:-8}
rounds=${ROUNDS:-2}
prompts=${PROMPTS:-64,256}
threads=${THREADS:-1,2}
syn=target/release/synapse
dev=target/release/synapse-dev
bin="$(scripts/build-llama.sh | tail -1)"
out=bench/out/moe
mkdir -p "$out" bench/out/models
cargo build --release --locked -p synapse-cli >&2
export LD_LIBRARY_PATH="$root/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

model=bench/out/models/qwen3-30b-a3b-${layers}L-Q4_K_M.gguf
if [[ ! -f $model ]]; then
    echo "moe: synthesizing $model (F16 first, then quantized: minutes)" >&2
    "$dev" synth qwen3-30b-a3b --layers "$layers" --type Q4_K_M -o "$model" >&2
fi

for ((r = 1; r <= rounds; r++)); do
    echo "moe: round $r of $rounds" >&2
    "$bin/llama-bench" -m "$model" -p "$prompts" -n 32 -t "$threads" -b 512 -ub 512 -r 2 \
        -o md >"$out/llama-$r.md"
    "$syn" bench -m "$model" -p "$prompts" -n 32 -t "$threads" -b 512 -r 2 -q \
        >"$out/synapse-$r.md"
done
for ((r = 1; r <= rounds; r++)); do
    echo "### round $r: llama.cpp"
    cat "$out/llama-$r.md"
    echo
    echo "### round $r: synapse"
    cat "$out/synapse-$r.md"
    echo
done

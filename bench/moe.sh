#!/usr/bin/env bash
# Mixtures of experts, side by side: `synapse bench` against llama-bench (built by
# scripts/build-llama.sh from the llama-cpp-python sdist) on a random-weight file with a real
# mixture's full widths and as many of its layers as LAYERS says, quantized as synth makes it
# (llama-quantize's rules). The engines alternate, ROUNDS times, same file, same threads.
#   SHAPE=qwen3-30b-a3b TYPE=Q4_K_M (the default): 128 experts, 8 used a token, 768 wide;
#     2048-wide embeddings, 32/4 heads of 128, a 151936-token vocabulary; 48 layers in all.
#   SHAPE=gpt-oss-20b TYPE=MXFP4_MOE: 32 experts, 4 used, 2880 wide, MXFP4, the rest Q8_0;
#     2880-wide embeddings, 64/8 heads of 64, a 201088-token vocabulary; 24 layers in all.
# Decode's bandwidth counts the bytes a token reads: the routed share of each expert stack,
# the attention and the output head whole, one row of the embedding.
#
#   bench/moe.sh                                  # 8 layers, pp64 pp256 tg32, 1 and 2 threads
#   LAYERS=4 ROUNDS=1 PROMPTS=64 bench/moe.sh
#   SHAPE=gpt-oss-20b TYPE=MXFP4_MOE bench/moe.sh
#
# Prints both engines' markdown tables; raw outputs go to bench/out/moe/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
layers=${LAYERS:-8}
shape=${SHAPE:-qwen3-30b-a3b}
type=${TYPE:-Q4_K_M}
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

model=bench/out/models/$shape-${layers}L-$type.gguf
if [[ ! -f $model ]]; then
    echo "moe: synthesizing $model (F16 first, then quantized: minutes)" >&2
    "$dev" synth "$shape" --layers "$layers" --type "$type" -o "$model" >&2
fi

for ((r = 1; r <= rounds; r++)); do
    echo "moe: round $r of $rounds" >&2
    "$bin/llama-bench" -m "$model" -p "$prompts" -n 32 -t "$threads" -b 512 -ub 512 -r 2 \
        -o md >"$out/$shape-llama-$r.md"
    "$syn" bench -m "$model" -p "$prompts" -n 32 -t "$threads" -b 512 -r 2 -q \
        >"$out/$shape-synapse-$r.md"
done
for ((r = 1; r <= rounds; r++)); do
    echo "### round $r: llama.cpp"
    cat "$out/$shape-llama-$r.md"
    echo
    echo "### round $r: synapse"
    cat "$out/$shape-synapse-$r.md"
    echo
done

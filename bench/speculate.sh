#!/usr/bin/env bash
# Speculative decoding, side by side: `synapse run --lookup K` / `--draft` against llama.cpp's
# llama-lookup / llama-speculative (built by scripts/build-llama.sh from the same
# llama-cpp-python sdist), greedy, on the same files, prompts (bench/speculate/*.txt: a code
# edit, a quote, JSON from a list) and threads. Each speculative run's text is compared with
# its own engine's plain run: synapse's must be equal (the script fails otherwise);
# llama.cpp's is reported as it is. Prints a markdown table; raw outputs go to
# bench/out/speculate/.
#
#   bench/speculate.sh                      # every model, lookup and draft pairs
#   THREADS=2 N=256 KS="4 8" MODELS="smollm2 gemma synth1b" bench/speculate.sh
#
# The draft pairs of the real models are the model in F16 (the target) and its quantized file
# (the draft), the F16 made from that file by llama-quantize --allow-requantize. synth1b is a
# pair made to agree: a Llama-3.2-1B-shaped F16 file of random weights whose layers from the
# third on add nothing (`synth --inert-from 2`), drafted by its first two layers in Q8_0
# (`synth --layers 2`, the same seed: the same weights), on a plain-text prompt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads=${THREADS:-2}
n=${N:-256}
ks=(${KS:-4 8})
models=(${MODELS:-smollm2 gemma synth1b})
syn=target/release/synapse
dev=target/release/synapse-dev
bin="$(scripts/build-llama.sh | tail -1)"
out=bench/out/speculate
mkdir -p "$out" bench/out/models
cargo build --release --locked -p synapse-cli >&2

smol=models/SmolLM2-135M-Instruct.Q4_1.gguf
gemma=models/gemma-3-270m-q4_k_m.gguf
f16() { # quantized file -> its F16 copy's path
    local f="bench/out/models/$(basename "${1%.gguf}")-F16.gguf"
    [[ -f $f ]] || "$bin/llama-quantize" --allow-requantize "$1" "$f" F16 >/dev/null 2>&1
    echo "$f"
}

# The generated text: what follows the echoed prompt in an engine's output (llama-lookup and
# llama-speculative echo it with its special tokens, llama-completion without them).
generated() { # output prompt
    python3 - "$1" "$2" <<'EOF'
import re, sys
text, prompt = (open(p, encoding="utf-8", errors="replace").read() for p in sys.argv[1:3])
special = re.compile(r"<\|im_(start|end)\|>|<(start|end)_of_turn>|<bos>")
for echo in (prompt, special.sub("", prompt)):
    at = text.find(echo)
    if at >= 0:
        text = text[at + len(echo):]
        break
print(text.removesuffix("\n").removesuffix(" [end of text]").strip())
EOF
}
# "yes" when the shorter of two texts starts the longer (the engines stop a few tokens apart).
same() {
    python3 - "$1" "$2" <<'EOF'
import sys
a, b = (open(p, encoding="utf-8").read().strip() for p in sys.argv[1:3])
a, b = sorted((a, b), key=len)
print("yes" if b.startswith(a) else "no")
EOF
}
syn_run() { # tag model prompt args...
    local tag=$1 model=$2 prompt=$3
    shift 3
    "$syn" run -m "$model" -f "$prompt" -n "$n" --temp 0 -t "$threads" "$@" \
        >"$out/$tag.syn.out" 2>"$out/$tag.syn.err"
    cp "$out/$tag.syn.out" "$out/$tag.syn.txt"
    grep -o 'decode: [0-9]* tokens, [0-9.]* tok/s' "$out/$tag.syn.err" | awk '{print $4}'
}
syn_accept() { # tag
    grep -o '([0-9]*%)' "$out/$1.syn.err" | tr -d '()' || echo "-"
}
ll_run() { # tag tool model prompt args...
    local tag=$1 tool=$2 model=$3 prompt=$4
    shift 4
    [[ $tool == llama-completion ]] && set -- -no-cnv "$@" # a prompt, not a conversation
    # -p with the file's text: -f drops its last newline, the one after the assistant's turn.
    local text
    text="$(cat "$prompt"; printf x)"
    "$bin/$tool" -m "$model" -p "${text%x}" -n "$n" --temp 0 -t "$threads" "$@" \
        >"$out/$tag.ll.out" 2>"$out/$tag.ll.err" </dev/null
    generated "$out/$tag.ll.out" "$prompt" >"$out/$tag.ll.txt"
    if [[ $tool == llama-completion ]]; then
        grep -E 'eval time' "$out/$tag.ll.err" | grep -v prompt |
            grep -oE '[0-9.]+ tokens per second' | awk '{print $1}'
    else
        grep -E 'decoded .* speed' "$out/$tag.ll.err" | grep -oE 'speed: *[0-9.]+' | awk '{print $2}'
    fi
}
ll_accept() { # tag
    grep -oE 'accept *= *[0-9.]+%' "$out/$1.ll.err" | grep -oE '[0-9.]+%' || echo "-"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }

echo "| model | task | guesses | synapse plain / speculative tok/s | speedup | accepted | = plain | llama.cpp plain / speculative tok/s | speedup | accepted | = plain |"
echo "|---|---|---|--:|--:|--:|---|--:|--:|--:|---|"
for model_name in "${models[@]}"; do
    case $model_name in
        smollm2) model=$smol tasks=(code-edit quote json) pairs=(lookup draft) ;;
        gemma) model=$gemma tasks=(code-edit quote json) pairs=(lookup draft) ;;
        synth1b)
            model=bench/out/models/llama-3.2-1b-L2-Q8_0.gguf
            target_f16=bench/out/models/llama-3.2-1b-inert2-F16.gguf
            [[ -f $model ]] || "$dev" synth llama-3.2-1b --layers 2 --type Q8_0 -o "$model" >&2
            [[ -f $target_f16 ]] ||
                "$dev" synth llama-3.2-1b --inert-from 2 --type F16 -o "$target_f16" >&2
            tasks=(story) pairs=(draft)
            ;;
        *) echo "unknown model $model_name (smollm2, gemma, synth1b)" >&2 && exit 2 ;;
    esac
    [[ $model_name == synth1b ]] || target_f16=$(f16 "$model")
    for task in "${tasks[@]}"; do
        prompt=bench/speculate/$model_name-$task.txt
        for pair in "${pairs[@]}"; do
            if [[ $pair == lookup ]]; then target=$model; else target=$target_f16; fi
            base="$model_name-$task-$pair"
            s0=$(syn_run "$base-plain" "$target" "$prompt")
            l0=$(ll_run "$base-plain" llama-completion "$target" "$prompt")
            for k in "${ks[@]}"; do
                tag="$base-$k"
                if [[ $pair == lookup ]]; then
                    s=$(syn_run "$tag" "$target" "$prompt" --lookup "$k")
                    l=$(ll_run "$tag" llama-lookup "$target" "$prompt" --spec-draft-n-max "$k")
                    what="lookup $k"
                else
                    s=$(syn_run "$tag" "$target" "$prompt" --draft "$model" --draft-max "$k")
                    l=$(ll_run "$tag" llama-speculative "$target" "$prompt" -md "$model" \
                        --spec-draft-n-max "$k")
                    what="F16 drafted by $(basename "$model" .gguf | sed 's/.*[.-]//'), $k"
                fi
                if ! cmp -s "$out/$tag.syn.txt" "$out/$base-plain.syn.txt"; then
                    echo "synapse: $tag differs from plain decoding" >&2
                    exit 1
                fi
                echo "| $model_name | $task | $what | $s0 / $s | $(ratio "$s" "$s0") | $(syn_accept "$tag") | yes" \
                    "| $l0 / $l | $(ratio "$l" "$l0") | $(ll_accept "$tag") |" \
                    "$(same "$out/$tag.ll.txt" "$out/$base-plain.ll.txt") |"
            done
        done
    done
done
echo
echo "threads $threads, $n tokens, greedy, $(date -u +%Y-%m-%d)"

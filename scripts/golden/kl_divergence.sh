#!/usr/bin/env bash
# Golden data for `synapse perplexity --kl-divergence-base / --kl-divergence` from llama.cpp's
# llama-perplexity (scripts/build-llama.sh), into crates/cli/tests/data/kld/. Not run by the test
# suite (the outputs are committed); run it again only to refresh them:
#
#   scripts/build-llama.sh && scripts/golden/kl_divergence.sh
#
# The base is the random-weight tiny llama in Q8_0, compared with the same weights in Q4_0
# (crates/engine/tests/data/forward), over the first 4 windows of 128 tokens of
# crates/cli/tests/data/perplexity.txt. `-ub 1`: llama.cpp's one-token arithmetic, whose logits
# synapse's equal at any batch (its batched arithmetic is another).
#   tiny-Q8_0.base:        the base file llama-perplexity writes (compared byte for byte)
#   tiny-Q8_0.base.golden: what the base run prints (the running values and the estimate)
#   tiny-Q4_0.kld.golden:  the comparison's table and statistics, stdout without its timing line
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=third_party/llama.cpp/build/bin
export LD_LIBRARY_PATH="$PWD/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tiny=crates/engine/tests/data/forward
out=crates/cli/tests/data/kld
mkdir -p "$out"
common=(-c 128 -b 128 -ub 1 -t 2)
"$bin/llama-perplexity" -m "$tiny/tiny-Q8_0.gguf" -f crates/cli/tests/data/perplexity.txt \
    "${common[@]}" --chunks 4 --kl-divergence-base "$out/tiny-Q8_0.base" >"$out/base.stdout" 2>"$out/base.stderr"
{
    grep -o '^\[.*,$' "$out/base.stdout"
    grep -o 'Final estimate: .*' "$out/base.stderr"
} >"$out/tiny-Q8_0.base.golden"
"$bin/llama-perplexity" -m "$tiny/tiny-Q4_0.gguf" "${common[@]}" \
    --kl-divergence-base "$out/tiny-Q8_0.base" --kl-divergence 2>/dev/null |
    grep -v 'minutes$' >"$out/tiny-Q4_0.kld.golden"
rm "$out/base.stdout" "$out/base.stderr"
ls -l "$out"

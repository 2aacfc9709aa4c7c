"""Serving speed of an OpenAI-compatible server (synapse serve or llama-server) at a number of
concurrent streams: aggregate output tokens/s, time to first token p50/p99 and time per output
token p50, over streamed /v1/completions of fixed-length prompts (token ids, different for each
request, so no prefix is shared) and fixed-length answers (ignore_eos).

    python bench/serve_bench.py --base-url http://127.0.0.1:8080 --streams 8 [--rounds 2]

Prints one JSON line.
"""

import argparse
import asyncio
import json
import random
import statistics
import time

import httpx


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def one(client, base, prompt, max_tokens):
    """(time to first token, [times of each token chunk], tokens generated) of one request."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps, usage = [], None
    async with client.stream("POST", base + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            if any(c.get("text") for c in chunk.get("choices", [])):
                stamps.append(time.perf_counter() - t0)
    n = usage if usage is not None else len(stamps)
    return stamps[0], stamps, n


async def main_async(a):
    rng = random.Random(a.seed)
    limits = httpx.Limits(max_connections=a.streams + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        def prompt():
            return [rng.randrange(1000, 20000) for _ in range(a.prompt_tokens)]
        await one(client, a.base_url, prompt(), 8)  # warm-up
        ttft, tpot, tokens = [], [], 0

        async def stream():
            nonlocal tokens
            for _ in range(a.rounds):
                first, stamps, n = await one(client, a.base_url, prompt(), a.max_tokens)
                ttft.append(first)
                if len(stamps) > 1:
                    tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
                tokens += n
        t0 = time.perf_counter()
        await asyncio.gather(*[stream() for _ in range(a.streams)])
        wall = time.perf_counter() - t0
    print(json.dumps({
        "streams": a.streams, "requests": a.streams * a.rounds, "tokens": tokens,
        "agg_tok_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(1000 * pct(ttft, 50), 1), "ttft_p99_ms": round(1000 * pct(ttft, 99), 1),
        "tpot_p50_ms": round(1000 * statistics.median(tpot), 2),
    }))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream, one after another")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()

"""A bounded load test of a running `synapse serve`: many streaming clients for a fixed time,
every answer checked against the one its prompt gets alone.

    python bench/serve_load.py --base-url http://127.0.0.1:PORT [--clients 64] [--seconds 120]
                               [--max-tokens 64] [--pid SERVER_PID]

Each prompt is sampled at temperature 0.8 with a seed of its own, first alone (one request at
a time: the reference) and then under load; the server promises the same bits whatever else
it serves, so any difference in the text is a failure, as is any error. Reports requests,
output tokens/s over the load, time to first token (p50, p99) and, with --pid, the server's
resident memory after warm-up and at the end, and the server's own step statistics over the
load (/metrics). Exits 1 on any error or mismatch.
"""

import argparse
import asyncio
import sys
import time
import urllib.request

import openai

PROMPTS = [
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List five fruits, one per line.",
    "What is the capital of France, and what is it known for?",
    "Give me three tips for learning to play the guitar.",
    "Describe a cat to someone who has never seen one.",
    "Write the opening line of a mystery novel.",
    "What are the benefits of drinking water?",
]
TEMPERATURE = 0.8
SEED0 = 1234  # prompt i is sampled with seed SEED0 + i


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def server_metrics(base):
    """The server's unlabelled counters, gauges and sums from /metrics, by name."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    # Histogram buckets (labelled) and comments left out.
    pairs = (line.split() for line in lines if line[:1] not in ("", "#") and "{" not in line)
    return {name: float(value) for name, value in pairs}


def pct(xs, p):
    """The p-th percentile by nearest rank."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs)) - 1))]


async def complete(client, i, max_tokens):
    """(text, completion tokens, seconds to the first text) of prompt i, streamed."""
    t0 = time.monotonic()
    ttft = None
    parts = []
    tokens = None
    stream = await client.chat.completions.create(
        model="synapse",
        messages=[{"role": "user", "content": PROMPTS[i]}],
        temperature=TEMPERATURE,
        seed=SEED0 + i,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            if c.delta.content:
                if ttft is None:
                    ttft = time.monotonic() - t0
                parts.append(c.delta.content)
    if tokens is None:
        raise RuntimeError("the stream ended without a usage chunk")
    return "".join(parts), tokens, ttft


class Tally:
    def __init__(self):
        self.done = 0
        self.tokens = 0
        self.ttft = []
        self.errors = []
        self.mismatches = []


async def client_loop(client, c, refs, deadline, max_tokens, tally):
    # Clients start at different prompts, so that every prompt is in flight at once.
    n = c
    while time.monotonic() < deadline:
        i = n % len(PROMPTS)
        n += 1
        try:
            text, tokens, ttft = await complete(client, i, max_tokens)
        except Exception as e:  # every failure counts, whatever its kind
            tally.errors.append(f"client {c}, prompt {i}: {type(e).__name__}: {e}")
            # A server that has gone would otherwise be asked again at once, all the run long.
            await asyncio.sleep(1)
            continue
        tally.done += 1
        tally.tokens += tokens
        if ttft is not None:
            tally.ttft.append(ttft)
        if text != refs[i]:
            tally.mismatches.append((i, text))


async def sample_rss(pid, samples, stop):
    t0 = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - t0, rss_kib(pid)))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


def first_difference(a, b):
    n = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n, a[n : n + 30], b[n : n + 30]


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pid", type=int, help="the server's process id, to sample its memory")
    ap.add_argument("--max-rss-growth-mib", type=float,
                    help="fail if the server's memory grows more than this after warm-up")
    args = ap.parse_args()

    client = openai.AsyncOpenAI(
        base_url=args.base_url.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=600
    )
    rss_start = rss_kib(args.pid) if args.pid else None

    refs = []
    for i in range(len(PROMPTS)):
        text, tokens, _ = await complete(client, i, args.max_tokens)
        refs.append(text)
        print(f"reference {i}: {tokens} tokens: {text[:60]!r}...")

    m0 = server_metrics(args.base_url)
    tally = Tally()
    samples = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(args.pid, samples, stop)) if args.pid else None
    t0 = time.monotonic()
    print(f"load: {args.clients} clients for {args.seconds:g} s, max_tokens {args.max_tokens}")
    await asyncio.gather(
        *(
            client_loop(client, c, refs, t0 + args.seconds, args.max_tokens, tally)
            for c in range(args.clients)
        )
    )
    elapsed = time.monotonic() - t0
    stop.set()
    if sampler:
        await sampler
    await client.close()
    m1 = server_metrics(args.base_url)
    d = {k: m1[k] - m0.get(k, 0) for k in m1}

    print(
        f"requests: {tally.done} in {elapsed:.1f} s ({tally.done / elapsed:.2f}/s; none started "
        f"after {args.seconds:g} s, the rest is the queue draining)"
    )
    print(f"errors: {len(tally.errors)}")
    for e in tally.errors[:5]:
        print(f"  {e}")
    print(f"mismatches: {len(tally.mismatches)}")
    for i, text in tally.mismatches[:5]:
        at, want, got = first_difference(refs[i], text)
        print(f"  prompt {i} differs at char {at}: reference {want!r}, got {got!r}")
    print(f"output tokens/s: {tally.tokens / elapsed:.1f} ({tally.tokens} tokens)")
    if tally.ttft:
        p50, p99 = pct(tally.ttft, 50), pct(tally.ttft, 99)
        print(f"time to first token: p50 {p50:.3f} s, p99 {p99:.3f} s")
    steps = d["synapse_batch_sequences_count"]
    if steps:
        seqs = d["synapse_batch_sequences_sum"] / steps
        tokens = d["synapse_batch_tokens_sum"] / steps
        ms = 1000 * d["synapse_step_seconds_sum"] / steps
        hits = d["synapse_prefix_cache_hits_total"]
        cached, prompt = d["synapse_prompt_tokens_cached_total"], d["synapse_prompt_tokens_total"]
        print(
            f"server: {steps:.0f} steps, a step {seqs:.2f} sequences, {tokens:.1f} tokens, "
            f"{ms:.1f} ms; prefix cache: {hits:.0f} hits, {cached:.0f}/{prompt:.0f} prompt tokens"
        )
    if samples:
        # Warm-up: the first quarter of the load, at most 10 s (the slots' buffers are sized).
        warm = min(10.0, args.seconds / 4)
        after = next((kib for t, kib in samples if t >= warm), samples[-1][1])
        end = samples[-1][1]
        peak = max(kib for _, kib in samples)
        print(
            f"server RSS: {rss_start / 1024:.1f} MiB before the references, {after / 1024:.1f} MiB "
            f"after {warm:g} s of load, {end / 1024:.1f} MiB at the end (peak {peak / 1024:.1f}): "
            f"growth {(end - after) / 1024:+.1f} MiB over {samples[-1][0] - warm:.0f} s"
        )
    ok = tally.done > 0 and not tally.errors and not tally.mismatches
    if samples and args.max_rss_growth_mib is not None and (end - after) / 1024 > args.max_rss_growth_mib:
        print(f"the server's memory grew more than {args.max_rss_growth_mib:g} MiB after warm-up")
        ok = False
    print("serve_load: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

"""The determinism suite: a request's tokens and every logprob, bit for bit, do not depend on
what else the server runs, on its prefix cache, or (across runs of this script against servers
of other -np, -t and -b, compared by the caller) on its configuration.

    python tests/server/test_determinism.py --base-url http://127.0.0.1:PORT --out results.json

At temperature 0 and at temperature 0.8 with a seed, each target request is sent alone, again
(a prefix-cache hit), together with 1, 3, 8 and 16 other different requests, streamed among
others, and as 64 copies at once (--crowd scales these); a longer prompt sharing a cached prefix gives what it gave
cold; and llama.cpp's same-seed test (the same seeded request four times, prompt cache on)
gives one text. The results are written for the caller to compare across servers, one of
which may guess tokens by prompt lookup (`serve --lookup N`): then --expect-guesses checks in
/metrics that guesses were both accepted and rejected, so that both paths ran (or, with
`--expect-guesses rejected`, that some were rejected).
"""

import argparse
import asyncio
import json
import sys
import urllib.request

import openai

PROMPTS = [
    "Write a list of five fruits, one per line:\n",
    "The history of the printing press begins",
    "def fibonacci(n):\n",
]
# A prompt whose own tokens are favoured by a logit bias (set per model from /tokenize): the text
# keeps recombining them, so prompt lookup (`serve --lookup`) guesses often, right and wrong,
# whatever the weights, random ones included.
REPEAT = "one two three four five, " * 4
OTHER_PROMPTS = [
    "Once upon a time in a small village",
    "The three laws of thermodynamics are",
    "Translate to French: the cat sleeps on the mat.",
    "List the planets of the solar system:",
    "A haiku about autumn:\n",
    "SELECT name, count(*) FROM",
    "The quick brown fox",
    "In 1492, Columbus",
]
MAX_TOKENS = 24


def targets(with_chat=True, repeat_bias=None):
    """(name, kind, request) of every target."""
    out = []
    if repeat_bias:
        for temp, seed in [(0.0, None), (0.8, 99)]:
            req = {"prompt": REPEAT, "max_tokens": MAX_TOKENS, "temperature": temp, "logprobs": 2,
                   "logit_bias": repeat_bias}
            if seed is not None:
                req["seed"] = seed
            out.append((f"repeat-t{temp}", "text", req))
    for i, p in enumerate(PROMPTS):
        for temp, seed in [(0.0, None), (0.8, 1234 + i)]:
            req = {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": temp, "logprobs": 2}
            if seed is not None:
                req["seed"] = seed
            out.append((f"text{i}-t{temp}", "text", req))
    chat = {"messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": 77, "logprobs": True, "top_logprobs": 2}
    if with_chat:
        out.append(("chat-t0.8", "chat", chat))
    return out


def others(n, salt):
    """`n` requests unlike the targets: other prompts, lengths, temperatures, seeds."""
    reqs = []
    for j in range(n):
        p = OTHER_PROMPTS[(j + salt) % len(OTHER_PROMPTS)] + " " * (j % 3)
        reqs.append(("text", {"prompt": p, "max_tokens": 8 + (j * 5) % 30,
                              "temperature": [0.0, 0.7, 1.1][j % 3], "seed": 1000 + j + salt}))
    return reqs


async def send(c, kind, req, stream=False):
    """(text, [(token, logprob, [(token, logprob)...])...]) of one request's first choice."""
    if kind == "chat":
        if stream:
            text, lps = "", []
            async for ch in await c.chat.completions.create(model="m", stream=True, **req):
                for x in ch.choices:
                    text += x.delta.content or ""
                    if x.logprobs and x.logprobs.content:
                        lps += [(t.token, t.logprob, [(u.token, u.logprob) for u in t.top_logprobs])
                                for t in x.logprobs.content]
            return text, lps
        r = (await c.chat.completions.create(model="m", **req)).choices[0]
        lps = [(t.token, t.logprob, [(u.token, u.logprob) for u in t.top_logprobs])
               for t in (r.logprobs.content if r.logprobs else [])]
        return r.message.content, lps
    if stream:
        text, lps = "", []
        async for ch in await c.completions.create(model="m", stream=True, **req):
            for x in ch.choices:
                text += x.text
                if x.logprobs:
                    lps += [(t, p, sorted(top.items())) for t, p, top in
                            zip(x.logprobs.tokens, x.logprobs.token_logprobs, x.logprobs.top_logprobs)]
        return text, lps
    r = (await c.completions.create(model="m", **req)).choices[0]
    L = r.logprobs
    lps = [(t, p, sorted(top.items())) for t, p, top in
           zip(L.tokens, L.token_logprobs, L.top_logprobs)] if L else []
    return r.text, lps


def same(got, want, what):
    if got != want:
        print(f"FAIL: {what}\n  want {want[0]!r}\n  got  {got[0]!r}", file=sys.stderr)
        raise AssertionError(what)


async def main_async(base, out, chat, crowd, expect_guesses):
    c = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
    results = {}
    # A longer prompt sharing the first target's prefix, cold (before that prefix is cached).
    longer = {"prompt": PROMPTS[0] + "1. Apple\n2.", "max_tokens": MAX_TOKENS, "temperature": 0.8,
              "seed": 5, "logprobs": 2}
    results["longer-cold"] = await send(c, "text", longer)

    ids = json.loads(urllib.request.urlopen(urllib.request.Request(
        base + "/tokenize", data=json.dumps({"content": REPEAT}).encode(),
        headers={"Content-Type": "application/json"})).read())["tokens"]
    ts = targets(chat, {str(t): 8.0 for t in sorted(set(ids))})
    for name, kind, req in ts:
        results[name] = await send(c, kind, req)
        n_tokens = len(results[name][1])
        assert n_tokens > 0, f"{name}: no logprobs"
    print(f"ok: {len(ts)} targets alone")

    for name, kind, req in ts:
        same(await send(c, kind, req), results[name], f"{name}: again (prefix-cache hit)")
    print("ok: every target again, from the prefix cache")
    same(await send(c, "text", longer), results["longer-cold"], "a longer prompt after its prefix was cached")
    print("ok: a longer prompt over a cached prefix gives its cold result")

    for n in [m for m in [1, 3, 8, 16] if m <= crowd]:
        for k, (name, kind, req) in enumerate(ts[1::2]):
            extra = [send(c, kk, rr) for kk, rr in others(n, salt=n + k)]
            got = await asyncio.gather(send(c, kind, req), *extra)
            same(got[0], results[name], f"{name}: with {n} others")
        print(f"ok: every seeded target together with {n} other requests")

    for name, kind, req in ts[:2] + ts[-1:]:
        extra = [send(c, kk, rr, stream=True) for kk, rr in others(8, salt=3)]
        got = await asyncio.gather(send(c, kind, req, stream=True), *extra)
        same(got[0], results[name], f"{name}: streamed among 8 others")
    print("ok: streamed among others, the same tokens and logprobs")

    name, kind, req = ts[1]
    copies = await asyncio.gather(*[send(c, kind, req) for _ in range(4 * crowd)])
    distinct = {json.dumps(x) for x in copies}
    assert len(distinct) == 1, f"{len(copies)} copies gave {len(distinct)} distinct completions"
    same(copies[0], results[name], f"{name}: {len(copies)} copies at once")
    print(f"ok: {len(copies)} copies of one request at once give one completion, its own")

    # llama.cpp's test_consistent_result_same_seed, prompt cache on.
    seeded = {"prompt": "I believe the meaning of life is", "seed": 42, "temperature": 1.0,
              "max_tokens": 16, "logprobs": 1}
    runs = [await send(c, "text", seeded) for _ in range(4)]
    assert all(r == runs[0] for r in runs), "the same seed gave different texts"
    results["same-seed"] = runs[0]
    print("ok: the same seed four times, one text")

    if expect_guesses:
        metrics = urllib.request.urlopen(base + "/metrics").read().decode()
        value = lambda name: float(next(l.split()[1] for l in metrics.splitlines()
                                        if l.startswith(name + " ")))
        drafted = value("synapse_draft_tokens_total")
        accepted = value("synapse_draft_accepted_tokens_total")
        want = (accepted < drafted) if expect_guesses == "rejected" else (0 < accepted < drafted)
        assert want, f"prompt lookup: {accepted} of {drafted} guesses accepted"
        print(f"ok: {accepted:.0f} of {drafted:.0f} guesses accepted")

    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"test_determinism: all passed; {len(results)} results in {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-chat", action="store_true", help="for a model without a chat template")
    ap.add_argument("--crowd", type=int, default=16,
                    help="the most other requests beside a target (copies at once: 4x this)")
    ap.add_argument("--expect-guesses", nargs="?", const="both", choices=["both", "rejected"],
                    help="the server guesses by prompt lookup: check that guesses held and failed "
                         "(both), or at least that some failed (rejected: a model whose output "
                         "seldom repeats)")
    a = ap.parse_args()
    asyncio.run(main_async(a.base_url, a.out, not a.no_chat, a.crowd, a.expect_guesses))


if __name__ == "__main__":
    main()

"""The `openai` package against a running `synapse serve`: chat and completions, streamed and
not, usage, logprobs, stop strings, n, seeds, the other endpoints, and errors in OpenAI's shape.

    python tests/server/test_openai.py --base-url http://127.0.0.1:PORT [--api-key KEY]

The server must run with --api-key KEY when one is given (the 401 cases), -c 512 (the
prompt-length case) and --max-body 65536 (the 413 case).
"""

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.request

import openai

PROMPT = "Write a list of five fruits, one per line:\n"
CHAT = [{"role": "user", "content": "Name three colours."}]


def http(base, path, body=None, key=None, raw=None):
    """(status, parsed JSON or text, headers) of a plain request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, text, headers = r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        status, text, headers = e.code, e.read().decode(), e.headers
    try:
        return status, json.loads(text), headers
    except json.JSONDecodeError:
        return status, text, headers


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def completions(c):
    r = c.completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0)
    ch = r.choices[0]
    check(ch.finish_reason == "length" and r.usage.completion_tokens == 16, "completion: 16 tokens, length")
    check(r.usage.total_tokens == r.usage.prompt_tokens + 16, "completion: usage adds up")
    again = c.completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0)
    check(again.choices[0].text == ch.text, "completion: greedy repeats")
    check(again.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1,
          "completion: the repeat reads its prompt from the prefix cache")

    # Streamed: the pieces make the same text; usage comes last, only when asked.
    pieces, usage, finish = [], None, None
    for chunk in c.completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0,
                                      stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for x in chunk.choices:
            pieces.append(x.text)
            finish = x.finish_reason or finish
    check("".join(pieces) == ch.text and len(pieces) > 2, "completion stream: same text, in pieces")
    check(usage is not None and usage.completion_tokens == 16 and finish == "length", "completion stream: usage and finish")
    no_usage = list(c.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0, stream=True))
    check(all(x.usage is None for x in no_usage), "completion stream: no usage unless asked")

    # Stop strings: the text ends before the first one.
    cut = ch.text[len(ch.text) // 2:][:3]
    s = c.completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0, stop=[cut, "zzz"])
    check(s.choices[0].finish_reason == "stop" and s.choices[0].text == ch.text[: ch.text.index(cut)],
          f"completion: stop {cut!r} cuts the text there")
    streamed = "".join(x.text for chunk in c.completions.create(
        model="m", prompt=PROMPT, max_tokens=16, temperature=0, stop=cut, stream=True) for x in chunk.choices)
    check(streamed == s.choices[0].text, "completion stream: the stop string is never sent")

    # Logprobs: the chosen token's is among the top ones; tokens make the text.
    lp = c.completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3).choices[0]
    L = lp.logprobs
    check(len(L.tokens) == 8 and "".join(L.tokens) == lp.text, "completion logprobs: tokens make the text")
    check(all(t <= 0 for t in L.token_logprobs), "completion logprobs: log probabilities")
    check(all(abs(max(top.values()) - p) < 1e-6 for top, p in zip(L.top_logprobs, L.token_logprobs)),
          "completion logprobs: greedy takes the most likely")

    # Token ids as the prompt.
    ids = http(c.base_url_str, "/tokenize", {"content": PROMPT, "add_special": True}, c.api_key)[1]["tokens"]
    by_ids = c.completions.create(model="m", prompt=ids, max_tokens=16, temperature=0)
    check(by_ids.choices[0].text == ch.text, "completion: token ids give the same text")

    # A list of prompts: each its own choices, in order, the prompts' tokens added up.
    other = "The capital of France is"
    two = c.completions.create(model="m", prompt=[PROMPT, other], max_tokens=16, temperature=0)
    alone = c.completions.create(model="m", prompt=other, max_tokens=16, temperature=0)
    texts = [x.text for x in sorted(two.choices, key=lambda x: x.index)]
    check(texts == [ch.text, alone.choices[0].text], "completion: a list of prompts, a choice each")
    check(two.usage.prompt_tokens == r.usage.prompt_tokens + alone.usage.prompt_tokens,
          "completion: a list's prompt tokens add up")

    # n choices with a seed: different draws, each reproducible.
    a = c.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=42, n=3)
    b = c.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=42, n=3)
    texts = [x.text for x in sorted(a.choices, key=lambda x: x.index)]
    check(texts == [x.text for x in sorted(b.choices, key=lambda x: x.index)], "n=3: a seed reproduces every choice")
    check(len(set(texts)) > 1, "n=3: the choices differ")
    check(a.usage.completion_tokens == 36, "n=3: usage counts every choice")


def chat(c):
    r = c.chat.completions.create(model="m", messages=CHAT, max_tokens=24, temperature=0)
    m = r.choices[0].message
    check(m.role == "assistant" and len(m.content) > 0, "chat: an answer")
    pieces, roles = [], []
    for chunk in c.chat.completions.create(model="m", messages=CHAT, max_tokens=24, temperature=0, stream=True):
        for x in chunk.choices:
            roles.append(x.delta.role)
            pieces.append(x.delta.content or "")
    check("".join(pieces) == m.content and roles[0] == "assistant", "chat stream: role first, same text")
    lp = c.chat.completions.create(model="m", messages=CHAT, max_tokens=6, temperature=0,
                                   logprobs=True, top_logprobs=2).choices[0]
    content = lp.logprobs.content
    check(len(content) == 6 and all(len(t.top_logprobs) == 2 for t in content), "chat logprobs: per token, top 2")
    check("".join(t.token for t in content) == lp.message.content, "chat logprobs: tokens make the text")
    seeded = [c.chat.completions.create(model="m", messages=CHAT, max_tokens=16, temperature=0.9, seed=5)
              .choices[0].message.content for _ in range(2)]
    check(seeded[0] == seeded[1], "chat: a seed reproduces the draw")
    r = c.chat.completions.create(model="m", messages=CHAT, max_tokens=16, temperature=0.9)
    seed = r.model_extra.get("seed")
    check(isinstance(seed, int) and 0 <= seed < 2**53, "chat: a fresh seed is returned, exact in JSON numbers")


def errors(c, base, key):
    def status(call):
        try:
            call()
        except openai.APIStatusError as e:
            return e.status_code, e.body
        return 200, None

    code, body = status(lambda: c.chat.completions.create(model="m", messages=CHAT, temperature="hot"))
    check(code == 400 and "temperature" in json.dumps(body), "400: a wrong type names the field")
    code, body = status(lambda: c.completions.create(model="m", prompt="x " * 2000, max_tokens=4))
    check(code == 400 and "512" in body["message"], f"400: a prompt past the context names both numbers: {body['message']}")
    code, _ = status(lambda: c.completions.create(model="m", prompt="x", top_p=7))
    check(code == 400, "400: top_p out of range")
    s, body, _ = http(base, "/v1/completions", raw=b"{not json", key=key)
    check(s == 400 and body["error"]["type"] == "invalid_request_error", "400: bad JSON, OpenAI's shape")
    s, body, _ = http(base, "/v1/completions", {"prompt": "x" * 100_000}, key=key)
    check(s == 413 and "bytes" in body["error"]["message"], "413: body too large")
    if key:
        bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
        code, _ = status(lambda: bad.models.list())
        check(code == 401, "401: wrong API key")
        s, _, _ = http(base, "/v1/models")
        check(s == 401, "401: no API key")
        s, _, _ = http(base, "/metrics")
        check(s == 401, "401: metrics without the key")
    s, body, _ = http(base, "/health")
    check(s == 200 and body["status"] == "ok", "health: ok")


async def disconnect(base, key):
    """A client that goes away: its sequence stops (the cancel counter moves)."""
    def cancelled():
        text = http(base, "/metrics", key=key)[1]
        line = [x for x in text.splitlines() if x.startswith("synapse_requests_cancelled_total")]
        return float(line[0].split()[-1])
    before = cancelled()
    ac = openai.AsyncOpenAI(base_url=base + "/v1", api_key=key or "none", max_retries=0)
    stream = await ac.completions.create(model="m", prompt=PROMPT, max_tokens=400, temperature=0, stream=True)
    n = 0
    async for _ in stream:
        n += 1
        if n == 3:
            break
    await stream.close()
    for _ in range(100):
        if cancelled() > before:
            break
        await asyncio.sleep(0.05)
    check(cancelled() > before, "a disconnected stream is cancelled")


def others(c, base, key):
    models = c.models.list().data
    check(len(models) == 1 and models[0].id.endswith(".gguf"), "models: the served file")
    s, t, _ = http(base, "/tokenize", {"content": "Hello world"}, key)
    s2, d, _ = http(base, "/detokenize", {"tokens": t["tokens"]}, key)
    check(s == 200 and s2 == 200 and d["content"] == "Hello world", "tokenize and detokenize round-trip")
    s, _, _ = http(base, "/detokenize", {"tokens": [10**9]}, key)
    check(s == 400, "detokenize: an id past the vocabulary is a 400")
    text = http(base, "/metrics", key=key)[1]
    for name in ["synapse_requests_finished_total", "synapse_prompt_tokens_cached_total",
                 "synapse_time_to_first_token_seconds_bucket", "synapse_time_per_output_token_seconds_count",
                 "synapse_batch_sequences_bucket", "synapse_queue_depth"]:
        check(name in text, f"metrics: {name}")


async def queue_full(base):
    """A server of one slot and a queue of one (-np 1 --max-queue 1): of three requests at
    once, one runs, one waits, one is refused with 503 and Retry-After."""
    async def one():
        return await asyncio.to_thread(
            http, base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 64, "temperature": 0})
    got = await asyncio.gather(*[one() for _ in range(3)])
    refused = [g for g in got if g[0] == 503]
    check(len(refused) >= 1 and all(g[0] in (200, 503) for g in got), "503: a full queue refuses")
    s, body, headers = refused[0]
    check(body["error"]["code"] == "queue_full" and headers.get("Retry-After") == "1", "503: Retry-After")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key")
    ap.add_argument("--queue-full", action="store_true", help="only the full-queue case")
    ap.add_argument("--greedy-equals", metavar="FILE",
                    help="only check that a greedy completion of FILE's prompt is FILE's text "
                         "(JSON: prompt, max_tokens, text from `synapse run --temp 0`)")
    a = ap.parse_args()
    if a.greedy_equals:
        with open(a.greedy_equals) as f:
            want = json.load(f)
        c = openai.OpenAI(base_url=a.base_url + "/v1", api_key=a.api_key or "none", max_retries=0)
        r = c.completions.create(model="m", prompt=want["prompt"], max_tokens=want["max_tokens"], temperature=0)
        check(r.choices[0].text == want["text"], f"served greedy text is `synapse run`'s: {want['text']!r}")
        return
    if a.queue_full:
        asyncio.run(queue_full(a.base_url))
        return
    c = openai.OpenAI(base_url=a.base_url + "/v1", api_key=a.api_key or "none", max_retries=0, timeout=300)
    c.base_url_str = a.base_url
    completions(c)
    chat(c)
    errors(c, a.base_url, a.api_key)
    others(c, a.base_url, a.api_key)
    asyncio.run(disconnect(a.base_url, a.api_key))
    print("test_openai: all passed")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write docs/perf-compare.md and the roofline plot from the raw results of bench/compare.sh.

Everything above the marker line in the report is regenerated; everything below it (hand-written
analysis) is kept as it is.
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict

MARKER = "<!-- Everything below this line is hand-written and kept by bench/compare.sh. -->"


def load_json(path):
    with open(path) as f:
        return json.load(f)


def mean_sd(xs):
    if not xs:
        return float("nan"), float("nan")
    m = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return m, sd


def collect(raw):
    """{(engine, base, threads): {"pp": [ts...], "tg": [ts...], "rows": [...]}}"""
    res = defaultdict(lambda: {"pp": [], "tg": [], "rows": []})
    # In the order the runs were made (the script's order of files).
    for path in sorted(glob.glob(os.path.join(raw, "*--*--t*--r*.json")), key=os.path.getmtime):
        name = os.path.basename(path)[: -len(".json")]
        engine, base, t, _ = name.split("--")
        t = int(t[1:])
        try:
            rows = load_json(path)
        except (json.JSONDecodeError, OSError) as e:
            print(f"perf_report: {path}: {e}", file=sys.stderr)
            continue
        for r in rows:
            kind = "pp" if r["n_prompt"] > 0 and r["n_gen"] == 0 else "tg" if r["n_gen"] > 0 and r["n_prompt"] == 0 else None
            if kind is None:
                continue
            samples = r.get("samples_ts") or [r["avg_ts"]]
            res[(engine, base, t)][kind].extend(samples)
            res[(engine, base, t)]["rows"].append(r)
    return res


def peaks(raw):
    best = {}
    isa = "?"
    for path in sorted(glob.glob(os.path.join(raw, "membw-*.json"))):
        for r in load_json(path):
            best[r["n_threads"]] = max(best.get(r["n_threads"], 0.0), r["gbs"])
            isa = r.get("isa", isa)
    return best, isa


def machine(raw):
    text = open(os.path.join(raw, "machine.txt")).read()
    lscpu = {}
    for line in text.split("---")[0].splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            lscpu[k.strip()] = v.strip()
    mem = re.search(r"^Mem:\s+(\d+)", text, re.M)
    flags = lscpu.get("Flags", "").split()
    simd = [f for f in ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "asimd", "asimddp"] if f in flags]
    load = text.split("---")[-1].strip()
    return {
        "model": lscpu.get("Model name", "?"),
        "cpus": lscpu.get("CPU(s)", "?"),
        "tpc": lscpu.get("Thread(s) per core", "?"),
        "l3": lscpu.get("L3 cache", "?"),
        "hyp": lscpu.get("Hypervisor vendor", ""),
        "mem": mem.group(1) + " GiB" if mem else "?",
        "simd": simd,
        "load": load,
    }


def label(base):
    names = {
        "SmolLM2-135M-Instruct.Q4_1": "SmolLM2-135M Q4_1 (real)",
        "gemma-3-270m-q4_k_m": "Gemma-3-270M Q4_K_M (real)",
    }
    if base in names:
        return names[base]
    m = re.match(r"llama-3\.2-1b-L(\d+)-(.+)", base)
    if m:
        return f"Llama-3.2-1B shape, {m.group(1)} layers, {m.group(2)} (synth)"
    m = re.match(r"fmt-L(\d+)-(.+)", base)
    if m:
        return f"{m.group(2)} (1B matrices, {m.group(1)} layers, synth)"
    return base


def short(base):
    m = re.match(r"fmt-L\d+-(.+)", base)
    if m:
        return m.group(1).replace("_M", "")
    return {
        "SmolLM2-135M-Instruct.Q4_1": "SmolLM2\nQ4_1",
        "gemma-3-270m-q4_k_m": "Gemma3\nQ4_K_M",
    }.get(base, re.sub(r"llama-3\.2-1b-L\d+-", "1B\n", base))


def outside(raw):
    """Per thread count: rates from each interleaved rep (outside and inside), and their medians."""
    path = os.path.join(raw, "outside.jsonl")
    if not os.path.exists(path):
        return []
    walls = defaultdict(dict)  # (threads, rep) -> {(prompt, n_predict): wall_s}
    for line in open(path):
        r = json.loads(line)
        walls[(r["threads"], r["rep"])][(r["prompt"], r["n_predict"])] = r["wall_s"]
    out = []
    for t in sorted({k[0] for k in walls}):
        reps = []
        for (tt, k), w in sorted(walls.items()):
            if tt != t:
                continue
            g = max(n for (pr, n) in w if pr == "p1") - 1
            np_ = max(int(pr[1:]) for (pr, n) in w)
            t_dec = w[("p1", g + 1)] - w[("p1", 1)]
            t_pp = w[(f"p{np_}", 1)] - w[("p1", 1)] + t_dec / g
            inside = load_json(os.path.join(raw, f"inside-t{t}-k{k}.json"))
            reps.append(dict(
                g=g, np=np_, walls=w,
                tg_out=g / t_dec if t_dec > 0 else float("nan"),
                pp_out=np_ / t_pp if t_pp > 0 else float("nan"),
                pp_in=next(r["avg_ts"] for r in inside if r["n_prompt"] == np_),
                tg_in=next(r["avg_ts"] for r in inside if r["n_gen"] > 0),
            ))
        med = {key: statistics.median(r[key] for r in reps) for key in ("tg_out", "pp_out", "pp_in", "tg_in")}
        out.append(dict(t=t, g=reps[0]["g"], np=reps[0]["np"], reps=reps, **med))
    return out


def outside_section(raw):
    o = outside(raw)
    if not o:
        return []
    L = []
    P = o[0]["np"]
    L.append("`synapse run` timed from outside by `/usr/bin/time` (whole-process wall time, loading "
             "included) on the Llama-3.2-1B-shaped file, whose generated byte-level vocabulary makes a "
             f"{P - 1}-letter prompt plus BOS exactly {P} tokens and `a` without BOS one. Differences of wall times "
             "cancel loading: decode rate = G / (T(1-token prompt, G+1 tokens) − T(1-token prompt, 1 token)), "
             f"G steps at positions 1..G as the bench's tgG at 0..G−1; prefill time of {P} tokens = "
             f"T({P}-token prompt, 1 token) − T(1-token prompt, 1 token) + one decode step. Each rep runs the "
             f"three timed commands and then `synapse bench -p {P} -n G -r 1` (after its warm-up run), so that "
             "both sides see the same state of the machine; the table holds the medians over reps "
             "(`bench/outside-clock.sh`).")
    L.append("")
    L.append(f"| threads | G | reps | outside pp{P} tok/s | bench pp{P} tok/s | bench / outside | outside tg tok/s | bench tg tok/s | bench / outside |")
    L.append("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in o:
        L.append(f"| {r['t']} | {r['g']} | {len(r['reps'])} | {r['pp_out']:.1f} | {r['pp_in']:.1f} | {r['pp_in'] / r['pp_out']:.2f} | "
                 f"{r['tg_out']:.1f} | {r['tg_in']:.1f} | {r['tg_in'] / r['tg_out']:.2f} |")
    L.append("")
    L.append("Per rep (outside / bench tok/s): " + "; ".join(
        f"{r['t']} thread(s): " + ", ".join(
            f"pp {x['pp_out']:.1f}/{x['pp_in']:.1f} tg {x['tg_out']:.1f}/{x['tg_in']:.1f}" for x in r["reps"])
        for r in o) + ".")
    L.append("")
    worst = max(max(abs(r["pp_in"] / r["pp_out"] - 1), abs(r["tg_in"] / r["tg_out"] - 1)) for r in o)
    L.append(f"Largest disagreement: {100 * worst:.1f}% ({'within' if worst <= 0.10 else 'NOT within'} the 10% the issue asks for).")
    L.append("")
    return L


DEPTH_MODELS = {
    "SmolLM2-135M-Instruct.Q4_1": "SmolLM2-135M Q4_1",
    "gemma-3-270m-q4_k_m": "Gemma-3-270M Q4_K_M",
}


def depth_section(raw):
    """Models at depth: llama-bench against synapse bench, per model, test and thread count."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(raw, "depth--*--t*.json"))):
        parts = os.path.basename(path)[: -len(".json")].split("--")
        engine = parts[1]
        # depth--ENGINE--MODEL--tT (older runs: depth--ENGINE--tT, SmolLM2).
        model = parts[2] if len(parts) == 4 else "SmolLM2-135M-Instruct.Q4_1"
        try:
            data = load_json(path)
        except (json.JSONDecodeError, OSError):
            continue
        for r in data:
            test = f"pp{r['n_prompt']}" if r["n_prompt"] > 0 else f"tg{r['n_gen']}"
            key = (model, f"{test} @ d{r.get('n_depth', 0)}", r["n_threads"])
            rows.setdefault(key, {})[engine] = (r["avg_ts"], r["stddev_ts"])
    if not rows:
        return []
    L = ["## At depth: attention with a full context", ""]
    L.append("SmolLM2-135M Q4_1 (the smallest model, where attention weighs most) and Gemma-3-270M Q4_K_M "
             "(heads of 256 values; five layers in six attend over a sliding window of 512) with the context "
             "already holding the tokens of an untimed prefill (`-d`, both engines).")
    L.append("")
    L.append("| model | test | threads | llama.cpp t/s | synapse t/s | synapse / llama.cpp |")
    L.append("|---|---|--:|--:|--:|--:|")
    for (model, test, t), v in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        if "llama" in v and "synapse" in v:
            (lm, ls), (sm, ss) = v["llama"], v["synapse"]
            name = DEPTH_MODELS.get(model, model)
            L.append(f"| {name} | {test} | {t} | {lm:.1f} ± {ls:.1f} | {sm:.1f} ± {ss:.1f} | **{sm / lm:.2f}x** |")
    L.append("")
    return L


def memory_section(raw):
    paths = {k: os.path.join(raw, f"rss-{k}.txt") for k in ("synapse", "llama", "file")}
    if not all(os.path.exists(p) for p in paths.values()):
        return []
    try:
        syn_kb = int(open(paths["synapse"]).read().split()[-1])
        lla_kb = int(open(paths["llama"]).read().split()[-1])
        file_b = int(open(paths["file"]).read().split()[-1])
    except (ValueError, IndexError):
        return []
    mib = lambda b: b / (1 << 20)
    L = ["## Peak memory while generating", ""]
    L.append("Maximum resident set (`/usr/bin/time -f %M`) of a 64-token prompt and 64 generated tokens on the "
             "Llama-3.2-1B-shaped Q4_K_M file with a 4096-token context, two threads. Its KV cache at that context "
             "is 16 layers x 2 (K, V) x 512 values x 2 bytes x 4096 positions = 128 MiB.")
    L.append("")
    L.append("| | MiB | over the file |")
    L.append("|---|--:|--:|")
    L.append(f"| the GGUF file | {mib(file_b):.0f} | |")
    L.append(f"| synapse | {mib(syn_kb * 1024):.0f} | +{mib(syn_kb * 1024 - file_b):.0f} |")
    L.append(f"| llama.cpp (llama-completion) | {mib(lla_kb * 1024):.0f} | +{mib(lla_kb * 1024 - file_b):.0f} |")
    L.append("")
    return L


def plot(res, bases, peak, svg):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = sorted({t for (_, _, t) in res})
    fig, axes = plt.subplots(len(threads), 1, figsize=(max(8, 0.75 * len(bases) + 2), 3.6 * len(threads)), squeeze=False)
    for ax, t in zip(axes[:, 0], threads):
        xs = range(len(bases))
        syn, lla = [], []
        for b in bases:
            s = res.get(("synapse", b, t))
            bpt = s["rows"][0]["weight_bytes_per_token"] if s and s["rows"] else 0
            syn.append(bpt * mean_sd(s["tg"])[0] / 1e9 if s and s["tg"] else 0)
            lo = res.get(("llama", b, t))
            lla.append(bpt * mean_sd(lo["tg"])[0] / 1e9 if lo and lo["tg"] else 0)
        w = 0.38
        ax.bar([x - w / 2 for x in xs], lla, w, label="llama.cpp", color="#9aa5b1")
        ax.bar([x + w / 2 for x in xs], syn, w, label="synapse", color="#d9480f")
        if t in peak:
            ax.axhline(peak[t], color="black", linestyle="--", linewidth=1)
            ax.text(len(bases) - 0.5, peak[t], f"measured read bandwidth, {t} thread(s): {peak[t]:.1f} GB/s", ha="right", va="bottom", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([short(b) for b in bases], fontsize=8)
        ax.set_ylabel("weight GB/s in decode")
        ax.set_title(f"Decode (tg): bytes of weights per token x tokens/s, {t} thread(s)", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
        top = max([peak.get(t, 0)] + syn + lla)
        ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    fig.tight_layout()
    fig.savefig(svg, format="svg")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out")
    ap.add_argument("--svg")
    ap.add_argument("--outside-only", action="store_true", help="print the outside-clock section and stop")
    ap.add_argument("--quick", type=int, default=0)
    ap.add_argument("--p", type=int, default=64)
    ap.add_argument("--n", type=int, default=32)
    a = ap.parse_args()
    if a.outside_only:
        print("\n".join(outside_section(a.raw)))
        return
    if not (a.out and a.svg):
        ap.error("--out and --svg are required")

    res = collect(a.raw)
    peak, probe_isa = peaks(a.raw)
    m = machine(a.raw)
    bases = []
    for (_, b, _) in res:
        if b not in bases:
            bases.append(b)
    plot(res, bases, peak, a.svg)

    commit = open(os.path.join(a.raw, "commit.txt")).read().strip()
    llama_v = open(os.path.join(a.raw, "llama_version.txt")).read().strip()
    isa = next((r["kernel_isa"] for k, v in res.items() if k[0] == "synapse" for r in v["rows"]), "?")
    L = []
    L.append("# Performance")
    L.append("")
    L.append("Generated by `bench/compare.sh` (one command; `--quick` for a short check of the script), "
             f"at synapse commit `{commit}`, against llama.cpp from `{llama_v}` (`scripts/build-llama.sh`). "
             "Do not edit above the marker line near the end: the next run rewrites it.")
    L.append("")
    if a.quick:
        L.append("> **Quick mode**: small files, one round, one repetition. These numbers check the script, "
                 "not the engines; run `bench/compare.sh` without `--quick` for real ones.")
        L.append("")
    L.append("## Machine")
    L.append("")
    L.append(f"- CPU: {m['model']}, {m['cpus']} CPUs ({m['tpc']} thread(s) per core){', ' + m['hyp'] + ' VM' if m['hyp'] else ''}; "
             f"L3 {m['l3']}; memory {m['mem']}.")
    L.append(f"- Vector features: {', '.join(m['simd'])}. synapse's kernel path: `{isa}`.")
    L.append(f"- Load when the run started: `{m['load']}` (the numbers are only as good as the machine was quiet).")
    L.append("- Read bandwidth (`synapse bench --membw`: each thread of synapse's pool streams its own share "
             f"of a 1 GiB buffer with {probe_isa} loads, best of 5, better of a probe before and after the runs):")
    L.append("")
    L.append("| threads | read GB/s |")
    L.append("|--:|--:|")
    for t in sorted(peak):
        L.append(f"| {t} | {peak[t]:.1f} |")
    L.append("")

    rounds = max((int(os.path.basename(p).rsplit("--r", 1)[1][:-5]) for p in glob.glob(os.path.join(a.raw, "*--*--t*--r*.json"))), default=0)
    reps = max((len(r.get("samples_ts") or [0]) for v in res.values() for r in v["rows"]), default=0)
    L.append(f"## Side by side: synapse / llama.cpp, pp{a.p} and tg{a.n}")
    L.append("")
    L.append(f"Same file, same thread count, engines alternating (llama-bench, then `synapse bench`, "
             f"{rounds} round(s) of `-r {reps}` each, after each engine's own warm-up run); each rate is the mean ± standard deviation over every repetition of every round. "
             "Ratios above 1 mean synapse is faster. Weight GB/s: bytes of weights one decode step reads "
             "(from `synapse bench`) times tokens/s; of peak: against the read bandwidth at that thread count.")
    L.append("")
    L.append(f"| model | threads | llama.cpp pp{a.p} | synapse pp{a.p} | pp ratio | llama.cpp tg{a.n} | synapse tg{a.n} | tg ratio | synapse GB/s | of peak | llama.cpp of peak |")
    L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for b in bases:
        for t in sorted({k[2] for k in res if k[1] == b}):
            s = res.get(("synapse", b, t))
            lo = res.get(("llama", b, t))
            if not s or not lo:
                continue
            spp, sppd = mean_sd(s["pp"])
            stg, stgd = mean_sd(s["tg"])
            lpp, lppd = mean_sd(lo["pp"])
            ltg, ltgd = mean_sd(lo["tg"])
            bpt = s["rows"][0]["weight_bytes_per_token"]
            sg = bpt * stg / 1e9
            lg = bpt * ltg / 1e9
            pk = peak.get(t, 0)
            L.append(f"| {label(b)} | {t} | {lpp:.1f} ± {lppd:.1f} | {spp:.1f} ± {sppd:.1f} | **{spp / lpp:.2f}x** | "
                     f"{ltg:.1f} ± {ltgd:.1f} | {stg:.1f} ± {stgd:.1f} | **{stg / ltg:.2f}x** | {sg:.1f} | "
                     f"{100 * sg / pk:.0f}% | {100 * lg / pk:.0f}% |" if pk else
                     f"| {label(b)} | {t} | {lpp:.1f} | {spp:.1f} | {spp / lpp:.2f}x | {ltg:.1f} | {stg:.1f} | {stg / ltg:.2f}x | {sg:.1f} | - | - |")
    L.append("")
    L.append("## Roofline: decode against the measured read bandwidth")
    L.append("")
    L.append("![achieved weight bandwidth in decode per file and thread count, against the measured peak](perf-roofline.svg)")
    L.append("")
    L.append("[perf-roofline.svg](perf-roofline.svg): for each file and thread count, the weight bandwidth each engine "
             "reaches while decoding (bytes of weights per token x tokens/s), under the dashed line of the machine's "
             "measured read bandwidth. Decode reads every weight once per token, so the dashed line is its ceiling. "
             "(KV-cache traffic is not counted: at these short contexts it is small.)")
    L.append("")

    L.extend(depth_section(a.raw))
    L.extend(memory_section(a.raw))
    L.append("## Kernels")
    L.append("")
    for name, title in [("gemv.md", "gemv-bench"), ("kbench.md", "kbench")]:
        p = os.path.join(a.raw, name)
        if os.path.exists(p):
            L.append(f"### {title}")
            L.append("")
            L.append(open(p).read().strip())
            L.append("")
    L.append("Matrices that fit in the last-level cache can exceed the read bandwidth when they are warm; "
             "both benchmarks time one-token products over copies of the matrix larger than the probe's "
             "buffer, so that the weights come from memory as in decode.")
    L.append("")

    L.append("## Does `synapse bench` measure what a user sees? An outside clock")
    L.append("")
    L.extend(outside_section(a.raw))

    L.append("## Commands")
    L.append("")
    L.append("Every command the run executed, in order (`LD_LIBRARY_PATH` pointed at llama.cpp's build directory):")
    L.append("")
    L.append("```sh")
    L.append(open(os.path.join(a.raw, "commands.txt")).read().strip())
    L.append("```")
    L.append("")

    kept = ""
    if os.path.exists(a.out):
        old = open(a.out).read()
        if MARKER in old:
            kept = old.split(MARKER, 1)[1]
    text = "\n".join(L) + "\n" + MARKER + "\n"
    if kept.strip():
        text += kept.lstrip("\n")
    with open(a.out, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")

if __name__ == "__main__":
    main()

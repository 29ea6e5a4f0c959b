"""Batch jobs' throughput, side by side in one run: what the batch layer and the Ray layer cost.

Four ways through the same N chat requests (greedy, max_tokens each), interleaved run by run, medians:

  generate  LLM.generate on every prompt in one call (prompts through the chat template first): the
            engine with nothing around it
  batch     edgeinfer.batch.run_batch on the same requests as a batch file, from the call to the last line written
            (same process, same loaded model as `generate`)
  cli       `edgeinfer batch MODEL IN OUT --threads T`: from the command's start (a new process) to the
            last line written, model load included
  ray       `edgeinfer batch MODEL IN OUT --ray local --workers W --threads T/W`: the same span, with the
            local Ray cluster's start, the actors' model loads and Ray Data in it (the cluster's
            shutdown comes after the last line; the time to the command's exit is reported too)

Targets (issue 21): batch >= 0.9x generate; ray within 15% of cli.

    python benchmarks/batch_throughput.py --model smollm2-135m-instruct --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TOPICS = ["the sea", "a robot", "winter", "coffee", "a library", "mountains", "a cat", "the moon", "trains",
          "gardens", "rain", "music", "bread", "bicycles", "a lighthouse", "owls"]
ASKS = ["Write two sentences about {}.", "Give three facts about {}.", "Describe {} to a child.",
        "Write a haiku about {}.", "What is interesting about {}?", "Tell a very short story about {}.",
        "List four words related to {}.", "Explain why people like {}."]


def requests(n: int, max_tokens: int) -> list[dict]:
    out = []
    for i in range(n):
        q = ASKS[i % len(ASKS)].format(TOPICS[(i // len(ASKS)) % len(TOPICS)])
        out.append({"custom_id": f"req-{i:04d}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": q}], "max_tokens": max_tokens,
                             "temperature": 0}})
    return out


def tokens_in(path: str) -> int:
    n = 0
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec["error"] is not None:
                raise SystemExit(f"a request failed: {line[:300]}")
            n += rec["response"]["body"]["usage"]["completion_tokens"]
    return n


def run_cli(args: list[str], out: str) -> tuple[float, float]:
    """Seconds from the command's start to the last line written (the output's mtime), and to its exit
    (which adds, for --ray local, the cluster's shutdown)."""
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "batch", *args, "--quiet"],
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"edgeinfer batch failed ({p.returncode}): {p.stderr[-2000:]}")
    return os.stat(out).st_mtime - t0, time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="Ray actors (threads each: threads / workers)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="generate,batch,cli,ray")
    ap.add_argument("--out", default="", help="Write the results as JSON here.")
    a = ap.parse_args()
    modes = a.modes.split(",")

    from edgeinfer import LLM, SamplingParams
    from edgeinfer.batch import run_batch
    from edgeinfer.system import system_info

    reqs = requests(a.requests, a.max_tokens)
    tmp = tempfile.mkdtemp(prefix="batch-bench-")
    inp = os.path.join(tmp, "in.jsonl")
    with open(inp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in reqs)
    llm = LLM(a.model, threads=a.threads, progress=False) if {"generate", "batch"} & set(modes) else None
    if llm is not None:  # the first pass compiles what is not cached yet, and warms the caches
        llm.generate([llm.render_chat(reqs[0]["body"]["messages"])], SamplingParams(max_tokens=4, temperature=0))
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(a.repeats):
        for m in modes:
            out = os.path.join(tmp, f"{m}-{r}.jsonl")
            if m == "generate":
                t0 = time.perf_counter()
                ids = [llm.render_chat(q["body"]["messages"]) for q in reqs]
                comps = llm.generate(ids, SamplingParams(max_tokens=a.max_tokens, temperature=0))
                secs = time.perf_counter() - t0
                toks = sum(len(c.token_ids) for c in comps)
            elif m == "batch":
                t0 = time.perf_counter()
                run_batch(llm, inp, out)
                secs = time.perf_counter() - t0
                toks = tokens_in(out)
            elif m == "cli":
                secs, exit_s = run_cli([a.model, inp, out, "--threads", str(a.threads)], out)
                toks = tokens_in(out)
            elif m == "ray":
                secs, exit_s = run_cli([a.model, inp, out, "--ray", "local", "--workers", str(a.workers),
                                        "--threads", str(max(1, a.threads // a.workers))], out)
                toks = tokens_in(out)
            else:
                raise SystemExit(f"unknown mode {m!r}")
            res = {"seconds": round(secs, 2), "tokens": toks, "tok_s": round(toks / secs, 2)}
            if m in ("cli", "ray"):
                res["exit_seconds"] = round(exit_s, 2)
            results[m].append(res)
            print(f"run {r + 1} {m:<8} {secs:7.1f} s  {toks} tokens  {toks / secs:6.1f} tok/s"
                  + (f"  (exit at {exit_s:.1f} s)" if m in ("cli", "ray") else ""), flush=True)
    med = {m: statistics.median(x["tok_s"] for x in v) for m, v in results.items() if v}
    info = system_info()
    summary = {"cpu": info["cpu"], "kernel_path": info["kernel_path"],
               "model": a.model, "requests": a.requests, "max_tokens": a.max_tokens, "threads": a.threads,
               "workers": a.workers, "repeats": a.repeats, "runs": results, "median_tok_s": med}
    print(f"{info['cpu']}, kernel path {info['kernel_path']}")
    print("median tok/s: " + ", ".join(f"{m} {v:.1f}" for m, v in med.items()))
    if "generate" in med and "batch" in med:
        print(f"batch / generate: {med['batch'] / med['generate']:.3f} (target >= 0.9)")
    if "cli" in med and "ray" in med:
        print(f"ray / cli: {med['ray'] / med['cli']:.3f} (target >= 0.85)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()

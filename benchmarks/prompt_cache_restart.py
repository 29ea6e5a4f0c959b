"""Time to first token after a restart, with and without `--prompt-cache`: a long prompt seen by an earlier
process, against a prompt of the same length never seen (cold), in one fresh process.

    python benchmarks/prompt_cache_restart.py [--model qwen2.5-coder-0.5b-instruct] [--tokens 1500] [--repeats 3]

Each repeat: a first process computes prompt A with the prompt cache on (its blocks are written to a fresh
folder) and exits; a second process, with the same folder, first answers a short unrelated prompt (the
kernels loaded, as on a server that has been up a moment), then times prompt A (seen before the restart) and
a cold prompt B of the same length, alternating, and checks that A's answer is the same text as the first
process gave. Medians; writes benchmarks/results/prompt-cache-restart-*.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

import results_io  # benchmarks/results_io.py, beside this script

CHILD = r"""
import json, sys, time
import numpy as np
from edgeinfer import LLM, SamplingParams, bench
model, folder, n, seed, role = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llm = LLM(model, prompt_cache=folder, progress=False, threads=2)
rng = np.random.default_rng(seed)
a, b = bench.random_prompt(llm, n, rng), bench.random_prompt(llm, n, rng)
params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

def ttft(ids):
    t0 = time.perf_counter()
    with llm.engine.run() as run:
        run.submit(ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        for _ in run:
            return time.perf_counter() - t0

if role == "first":
    out = llm.generate(a, params)[0].text
    llm.engine.disk.store.flush()
    print(json.dumps({"text": out}))
else:
    llm.generate([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=2))  # warm: kernels loaded
    seen, cold = ttft(a), ttft(b)
    out = llm.generate(a, params)[0].text
    print(json.dumps({"seen_s": seen, "cold_s": cold, "text": out, "stats": llm.engine.stats()}))
"""


def child(model: str, folder: str, n: int, seed: int, role: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, model, folder, str(n), str(seed), role], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    from edgeinfer import bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs = []
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            first = child(args.model, folder, args.tokens, r, "first")
            second = child(args.model, folder, args.tokens, r, "second")
        runs.append({"seen_s": second["seen_s"], "cold_s": second["cold_s"], "same_text": second["text"] == first["text"],
                     "hits": second["stats"]["prompt_cache_hits"]})
        print(f"  run {r + 1}: seen {second['seen_s']:.3f} s, cold {second['cold_s']:.3f} s, blocks from disk "
              f"{runs[-1]['hits']}, same text {runs[-1]['same_text']}", file=sys.stderr, flush=True)
    seen, cold = statistics.median(x["seen_s"] for x in runs), statistics.median(x["cold_s"] for x in runs)
    out = {"system": bench.system_info(), "model": args.model, "tokens": args.tokens, "runs": runs,
           "median_seen_s": seen, "median_cold_s": cold, "ratio": seen / cold,
           "same_text": all(x["same_text"] for x in runs)}
    print(f"{args.model}, a {args.tokens}-token prompt after a restart: TTFT {seen:.3f} s seen before (from the "
          f"prompt cache) against {cold:.3f} s cold: {seen / cold:.3f}x; same text: {out['same_text']}")
    results_io.save("prompt-cache-restart", out)


if __name__ == "__main__":
    main()

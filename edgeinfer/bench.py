"""Throughput and start-up measurements for `edgeinfer bench` and benchmarks/compare_llamacpp.py.

Each measurement is a function of a loaded LLM (or of a model path, for the cold-start one) and
returns one number; callers take medians over repeats. Prompts are random normal tokens, drawn
afresh for every run, so the prefix cache never turns a prefill measurement into a cache hit.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from .sampling import SamplingParams
from .system import system_info  # noqa: F401  (benchmarks/compare_llamacpp.py reads it from here)

KEYS = ("pp128_tok_s", "pp512_tok_s", "tg128_tok_s", "batched8_tok_s", "ttft_cold_s", "peak_rss_mb",
        "prefix500_ttft_ratio")


def random_prompt(llm, n: int, rng: np.random.Generator) -> list[int]:
    tok = llm.tokenizer
    normal = np.nonzero(tok.token_types == 1)[0]
    return [int(t) for t in rng.choice(normal, n)]


def prompt_tok_s(llm, n: int, rng) -> float:
    """Prompt processing: n tokens prefilled (one output token), tokens per second."""
    ids = random_prompt(llm, n, rng)
    t0 = time.perf_counter()
    llm.generate(ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    return n / (time.perf_counter() - t0)


def decode_tok_s(llm, n_streams: int, n_tokens: int, rng, prompt_len: int = 16) -> float:
    """Aggregate decode rate: n_streams sequences of prompt_len tokens each generate n_tokens; the
    time from the step where every stream has its first token to the end."""
    eng = llm.engine
    params = SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True)
    rids = {eng.add_request(random_prompt(llm, prompt_len, rng), params) for _ in range(n_streams)}
    started, done, counted, t_start = set(), set(), 0, None
    while len(done) < len(rids):
        outs = eng.step()
        for o in outs:
            if o.request_id not in rids:
                continue
            if t_start is not None:
                counted += len(o.new_token_ids)
            started.add(o.request_id)
            if o.finished:
                done.add(o.request_id)
        if t_start is None and len(started) == len(rids):
            t_start = time.perf_counter()
    return counted / (time.perf_counter() - t_start)


def prefix_ttft_ratio(llm, rng, prefix_len: int = 496) -> float:
    """Time to first token of a request sharing a prefix_len-token prefix with the one before it,
    over that first request's: what the prefix cache saves."""
    prefix = random_prompt(llm, prefix_len, rng)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    for _ in range(2):
        ids = prefix + random_prompt(llm, 8, rng)
        t0 = time.perf_counter()
        llm.generate(ids, params)
        times.append(time.perf_counter() - t0)
    return times[1] / times[0]


_COLD_CHILD = r"""
import resource, sys, time
from edgeinfer import LLM, SamplingParams
llm = LLM(sys.argv[1], threads=int(sys.argv[2]), progress=False)
n = 0
for chunk in llm.stream("Once upon a time", SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)):
    if n == 0:
        print("FIRST", flush=True)
    n += len(chunk.token_ids)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec
print("RSS_KB", open("/proc/self/status").read().split("VmHWM:")[1].split()[0], flush=True)
"""


def cold_start(model_path: str, threads: int) -> tuple[float, float]:
    """A fresh process (warm kernel cache): seconds from its start to the first token, and its peak
    RSS in MB over loading the model and generating 64 tokens."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _COLD_CHILD, str(model_path), str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ttft, rss = None, None
    for line in proc.stdout:
        if line.startswith("FIRST") and ttft is None:
            ttft = time.perf_counter() - t0
        elif line.startswith("RSS_KB"):
            rss = int(line.split()[1]) / 1024
    err = proc.stderr.read()
    if proc.wait() != 0 or ttft is None or rss is None:
        raise RuntimeError(f"the cold-start process failed: {err.strip().splitlines()[-1] if err.strip() else '?'}")
    return ttft, rss


def run(llm, repeats: int = 3, threads: int = 0, progress=None) -> dict:
    """All measurements, each the median of `repeats` runs. progress(name) is called before each."""
    from .config import default_threads

    threads = threads or default_threads()
    rng = np.random.default_rng(0)
    say = progress or (lambda name: None)
    say("warm-up")
    prompt_tok_s(llm, 16, rng)
    results: dict[str, list[float]] = {k: [] for k in KEYS}
    for r in range(repeats):
        say(f"run {r + 1}/{repeats}: prompt 128")
        results["pp128_tok_s"].append(prompt_tok_s(llm, 128, rng))
        say(f"run {r + 1}/{repeats}: prompt 512")
        results["pp512_tok_s"].append(prompt_tok_s(llm, 512, rng))
        say(f"run {r + 1}/{repeats}: decode 128")
        results["tg128_tok_s"].append(decode_tok_s(llm, 1, 128, rng))
        say(f"run {r + 1}/{repeats}: 8 streams")
        results["batched8_tok_s"].append(decode_tok_s(llm, 8, 64, rng))
        say(f"run {r + 1}/{repeats}: shared 496-token prefix")
        results["prefix500_ttft_ratio"].append(prefix_ttft_ratio(llm, rng))
        say(f"run {r + 1}/{repeats}: cold start")
        ttft, rss = cold_start(str(llm.path), threads)
        results["ttft_cold_s"].append(ttft)
        results["peak_rss_mb"].append(rss)
    out = {k: round(statistics.median(v), 3) for k, v in results.items()}
    out["runs"] = {k: [round(x, 3) for x in v] for k, v in results.items()}
    out["threads"] = threads
    out["system"] = system_info()
    out["model"] = os.path.basename(str(llm.path))
    out["file_mb"] = round(os.path.getsize(llm.path) / 1e6, 1)
    return out


def format_table(res: dict) -> str:
    rows = [("prompt processing, 128 tokens", "pp128_tok_s", "tok/s"),
            ("prompt processing, 512 tokens", "pp512_tok_s", "tok/s"),
            ("decode, 128 tokens, 1 stream", "tg128_tok_s", "tok/s"),
            ("decode, 8 streams (aggregate)", "batched8_tok_s", "tok/s"),
            ("cold start to first token", "ttft_cold_s", "s"),
            ("peak RSS, generate 64 tokens", "peak_rss_mb", "MB"),
            ("TTFT with a cached 496-token prefix", "prefix500_ttft_ratio", "x the uncached")]
    lines = [f"{res['model']} ({res['file_mb']} MB), {res['threads']} threads, median of {len(res['runs']['pp128_tok_s'])}; "
             f"{res['system']['cpu']}, kernel path {res['system']['kernel_path']}"]
    lines += [f"  {label:<32} {res[key]:>9.2f} {unit}" for label, key, unit in rows]
    return "\n".join(lines)


def to_json(res: dict) -> str:
    return json.dumps(res)

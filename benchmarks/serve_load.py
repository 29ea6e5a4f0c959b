"""Load test for `edgeinfer serve`: N concurrent streaming clients on loopback.

    python benchmarks/serve_load.py [--model smollm2-135m-instruct] [--clients 16] [--requests 32] [--max-tokens 64]

Starts the server on a free loopback port, sends --requests chat requests from --clients threads at
once, and reports time to first token and per-token latency (P50/P95/P99), errors, and aggregate
throughput, next to LLM.generate on the same prompts in-process (one continuous batch). Writes JSON
to benchmarks/results/. Requests stay on 127.0.0.1 and the run is bounded by --requests.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

RESULTS = Path(__file__).resolve().parent / "results"
TOPICS = ["the sea", "a red fox", "rain in spring", "an old clock", "mountains", "a quiet library", "coffee",
          "the moon", "a lost key", "city lights", "a garden", "winter", "a train at night", "bees", "paper boats",
          "a lighthouse"]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def one_request(base, model, i, max_tokens, out):
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]}."}]}
    t0 = time.perf_counter()
    stamps = []
    try:
        with httpx.Client(timeout=300) as h, h.stream("POST", base + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out.append({"error": f"HTTP {r.status_code}"})
                return
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line and '"content": ""' not in line:
                    stamps.append(time.perf_counter())
    except httpx.HTTPError as e:
        out.append({"error": str(e)})
        return
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    out.append({"ttft": stamps[0] - t0 if stamps else None, "gaps": gaps, "tokens": len(stamps),
                "seconds": time.perf_counter() - t0})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer.cli.main", "serve", args.model, "--port", str(port),
                             "--threads", str(args.threads)],  # same engine settings as LLM() below
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        results: list[dict] = []
        sem = threading.Semaphore(args.clients)

        def worker(i):
            with sem:
                one_request(base, model, i, args.max_tokens, results)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    ok = [r for r in results if "error" not in r]
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    server_tok_s = tokens / wall

    from edgeinfer import LLM, SamplingParams

    llm = LLM(args.model, threads=args.threads, progress=False)
    prompts = [llm.render_chat([{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]}."}])
               for i in range(args.requests)]
    t1 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True))
    direct_tok_s = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t1)

    report = {
        "model": args.model, "clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens,
        "errors": len(results) - len(ok),
        "ttft_s": {p: round(pct(ttfts, p), 4) for p in (50, 95, 99)},
        "per_token_s": {p: round(pct(gaps, p), 4) for p in (50, 95, 99)},
        "server_tok_s": round(server_tok_s, 2), "llm_generate_tok_s": round(direct_tok_s, 2),
        "server_over_generate": round(server_tok_s / direct_tok_s, 3),
        "mean_ttft_s": round(statistics.mean(ttfts), 4) if ttfts else None,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"serve-load-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()

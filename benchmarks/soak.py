"""Soak test: run `edgeinfer serve` on 127.0.0.1 under a mixed load for a while and watch it for leaks.

    python benchmarks/soak.py --model smollm2-135m-instruct --minutes 30 --out benchmarks/results/soak

The load (all to the loopback address, bounded in time): plain and streamed requests, chat and
completions, short and long; a fraction cancelled mid-stream by disconnecting; a fraction of malformed
bodies; and every `--burst-every` seconds a burst above `--max-queue`. Every `--idle-every` seconds the
load pauses until the server is idle, and the KV blocks in use are read then.

Once a second it samples the server process's RSS, open file descriptors and threads, and the KV blocks
in use (from /metrics). It writes soak.json (every sample, request and check) and soak.png, prints the
pass criteria and exits 1 if one fails:
- RSS growth after warm-up under 5% (median of the last window against the first);
- KV blocks back to zero at every idle point, and every idle point reached (the requests in flight
  finish within --drain-timeout);
- file descriptors and threads flat (idle-point counts after warm-up grow by at most a small slack);
- no 5xx other than the 503s of a full queue;
- the P99 latency of the last window within 20% of the first window after warm-up (windows of 5
  minutes, or a quarter of the run after warm-up if that is shorter).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

PROMPTS = ["Write a haiku about the sea.", "What is the capital of France? Answer in one word.",
           "List three prime numbers.", "Explain recursion to a child in two sentences.",
           "Translate 'good morning' into Spanish.", "Give me a name for a grey cat."]
MALFORMED = [  # (body, content type): each must get a 4xx
    (b"{bad json", "application/json"),
    (b"[1, 2]", "application/json"),
    (b'{"prompt": "x", "temperature": "hot"}', "application/json"),
    (b'{"prompt": "x", "temperature": NaN}', "application/json"),
    (b'{"prompt": "x", "prompt": "y"}', "application/json"),
    (b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}", "application/json"),
    (b'{"prompt": "\xff\xfe"}', "application/json"),
    (b"prompt=x", "application/x-www-form-urlencoded"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', "application/json"),
    (json.dumps({"prompt": "x", "max_tokens": 10**9}).encode(), "application/json"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_sample(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) * 1024
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
    return {"rss": rss, "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class Soak:
    def __init__(self, args, base: str, pid: int):
        self.args, self.base, self.pid = args, base, pid
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.end = self.t0 + args.minutes * 60
        self.requests: list[dict] = []
        self.samples: list[dict] = []
        self.idle_checks: list[dict] = []
        self.go = asyncio.Event()
        self.go.set()
        self.inflight = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def one(self, client: httpx.AsyncClient, kind: str | None = None) -> None:
        a, rng = self.args, self.rng
        kind = kind or rng.choices(["plain", "stream", "cancel", "malformed"],
                                   [1 - a.stream_frac - a.cancel_frac - a.malformed_frac, a.stream_frac,
                                    a.cancel_frac, a.malformed_frac])[0]
        chat = rng.random() < 0.5
        long = rng.random() < a.long_frac
        max_tokens = a.long_tokens if long else a.short_tokens
        prompt = rng.choice(PROMPTS)
        body = ({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
        body.update(max_tokens=max_tokens, temperature=rng.choice([0, 0.7]), seed=rng.randrange(1 << 30))
        url = self.base + ("/v1/chat/completions" if chat else "/v1/completions")
        rec = {"t": self.now(), "kind": kind, "chat": chat, "long": long, "status": None, "latency": None}
        t0 = time.monotonic()
        self.inflight += 1
        try:
            if kind == "malformed":
                raw, ctype = rng.choice(MALFORMED)
                r = await client.post(url, content=raw, headers={"Content-Type": ctype})
                rec["status"] = r.status_code
            elif kind in ("stream", "cancel"):
                body["stream"] = True
                async with client.stream("POST", url, json=body) as r:
                    rec["status"] = r.status_code
                    chunks = 0
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            chunks += 1
                            if kind == "cancel" and chunks >= 2:
                                break  # leaving the block closes the connection mid-stream
                        if r.status_code == 200 and '"error"' in line:
                            rec["stream_error"] = line[:200]
            else:
                r = await client.post(url, json=body)
                rec["status"] = r.status_code
            rec["latency"] = time.monotonic() - t0
        except httpx.HTTPError as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        finally:
            self.inflight -= 1
        self.requests.append(rec)

    async def worker(self, client: httpx.AsyncClient) -> None:
        while time.monotonic() < self.end:
            await self.go.wait()
            await self.one(client)

    async def bursts(self, client: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(self.args.burst_every)
            if time.monotonic() >= self.end:
                return
            await self.go.wait()
            await asyncio.gather(*(self.one(client, "plain") for _ in range(self.args.burst)))

    async def idle_points(self, client: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(self.args.idle_every)
            if time.monotonic() >= self.end:
                return
            self.go.clear()  # pause the load until the server has nothing to do
            t0 = time.monotonic()
            while self.inflight and time.monotonic() - t0 < self.args.drain_timeout:
                await asyncio.sleep(0.05)
            drained = not self.inflight  # else a request is still out: not an idle point
            await asyncio.sleep(0.3)
            text = (await client.get(self.base + "/metrics")).text
            self.idle_checks.append({"t": self.now(), "drained": drained,
                                     "kv_blocks_used": metric(text, "edgeinfer_kv_blocks_used"),
                                     "running": metric(text, "edgeinfer_running_sequences"),
                                     "waiting": metric(text, "edgeinfer_waiting_sequences"),
                                     **proc_sample(self.pid)})
            self.go.set()

    async def sampler(self, client: httpx.AsyncClient) -> None:
        while time.monotonic() < self.end:
            try:
                text = (await client.get(self.base + "/metrics")).text
                self.samples.append({"t": self.now(), "kv_blocks_used": metric(text, "edgeinfer_kv_blocks_used"),
                                     **proc_sample(self.pid)})
            except (httpx.HTTPError, OSError):
                pass
            await asyncio.sleep(1.0)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.args.concurrency + self.args.burst + 4)
        async with httpx.AsyncClient(timeout=30) as probe:
            async with httpx.AsyncClient(timeout=self.args.timeout, limits=limits) as client:
                tasks = [asyncio.create_task(self.worker(client)) for _ in range(self.args.concurrency)]
                side = [asyncio.create_task(c) for c in (self.bursts(client), self.idle_points(probe),
                                                         self.sampler(probe))]
                await asyncio.gather(*tasks)
                for t in side:
                    t.cancel()
                await asyncio.gather(*side, return_exceptions=True)
            await asyncio.sleep(1.0)  # the load's connections are closed; the last aborts land
            text = (await probe.get(self.base + "/metrics")).text
            self.idle_checks.append({"t": self.now(), "drained": True,
                                     "kv_blocks_used": metric(text, "edgeinfer_kv_blocks_used"),
                                     "running": metric(text, "edgeinfer_running_sequences"),
                                     "waiting": metric(text, "edgeinfer_waiting_sequences"), **proc_sample(self.pid)})


def p99(xs: list[float]) -> float | None:
    if len(xs) < 5:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def judge(s: Soak, warmup: float, duration: float) -> dict:
    window = min(300.0, (duration - warmup) / 4)
    first = (warmup, warmup + window)
    last = (duration - window, duration)

    def within(t, w):
        return w[0] <= t < w[1]

    rss_first = [x["rss"] for x in s.samples if within(x["t"], first)]
    rss_last = [x["rss"] for x in s.samples if within(x["t"], last)]
    rss_growth = statistics.median(rss_last) / statistics.median(rss_first) - 1 if rss_first and rss_last else None
    idle = [c for c in s.idle_checks if c["t"] >= warmup and c["drained"]]
    leaked = [c for c in s.idle_checks if c["drained"] and c["kv_blocks_used"] != 0]
    undrained = [c for c in s.idle_checks if not c["drained"]]
    def growth(key):  # the idle points' later half against their earlier half (medians: a connection the
        if len(idle) < 2:  # client's pool keeps open at one point is not a leak)
            return None
        half = len(idle) // 2
        return statistics.median(c[key] for c in idle[half:]) - statistics.median(c[key] for c in idle[:half])

    fd_growth, thread_growth = growth("fds"), growth("threads")
    ok = [r for r in s.requests if r["status"] == 200 and r["kind"] == "plain" and r["latency"] is not None]
    lat_first = p99([r["latency"] for r in ok if within(r["t"], first)])
    lat_last = p99([r["latency"] for r in ok if within(r["t"], last)])
    statuses: dict[str, int] = {}
    for r in s.requests:
        key = str(r["status"]) if r["status"] is not None else "no response"
        statuses[key] = statuses.get(key, 0) + 1
    unexpected_5xx = sum(v for k, v in statuses.items() if k.startswith("5") and k != "503")
    malformed_accepted = sum(1 for r in s.requests if r["kind"] == "malformed" and r["status"] is not None
                             and not 400 <= r["status"] < 500)
    no_response = statuses.get("no response", 0)
    stream_errors = sum(1 for r in s.requests if "stream_error" in r)
    checks = {
        "rss_growth_under_5pct": rss_growth is not None and rss_growth < 0.05,
        "kv_blocks_zero_when_idle": bool(s.idle_checks) and not leaked,
        "drained_at_every_idle_point": not undrained,
        "fds_flat": fd_growth is not None and fd_growth <= 4,
        "threads_flat": thread_growth is not None and thread_growth <= 2,
        "no_unexpected_5xx": unexpected_5xx == 0 and stream_errors == 0,
        "malformed_all_4xx": malformed_accepted == 0,
        "every_request_answered": no_response == 0,
        "p99_latency_within_20pct": lat_first is not None and lat_last is not None and lat_last <= 1.2 * lat_first,
    }
    return {"passed": all(checks.values()), "checks": checks, "figures": {
        "requests": len(s.requests), "statuses": statuses, "by_kind": {k: sum(1 for r in s.requests if r["kind"] == k)
                                                                      for k in ("plain", "stream", "cancel", "malformed")},
        "rss_growth": rss_growth, "rss_first_window_mb": statistics.median(rss_first) / 2**20 if rss_first else None,
        "rss_last_window_mb": statistics.median(rss_last) / 2**20 if rss_last else None,
        "idle_points": len(s.idle_checks), "idle_points_with_blocks_in_use": len(leaked),
        "idle_points_not_drained": len(undrained),
        "fd_growth": fd_growth, "thread_growth": thread_growth,
        "fds_at_idle": [c["fds"] for c in idle], "threads_at_idle": [c["threads"] for c in idle],
        "p99_first_window_s": lat_first, "p99_last_window_s": lat_last, "window_s": window, "warmup_s": warmup,
        "unexpected_5xx": unexpected_5xx, "stream_errors": stream_errors, "malformed_accepted": malformed_accepted,
        "no_response": no_response}}


def plot(s: Soak, verdict: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [x["t"] / 60 for x in s.samples]
    fig, axes = plt.subplots(5, 1, figsize=(9, 12), sharex=True)
    series = [("RSS (MiB)", [x["rss"] / 2**20 for x in s.samples]), ("KV blocks in use", [x["kv_blocks_used"]
                                                                                         for x in s.samples]),
              ("open file descriptors", [x["fds"] for x in s.samples]), ("threads", [x["threads"] for x in s.samples])]
    for ax, (label, ys) in zip(axes, series):
        ax.plot(t, ys, lw=0.8)
        ax.set_ylabel(label)
        ax.axvline(verdict["figures"]["warmup_s"] / 60, color="grey", ls=":", lw=0.8)
    axes[1].scatter([c["t"] / 60 for c in s.idle_checks], [c["kv_blocks_used"] for c in s.idle_checks], s=8,
                    color="red", label="idle points", zorder=3)
    axes[1].legend(loc="upper right", fontsize=8)
    ok = [r for r in s.requests if r["status"] == 200 and r["latency"] is not None and r["kind"] == "plain"]
    axes[4].scatter([r["t"] / 60 for r in ok], [r["latency"] for r in ok], s=2, alpha=0.4)
    axes[4].set_ylabel("latency, plain (s)")
    axes[4].set_xlabel("minutes")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="catalog name or .gguf path")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=None, help="minutes of warm-up (default: 2, or 1/6 of a short run)")
    ap.add_argument("--concurrency", type=int, default=6, help="clients sending requests back to back")
    ap.add_argument("--max-queue", type=int, default=4)
    ap.add_argument("--burst", type=int, default=24, help="requests sent at once in a burst")
    ap.add_argument("--burst-every", type=float, default=45.0, help="seconds between bursts")
    ap.add_argument("--idle-every", type=float, default=60.0, help="seconds between idle points")
    ap.add_argument("--stream-frac", type=float, default=0.3)
    ap.add_argument("--cancel-frac", type=float, default=0.1)
    ap.add_argument("--malformed-frac", type=float, default=0.1)
    ap.add_argument("--long-frac", type=float, default=0.2)
    ap.add_argument("--short-tokens", type=int, default=16)
    ap.add_argument("--long-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120.0, help="client timeout per request (s)")
    ap.add_argument("--drain-timeout", type=float, default=120.0,
                    help="seconds an idle point waits for the requests in flight to finish")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/soak", help="folder for soak.json and soak.png")
    ap.add_argument("--server-arg", action="append", default=[], help="extra argument for `edgeinfer serve`")
    args = ap.parse_args(argv)
    duration = args.minutes * 60
    warmup = (args.warmup if args.warmup is not None else min(2.0, args.minutes / 6)) * 60

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "edgeinfer.cli.main", "serve", args.model, "--host", "127.0.0.1", "--port", str(port),
           "--max-queue", str(args.max_queue), "--threads", str(args.threads), *args.server_arg]
    log_path = Path(args.out) / "server.log"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.time()
        while True:
            if server.poll() is not None:
                print(f"the server exited: see {log_path}", file=sys.stderr)
                return 1
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() - t0 > 300:
                print("the server did not become ready in 5 minutes", file=sys.stderr)
                return 1
            time.sleep(0.2)
        soak = Soak(args, base, server.pid)
        print(f"soak: {args.model}, {args.minutes:g} min (warm-up {warmup / 60:.1f}), server pid {server.pid}",
              flush=True)
        asyncio.run(soak.run())
        crashed = server.poll() is not None
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    verdict = judge(soak, warmup, duration)
    verdict["checks"]["server_alive_and_clean_exit"] = not crashed and server.returncode == 0
    log_text = log_path.read_text()
    verdict["checks"]["no_traceback_in_log"] = "Traceback" not in log_text
    verdict["passed"] = all(verdict["checks"].values())
    from edgeinfer.system import system_info

    record = {"model": args.model, "minutes": args.minutes, "args": vars(args), "system": system_info(),
              "verdict": verdict, "samples": soak.samples, "idle_checks": soak.idle_checks, "requests": soak.requests}
    out = Path(args.out)
    (out / "soak.json").write_text(json.dumps(record, indent=1))
    plot(soak, verdict, out / "soak.png", f"edgeinfer soak: {args.model}, {args.minutes:g} min, "
                                          f"{len(soak.requests)} requests")
    f = verdict["figures"]
    print(f"requests {f['requests']} {f['statuses']} by kind {f['by_kind']}")
    print(f"RSS {f['rss_first_window_mb']:.1f} -> {f['rss_last_window_mb']:.1f} MiB ({100 * f['rss_growth']:+.2f}%); "
          f"idle points {f['idle_points']}, with blocks in use {f['idle_points_with_blocks_in_use']}; "
          f"fd growth {f['fd_growth']}, thread growth {f['thread_growth']}")
    if f["p99_first_window_s"] is not None and f["p99_last_window_s"] is not None:
        print(f"P99 latency (plain): first window {f['p99_first_window_s']:.3f} s, last {f['p99_last_window_s']:.3f} s")
    for name, passed in verdict["checks"].items():
        print(f"  {'PASS' if passed else 'FAIL'}  {name}")
    print(f"{'PASSED' if verdict['passed'] else 'FAILED'}; record: {out / 'soak.json'}, chart: {out / 'soak.png'}")
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Our server against llama.cpp's own server, under the same load, one after the other, on one machine.

    python benchmarks/serve_compare.py [--models smollm2-135m-instruct,gemma3-270m] [--threads 2]
        [--parallel 8] [--rates 0.5,1,2,3,4,inf] [--num-prompts 40] [--input-len 128] [--output-len 64]
        [--peers edgeinfer,llama-server[,llama-cpp-python]] [--llama-python PYTHON]

For each model, each server is started on a free loopback port with the same GGUF, the same thread
count, the same number of parallel sequences and the same total context (KV for --parallel times the
longest request), driven by `edgeinfer bench-serve`'s load generator through a sweep of request rates
(the fixed workload) and one run of the shared-prefix workload, and stopped before the next starts.

The peers:
- `edgeinfer`: `edgeinfer serve MODEL --threads T --max-seqs P --max-context P*longest`, its prefix cache on,
  on the best kernel path of this CPU; `edgeinfer-avx2`: the same on the avx2 path (EDGEINFER_KERNELS=avx2),
  the instruction set llama-server's prebuilt wheel uses.
- `llama-server`: llama.cpp's own HTTP server, embedded in the `xllamacpp` wheel (prebuilt: its ISA is
  printed from the library's system info), with `--parallel P --cont-batching -c P*longest`, prompt
  caching on as by default, `--threads T --threads-batch T`, metrics on.
- `llama-cpp-python`: llama-cpp-python's simpler server (one request at a time), from the build the
  project's install script makes for this CPU; optional.
The llama.cpp peers run under --llama-python (a Python with xllamacpp / llama-cpp-python[server]).

Writes benchmarks/results/serve-compare-<time>.json, a Markdown table and one chart per model.
All traffic stays on 127.0.0.1 and every run is bounded by --num-prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from edgeinfer import registry
from edgeinfer.bench import serve as bs

RESULTS = Path(__file__).resolve().parent / "results"

# llama.cpp's server inside the xllamacpp wheel: its CommonParams are llama-server's flags
XLLAMACPP_LAUNCH = r"""
import json, sys, time
import xllamacpp as x
a = json.loads(sys.argv[1])
p = x.CommonParams()
p.model.path = a["model"]
p.n_parallel = a["parallel"]          # --parallel
p.cont_batching = True                # --cont-batching
p.n_ctx = a["n_ctx"]                  # -c
p.cpuparams.n_threads = a["threads"]  # --threads
p.cpuparams_batch.n_threads = a["threads"]  # --threads-batch
p.port = a["port"]                    # --port (host 127.0.0.1)
p.endpoint_metrics = True             # --metrics
print("FLAGS " + json.dumps({"parallel": p.n_parallel, "cont_batching": p.cont_batching, "ctx": p.n_ctx,
      "threads": p.cpuparams.n_threads, "threads_batch": p.cpuparams_batch.n_threads, "cache_prompt": p.cache_prompt,
      "n_batch": p.n_batch, "n_ubatch": p.n_ubatch, "kv_unified": p.kv_unified, "flash_attn": str(p.flash_attn_type),
      "cache_type_k": str(p.cache_type_k), "cache_type_v": str(p.cache_type_v)}), flush=True)
print("SYSTEM " + x.get_system_info(), flush=True)
server = x.Server(p)
print("LISTENING " + server.listening_address, flush=True)
while True:
    time.sleep(3600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    def __init__(self, name: str, cmd: list[str], port: int, flags: dict, tokenizer: str | None = None, env=None):
        self.name, self.cmd, self.port, self.flags, self.tokenizer = name, cmd, port, flags, tokenizer
        self.base = f"http://127.0.0.1:{port}"
        self.log = RESULTS / f".{name}-{port}.log"
        self.env = env
        self.proc = None

    def start(self, timeout: float = 300.0) -> "Peer":
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start; see {self.log}:\n{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200 or (
                        self.name == "llama-cpp-python" and httpx.get(self.base + "/v1/models", timeout=2).status_code == 200):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            self.stop()
            raise RuntimeError(f"{self.name} did not become ready in {timeout:.0f} s; see {self.log}")
        self.flags["ready_s"] = round(time.time() - t0, 2)
        text = self.log.read_text()
        for line in text.splitlines():
            if line.startswith("FLAGS "):
                self.flags["effective"] = json.loads(line[6:])
            if line.startswith("SYSTEM "):
                self.flags["isa"] = line[7:].strip()
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "logf", None):
            self.logf.close()


def our_isa(threads: int) -> str:
    from edgeinfer.kernels.cpu import simd

    return f"edgeinfer kernel path {simd.choose_path()} ({threads} threads)"


def make_peer(kind: str, model_path: Path, model_name: str, args, n_ctx: int) -> Peer:
    port = free_port()
    if kind in ("edgeinfer", "edgeinfer-avx2"):
        cmd = [sys.executable, "-m", "edgeinfer.cli.main", "serve", str(model_path), "--port", str(port),
               "--threads", str(args.threads), "--max-seqs", str(args.parallel), "--max-context", str(n_ctx),
               "--max-queue", "100000", "--request-timeout", str(args.timeout)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        isa = our_isa(args.threads)
        if kind == "edgeinfer-avx2":  # the kernel path llama-server's prebuilt wheel runs: AVX2 without VNNI
            env["EDGEINFER_KERNELS"] = "avx2"
            isa = f"edgeinfer kernel path avx2, forced by EDGEINFER_KERNELS ({args.threads} threads)"
        return Peer(kind, cmd, port, {"command": " ".join(cmd[2:]), "isa": isa}, env=env)
    if kind == "llama-server":
        a = {"model": str(model_path), "parallel": args.parallel, "n_ctx": n_ctx, "threads": args.threads, "port": port}
        cmd = [args.llama_python, "-c", XLLAMACPP_LAUNCH, json.dumps(a)]
        flags = {"command": f"llama-server -m {model_path.name} --parallel {args.parallel} --cont-batching -c {n_ctx} "
                            f"--threads {args.threads} --threads-batch {args.threads} --metrics --port {port} "
                            "(xllamacpp's embedded server)"}
        return Peer(kind, cmd, port, flags)
    if kind == "llama-cpp-python":
        cmd = [args.llama_python, "-m", "llama_cpp.server", "--model", str(model_path), "--n_threads", str(args.threads),
               "--n_threads_batch", str(args.threads), "--n_ctx", str(n_ctx), "--port", str(port), "--host", "127.0.0.1"]
        return Peer(kind, cmd, port, {"command": " ".join(cmd[1:])}, tokenizer=str(model_path))
    raise SystemExit(f"unknown peer {kind!r}")


async def drive(peer: Peer, args, workload: str, rates: list[float], num: int, seed: int) -> list[dict]:
    cfg = bs.BenchConfig(base_url=peer.base, workload=workload, num_prompts=num, request_rate=rates[0],
                         input_len=args.input_len, output_len=args.output_len, prefix_len=args.prefix_len,
                         seed=seed, warmup=2, timeout=args.timeout, slo_ttft_ms=args.slo_ttft_ms,
                         slo_tpot_ms=args.slo_tpot_ms, tokenizer=peer.tokenizer, progress=not args.quiet)
    runs, info = await bs.bench_serve(cfg, rates)
    peer.flags.setdefault("tokenizer", info.get("tokenizer"))
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma3-270m")
    ap.add_argument("--peers", default="edgeinfer,llama-server")
    ap.add_argument("--llama-python", default=sys.executable, help="Python with xllamacpp (and llama-cpp-python[server]).")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--rates", default="0.5,1,2,3,4,inf")
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--prefix-questions", type=int, default=16, help="Requests of the shared-prefix run.")
    ap.add_argument("--prefix-rate", type=float, default=1.0, help="Request rate of the shared-prefix run.")
    ap.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--skip-sweep", action="store_true", help="Only the shared-prefix run.")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the servers
    rates = bs.parse_rates(args.rates)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    longest = max(args.input_len + args.output_len, args.prefix_len + args.input_len + args.output_len + 16)
    n_ctx = args.parallel * longest

    record = {"tool": "benchmarks/serve_compare.py", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "args": vars(args), "n_ctx_total": n_ctx, "longest_request_tokens": longest, "models": {}}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    md = [f"# serve_compare {record['time']}", "",
          f"{args.threads} threads, {args.parallel} parallel sequences, total context {n_ctx} tokens on both; "
          f"fixed workload in {args.input_len} / out {args.output_len} tokens, {args.num_prompts} requests per rate; "
          f"knee: highest rate with P99 TTFT < {args.slo_ttft_ms:g} ms and P99 TPOT < {args.slo_tpot_ms:g} ms.", ""]
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        path = registry.resolve(model, progress=True)
        per = record["models"][model] = {}
        curves = {}
        for kind in peers:
            peer = make_peer(kind, path, model, args, n_ctx)
            print(f"== {model} on {kind}: {peer.flags['command']}", file=sys.stderr, flush=True)
            peer.start()
            try:
                sweep = [] if args.skip_sweep else asyncio.run(drive(peer, args, "fixed", rates, args.num_prompts,
                                                                     args.seed))
                # other prompts than the sweep's (which ran on this server just before)
                prefix = asyncio.run(drive(peer, args, "shared-prefix", [args.prefix_rate], args.prefix_questions,
                                           args.seed + 99_991))
            finally:
                peer.stop()
            knee = bs.goodput_knee(sweep, args.slo_ttft_ms, args.slo_tpot_ms)
            knee = "inf" if knee == math.inf else knee  # as the runs write it: JSON has no infinity
            per[kind] = {"flags": peer.flags, "sweep": sweep, "shared_prefix": prefix[0], "knee_req_s": knee}
            curves[kind] = sweep
            print(bs.format_table(sweep), file=sys.stderr, flush=True)
        md += [f"## {model}", ""]
        if not args.skip_sweep:
            chart = bs.plot_sweep(curves, RESULTS / f"serve-compare-{stamp}-{model}.png",
                                  title=f"{model}: {args.threads} threads, {args.parallel} parallel, "
                                        f"in {args.input_len} / out {args.output_len} tokens")
            per["chart"] = chart.name
            md += ["```", bs.format_table([r for k in peers for r in per[k]["sweep"]],
                                          [k for k in peers for _ in per[k]["sweep"]]), "```", ""]
        for k in peers:
            sp = per[k]["shared_prefix"]
            md.append(f"- {k}: knee {per[k]['knee_req_s']} req/s; shared-prefix ({args.prefix_len}-token prefix, "
                      f"{args.prefix_questions} requests at {args.prefix_rate:g}/s): mean TTFT "
                      f"{_fmt(sp['ttft_ms_mean'])} ms, P99 {_fmt(sp['ttft_ms_p99'])} ms; ISA: {per[k]['flags'].get('isa', '?')}")
            md.append(f"  - flags: {per[k]['flags']['command']}")
        if "chart" in per:
            md.append(f"\n![{model}]({per['chart']})\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"serve-compare-{stamp}.json"
    out.write_text(json.dumps(record, indent=1))
    (RESULTS / f"serve-compare-{stamp}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"JSON: {out}")


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.0f}"


if __name__ == "__main__":
    main()

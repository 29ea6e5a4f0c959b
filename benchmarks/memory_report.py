"""Where edgeinfer's memory goes: RSS after loading, at the first token, at the peak, and after a long
mixed load on the server, each split into anonymous memory (the process's own) and file-backed pages
(the page cache: shared libraries and any mapped file, which the kernel can drop and share).

    python benchmarks/memory_report.py [--models smollm2-135m-instruct gemma3-270m] [--kv-type f16]
                                       [--load-seconds 60] [--threads 2]

Also measures the runtime's own baseline (a process with the kernels loaded and a tiny model), which
is the RUNTIME_BYTES estimate edgeinfer/memory.py adds for `--memory-budget`. JSON goes to
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import results_io  # benchmarks/results_io.py, beside this script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def status(pid: int | str = "self") -> dict:
    s = Path(f"/proc/{pid}/status").read_text()
    g = lambda k: round(int(s.split(k + ":")[1].split()[0]) / 1024, 1)  # noqa: E731
    return {"rss_mb": g("VmRSS"), "peak_mb": g("VmHWM"), "anon_mb": g("RssAnon"), "file_mb": g("RssFile")}


_BASELINE = r"""
import json, sys
from edgeinfer import LLM, SamplingParams
llm = LLM(sys.argv[1], threads=2, progress=False)
llm.generate("the hen", SamplingParams(temperature=0, max_tokens=8))
s = open("/proc/self/status").read()
print(json.dumps({k: int(s.split(k + ":")[1].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile")}))
"""


def runtime_baseline() -> dict:
    """RSS of a process that loaded a tiny model and generated: the interpreter, numpy, Numba, LLVM and the
    compiled kernels, with next to no weights."""
    from tiny_models import write_tiny_llama

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "tiny.gguf")
        write_tiny_llama(p)
        out = subprocess.run([sys.executable, "-c", _BASELINE, p], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mixed_load(model: str, kv_type: str, threads: int, seconds: float, port: int = 8791) -> dict:
    """Our server under a mixed load for `seconds` (streamed and plain, chat and completions, short and
    long prompts and answers, 4 clients at once): RSS before, during (sampled each second) and after."""
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer.cli.main", "serve", model, "--port", str(port),
                             "--threads", str(threads), "--kv-type", kv_type],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=1) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("the server did not come up")
        idle = status(proc.pid)
        stop = time.monotonic() + seconds
        words = "the quick brown fox jumps over the lazy dog while a small model writes a story".split()
        done = [0]

        def client(seed):
            rng = random.Random(seed)
            while time.monotonic() < stop:
                n = rng.choice([8, 64, 400, 1200])
                text = " ".join(rng.choice(words) for _ in range(n))
                chat = rng.random() < 0.5
                body = {"model": model, "max_tokens": rng.choice([4, 32, 128]), "temperature": 0.7,
                        "stream": rng.random() < 0.5}
                if chat:
                    body["messages"] = [{"role": "user", "content": text}]
                else:
                    body["prompt"] = text
                req = urllib.request.Request(base + ("/v1/chat/completions" if chat else "/v1/completions"),
                                             json.dumps(body).encode(), {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=300) as r:
                        r.read()
                    done[0] += 1
                except OSError:
                    pass

        threads_ = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads_:
            t.start()
        samples = []
        while any(t.is_alive() for t in threads_):
            samples.append(status(proc.pid))
            time.sleep(1.0)
        for t in threads_:
            t.join()
        after = status(proc.pid)
        return {"requests": done[0], "idle": idle, "after": after,
                "max_rss_mb": max(s["rss_mb"] for s in samples), "max_anon_mb": max(s["anon_mb"] for s in samples)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    from edgeinfer import bench, registry
    from edgeinfer.system import system_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--kv-type", default="f16", choices=["f32", "f16", "q8_0"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--load-seconds", type=float, default=60.0)
    args = ap.parse_args()
    out = {"system": system_info(), "kv_type": args.kv_type, "runtime_baseline": runtime_baseline(), "models": {}}
    print(f"runtime baseline (tiny model loaded): {out['runtime_baseline']}")
    for m in args.models:
        path = str(registry.resolve(m))
        cold = bench.cold_start(path, args.threads, args.kv_type)
        load = mixed_load(m, args.kv_type, args.threads, args.load_seconds) if args.load_seconds > 0 else None
        out["models"][m] = {"file_mb": round(os.path.getsize(path) / 2**20, 1), "fresh_process": cold,
                            "server_mixed_load": load}
        print(f"\n{m} ({out['models'][m]['file_mb']} MB file), KV {args.kv_type}")
        print(f"  after load {cold['rss_load_mb']:.0f} MB, first token {cold['rss_first_mb']:.0f} MB, "
              f"peak {cold['peak_rss_mb']:.0f} MB; at the end: anon {cold['anon_end_mb']:.0f} MB, "
              f"file-backed {cold['file_end_mb']:.0f} MB")
        if load:
            print(f"  server: idle {load['idle']}, after {load['requests']} mixed requests in "
                  f"{args.load_seconds:.0f} s: {load['after']} (max RSS {load['max_rss_mb']} MB)")
    results_io.save("memory", out)


if __name__ == "__main__":
    main()

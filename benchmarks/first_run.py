"""The first run: a fresh process with an empty kernel cache, whole, and where its time goes.

Each model runs `edgeinfer generate MODEL Hello --max-tokens 4` in a fresh process; all of them share one
new, empty kernel cache, in the order given, so the first is a first run and each later one pays only for
what it adds (its weight types' matmul units, its KV type, ...):

    python benchmarks/first_run.py --models smollm2-135m-instruct gemma3-270m

Per model: the whole process's seconds (start to exit), the parallel compile's wall seconds and each job's
seconds in its worker (kernels/cpu/parallel_compile.py: paged attention, one matmul unit per kernel family,
the embedding decoder, the per-op forward's kernels, ...), longest first; and when the background compile
of what the first answer did not wait for (kernels/cpu/background.py: the compiled step, the few-token
units) was done, counted from the same start. Each model starts once the one before is wholly compiled.
Results: a table and benchmarks/results/first_run-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from results_io import save

MODELS = ["smollm2-135m-instruct", "gemma3-270m"]

_CHILD = r"""
import json, sys
from edgeinfer.cli.main import main
from edgeinfer.kernels.cpu import parallel_compile
try:
    main(["generate", sys.argv[1], "Hello", "--max-tokens", "4"], standalone_mode=False)
finally:
    print("COMPILES " + json.dumps(parallel_compile.finished), file=sys.stderr, flush=True)
"""


def run(model: str, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["NUMBA_CACHE_DIR"] = cache
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _CHILD, model], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    compiles = []
    for line in p.stderr.splitlines():
        if "COMPILES " in line:  # the compile's status line ends in \r, not \n: the report may share its line
            compiles = json.loads(line[line.index("COMPILES ") + len("COMPILES "):])
    bg = _wait_background()
    background_s = round(time.perf_counter() - t0, 2) if bg else None
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "?"
        raise SystemExit(f"{model}: the process failed: {tail}")
    jobs = {}
    for c in compiles:
        jobs.update(c["jobs_s"])
    return {"model": model, "process_s": round(wall, 2), "compile_wall_s": round(sum(c["wall_s"] for c in compiles), 2),
            "workers": max((c["workers"] for c in compiles), default=0), "background_done_s": background_s,
            "jobs_s": {k: round(v, 2) for k, v in sorted(jobs.items(), key=lambda kv: -kv[1])}}


def _wait_background() -> bool:
    """Wait for the background compile a run left (its process, found by its command line); whether
    there was one."""
    def running():
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"edgeinfer.kernels.cpu.parallel_compile" in f.read():
                        return True
            except (OSError, ValueError):
                pass
        return False

    seen = False
    end = time.monotonic() + 900
    while running():
        if time.monotonic() > end:
            raise SystemExit("the background compile did not end within 900 s")
        seen = True
        time.sleep(0.2)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    args = ap.parse_args()
    from edgeinfer.system import path_label, system_info

    info = system_info()
    print(f"{info['cpu']}, {os.cpu_count()} CPUs, kernel path {path_label(info)}")
    out = {"cpu": info["cpu"], "kernel_path": path_label(info), "runs": []}
    with tempfile.TemporaryDirectory(prefix="edgeinfer-first-run-") as cache:
        for i, m in enumerate(args.models):
            r = run(m, cache)
            out["runs"].append(r)
            what = "first run (empty kernel cache)" if i == 0 else "then, what it adds"
            print(f"\n{m}: {what}: whole process {r['process_s']:.1f} s, compile {r['compile_wall_s']:.1f} s "
                  f"on {r['workers']} worker processes")
            for name, s in r["jobs_s"].items():
                print(f"  {s:6.1f} s  {name}")
            if r["background_done_s"] is not None:
                print(f"  the background compile done {r['background_done_s']:.1f} s after the start")
    save("first_run", out)


if __name__ == "__main__":
    main()

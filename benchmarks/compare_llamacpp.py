"""edgeinfer against llama.cpp (through llama-cpp-python), side by side in one run.

    python benchmarks/compare_llamacpp.py [--models smollm2-135m-instruct gemma3-270m] [--threads 2] [--repeats 3]

For each model both engines load the same GGUF file with the same thread count; every measurement
alternates between them (edgeinfer, llama.cpp, edgeinfer, ...) so machine noise hits both alike.
Figures: prompt processing of 128 and 512 tokens, decode of 128 tokens after a 16-token prompt,
aggregate decode of 8 streams (64 tokens each), and a fresh process generating 64 tokens: its time
to the first token and to the last, its peak RSS, and that peak less the model file's bytes (what the
runtime itself costs). Both sides run a 2,048-token context with an f16 KV cache (llama.cpp's
default), so memory compares like for like. Medians are printed with the ratios; JSON and a bar chart
go to benchmarks/results/. Needs `pip install llama-cpp-python` (and matplotlib for the chart).

    python benchmarks/compare_llamacpp.py --baseline /tmp/base-venv/bin/python ...

adds two contenders to the same alternation: another install of edgeinfer (the commit before a change,
installed in its own environment), and this checkout's, each in a process of its own that measures on
command with its own edgeinfer.bench, so a change's speed is measured against its parent in the very same
run, both in processes alike (the in-process edgeinfer shares its process with llama.cpp's model and
threads). Prompt, decode and 8-stream figures; the columns "this" and "baseline", and their ratio.

    python benchmarks/compare_llamacpp.py --llama-bench /path/to/ik_llama.cpp/build/bin/llama-bench \
        --llama-bench-args "-rtr 1" --llama-bench-name ik_llama.cpp ...

adds a third runtime to the same alternation: a `llama-bench` binary built by whoever benchmarks (say
ik_llama.cpp's, from its public source with native flags; the project ships none of its code), run on the
same file with the same thread count, one repetition per round, for prompt 128 and 512 and decode 128
(`-p N -n 0`, `-p 0 -n 128`; its decode starts from an empty context, ours after a 16-token prompt). Its
column and the ratio edgeinfer / it are printed beside llama.cpp's; llama-bench has no 8-stream figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = [("pp128_tok_s", "prompt 128 (tok/s)"), ("pp512_tok_s", "prompt 512 (tok/s)"),
           ("tg128_tok_s", "decode (tok/s)"), ("batched8_tok_s", "8 streams (tok/s)"),
           ("ttft_cold_s", "fresh: first token (s)"), ("wall64_cold_s", "fresh: 64 tokens (s)"),
           ("peak_rss_mb", "peak RSS (MB)"), ("rss_less_weights_mb", "peak RSS - file (MB)")]
CONTEXT = 2048  # both sides, with f16 KV
COLD = {"ttft_cold_s", "wall64_cold_s", "peak_rss_mb", "rss_less_weights_mb"}


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level API: one context with room for 8 sequences."""

    def __init__(self, path: str, threads: int, n_ctx: int = 2048):
        import llama_cpp as L

        self.L = L
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, 512, 512, 8
        p.n_threads = p.n_threads_batch = threads
        p.kv_unified = True
        self.ctx = L.llama_init_from_model(self.model, p)
        self.batch = L.llama_batch_init(512, 0, 8)

    def _clear(self):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def _decode(self, items):
        """items: (token, position, sequence, wants_logits) -> {batch index: logits}"""
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, want) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0] = seq
            b.logits[i] = want
        if self.L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def _argmax(self, i):
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def prompt_tok_s(self, ids):
        self._clear()
        t0 = time.perf_counter()
        for s in range(0, len(ids), 512):
            chunk = ids[s:s + 512]
            self._decode([(t, s + j, 0, s + j == len(ids) - 1) for j, t in enumerate(chunk)])
        self._argmax(len(ids) - 1 - (len(ids) - 1) // 512 * 512)
        return len(ids) / (time.perf_counter() - t0)

    def decode_tok_s(self, prompts, n_tokens):
        """All streams prefilled, then n_tokens greedy steps with one token per stream per step."""
        self._clear()
        last = []
        for s, ids in enumerate(prompts):
            self._decode([(t, j, s, j == len(ids) - 1) for j, t in enumerate(ids)])
            last.append(self._argmax(len(ids) - 1))
        pos = [len(p) for p in prompts]
        t0 = time.perf_counter()
        for _ in range(n_tokens - 1):
            self._decode([(last[s], pos[s], s, True) for s in range(len(prompts))])
            last = [self._argmax(s) for s in range(len(prompts))]
            pos = [p + 1 for p in pos]
        return len(prompts) * (n_tokens - 1) / (time.perf_counter() - t0)


_LLAMA_COLD = r"""
import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=int(sys.argv[3]), n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]),
            verbose=False)  # f16 KV: llama.cpp's default
print("LOADED", open("/proc/self/status").read().split("VmRSS:")[1].split()[0], flush=True)
n = 0
for out in llm("Once upon a time", max_tokens=64, temperature=0.0, stream=True):
    if n == 0:
        print("FIRST", open("/proc/self/status").read().split("VmRSS:")[1].split()[0], flush=True)
    n += 1
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec
s = open("/proc/self/status").read()
print("END", *(s.split(k + ":")[1].split()[0] for k in ("VmHWM", "RssAnon", "RssFile")), flush=True)
"""


def llama_cold_start(path: str, threads: int) -> dict:
    """The same figures as edgeinfer.bench.cold_start, for llama.cpp in a fresh process."""
    t0 = time.perf_counter()
    from edgeinfer.bench import child_env

    proc = subprocess.Popen([sys.executable, "-c", _LLAMA_COLD, path, str(threads), str(CONTEXT)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())
    out = {}
    for line in proc.stdout:
        word, *vals = line.split()
        if word == "LOADED":
            out["rss_load_mb"] = int(vals[0]) / 1024
        elif word == "FIRST" and "ttft_s" not in out:
            out["ttft_s"] = time.perf_counter() - t0
            out["rss_first_mb"] = int(vals[0]) / 1024
        elif word == "END":
            out["wall64_s"] = time.perf_counter() - t0
            out["peak_rss_mb"], out["anon_end_mb"], out["file_end_mb"] = (int(v) / 1024 for v in vals)
    if proc.wait() != 0 or "peak_rss_mb" not in out:
        raise RuntimeError("the llama.cpp cold-start process failed")
    return out


_BASELINE = r"""
import sys
import numpy as np
from edgeinfer import LLM
from edgeinfer import bench as eb
llm = LLM(sys.argv[1], threads=int(sys.argv[2]), kv_type="f16", max_context=int(sys.argv[3]), progress=False)
rng = np.random.default_rng(1)
eb.prompt_tok_s(llm, 16, rng)  # warm-up
print("READY", flush=True)
for line in sys.stdin:
    fig, n = line.split()
    v = eb.prompt_tok_s(llm, int(n), rng) if fig == "pp" else eb.decode_tok_s(llm, 1 if fig == "tg" else 8, int(n), rng)
    print(v, flush=True)
"""
SWITCH_S = 0.5  # between processes: the one that just ran lets its worker threads stop spinning


class BenchBinary:
    """A llama-bench binary (another runtime's), run once per measurement on the same file and threads."""

    ARGS = {"pp128_tok_s": ["-p", "128", "-n", "0"], "pp512_tok_s": ["-p", "512", "-n", "0"],
            "tg128_tok_s": ["-p", "0", "-n", "128"]}

    def __init__(self, binary: str, path: str, threads: int, extra: list[str]):
        self.cmd = [binary, "-m", path, "-t", str(threads), "-r", "1", "-o", "json", *extra]

    def measure(self, fig: str) -> float | None:
        if fig not in self.ARGS:
            return None
        time.sleep(SWITCH_S)
        out = subprocess.run(self.cmd + self.ARGS[fig], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(self.cmd)} failed: {out.stderr[-400:]}")
        rows = json.loads(out.stdout)
        time.sleep(SWITCH_S)
        return float(rows[-1]["avg_ts"])


class Baseline:
    """Another edgeinfer install in a process of its own, measuring when asked (see _BASELINE)."""

    def __init__(self, python: str, model: str, threads: int):
        import tempfile

        from edgeinfer.bench import child_env

        self.cwd = tempfile.mkdtemp()  # not a checkout: its sources must not shadow that install
        self.proc = subprocess.Popen([python, "-c", _BASELINE, model, str(threads), str(CONTEXT)], cwd=self.cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError(f"the baseline process ({python}) failed to load {model}")

    def measure(self, fig: str, n: int) -> float:
        time.sleep(SWITCH_S)
        self.proc.stdin.write(f"{fig} {n}\n")
        self.proc.stdin.flush()
        v = float(self.proc.stdout.readline())
        time.sleep(SWITCH_S)
        return v

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def compare(model: str, threads: int, repeats: int, only: set[str], baseline: str | None = None,
            other: tuple | None = None) -> dict:
    """other: (name, llama-bench binary, its extra arguments) of a third runtime, or None."""
    from edgeinfer import LLM
    from edgeinfer import bench as eb

    ei = LLM(model, threads=threads, kv_type="f16", max_context=CONTEXT, progress=True)
    path = str(ei.path)
    file_mb = os.path.getsize(path) / 2**20
    lc = LlamaCpp(path, threads, n_ctx=CONTEXT)
    rng = np.random.default_rng(0)
    names = ("edgeinfer", "llama.cpp") + (("this", "baseline") if baseline else ()) + ((other[0],) if other else ())
    third = BenchBinary(other[1], path, threads, other[2]) if other else None
    runs = {name: {k: [] for k, _ in FIGURES} for name in names}
    # the two installs in processes of their own; which goes first alternates with each repeat
    pair = {"this": Baseline(sys.executable, model, threads), "baseline": Baseline(baseline, model, threads)} \
        if baseline else {}

    def measure_pair(r, key, fig, n):
        if not pair:
            return
        for name in ("this", "baseline") if r % 2 == 0 else ("baseline", "this"):
            runs[name][key].append(pair[name].measure(fig, n))
    details = {"edgeinfer": [], "llama.cpp": []}  # each fresh process's RSS after load / at first token, phases
    eb.prompt_tok_s(ei, 16, rng)  # warm-up
    lc.prompt_tok_s(eb.random_prompt(ei, 16, rng))
    for r in range(repeats):
        print(f"  {model}: run {r + 1}/{repeats}", file=sys.stderr, flush=True)
        for n in (128, 512):
            if f"pp{n}_tok_s" in only:
                ids = eb.random_prompt(ei, n, rng)
                runs["edgeinfer"][f"pp{n}_tok_s"].append(eb.prompt_tok_s(ei, n, rng))
                runs["llama.cpp"][f"pp{n}_tok_s"].append(lc.prompt_tok_s(ids))
                if third:
                    runs[other[0]][f"pp{n}_tok_s"].append(third.measure(f"pp{n}_tok_s"))
                measure_pair(r, f"pp{n}_tok_s", "pp", n)
        if "tg128_tok_s" in only:
            runs["edgeinfer"]["tg128_tok_s"].append(eb.decode_tok_s(ei, 1, 128, rng))
            runs["llama.cpp"]["tg128_tok_s"].append(lc.decode_tok_s([eb.random_prompt(ei, 16, rng)], 128))
            if third:
                runs[other[0]]["tg128_tok_s"].append(third.measure("tg128_tok_s"))
            measure_pair(r, "tg128_tok_s", "tg", 128)
        if "batched8_tok_s" in only:
            runs["edgeinfer"]["batched8_tok_s"].append(eb.decode_tok_s(ei, 8, 64, rng))
            runs["llama.cpp"]["batched8_tok_s"].append(
                lc.decode_tok_s([eb.random_prompt(ei, 16, rng) for _ in range(8)], 64))
            measure_pair(r, "batched8_tok_s", "b8", 64)
        if only & COLD:
            for name, fn in (("edgeinfer", lambda: eb.cold_start(path, threads, "f16", CONTEXT)),
                             ("llama.cpp", lambda: llama_cold_start(path, threads))):
                time.sleep(1.0)  # this process's worker threads stop spinning before a fresh one starts
                c = fn()
                runs[name]["ttft_cold_s"].append(c["ttft_s"])
                runs[name]["wall64_cold_s"].append(c["wall64_s"])
                runs[name]["peak_rss_mb"].append(c["peak_rss_mb"])
                runs[name]["rss_less_weights_mb"].append(c["peak_rss_mb"] - file_mb)
                details[name].append({k: round(v, 4) if isinstance(v, float) else v for k, v in c.items()})
    for p in pair.values():
        p.close()
    keys = [k for k, _ in FIGURES if runs["edgeinfer"][k]]
    med = {name: {k: round(statistics.median(figs[k]), 3) for k in keys if figs[k]} for name, figs in runs.items()}
    ratio = {k: round(med["edgeinfer"][k] / med["llama.cpp"][k], 3) for k in keys}
    extra = {}
    if third:
        extra = {"other": other[0], "other_command": " ".join(third.cmd), f"ratio_edgeinfer_over_{other[0]}":
                 {k: round(med["edgeinfer"][k] / med[other[0]][k], 3) for k in med[other[0]]}}
    if pair:
        extra = {**extra, "baseline_python": baseline, "ratio_this_over_baseline":
                 {k: round(med["this"][k] / med["baseline"][k], 3) for k in med["baseline"]}}
    return {**extra, "model": model, "file": os.path.basename(path), "threads": threads, "repeats": repeats,
            "system": eb.system_info(), "context": CONTEXT, "kv_type": "f16", "file_mb": round(file_mb, 1),
            "median": med, "ratio_edgeinfer_over_llamacpp": ratio, "runs": runs, "cold_details": details}


def chart(results: list[dict], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib)", file=sys.stderr)
        return
    fig, axes = plt.subplots(len(results), len(FIGURES), figsize=(3 * len(FIGURES), 3 * len(results)), squeeze=False)
    for row, res in zip(axes, results):
        for ax, (key, label) in zip(row, FIGURES):
            if key not in res["median"]["edgeinfer"]:
                ax.axis("off")
                continue
            vals = [res["median"]["edgeinfer"][key], res["median"]["llama.cpp"][key]]
            ax.bar(["edgeinfer", "llama.cpp"], vals, color=["tab:blue", "tab:gray"])
            ax.set_title(f"{res['model']}\n{label}", fontsize=8)
            ax.tick_params(labelsize=7)
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"chart: {out}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", metavar="PYTHON", default=None,
                    help="also measure the edgeinfer installed for this interpreter (the commit before a change)")
    ap.add_argument("--llama-bench", metavar="BINARY", default=None,
                    help="also run this llama-bench binary (another runtime's, e.g. ik_llama.cpp's) in the alternation")
    ap.add_argument("--llama-bench-args", default="", help="extra arguments for it, e.g. \"-rtr 1\"")
    ap.add_argument("--llama-bench-name", default="ik_llama.cpp", help="its column's name")
    ap.add_argument("--only", nargs="+", choices=[k for k, _ in FIGURES], default=[k for k, _ in FIGURES],
                    help="measure only these figures")
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("llama-cpp-python is not installed: pip install llama-cpp-python (it builds llama.cpp, ~12 min)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    other = (args.llama_bench_name, args.llama_bench, args.llama_bench_args.split()) if args.llama_bench else None
    results = [compare(m, args.threads, args.repeats, set(args.only), args.baseline, other) for m in args.models]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"compare-{stamp}.json").write_text(json.dumps(results, indent=1))
    chart(results, RESULTS / f"compare-{stamp}.png")
    from edgeinfer.system import path_label

    for res in results:
        sysinfo = res["system"]
        print(f"\n{res['model']} ({res['file']}), {res['threads']} threads, median of {res['repeats']}; "
              f"{sysinfo['cpu']}, kernel path {path_label(sysinfo)}")
        name = res.get("other")
        print(f"  {'':<24}{'edgeinfer':>12}{'llama.cpp':>12}{'ratio':>8}" + (f"{name:>14}{'ratio':>8}" if name else ""))
        for key, label in FIGURES:
            if key not in res["median"]["edgeinfer"]:
                continue
            m = res["median"]
            line = (f"  {label:<24}{m['edgeinfer'][key]:>12.2f}{m['llama.cpp'][key]:>12.2f}"
                    f"{res['ratio_edgeinfer_over_llamacpp'][key]:>8.2f}")
            if name and key in m[name]:
                line += f"{m[name][key]:>14.2f}{res[f'ratio_edgeinfer_over_{name}'][key]:>8.2f}"
            if key in res.get("ratio_this_over_baseline", {}):
                line += (f"   this {m['this'][key]:>9.2f}  baseline {m['baseline'][key]:>9.2f}"
                         f"  this/baseline {res['ratio_this_over_baseline'][key]:.3f}")
            print(line)
    print(f"\nJSON: {RESULTS / f'compare-{stamp}.json'}")


if __name__ == "__main__":
    main()

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

from ..sampling import SamplingParams
from ..system import path_label, system_info  # noqa: F401  (benchmarks/compare_llamacpp.py reads them from here)

KEYS = ("pp128_tok_s", "pp512_tok_s", "tg128_tok_s", "batched8_tok_s", "ttft_cold_s", "wall64_cold_s",
        "peak_rss_mb", "rss_load_mb", "rss_first_mb", "prefix500_ttft_ratio")


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


def decode_tok_s(llm, n_streams: int, n_tokens: int, rng, prompt_len: int = 16, lora=None) -> float:
    """Aggregate decode rate: n_streams sequences of prompt_len tokens each generate n_tokens; the
    time from the step where every stream has its first token to the end. lora: each stream's
    SamplingParams.lora (a list), or None: the LLM's own adapters."""
    params = [SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True,
                             lora=None if lora is None else lora[i]) for i in range(n_streams)]
    with llm.engine.run() as run:
        for i in range(n_streams):
            run.submit(random_prompt(llm, prompt_len, rng), params[i])
        started, counted, t_start = set(), 0, None
        for outs in run.steps():
            for o in outs:
                if t_start is not None:
                    counted += len(o.new_token_ids)
                started.add(o.request_id)
            if t_start is None and len(started) == n_streams:
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
import json, sys, time
t0 = time.perf_counter()


def mem():
    s = open("/proc/self/status").read()
    g = lambda k: int(s.split(k + ":")[1].split()[0]) / 1024
    return {"rss": g("VmRSS"), "hwm": g("VmHWM"), "anon": g("RssAnon"), "file": g("RssFile")}


from edgeinfer import LLM, SamplingParams
t_import = time.perf_counter()
llm = LLM(sys.argv[1], threads=int(sys.argv[2]), kv_type=sys.argv[3], max_context=int(sys.argv[4]), progress=False)
t_load = time.perf_counter()
at_load = mem()
n, first, at_first = 0, None, None
for chunk in llm.stream("Once upon a time", SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)):
    if first is None:
        first = time.perf_counter()
        at_first = mem()
        print("FIRST", flush=True)
    n += len(chunk.token_ids)
end = time.perf_counter()
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec
print("JSON", json.dumps({"import_s": t_import - t0, **llm.timings, "first_forward_s": first - t_load,
                          "to_first_token_s": first - t0, "wall64_s": end - t0, "tokens": n,
                          "mem_load": at_load, "mem_first": at_first, "mem_end": mem()}), flush=True)
"""

# the start-up phases, in order (seconds; LLM.timings names the loading ones)
STARTUP = ("interpreter_s", "import_s", "open_s", "backend_s", "tokenizer_s", "precompile_s", "weights_s", "engine_s",
           "first_forward_s")


def child_env(extra: dict | None = None) -> dict:
    """The environment of a fresh measured process: this one's, with Python's bytecode cache on, as on any
    normal install (some sandboxes set PYTHONDONTWRITEBYTECODE, which recompiles every module's source
    at each start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra or {})
    return env


def cold_start(model_path: str, threads: int, kv_type: str = "", max_context: int = 0,
               env: dict | None = None) -> dict:
    """A fresh process (warm kernel cache, unless env points Numba elsewhere) loads the model and
    generates 64 tokens: seconds to its first token (ttft_s, from the parent's spawn) and to its last
    (wall64_s), its peak RSS in MB, RSS after loading and at the first token (with the anonymous and
    file-backed parts), and the start-up phases (STARTUP)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _COLD_CHILD, str(model_path), str(threads), kv_type,
                             str(max_context)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(env))
    ttft, data, wall = None, None, None
    for line in proc.stdout:
        if line.startswith("FIRST") and ttft is None:
            ttft = time.perf_counter() - t0
        elif line.startswith("JSON"):
            wall = time.perf_counter() - t0
            data = json.loads(line[4:])
    err = proc.stderr.read()
    if proc.wait() != 0 or ttft is None or data is None:
        raise RuntimeError(f"the cold-start process failed: {err.strip().splitlines()[-1] if err.strip() else '?'}")
    # the interpreter's own start: spawn to the child's first line of code
    phases = {"interpreter_s": max(0.0, ttft - data["to_first_token_s"])}
    phases.update({k: data[k] for k in STARTUP[1:]})
    return {"ttft_s": ttft, "wall64_s": wall, "peak_rss_mb": data["mem_end"]["hwm"],
            "rss_load_mb": data["mem_load"]["rss"], "rss_first_mb": data["mem_first"]["rss"],
            "anon_end_mb": data["mem_end"]["anon"], "file_end_mb": data["mem_end"]["file"],
            "startup": {k: round(v, 4) for k, v in phases.items()}}


def first_run(model_path: str, threads: int) -> float:
    """Seconds to the first token of a fresh process with an empty kernel cache (a first run)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgeinfer-first-run-") as d:
        return cold_start(model_path, threads, env={"NUMBA_CACHE_DIR": d})["ttft_s"]


def load_spec_prompts(path: str | None = None) -> list:
    """Prompts for the speculation comparison: a JSON list of strings or {"prompt": str} or {"messages": [...]}
    (a chat, rendered with the model's template); by default a few built-in code prompts (editing and
    completion)."""
    if path is None:
        from importlib.resources import files

        text = files("edgeinfer").joinpath("data/spec_prompts.json").read_text()
    else:
        with open(path) as f:
            text = f.read()
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(items, list) or not items or not all(
            isinstance(x, str) or (isinstance(x, dict) and ("prompt" in x or "messages" in x)) for x in items):
        raise ValueError(f"{path or 'the built-in prompts'}: expected a non-empty JSON list of strings or objects "
                         "with 'prompt' or 'messages'")
    return items


def _prompt_ids(llm, item) -> list[int]:
    if isinstance(item, str):
        return llm.tokenize(item, add_bos=None)
    if "messages" in item:
        return llm.render_chat(item["messages"])
    return llm.tokenize(item["prompt"], add_bos=None)


def timed_decode(llm, ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    """Greedy generation of ids; the output tokens and the decode time (first token to last)."""
    toks, t_first = [], None
    with llm.engine.run() as run:
        run.submit(ids, SamplingParams(temperature=0, max_tokens=max_tokens))
        for o in run:
            toks.extend(o.new_token_ids)
            if t_first is None:
                t_first = time.perf_counter()
    return toks, time.perf_counter() - t_first


def spec_compare(llm, prompts: list, repeats: int = 3, max_tokens: int = 128, say=None) -> dict:
    """Greedy decode of each prompt with and without speculation, interleaved run by run: decode tokens per
    second (all prompts' tokens after the first over their decode time; the median of the repeats),
    the speed-up, the acceptance rate, and whether the outputs were identical."""
    eng = llm.engine
    if eng.proposer is None:
        raise ValueError("the model was loaded without speculation")
    say = say or (lambda s: None)
    ids = [_prompt_ids(llm, p) for p in prompts]
    timed_decode(llm, ids[0], 8)  # warm-up: the draft's kernels
    rates = {False: [], True: []}
    same = True
    proposed = accepted = 0
    plain: list = []  # this repeat's outputs without speculation (the same every repeat: greedy)
    for r in range(repeats):
        for mode in (False, True):
            say(f"speculation {'on' if mode else 'off'}: run {r + 1}/{repeats}")
            eng.speculate = mode
            n = secs = 0
            before = eng.stats()
            outs = []
            for p in ids:
                toks, dt = timed_decode(llm, p, max_tokens)
                outs.append(toks)
                n += len(toks) - 1
                secs += dt
            after = eng.stats()
            if mode:
                proposed += after["spec_proposed_tokens"] - before["spec_proposed_tokens"]
                accepted += after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
                same = same and outs == plain
            else:
                plain = outs
            rates[mode].append(n / secs)
    eng.speculate = True
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    return {"method": eng.proposer.kind, "draft": os.path.basename(str(getattr(llm, "draft_path", ""))) or None,
            "max_draft_tokens": eng.proposer.max_tokens, "prompts": len(prompts), "max_tokens": max_tokens,
            "decode_tok_s_without": round(off, 2), "decode_tok_s_with": round(on, 2), "speedup": round(on / off, 3),
            "proposed_tokens": proposed, "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / proposed, 4) if proposed else 0.0, "identical_output": same,
            "runs": {"without": [round(x, 2) for x in rates[False]], "with": [round(x, 2) for x in rates[True]]}}


def run(llm, repeats: int = 3, threads: int = 0, progress=None, first_run_too: bool = False,
        spec_prompts: list | None = None, spec_only: bool = False) -> dict:
    """All measurements, each the median of `repeats` runs. progress(name) is called before each.
    first_run_too: also the time to a first token with an empty kernel cache (first_run_s, one run:
    it compiles every kernel the model needs, tens of seconds). With speculation on the engine, the usual
    figures are measured without it, then spec_compare on spec_prompts; spec_only: that alone."""
    from ..config import default_threads

    threads = threads or default_threads()
    rng = np.random.default_rng(0)
    say = progress or (lambda name: None)
    about = {"threads": threads, "system": system_info(), "model": os.path.basename(str(llm.path)),
             "file_mb": round(os.path.getsize(llm.path) / 1e6, 1)}
    spec = None
    if llm.engine.speculates:
        spec = spec_compare(llm, spec_prompts or load_spec_prompts(), repeats, say=say)
    if spec_only:
        return {"speculation": spec, **about}
    if spec is not None:
        llm.engine.speculate = False  # random-token prompts: nothing to speculate on
    say("warm-up")
    prompt_tok_s(llm, 16, rng)
    results: dict[str, list[float]] = {k: [] for k in KEYS}
    startups: list[dict] = []
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
        time.sleep(1.0)  # this process's worker threads stop spinning before the fresh one starts
        c = cold_start(str(llm.path), threads, llm.engine.config.kv_dtype, llm.engine.max_context)
        results["ttft_cold_s"].append(c["ttft_s"])
        results["wall64_cold_s"].append(c["wall64_s"])
        for k in ("peak_rss_mb", "rss_load_mb", "rss_first_mb"):
            results[k].append(c[k])
        startups.append(c["startup"])
    out = {k: round(statistics.median(v), 3) for k, v in results.items()}
    out["runs"] = {k: [round(x, 3) for x in v] for k, v in results.items()}
    # where a fresh process's time to its first token goes: the median of each phase
    out["startup"] = {k: round(statistics.median(s[k] for s in startups), 4) for k in STARTUP}
    out["kv_type"] = llm.engine.config.kv_dtype
    out["max_context"] = llm.engine.max_context
    if first_run_too:
        say("first run (empty kernel cache)")
        out["first_run_s"] = round(first_run(str(llm.path), threads), 2)
    if spec is not None:
        out["speculation"] = spec
        llm.engine.speculate = True
    out.update(about)
    return out


def format_spec(res: dict) -> list[str]:
    s = res.get("speculation")
    if not s:
        return []
    how = f"draft {s['draft']}" if s["method"] == "draft" else "prompt lookup"
    return [f"  speculative decoding ({how}, up to {s['max_draft_tokens']} tokens), greedy, {s['prompts']} prompts x "
            f"{s['max_tokens']} tokens:",
            f"  {'decode without / with':<32} {s['decode_tok_s_without']:>9.2f} / {s['decode_tok_s_with']:.2f} tok/s "
            f"({s['speedup']:.2f}x)",
            f"  {'acceptance':<32} {s['acceptance_rate']:>9.1%} ({s['accepted_tokens']} of {s['proposed_tokens']} proposed); "
            f"output {'identical' if s['identical_output'] else 'DIFFERENT'}"]


def format_table(res: dict) -> str:
    if "runs" not in res:  # speculation only
        return "\n".join([f"{res['model']} ({res['file_mb']} MB), {res['threads']} threads; {res['system']['cpu']}, "
                          f"kernel path {path_label(res['system'])}"] + format_spec(res))
    rows = [("prompt processing, 128 tokens", "pp128_tok_s", "tok/s"),
            ("prompt processing, 512 tokens", "pp512_tok_s", "tok/s"),
            ("decode, 128 tokens, 1 stream", "tg128_tok_s", "tok/s"),
            ("decode, 8 streams (aggregate)", "batched8_tok_s", "tok/s"),
            ("fresh process: first token", "ttft_cold_s", "s"),
            ("fresh process: 64 tokens", "wall64_cold_s", "s"),
            ("peak RSS, generate 64 tokens", "peak_rss_mb", "MB"),
            ("RSS after loading", "rss_load_mb", "MB"),
            ("RSS at the first token", "rss_first_mb", "MB"),
            ("TTFT with a cached 496-token prefix", "prefix500_ttft_ratio", "x the uncached")]
    lines = [f"{res['model']} ({res['file_mb']} MB), {res['threads']} threads, median of {len(res['runs']['pp128_tok_s'])}; "
             f"{res['system']['cpu']}, kernel path {path_label(res['system'])}"]
    lines += [f"  {label:<32} {res[key]:>9.2f} {unit}" for label, key, unit in rows]
    if "first_run_s" in res:
        lines.append(f"  {'first run (empty kernel cache)':<32} {res['first_run_s']:>9.2f} s")
    lines.append("  start-up, fresh process (s): " + ", ".join(f"{k[:-2]} {v:.3f}" for k, v in res["startup"].items()))
    return "\n".join(lines + format_spec(res))


def to_json(res: dict) -> str:
    return json.dumps(res)

"""KV cache types side by side: decode speed and KV bytes per token per KV type (or K/V pair), in one run.

    python benchmarks/kv_types.py [--models smollm2-135m-instruct gemma3-270m] [--types f16 q8_0 q4_0 f16/q4_0]
        [--repeats 5] [--threads 2]

For each model one LLM per KV type is loaded; each measurement alternates between them: decode of 128
tokens after a 16-token prompt (attention is a small part), decode of 64 tokens after a 1,024-token
prompt (attention reads a long cache every token), and a 512-token prefill. Medians, with each type's
ratio to f16. Perplexity per KV type: `edgeinfer perplexity MODEL FILE --kv-type q8_0`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import results_io  # benchmarks/results_io.py, beside this script

TYPES = ("f16", "q8_0", "f32", "q4_0", "f16/q4_0")


def decode_after(llm, prompt_len: int, n_tokens: int, rng) -> float:
    """Tokens per second of n_tokens greedy tokens after a prompt_len-token prompt (prefill not counted)."""
    from edgeinfer import bench
    from edgeinfer.sampling import SamplingParams

    t0, n = None, 0
    with llm.engine.run() as run:
        run.submit(bench.random_prompt(llm, prompt_len, rng),
                   SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True))
        for o in run:
            if t0 is None:
                t0 = time.perf_counter()  # the first token: the prefill is done
            else:
                n += len(o.new_token_ids)
    return n / (time.perf_counter() - t0)


def main() -> None:
    from edgeinfer import LLM, bench, memory
    from edgeinfer.config import kv_type_name

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", nargs="+", default=list(TYPES), help="KV types (f16 first: the ratios' base)")
    args = ap.parse_args()
    types = args.types if "f16" in args.types else ["f16", *args.types]
    out = {"system": bench.system_info(), "threads": args.threads, "repeats": args.repeats, "models": {}}
    for model in args.models:
        llms = {t: LLM(model, threads=args.threads, kv_type=t, max_context=2048, progress=True) for t in types}
        rng = np.random.default_rng(0)
        for llm in llms.values():  # compile and warm up each
            decode_after(llm, 16, 4, rng)
        figs = {t: {"tg128_short_tok_s": [], "tg64_after_1024_tok_s": [], "pp512_tok_s": []} for t in types}
        for r in range(args.repeats):
            print(f"  {model}: run {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
            for t, llm in llms.items():
                figs[t]["tg128_short_tok_s"].append(decode_after(llm, 16, 128, rng))
                figs[t]["tg64_after_1024_tok_s"].append(decode_after(llm, 1024, 64, rng))
                figs[t]["pp512_tok_s"].append(bench.prompt_tok_s(llm, 512, rng))
        cfg = llms["f16"].config
        med = {t: {k: round(statistics.median(v), 2) for k, v in f.items()} for t, f in figs.items()}
        per_token = memory.estimate(0, cfg, llms["f16"].engine.config, llms["f16"].kernels.KV_FORMATS).kv_per_token
        res = {"kv_bytes_per_token": {t: per_token[kv_type_name(t)] for t in types}, "median": med,
               "ratio_to_f16": {t: {k: round(med[t][k] / med["f16"][k], 3) for k in med[t]} for t in types},
               "runs": figs}
        out["models"][model] = res
        print(f"\n{model}, {args.threads} threads, median of {args.repeats}; {out['system']['cpu']}, "
              f"kernel path {out['system']['kernel_path']}")
        print(f"  {'KV':<10}{'bytes/token':>12}{'decode':>10}{'after 1024':>12}{'prefill 512':>13}   ratios to f16")
        for t in types:
            m, q = med[t], res["ratio_to_f16"][t]
            print(f"  {t:<10}{res['kv_bytes_per_token'][t]:>12}{m['tg128_short_tok_s']:>10.1f}"
                  f"{m['tg64_after_1024_tok_s']:>12.1f}{m['pp512_tok_s']:>13.1f}   "
                  f"{q['tg128_short_tok_s']:.3f} {q['tg64_after_1024_tok_s']:.3f} {q['pp512_tok_s']:.3f}")
    results_io.save("kv-types", out)


if __name__ == "__main__":
    main()

"""Structured output on real models: validity, decode speed with a constraint, compile times.

For each model:
1. Validity: every schema in schemas.json x --seeds seeds at --temperature, through the chat template,
   all requests in one continuous batch; a sample counts as valid when it parses, validates against its
   schema (multipleOf checked in decimal, as JSON means it) and ended on "stop" (a "length" end is a
   failure).
2. Compile: for each schema, the time from SamplingParams to a ready matcher with an empty cache (the
   first-token delay a new schema adds), and again from the cache; plus the one-off index of the
   vocabulary that the library builds per model.
3. Speed: single-sequence greedy decode with a JSON-schema constraint against the same number of
   tokens unconstrained, interleaved, --repeats times; medians. The mask cost per token is split into
   the library's mask computation and applying it to the logits row.

    python benchmarks/structured/bench_structured.py smollm2-135m-instruct gemma3-270m

The figures are printed, and saved as JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from decimal import Decimal

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import results_io  # noqa: E402  benchmarks/results_io.py: JSON to benchmarks/results/NAME-TIME.json


def decimal_validator(schema):
    """A jsonschema validator whose multipleOf works in decimal (0.1 * 3 is a multiple of 0.1)."""
    import jsonschema

    base = jsonschema.validators.validator_for(schema)

    def multiple_of(validator, m, instance, _schema):
        if not validator.is_type(instance, "number"):
            return
        if (Decimal(str(instance)) % Decimal(str(m))) != 0:
            yield jsonschema.ValidationError(f"{instance} is not a multiple of {m}")

    return jsonschema.validators.extend(base, {"multipleOf": multiple_of})(schema)


def check(text: str, schema) -> str | None:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}"
    err = next(iter(decimal_validator(schema).iter_errors(obj)), None)
    return None if err is None else err.message


def validity(llm, schemas, seeds, temperature, max_tokens):
    from edgeinfer import SamplingParams

    prompts, params, names = [], [], []
    for name, case in schemas.items():
        chat = llm.render_chat([{"role": "user", "content": case["prompt"] + " Answer in JSON."}])
        for seed in range(seeds):
            prompts.append(chat)
            params.append(SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens,
                                         json_schema=case["schema"]))
            names.append(name)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    failures = []
    for name, out in zip(names, outs):
        why = "ended on length" if out.finish_reason != "stop" else check(out.text, schemas[name]["schema"])
        if why:
            failures.append({"schema": name, "why": why, "text": out.text[:200]})
    n = len(outs)
    return {"samples": n, "valid": n - len(failures), "rate": round((n - len(failures)) / n, 4),
            "tokens": sum(len(o.token_ids) for o in outs), "seconds": round(elapsed, 1), "failures": failures}


def compile_times(llm, schemas):
    from edgeinfer import SamplingParams
    from edgeinfer.structured import GrammarCache, llg_tokenizer

    t0 = time.perf_counter()
    llg_tokenizer(llm.tokenizer)
    index_s = time.perf_counter() - t0
    cache = GrammarCache(llm.tokenizer, llm.kernels.mask_logits)
    first, cached = {}, {}
    for name, case in schemas.items():
        p = SamplingParams(json_schema=case["schema"])
        t0 = time.perf_counter()
        g = cache.guide(p)
        g.allowed()  # and the first mask: all of the delay before the first constrained token
        first[name] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        cache.guide(p).allowed()
        cached[name] = (time.perf_counter() - t0) * 1e3
    return {"vocab_index_s": round(index_s, 3),
            "first_ms": {k: round(v, 2) for k, v in first.items()},
            "first_ms_median": round(statistics.median(first.values()), 2),
            "first_ms_max": round(max(first.values()), 2),
            "cached_ms_median": round(statistics.median(cached.values()), 3)}


def decode_speed(llm, schemas, repeats, names):
    """tok/s after the first token, constrained against unconstrained with the same token count."""
    from edgeinfer import SamplingParams

    def timed(prompt, params):
        t0 = time.perf_counter()
        first, n, guide = None, 0, None
        with llm.engine.run() as run:
            guide = llm.engine.guide(params) if params.constrained else None  # as add_request would
            run.submit(prompt, params, guide=guide)
            for out in run:
                first = first or time.perf_counter()
                n += len(out.new_token_ids)
        end = time.perf_counter()
        return n, (n - 1) / (end - first), guide, first - t0

    rows = []
    for name in names:
        case = schemas[name]
        prompt = llm.render_chat([{"role": "user", "content": case["prompt"] + " Answer in JSON."}])
        for r in range(repeats):
            n, con, guide, _ = timed(prompt, SamplingParams(temperature=0, max_tokens=400, json_schema=case["schema"]))
            _, free, _, _ = timed(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            rows.append({"schema": name, "tokens": n, "constrained_tok_s": con, "free_tok_s": free,
                         "mask_us": guide.mask_seconds / guide.num_masks * 1e6,
                         "apply_us": guide.apply_seconds / guide.num_masks * 1e6})
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    return {"runs": len(rows), "constrained_tok_s": round(med("constrained_tok_s"), 1),
            "free_tok_s": round(med("free_tok_s"), 1),
            "ratio_median": round(statistics.median(r["constrained_tok_s"] / r["free_tok_s"] for r in rows), 3),
            "mask_us_median": round(med("mask_us"), 1), "apply_us_median": round(med("apply_us"), 1),
            "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--speed-schemas", default="order,weather,recipe,ticket,invoice",
                    help="Schemas the speed runs use (comma-separated).")
    ap.add_argument("--skip-validity", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import llguidance

    from edgeinfer import LLM
    from edgeinfer.system import system_info

    schemas = json.load(open(os.path.join(HERE, "schemas.json")))
    info = system_info()
    record = {"cpu": info["cpu"], "kernel_path": info["kernel_path"],
              "llguidance": llguidance.__version__, "threads": args.threads or os.cpu_count(), "models": {}}
    for model in args.models:
        llm = LLM(model, threads=args.threads, progress=False)
        res = {"compile": compile_times(llm, schemas)}
        print(model, "compile", {k: v for k, v in res["compile"].items() if k != "first_ms"}, flush=True)
        res["speed"] = decode_speed(llm, schemas, args.repeats, args.speed_schemas.split(","))
        print(model, "speed", {k: v for k, v in res["speed"].items() if k != "rows"}, flush=True)
        if not args.skip_validity:
            res["validity"] = validity(llm, schemas, args.seeds, args.temperature, args.max_tokens)
            v = res["validity"]
            print(model, f"validity {v['valid']}/{v['samples']} ({v['tokens']} tokens in {v['seconds']} s)", flush=True)
            for f in v["failures"]:
                print("  FAIL", f, flush=True)
        record["models"][model] = res
    results_io.save("structured", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())

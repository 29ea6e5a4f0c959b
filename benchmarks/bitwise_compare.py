"""Two installs of edgeinfer, the same requests, outputs compared bit for bit.

A refactor that changes no behaviour must give the very same tokens, log-probabilities, perplexities and
embeddings as the commit before it. This runs a fixed set of requests on each catalog model in each of two
interpreters (for example a virtual environment with the commit before installed, and this checkout's)
and compares every number exactly:

    python benchmarks/bitwise_compare.py --a /tmp/base-venv/bin/python --b .venv/bin/python

What runs, per model: 8 prompts greedy as one continuous batch (with top-5 log-probabilities per token);
one prompt through the per-op reference forward instead of the compiled step; seeded sampling at
temperature 0.8; a repetition penalty; a q8_0 KV cache; a chat turn; perplexity (2 chunks of 128);
embeddings (a generative model's last hidden state, and the encoder's pooled vectors). Only the public API
and `model.stack` (the per-op switch, present in both) are used, so any two commits can be compared.
Each worker runs from a temporary directory, so a checkout's sources never shadow the install under test.
`--zoo` runs the same checks on the arch zoo's random
models (tests/arch_zoo.py, written once from their fixed seeds, the same files for both sides) instead of
the catalog's (`--models` then names zoo models: those an older commit can run). A kernel path is chosen for both sides as usual, with EDGEINFER_KERNELS in the environment.
Results: a JSON line per check, and benchmarks/results/bitwise_<a>_<b>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

MODELS = ["smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct",
          "nomic-embed-text-v1.5"]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colours are", "import numpy as np\n\n", "Water boils at a temperature of",
           "The quick brown fox", "In 1969, the first people to walk on the Moon"]
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a screw press adapted from those used for wine and olives. "
        "Within fifty years presses were working in more than two hundred cities across Europe, and the number "
        "of books in circulation grew from thousands to millions. ") * 12


def worker(out_path: str, models: list[str]) -> None:
    from edgeinfer import LLM, SamplingParams

    res = {}
    for name in models:
        llm = LLM(name, threads=2, progress=False)
        key = os.path.basename(name)  # a catalog name, or a zoo file's name
        if llm.is_encoder:
            res[f"{key}/embed"] = llm.embed(["search_query: what is a printing press?",
                                              "search_document: " + TEXT[:400]])
            continue
        greedy = SamplingParams(temperature=0.0, max_tokens=24, logprobs=5)
        for i, c in enumerate(llm.generate(PROMPTS, greedy)):
            res[f"{key}/batch8/{i}/tokens"] = np.array(c.token_ids)
            res[f"{key}/batch8/{i}/logprobs"] = np.array([[t["logprob"]] + [lp for _, lp in t["top"]]
                                                           for t in c.logprobs])
        sampled = llm.generate(PROMPTS[:2], SamplingParams(temperature=0.8, top_p=0.95, seed=1, max_tokens=24))
        for i, c in enumerate(sampled):
            res[f"{key}/seeded/{i}"] = np.array(c.token_ids)
        pen = llm.generate(PROMPTS[4], SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=24))[0]
        res[f"{key}/repetition_penalty"] = np.array(pen.token_ids)
        chat = llm.chat([{"role": "user", "content": "Name two planets."}], SamplingParams(temperature=0.0,
                                                                                          max_tokens=16))
        res[f"{key}/chat"] = np.array(chat.token_ids)
        res[f"{key}/perplexity"] = np.array([llm.perplexity(TEXT, n_ctx=128, chunks=2)])
        res[f"{key}/embed_last"] = llm.embed(PROMPTS[:2], pooling="last")
        stack, llm.model.stack = llm.model.stack, None  # the per-op reference forward
        c = llm.generate(PROMPTS[0], greedy)[0]
        llm.model.stack = stack
        res[f"{key}/per_op/tokens"] = np.array(c.token_ids)
        res[f"{key}/per_op/logprobs"] = np.array([[t["logprob"]] + [lp for _, lp in t["top"]] for t in c.logprobs])
        del llm
        q8 = LLM(name, threads=2, kv_type="q8_0", progress=False)
        c = q8.generate(PROMPTS[2], greedy)[0]
        res[f"{key}/kv_q8_0/tokens"] = np.array(c.token_ids)
        res[f"{key}/kv_q8_0/logprobs"] = np.array([[t["logprob"]] + [lp for _, lp in t["top"]] for t in c.logprobs])
        del q8
        print(f"  {name}: done", file=sys.stderr, flush=True)
    np.savez(out_path, **res)


def run_side(python: str, out: str, models: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run([python, os.path.abspath(__file__), "--worker", out, "--models", *models], cwd=cwd, check=True)
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    # bit for bit: equal shapes and dtypes and equal bytes (NaNs included, -0.0 told from 0.0)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", help="the python of the first install (the commit before)")
    ap.add_argument("--b", help="the python of the second install (this change)")
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--label", default="", help="a name for the results file")
    ap.add_argument("--zoo", action="store_true", help="the arch zoo's random models instead of the catalog's")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.models)
        return
    if not (args.a and args.b):
        ap.error("give --a and --b")
    with tempfile.TemporaryDirectory() as tmp:
        if args.zoo:
            sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")]
            from arch_zoo import GOLDEN, write

            names = GOLDEN if args.models == MODELS else args.models  # --models: zoo names (both sides run them)
            args.models = []
            for name in names:
                write(name, os.path.join(tmp, f"{name}.gguf"))
                args.models.append(os.path.join(tmp, f"{name}.gguf"))
        print(f"a: {args.a}", file=sys.stderr)
        a = run_side(args.a, os.path.join(tmp, "a.npz"), args.models)
        print(f"b: {args.b}", file=sys.stderr)
        b = run_side(args.b, os.path.join(tmp, "b.npz"), args.models)
    rows = []
    for k in sorted(set(a) | set(b)):
        ok = k in a and k in b and same(a[k], b[k])
        rows.append({"check": k, "identical": ok})
        print(json.dumps(rows[-1]))
    n_bad = sum(not r["identical"] for r in rows)
    summary = {"a": args.a, "b": args.b, "models": args.models, "checks": len(rows), "different": n_bad, "rows": rows}
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", f"bitwise{'_' + args.label if args.label else ''}.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{len(rows) - n_bad} of {len(rows)} checks identical; {path}", file=sys.stderr)
    sys.exit(1 if n_bad else 0)


if __name__ == "__main__":
    main()

"""Embeddings: throughput side by side with llama.cpp, and a small retrieval check.

1. Throughput: --batch passages of exactly --tokens tokens each (cut from the bundled public-domain text,
   counted with the model's tokenizer, [CLS] and [SEP] included), embedded in one call, --repeats times;
   embeddings per second, the median. The same texts go to llama.cpp (llama-cpp-python's `embed`, same
   file, same threads) run in --llama-python, in the same run.
2. Retrieval: retrieval_pairs.json (hand-written query/passage pairs on unrelated topics); each query
   ("search_query: " prefix) ranks every passage ("search_document: " prefix) by cosine similarity; the
   figure is how many queries rank their own passage first, and the mean reciprocal rank.

    python benchmarks/embeddings/bench_embed.py nomic-embed-text-v1.5 --llama-python /work/llvenv/bin/python

The figures are printed, and saved as JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from importlib.resources import files

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from results_io import save  # noqa: E402

from edgeinfer import LLM, registry  # noqa: E402
from edgeinfer.system import system_info  # noqa: E402

LLAMA_CHILD = r"""
import json, sys, time, statistics
import llama_cpp
from llama_cpp import Llama
a = json.loads(sys.argv[1])
texts = json.load(open(a["texts"]))
n_batch = a["batch_tokens"]
# one pass of n_batch tokens holds n_batch // tokens-per-text whole texts (llama-cpp-python's embed packs
# texts into a batch while they fit)
llm = Llama(model_path=a["model"], embedding=True, n_ctx=max(n_batch, 2048), n_batch=n_batch, n_ubatch=n_batch,
            n_threads=a["threads"], n_threads_batch=a["threads"], n_seq_max=max(1, min(len(texts), 256)),
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
llm.embed(texts[:2])  # warm-up
times = []
for _ in range(a["repeats"]):
    t = time.perf_counter()
    vecs = llm.embed(texts, normalize=True)
    times.append(time.perf_counter() - t)
tokens = [len(llm.tokenize(t.encode(), add_bos=True)) for t in texts]
print("JSON " + json.dumps({"times": times, "tokens": tokens, "version": llama_cpp.__version__,
                            "system_info": llama_cpp.llama_print_system_info().decode(),
                            "first": [float(x) for x in vecs[0]]}))
"""


def passages(llm: LLM, n: int, tokens: int) -> list[str]:
    """n texts of exactly `tokens` tokens each (with the model's special tokens), from the bundled text."""
    words = files("edgeinfer").joinpath("data/botchan.txt").read_text().split()
    out, w = [], 0
    for _ in range(n):
        lo = w
        hi = lo + tokens  # words are at least a token each: too many, then trimmed
        while len(llm.embed_tokens([" ".join(words[lo:hi])])[0]) > tokens:
            hi -= 1
        text = " ".join(words[lo:hi])
        if len(llm.embed_tokens([text])[0]) != tokens:  # a word of several tokens crossed the line: pad
            text = text + " a" * (tokens - len(llm.embed_tokens([text])[0]))
        assert len(llm.embed_tokens([text])[0]) == tokens
        out.append(text)
        w = hi
    return out


def retrieval(llm: LLM, pairs: list[dict]) -> dict:
    q = llm.embed(["search_query: " + p["query"] for p in pairs])
    d = llm.embed(["search_document: " + p["passage"] for p in pairs])
    sims = q @ d.T
    ranks = [int((sims[i] > sims[i, i]).sum()) + 1 for i in range(len(pairs))]
    return {"pairs": len(pairs), "top1": sum(r == 1 for r in ranks), "mrr": round(float(np.mean([1 / r for r in ranks])), 4),
            "ranks": ranks}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="nomic-embed-text-v1.5")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-python", default=None, help="A Python with llama-cpp-python, for its figures.")
    ap.add_argument("--llama-batches", default="256,512,1024,2048,8192",
                    help="llama.cpp's n_batch = n_ubatch values to try (tokens per pass); its best is compared. "
                         "Its attention spans the whole pass, so a pass of many texts does much masked work.")
    args = ap.parse_args()

    llm = LLM(args.model, threads=args.threads, progress=True)
    texts = passages(llm, args.batch, args.tokens)
    n_tok = args.batch * args.tokens
    llm.embed(texts[:2])  # warm-up
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        ours = llm.embed(texts, batch_tokens=n_tok)
        times.append(time.perf_counter() - t)
    rate = args.batch / statistics.median(times)
    pairs = json.load(open(os.path.join(HERE, "retrieval_pairs.json")))
    result = {"model": args.model, "threads": args.threads, "batch": args.batch, "tokens_per_text": args.tokens,
              "system": system_info(),
              "edgeinfer": {"embeddings_per_s": round(rate, 2), "tokens_per_s": round(rate * args.tokens, 1),
                            "runs_s": [round(x, 3) for x in times], "retrieval": retrieval(llm, pairs)}}
    r = result["edgeinfer"]
    print(f"edgeinfer: {r['embeddings_per_s']:.2f} embeddings/s ({r['tokens_per_s']:.0f} tokens/s), batch {args.batch} "
          f"x {args.tokens} tokens, {args.threads} threads; retrieval top-1 {r['retrieval']['top1']}/{len(pairs)}, "
          f"MRR {r['retrieval']['mrr']}", flush=True)
    if args.llama_python:
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(texts, f)
        del llm
        sweep = {}
        for nb in [int(x) for x in args.llama_batches.split(",")]:
            if nb < args.tokens:
                continue
            a = {"model": str(registry.resolve(args.model, progress=False)), "texts": f.name, "threads": args.threads,
                 "repeats": args.repeats, "batch_tokens": nb}
            p = subprocess.run([args.llama_python, "-c", LLAMA_CHILD, json.dumps(a)], capture_output=True, text=True)
            line = next((x for x in p.stdout.splitlines() if x.startswith("JSON ")), None)
            if p.returncode != 0 or line is None:
                raise SystemExit(f"llama-cpp-python failed:\n{p.stderr[-3000:]}")
            sweep[nb] = json.loads(line[5:])
            print(f"  llama.cpp n_batch {nb}: {args.batch / statistics.median(sweep[nb]['times']):.2f} embeddings/s",
                  flush=True)
        os.unlink(f.name)
        best = max(sweep, key=lambda nb: -statistics.median(sweep[nb]["times"]))
        lc = sweep[best]
        lrate = args.batch / statistics.median(lc["times"])
        cos = float(np.dot(ours[0], lc["first"]) / np.linalg.norm(lc["first"]))
        result["llama_cpp"] = {"embeddings_per_s": round(lrate, 2), "best_n_batch": best,
                               "by_n_batch": {nb: round(args.batch / statistics.median(v["times"]), 3)
                                              for nb, v in sweep.items()},
                               "runs_s": [round(x, 3) for x in lc["times"]],
                               "engine": f"llama-cpp-python {lc['version']}", "system_info": lc["system_info"],
                               "tokens_per_text": sorted(set(lc["tokens"])), "cosine_first_text": round(cos, 6)}
        result["ratio"] = round(rate / lrate, 3)
        print(f"llama.cpp (best n_batch {best}): {lrate:.2f} embeddings/s; edgeinfer / llama.cpp = {result['ratio']:.2f} "
              f"(cosine of the first text's vectors {cos:.5f})")
    save(f"embed-{args.model}", result)


if __name__ == "__main__":
    main()

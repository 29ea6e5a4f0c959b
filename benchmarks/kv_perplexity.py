"""Perplexity with each K/V type pair, edgeinfer against llama.cpp (llama-cpp-python, flash attention on, as a
quantized V needs), on the same tokens, in one run.

    python benchmarks/kv_perplexity.py [--models smollm2-135m-instruct qwen2.5-coder-0.5b-instruct]
        [--types f16 q8_0 q8_0/f16] [--text tests/golden/botchan_a.txt] [--chunks 20] [--ctx 512]

Both score the second half of each chunk of --ctx tokens (llama-perplexity's way: edgeinfer's
`LLM.perplexity_details`; for llama.cpp the same chunks, the first token replaced by BOS where the model adds
one, evaluated with logits for every position), the text tokenized once by edgeinfer. Prints a table of both
perplexities and their ratio per type pair, and writes benchmarks/results/kv_perplexity-*.json.
"""

from __future__ import annotations

import argparse

import numpy as np

import results_io  # benchmarks/results_io.py, beside this script

from gguf import GGMLQuantizationType


def ggml_type(name: str) -> int:
    """A KV type's ggml type id (llama.cpp's -ctk/-ctv)."""
    return int(GGMLQuantizationType[name.upper()])


def llamacpp_ppl(path: str, chunks: list[list[int]], n_ctx: int, kv: str, threads: int) -> float:
    import llama_cpp

    k, _, v = kv.partition("/")
    v = v or k
    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True, flash_attn=True,
                          type_k=ggml_type(k), type_v=ggml_type(v), n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    first = n_ctx // 2
    nll, count = 0.0, 0
    for chunk in chunks:
        llm.reset()  # (the next eval starts at position 0: its KV from there is rewritten)
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:n_ctx], np.float64)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            nll -= row[chunk[j + 1]] - m - np.log(np.exp(row - m).sum())
            count += 1
    return float(np.exp(nll / count))


def main() -> None:
    from edgeinfer import LLM, bench, registry

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
    ap.add_argument("--types", nargs="+", default=["f16", "q8_0", "q8_0/f16", "f16/q8_0"])
    ap.add_argument("--text", default="tests/golden/botchan_a.txt")
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    text = open(args.text, encoding="utf-8").read()
    out = {"system": bench.system_info(), "text": args.text, "ctx": args.ctx, "chunks": args.chunks, "models": {}}
    for model in args.models:
        path = str(registry.resolve(model))
        rows = {}
        for kv in args.types:
            llm = LLM(model, threads=args.threads, kv_type=kv, max_context=args.ctx, progress=False)
            ours = llm.perplexity_details(text, n_ctx=args.ctx, chunks=args.chunks)
            ids = llm.tokenizer.encode(text, add_bos=False)
            chunks = []
            for c in range(ours["chunks"]):
                chunk = list(ids[c * args.ctx:(c + 1) * args.ctx])
                if llm.tokenizer.add_bos and llm.tokenizer.bos_id is not None:
                    chunk[0] = llm.tokenizer.bos_id
                chunks.append(chunk)
            theirs = llamacpp_ppl(path, chunks, args.ctx, kv, args.threads)
            rows[kv] = {"edgeinfer": round(ours["ppl"], 4), "llama_cpp": round(theirs, 4),
                        "ratio": round(ours["ppl"] / theirs, 4)}
            print(f"{model:32} {kv:10} edgeinfer {ours['ppl']:9.4f}  llama.cpp {theirs:9.4f}  "
                  f"ratio {ours['ppl'] / theirs:.4f}", flush=True)
        out["models"][model] = rows
    results_io.save("kv-perplexity", out)


if __name__ == "__main__":
    main()

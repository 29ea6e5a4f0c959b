"""Perplexity with each K/V type pair, edgeinfer against llama.cpp (llama-cpp-python, flash attention on, as a
quantized V needs), on the same tokens, in one run.

    python benchmarks/kv_perplexity.py [--models smollm2-135m-instruct qwen2.5-coder-0.5b-instruct]
        [--types f16 q8_0 q8_0/f16] [--text tests/golden/botchan_a.txt] [--chunks 20] [--ctx 512]

Both score the second half of each chunk of --ctx tokens (llama-perplexity's way: edgeinfer's
`LLM.perplexity_details`; for llama.cpp the same chunks, the first token replaced by BOS where the model adds
one, evaluated with logits for every position), the text tokenized once by edgeinfer. Prints a table of both
perplexities, their ratio with its standard error over the chunks and each chunk's ratio per type pair, and
writes benchmarks/results/kv_perplexity-*.json.
"""

from __future__ import annotations

import argparse

import numpy as np

import results_io  # benchmarks/results_io.py, beside this script

from gguf import GGMLQuantizationType


def ggml_type(name: str) -> int:
    """A KV type's ggml type id (llama.cpp's -ctk/-ctv)."""
    return int(GGMLQuantizationType[name.upper()])


def llamacpp_nll(path: str, chunks: list[list[int]], n_ctx: int, kv: str, threads: int) -> list[float]:
    """llama.cpp's mean negative log-likelihood of each chunk's scored half."""
    import llama_cpp

    k, _, v = kv.partition("/")
    v = v or k
    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True, flash_attn=True,
                          type_k=ggml_type(k), type_v=ggml_type(v), n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    first = n_ctx // 2
    out = []
    for chunk in chunks:
        llm.reset()  # (the next eval starts at position 0: its KV from there is rewritten)
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:n_ctx], np.float64)
        nll = 0.0
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            nll -= row[chunk[j + 1]] - m - np.log(np.exp(row - m).sum())
        out.append(nll / (n_ctx - 1 - first))
    return out


def compare(ours: list[float], theirs: list[float]) -> dict:
    """Both perplexities, their ratio, and the ratio's standard error from the chunks' differences (the spread
    of how far the two runtimes' chunks fall apart): a ratio within two of them of 1 is not a difference the
    chunks show."""
    d = np.asarray(ours) - np.asarray(theirs)
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
    ppl = lambda nll: round(float(np.exp(np.mean(nll))), 4)  # noqa: E731
    return {"edgeinfer": ppl(ours), "llama_cpp": ppl(theirs), "ratio": round(float(np.exp(d.mean())), 4),
            "ratio_se": round(se, 4), "chunk_ratios": [round(float(x), 4) for x in np.exp(d)]}


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
            r = rows[kv] = compare(ours["chunk_nll"], llamacpp_nll(path, chunks, args.ctx, kv, args.threads))
            each = " ".join(f"{x:.3f}" for x in r["chunk_ratios"])
            print(f"{model:32} {kv:10} edgeinfer {r['edgeinfer']:9.4f}  llama.cpp {r['llama_cpp']:9.4f}  "
                  f"ratio {r['ratio']:.4f} ± {r['ratio_se']:.4f}  chunks {each}", flush=True)
        out["models"][model] = rows
    results_io.save("kv-perplexity", out)


if __name__ == "__main__":
    main()

"""Reference outputs from llama.cpp (llama-cpp-python) for given GGUF models: the files in tests/golden.
usage: python benchmarks/make_golden.py MODEL.gguf CASES.json OUT.json

CASES.json has the keys `tokenize` (strings), `greedy` ({"prompt", "special", "n"}), `logits` (prompts) and
`perplexity` ({"file", "n_ctx", "chunks"}, the file relative to CASES.json). An existing reference file
(tests/golden/*.json) also serves as CASES.json: its inputs are read back from it, so re-running it against a
new llama.cpp build or another model asks the same questions. Needs llama-cpp-python; not a test dependency."""
import sys, json, math, numpy as np
from llama_cpp import Llama
model_path, cases_path, out_path = sys.argv[1:4]
cases = json.load(open(cases_path))
if "engine" in cases:  # a reference file: recover the questions it answered
    cases = {"tokenize": [t["text"] for t in cases["tokenize"]],
             "greedy": [{"prompt": g["prompt"], "special": g["parse_special"], "n": 48} for g in cases["greedy"]],
             "logits": [e["prompt"] for e in cases["logits"]],
             "perplexity": {k: cases["perplexity"][k] for k in ("file", "n_ctx", "chunks")}}
llm = Llama(model_path=model_path, n_threads=2, n_ctx=2048, n_batch=512, logits_all=True, verbose=False)
add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else None
out = {"model": model_path.split("/")[-1], "engine": "llama.cpp via llama-cpp-python 0.3.36", "tokenize": [], "greedy": [], "logits": [], "perplexity": None}
for s in cases["tokenize"]:
    ids = llm.tokenize(s.encode(), add_bos=False, special=False)
    ids_sp = llm.tokenize(s.encode(), add_bos=False, special=True)
    out["tokenize"].append({"text": s, "ids": ids, "ids_parse_special": ids_sp,
                            "detok": llm.detokenize(ids).decode("utf-8", errors="replace")})
def bos_ids(text, special):
    return llm.tokenize(text.encode(), add_bos=True, special=special)
for p in cases["greedy"]:
    ids = bos_ids(p["prompt"], p.get("special", False))
    llm.reset(); llm.eval(ids)
    gen = []; margins = []
    for _ in range(p.get("n", 48)):
        logits = np.array(llm.scores[llm.n_tokens - 1])
        t = int(np.argmax(logits)); gen.append(t)
        top2 = np.partition(logits, -2)[-2:]; margins.append(round(float(top2[1] - top2[0]), 4))
        if t == llm.token_eos(): break
        llm.eval([t])
    out["greedy"].append({"prompt": p["prompt"], "parse_special": p.get("special", False), "prompt_ids": ids, "output_ids": gen, "top1_top2_margins": margins,
                          "output_text": llm.detokenize(gen).decode("utf-8", errors="replace")})
for p in cases["logits"]:
    ids = bos_ids(p, False)
    llm.reset(); llm.eval(ids)
    lg = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    top = np.argsort(-lg)[:20]
    lse = float(np.log(np.exp(lg - lg.max()).sum()) + lg.max())
    out["logits"].append({"prompt": p, "prompt_ids": ids, "top_ids": [int(i) for i in top], "top_logits": [float(lg[i]) for i in top], "logsumexp": lse})
# perplexity: llama-perplexity style: chunks of n_ctx tokens, score second half
ppl = cases.get("perplexity")
if ppl:
    import os
    text = open(os.path.join(os.path.dirname(os.path.abspath(cases_path)), ppl["file"])).read()  # relative to CASES.json
    toks = llm.tokenize(text.encode(), add_bos=False, special=False)
    n_ctx = ppl["n_ctx"]; n_chunks = min(ppl["chunks"], len(toks) // n_ctx)
    nll = 0.0; count = 0
    bos = llm.token_bos()
    for c in range(n_chunks):
        chunk = toks[c * n_ctx:(c + 1) * n_ctx]
        if add_bos: chunk = [bos] + chunk[1:]
        llm.reset(); llm.eval(chunk)
        sc = np.array(llm.scores[:n_ctx], dtype=np.float64)
        for i in range(n_ctx // 2, n_ctx - 1):
            row = sc[i]; m = row.max(); lse = m + math.log(np.exp(row - m).sum())
            nll += lse - row[chunk[i + 1]]; count += 1
    out["perplexity"] = {"file": ppl["file"].split("/")[-1], "n_ctx": n_ctx, "chunks": n_chunks, "bos_first": bool(add_bos),
                         "scored": "tokens n_ctx/2 .. n_ctx-1 of each chunk (llama-perplexity style)", "ppl": math.exp(nll / count), "n_scored": count}
json.dump(out, open(out_path, "w"), ensure_ascii=False, indent=1)
print("wrote", out_path, "ppl", out["perplexity"] and out["perplexity"]["ppl"])

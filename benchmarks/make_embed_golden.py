"""Reference embeddings from llama.cpp (llama-cpp-python's `embed`) for an embedding model: the file in
tests/golden that tests/test_golden_embeddings.py compares against.
usage: python benchmarks/make_embed_golden.py MODEL.gguf TEXTS.json OUT.json

TEXTS.json is a list of strings (an existing reference file also serves: its texts are read back). For each
text: llama.cpp's token ids (with the model's special tokens) and its normalised, mean-pooled vector.
Needs llama-cpp-python; not a test dependency."""
import json
import sys

import llama_cpp
from llama_cpp import Llama

model_path, texts_path, out_path = sys.argv[1:4]
texts = json.load(open(texts_path))
if isinstance(texts, dict):  # a reference file: the same texts again
    texts = [c["text"] for c in texts["cases"]]
llm = Llama(model_path=model_path, embedding=True, n_ctx=2048, n_batch=2048, n_ubatch=2048, n_threads=2,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
cases = []
for t in texts:
    ids = llm.tokenize(t.encode(), add_bos=True, special=False)
    vec = llm.embed(t, normalize=True)
    cases.append({"text": t, "ids": ids, "embedding": [round(float(x), 7) for x in vec]})
json.dump({"model": model_path.split("/")[-1], "engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
           "pooling": "mean", "normalize": True, "cases": cases}, open(out_path, "w"), indent=1)
print(f"wrote {len(cases)} embeddings to {out_path}")

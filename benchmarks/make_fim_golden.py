"""Reference fill-in-the-middle outputs from llama.cpp (llama-cpp-python): tests/golden/fim.json.

usage: PYTHONPATH=<llama-cpp-python> python benchmarks/make_fim_golden.py [MODEL.gguf] [OUT.json]
(default: the catalog's qwen2.5-coder-0.5b-instruct, tests/golden/fim.json)

For each case the infill prompt is built as llama.cpp's server builds it for /infill (format_prompt_infill
in tools/server/server-common.cpp), written out here over llama.cpp's own tokenizer and the FIM token ids
its vocabulary loader found (llama_vocab_fim_pre and the rest): the repository chunk, one <|file_sep|>
chunk per input_extra file, the current file's header, then PSM order, with its truncation rule for the
given n_ctx, n_batch and n_predict (-1: llama-server's default). Then llama.cpp's greedy continuation of
those tokens: up to N tokens, stopping on an end-of-generation token (llama_vocab_is_eog), with the gap
between the best two logits at each step. Needs llama-cpp-python; not a test dependency."""

import json
import os
import sys

import llama_cpp
import numpy as np
from llama_cpp import Llama

N = 32
N_CTX, N_BATCH, N_PREDICT = 4096, 2048, -1  # the sizes the prompt is built for (llama-server's defaults)
CASES = [
    {"name": "function_body",
     "input_prefix": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
     "input_suffix": "\n\nif __name__ == \"__main__\":\n    print(fibonacci(10))\n",
     "input_extra": [], "prompt": ""},
    {"name": "with_input_extra",
     "input_prefix": "from geometry import Point, distance\n\n\ndef perimeter(points):\n"
                     "    \"\"\"The length of the closed polygon through points.\"\"\"\n    total = 0.0\n",
     "input_suffix": "\n    return total\n",
     "input_extra": [{"filename": "geometry.py",
                      "text": "from dataclasses import dataclass\nimport math\n\n\n@dataclass\nclass Point:\n"
                              "    x: float\n    y: float\n\n\ndef distance(a: Point, b: Point) -> float:\n"
                              "    return math.hypot(a.x - b.x, a.y - b.y)\n"},
                     {"filename": "README.md", "text": "# geometry\nPoints and distances in the plane.\n"}],
     "prompt": ""},
    {"name": "suffix_only",
     "input_prefix": "",
     "input_suffix": "    return sorted(set(items), key=items.index)\n\n\nprint(unique([3, 1, 3, 2, 1]))\n",
     "input_extra": [], "prompt": ""},
    {"name": "with_prompt",
     "input_prefix": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
     "input_suffix": "\n\n    def pop(self):\n        return self.items.pop()\n",
     "input_extra": [], "prompt": "        self.items"},
]


def main():
    if len(sys.argv) > 1:
        model_path = sys.argv[1]
    else:
        from edgeinfer import registry

        model_path = str(registry.resolve("qwen2.5-coder-0.5b-instruct"))
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "tests",
                                                                   "golden", "fim.json")
    llm = Llama(model_path=model_path, n_threads=2, n_ctx=512, n_batch=512, logits_all=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    fim = {k: int(getattr(llama_cpp, f"llama_vocab_fim_{k}")(vocab))
           for k in ("pre", "suf", "mid", "pad", "rep", "sep")}
    null = -1  # LLAMA_TOKEN_NULL
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))

    def tok(text, special=False):
        return llm.tokenize(text.encode(), add_bos=False, special=special) if text else []

    def infill(case):
        # format_prompt_infill, step by step
        prefix, suffix, prompt = tok(case["input_prefix"]), tok(case["input_suffix"]), tok(case["prompt"], True)
        extra = []
        if fim["rep"] != null:
            extra += [fim["rep"], *tok("myproject\n")]
        for chunk in case["input_extra"]:
            if fim["sep"] != null:
                extra += [fim["sep"], *tok(chunk.get("filename", "tmp") + "\n")]
            else:
                extra += tok("\n\n--- snippet ---\n\n")
            extra += tok(chunk["text"])
        if fim["sep"] != null:
            extra += [fim["sep"], *tok("filename\n")]
        n_prefix_take = min(len(prefix), 3 * (N_BATCH // 4))
        n_suffix_take = min(len(suffix), max(0, N_BATCH // 4 - (2 + len(prompt))))
        n_extra_take = min(max(0, N_CTX - N_BATCH - 2 * N_PREDICT), len(extra))
        prefix = [fim["pre"], *prefix[len(prefix) - n_prefix_take:], *prompt]
        suffix = [fim["suf"], *suffix[:n_suffix_take]]
        inp = ([llm.token_bos()] if add_bos else []) + prefix
        inp = extra[len(extra) - n_extra_take:] + inp
        return inp + suffix + [fim["mid"]]

    out = {"model": os.path.basename(model_path), "engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
           "fim_tokens": fim, "n_ctx": N_CTX, "n_batch": N_BATCH, "n_predict": N_PREDICT, "cases": []}
    for case in CASES:
        ids = infill(case)
        llm.reset()
        llm.eval(ids)
        gen, margins = [], []
        for _ in range(N):
            logits = np.array(llm.scores[llm.n_tokens - 1])
            t = int(np.argmax(logits))
            gen.append(t)
            top2 = np.partition(logits, -2)[-2:]
            margins.append(round(float(top2[1] - top2[0]), 4))
            if llama_cpp.llama_vocab_is_eog(vocab, t):
                break
            llm.eval([t])
        out["cases"].append({**case, "prompt_ids": ids, "output_ids": gen, "top1_top2_margins": margins,
                             "output_text": llm.detokenize(gen).decode("utf-8", errors="replace")})
        print(case["name"], len(ids), repr(out["cases"][-1]["output_text"]))
    with open(out_path, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    main()

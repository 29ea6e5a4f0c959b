"""Quantization quality: perplexity of edgeinfer's and llama.cpp's quantizations of the same F16.

    python benchmarks/quantize_quality.py [--model gemma3-270m] [--text tests/golden/botchan_a.txt] [--chunks 8]

1. F16 by dequantizing the catalog model (edgeinfer quantize-model --type F16);
2. edgeinfer: F16 -> Q4_K_M and F16 -> Q8_0; llama.cpp (llama-cpp-python's llama_model_quantize, when
   installed): F16 -> Q4_K_M;
3. perplexity of every file with edgeinfer (llama-perplexity's method, n_ctx 512), and a load-and-
   generate check of edgeinfer's files in llama.cpp.
Prints a table and writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def llama_cpp_quantize(src: Path, dst: Path, ftype: int) -> bool:
    try:
        import llama_cpp as L
    except ImportError:
        return False
    params = L.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    return L.llama_model_quantize(str(src).encode(), str(dst).encode(), params) == 0


def llama_cpp_loads(path: Path) -> bool | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(str(path), n_ctx=256, verbose=False)
    out = llm("The capital of France is", max_tokens=4, temperature=0)
    return bool(out["choices"][0]["text"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--text", default=str(Path(__file__).resolve().parents[1] / "tests" / "golden" / "botchan_a.txt"))
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--workdir", default="/tmp/edgeinfer-quant")
    args = ap.parse_args()

    from gguf.constants import LlamaFileType as FT

    from edgeinfer import LLM, registry
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.quant.tool import quantize_model

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    src = registry.resolve(args.model)
    files = {"F16": work / "f16.gguf", "edgeinfer Q4_K_M": work / "ei-q4_k_m.gguf", "edgeinfer Q8_0": work / "ei-q8_0.gguf",
             "llama.cpp Q4_K_M": work / "lc-q4_k_m.gguf"}
    with GGUFFile(src) as gf:
        quantize_model(gf, files["F16"], "F16", force=True, warn=lambda m: None)
    with GGUFFile(files["F16"]) as gf:
        quantize_model(gf, files["edgeinfer Q4_K_M"], "Q4_K_M", force=True)
        quantize_model(gf, files["edgeinfer Q8_0"], "Q8_0", force=True)
    if not llama_cpp_quantize(files["F16"], files["llama.cpp Q4_K_M"], int(FT.MOSTLY_Q4_K_M)):
        print("llama-cpp-python is not installed: no llama.cpp quantization to compare with")
        del files["llama.cpp Q4_K_M"]
    text = Path(args.text).read_text(encoding="utf-8")
    rows = {}
    for name, path in files.items():
        t0 = time.perf_counter()
        llm = LLM(str(path), progress=False)
        ppl = llm.perplexity(text, n_ctx=512, chunks=args.chunks)
        rows[name] = {"file": str(path), "mb": round(path.stat().st_size / 1e6, 1), "ppl": round(ppl, 4),
                      "seconds": round(time.perf_counter() - t0, 1)}
        if name.startswith("edgeinfer"):
            rows[name]["loads_in_llama_cpp"] = llama_cpp_loads(path)
        print(name, rows[name], flush=True)
    base = rows["F16"]["ppl"]
    for r in rows.values():
        r["vs_f16_pct"] = round(100 * (r["ppl"] / base - 1), 3)
    if "llama.cpp Q4_K_M" in rows:
        rows["edgeinfer Q4_K_M"]["vs_llama_cpp_q4_k_m_pct"] = round(
            100 * (rows["edgeinfer Q4_K_M"]["ppl"] / rows["llama.cpp Q4_K_M"]["ppl"] - 1), 3)
    print(f"\n{'file':<20}{'MB':>8}{'perplexity':>12}{'vs F16':>9}")
    for name, r in rows.items():
        print(f"{name:<20}{r['mb']:>8.1f}{r['ppl']:>12.4f}{r['vs_f16_pct']:>8.2f}%")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"quantize-quality-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(rows, indent=1))
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()

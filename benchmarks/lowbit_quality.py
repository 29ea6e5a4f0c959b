"""The low-bit types against llama.cpp: sizes, tensor bytes and perplexity of edgeinfer's and llama.cpp's
quantizations of one F16 file, with and without an importance matrix.

    python benchmarks/lowbit_quality.py F16.gguf [--types Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,IQ4_NL,IQ4_XS]
        [--text tests/golden/botchan_a.txt] [--chunks 8] [--imatrix-chunks 16] [--workdir /tmp/edgeinfer-lowbit]

1. The text is split: its first 60% calibrates the importance matrix (`edgeinfer imatrix`), perplexity is
   measured on the rest, which the matrix never saw.
2. For each type: edgeinfer's quantize-model and llama.cpp's llama_model_quantize (llama-cpp-python) of the
   same F16; with the imatrix, edgeinfer's quantize-model --imatrix and llama.cpp's llama_model_quantize with
   the same matrix (passed as llama-quantize passes it: llama_model_imatrix_data, name and in_sum2 / counts).
3. Each file's share of tensors whose bytes equal llama.cpp's file's, its size, and its perplexity measured by
   llama.cpp (llama-perplexity's method: chunks of --ctx tokens, the second half of each scored; a file whose
   tensors are all llama.cpp's file's, byte for byte, takes that file's figure) and, for the files made without
   an imatrix, by edgeinfer. The JSON is rewritten after every file.
Prints a table and writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FTYPE = {"Q2_K": "MOSTLY_Q2_K", "Q3_K_S": "MOSTLY_Q3_K_S", "Q3_K_M": "MOSTLY_Q3_K_M", "Q3_K_L": "MOSTLY_Q3_K_L",
         "IQ4_NL": "MOSTLY_IQ4_NL", "IQ4_XS": "MOSTLY_IQ4_XS", "Q4_K_M": "MOSTLY_Q4_K_M"}


def llama_perplexity(path: Path, text: str, n_ctx: int, chunks: int) -> float:
    """llama-perplexity's number for the file, computed through llama-cpp-python's logits."""
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, logits_all=True, verbose=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))
    toks = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)
    n = min(chunks, len(toks) // n_ctx)
    nll, count = 0.0, 0
    first = n_ctx // 2
    for c in range(n):
        ids = list(toks[c * n_ctx:(c + 1) * n_ctx])
        if add_bos:
            ids[0] = llm.token_bos()
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[:n_ctx], np.float64)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            nll += m + math.log(np.exp(row - m).sum()) - row[toks[c * n_ctx + j + 1]]
            count += 1
    del llm
    return math.exp(nll / count)


def llama_quantize(src: Path, dst: Path, type_name: str, imatrix=None) -> None:
    """llama_model_quantize of src into dst; imatrix: an Imatrix (quant/imatrix.py), handed to llama.cpp as
    llama-quantize hands its own (name, in_sum2 / counts) entries: llama_model_imatrix_data."""
    import ctypes

    import llama_cpp as L
    from gguf.constants import LlamaFileType as FT

    params = L.llama_model_quantize_default_params()
    params.ftype = int(FT[FTYPE[type_name]])
    params.nthread = 2
    keep = []
    if imatrix is not None:
        entries = (L.llama_model_imatrix_data * (len(imatrix.names) + 1))()
        for i, name in enumerate(imatrix.names):
            v = np.ascontiguousarray(imatrix.importance(name), np.float32).reshape(-1)
            keep.append(v)
            entries[i].name = name.encode()
            entries[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = v.size
        entries[len(imatrix.names)].name = None
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(L.llama_model_imatrix_data))
        keep.append(entries)
    if L.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {type_name}")


def same_tensors(a: Path, b: Path) -> float:
    """The share of tensors (by count) whose type and bytes are equal in both files."""
    from edgeinfer.gguf_file import GGUFFile

    with GGUFFile(a) as fa, GGUFFile(b) as fb:
        names = list(fa.tensors)
        same = 0
        for n in names:
            ta, tb = fa.tensors[n], fb.tensors.get(n)
            if tb is not None and ta.ggml_type == tb.ggml_type and np.array_equal(fa.tensor_bytes(n), fb.tensor_bytes(n)):
                same += 1
        return same / len(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("f16")
    ap.add_argument("--types", default="Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,IQ4_NL,IQ4_XS")
    ap.add_argument("--text", default=str(ROOT / "tests" / "golden" / "botchan_a.txt"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--imatrix-chunks", type=int, default=16)
    ap.add_argument("--no-imatrix", action="store_true")
    ap.add_argument("--imatrix-model", default=None,
                    help="the model the imatrix is computed on (default: the F16; a Q8_0 of it is as llama.cpp's docs "
                         "allow and many times faster on the CPU)")
    ap.add_argument("--first", default="Q3_K_M,IQ4_XS,Q2_K", help="types whose imatrix runs come first")
    ap.add_argument("--workdir", default="/tmp/edgeinfer-lowbit")
    args = ap.parse_args()

    from edgeinfer import LLM
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.quant.tool import quantize_model

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    f16 = Path(args.f16)
    text = Path(args.text).read_text(encoding="utf-8")
    cut = int(len(text) * 0.6)
    calib, held_out = text[:cut], text[cut:]
    imx = None
    if not args.no_imatrix:
        (work / "calib.txt").write_text(calib, encoding="utf-8")
        imx = work / "imatrix.gguf"
        if not imx.exists():
            subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "imatrix", args.imatrix_model or str(f16),
                            str(work / "calib.txt"),
                            "-o", str(imx), "--chunks", str(args.imatrix_chunks), "--ctx", str(args.ctx)], check=True)
    rows = {}

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"lowbit-quality-{time.strftime('%Y%m%d-%H%M%S')}.json"

    def save():
        out.write_text(json.dumps({"source": str(f16), "text": args.text, "ctx": args.ctx, "chunks": args.chunks,
                                   "rows": rows}, indent=1))

    def measure(name, path, ref=None, ours_ppl=True):
        t0 = time.perf_counter()
        r = {"file": str(path), "mb": round(path.stat().st_size / 1e6, 2)}
        if ref is not None:
            r["same_tensors_as_llama_cpp"] = round(same_tensors(path, ref), 4)
        if ref is not None and r["same_tensors_as_llama_cpp"] == 1.0:
            # byte for byte llama.cpp's tensors (and types): its measurements are this file's
            r["ppl_llama_cpp"] = rows[ref_name[ref]]["ppl_llama_cpp"]
            r["identical"] = True
        else:
            r["ppl_llama_cpp"] = round(llama_perplexity(path, held_out, args.ctx, args.chunks), 4)
        if ours_ppl:
            llm = LLM(str(path), progress=False)
            r["ppl_edgeinfer"] = round(llm.perplexity(held_out, n_ctx=args.ctx, chunks=args.chunks), 4)
            del llm
        r["seconds"] = round(time.perf_counter() - t0, 1)
        rows[name] = r
        save()
        print(name, r, flush=True)

    ref_name = {}
    measure("F16", f16, ours_ppl=False)  # edgeinfer runs F16 on its float kernels: slow, and no quantizer here
    from edgeinfer.quant.imatrix import Imatrix

    matrix = None
    if imx:
        matrix = Imatrix.load(imx)
        with GGUFFile(f16) as gf:
            matrix.check(gf)
    types = args.types.split(",")
    runs = [(t, False) for t in types] + ([(t, True) for t in sorted(types, key=lambda t: t not in args.first.split(","))]
                                           if imx else [])
    for t, with_imx in runs:
        tag = f"{t}{' imatrix' if with_imx else ''}"
        ours, theirs = work / f"ei-{t}{'-imx' if with_imx else ''}.gguf", work / f"lc-{t}{'-imx' if with_imx else ''}.gguf"
        t0 = time.perf_counter()
        llama_quantize(f16, theirs, t, matrix if with_imx else None)
        t_theirs = time.perf_counter() - t0
        t0 = time.perf_counter()
        with GGUFFile(f16) as gf:
            quantize_model(gf, ours, t, force=True, progress=False, imatrix=matrix if with_imx else None)
        t_ours = time.perf_counter() - t0
        ref_name[theirs] = f"llama.cpp {tag}"
        measure(f"llama.cpp {tag}", theirs, ours_ppl=not with_imx)
        measure(f"edgeinfer {tag}", ours, theirs, ours_ppl=not with_imx)
        rows[f"edgeinfer {tag}"]["quantize_s"] = round(t_ours, 1)
        rows[f"llama.cpp {tag}"]["quantize_s"] = round(t_theirs, 1)
        save()
    print(f"\n{'file':<28}{'MB':>9}{'same':>7}{'ppl llama.cpp':>15}{'ppl edgeinfer':>15}")
    for name, r in rows.items():
        same = f"{r['same_tensors_as_llama_cpp']:.2f}" if "same_tensors_as_llama_cpp" in r else ""
        ours_ppl = f"{r['ppl_edgeinfer']:>15.4f}" if "ppl_edgeinfer" in r else f"{'':>15}"
        print(f"{name:<28}{r['mb']:>9.1f}{same:>7}{r['ppl_llama_cpp']:>15.4f}{ours_ppl}")
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()

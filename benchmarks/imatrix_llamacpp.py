"""edgeinfer's imatrix beside one collected from llama.cpp's own graph, on the same chunks.

llama-cpp-python ships libllama but not the llama-imatrix tool, so this script does what llama-imatrix's
collector does (tools/imatrix/imatrix.cpp, IMatrixCollector::collect_imatrix) through the same hook it
uses: the context's cb_eval callback, which the graph scheduler calls for every node. It asks for every
MUL_MAT_ID and for each MUL_MAT of at least 16 F32 rows whose weight is a `blk.*` tensor (or
output.weight, with --process-output), and sums the squares of each one's input (src[1]) per column,
per expert for MUL_MAT_ID as its ids route the tokens. The chunks are edgeinfer's (calibration_chunks:
llama-imatrix's rule), each a fresh sequence with logits for every token, as llama-imatrix asks.

    python benchmarks/imatrix_llamacpp.py MODEL TEXT [--ctx 512] [--chunks 2] [--process-output] [-o F]
    python benchmarks/imatrix_llamacpp.py --golden tests/golden/imatrix_llamacpp.json   (from the repo root)

prints, per tensor, the relative L1 difference of the two importances and fails (exit 1) if a tensor is
in one and not the other, differs by more than --rtol (default 0.05: both quantize activations, so the
runs differ by rounding), or has more than 1% of its tokens routed to other experts (a near-tie in the
router may flip one). -o also writes llama.cpp's side as an imatrix file. --golden writes, for the tiny
models of golden_cases, llama.cpp's counts and importances (each row's sum and first columns) with the
chunks and the model files' sha256, for tests/test_imatrix.py. Needs llama-cpp-python (a tool, not a
dependency of the project or its tests).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np


class GGMLTensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h) as of ggml 0.25; checked against ggml_get_name's offset at start."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def tensor(ptr) -> GGMLTensor:
    return GGMLTensor.from_address(ptr)


def view(t: GGMLTensor, dtype) -> np.ndarray:
    """A copy of a tensor's data (host memory: the CPU backend) as numpy, ggml's dimensions reversed."""
    item = np.dtype(dtype).itemsize
    span = sum((t.ne[i] - 1) * t.nb[i] for i in range(4)) + item
    base = np.frombuffer((ctypes.c_char * span).from_address(t.data), dtype, count=span // item)
    return np.lib.stride_tricks.as_strided(base, shape=tuple(reversed(list(t.ne))),
                                           strides=tuple(reversed(list(t.nb)))).copy()


def weight_name(raw: bytes) -> str:
    # llama.cpp's filter_tensor_name: "CUDA0#blk.0.attn_k.weight#0" -> "blk.0.attn_k.weight"
    name = raw.decode()
    if "#" in name:
        name = name.split("#")[1]
    return name


def llamacpp_imatrix(model_path: str, chunks: list[list[int]], process_output: bool, n_ctx: int):
    import llama_cpp as L

    from edgeinfer.quant.imatrix import Imatrix

    lib = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml-base.so"))
    lib.ggml_op_name.restype = ctypes.c_char_p
    lib.ggml_op_name.argtypes = [ctypes.c_int]
    lib.ggml_get_name.restype = ctypes.c_void_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    ops = {}

    def op_name(op: int) -> str:
        if op not in ops:
            ops[op] = lib.ggml_op_name(op).decode()
        return ops[op]

    im = Imatrix(chunk_size=len(chunks[0]))
    checked = []
    F32 = 0  # GGML_TYPE_F32

    def collect(t_ptr, ask, _user):
        t = tensor(t_ptr)
        if not checked:  # the struct layout is this ggml's
            assert lib.ggml_get_name(t_ptr) - t_ptr == GGMLTensor.name.offset, "ggml_tensor layout differs"
            checked.append(True)
        op = op_name(t.op)
        if op not in ("MUL_MAT", "MUL_MAT_ID"):
            return False
        src0, src1 = tensor(t.src[0]), tensor(t.src[1])
        name = weight_name(src0.name)
        if ask:
            if op == "MUL_MAT_ID":
                return True
            if src1.ne[1] < 16 or src1.type != F32:
                return False
            return name.startswith("blk.") or (process_output and name == "output.weight")
        x = view(src1, np.float32)  # (ne3, ne2, ne1, ne0)
        if op == "MUL_MAT_ID":
            ids = view(tensor(t.src[2]), np.int32)[0, 0]  # (n_tokens, n_used)
            n_as = src0.ne[2]
            for tok in range(ids.shape[0]):
                for slot in range(ids.shape[1]):
                    ex = int(ids[tok, slot])
                    row = np.asarray(x[0, tok, slot % src1.ne[1]], np.float32)[None]
                    im.accumulate(name, row, ex, n_as)
        else:
            im.accumulate(name, np.asarray(x, np.float32).reshape(-1, src1.ne[0]))
        return True

    cb = L.ggml_backend_sched_eval_callback(collect)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    cp = L.llama_context_default_params()
    n = len(chunks[0])
    cp.n_batch = cp.n_ubatch = n
    cp.n_ctx = max(n, n_ctx)  # edgeinfer's context (LongRoPE files choose their factors by it)
    cp.cb_eval = cb
    cp.n_threads = cp.n_threads_batch = os.cpu_count() or 1
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(n, 0, 1)
    for chunk in chunks:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        batch.n_tokens = n
        for i, tok in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True  # every token an output, as llama-imatrix asks
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return im


def compare(ours, ref, rtol: float, show: bool = True) -> list[str]:
    """The tensors that differ beyond rounding (see the docstring); prints each tensor's difference."""
    bad = sorted(set(ours.names) ^ set(ref.names))
    for name in bad:
        print(f"{name}: only in {'edgeinfer' if name in ours else 'llama.cpp'}")
    worst = 0.0
    for name in sorted(set(ours.names) & set(ref.names)):
        x, y = ours.importance(name), ref.importance(name)
        moved = int(np.abs(ours.entries[name].counts - ref.entries[name].counts).sum()) // 2
        d = float(np.abs(x - y).sum() / max(np.abs(y).sum(), 1e-30))
        worst = max(worst, d)
        if show:
            counts = f"DIFFER ({moved} tokens routed elsewhere)" if moved else "equal"
            print(f"{name:<40} {'x'.join(map(str, x.shape)):>9}  counts {counts}  relative L1 difference {d:.2e}")
        if moved > 0.01 * ours.entries[name].counts.sum() or d > rtol:  # a near-tie in the router may flip one
            bad.append(name)
    print(f"{len(ours)} tensors (edgeinfer), {len(ref)} (llama.cpp); worst relative difference {worst:.2e}")
    return bad


# -- tests/golden/imatrix_llamacpp.json --------------------------------------------------------------

GOLDEN_TEXT = "tests/golden/botchan_a.txt"
HEAD = 32  # the columns of each matrix row the golden file keeps in full (and every row's sum)


def golden_cases():
    """(name, writer(path), n_ctx, chunks, process_output): the tiny llama of tests/tiny_models.py (Q8_0,
    untied output) and the zoo's qwen2moe (experts and a shared expert) and phi3 (fused q/k/v, gate/up)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "tests"))
    import arch_zoo
    from tiny_models import write_tiny_llama

    return [("tiny_llama_q8_0_untied", lambda p: write_tiny_llama(p, tied=False), 32, 3, True),
            ("qwen2moe", lambda p: arch_zoo.write("qwen2moe", p), 64, 2, False),
            ("phi3", lambda p: arch_zoo.write("phi3", p), 64, 2, False)]


def make_golden(out: str) -> None:
    import hashlib
    import json
    import tempfile

    import llama_cpp

    from edgeinfer import LLM
    from edgeinfer.imatrix import calibration_chunks

    text = open(GOLDEN_TEXT, encoding="utf-8").read()
    r = lambda v: float(f"{v:.5g}")  # noqa: E731
    cases = {}
    with tempfile.TemporaryDirectory() as d:
        for name, write, n_ctx, n_chunks, process_output in golden_cases():
            path = os.path.join(d, f"{name}.gguf")
            write(path)
            llm = LLM(path, progress=False)
            chunks = calibration_chunks(llm, text, n_ctx, n_chunks)
            ref = llamacpp_imatrix(path, chunks, process_output, llm.engine.max_context)
            ref.check(llm.gguf.tensors)
            tensors = {}
            for t in ref.names:
                imp = ref.importance(t)
                tensors[t] = {"counts": [int(c) for c in ref.entries[t].counts], "row_sums": [r(v) for v in imp.sum(1)],
                              "head": [[r(v) for v in row[:HEAD]] for row in imp]}
            cases[name] = {"sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(), "n_ctx": n_ctx,
                           "process_output": process_output, "context": llm.engine.max_context,
                           "chunks": chunks, "tensors": tensors}
            print(f"{name}: {len(tensors)} tensors")
    doc = {"made_by": "benchmarks/imatrix_llamacpp.py --golden", "llama_cpp_python": llama_cpp.__version__,
           "text": GOLDEN_TEXT, "head_columns": HEAD, "cases": cases}
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("text", nargs="?")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--process-output", action="store_true")
    ap.add_argument("--rtol", type=float, default=0.05)
    ap.add_argument("-o", "--output", default=None)
    ap.add_argument("--golden", metavar="OUT.json", default=None,
                    help="write llama.cpp's side of the golden cases (tests/golden/imatrix_llamacpp.json)")
    a = ap.parse_args()
    if a.golden:
        make_golden(a.golden)
        return 0
    if not (a.model and a.text):
        ap.error("give MODEL and TEXT (or --golden OUT.json)")
    from edgeinfer import LLM
    from edgeinfer.imatrix import calibration_chunks, collect

    llm = LLM(a.model, progress=False)
    text = open(a.text, encoding="utf-8").read()
    chunks = calibration_chunks(llm, text, a.ctx, a.chunks)
    ours = collect(llm, text, n_ctx=a.ctx, chunks=a.chunks, process_output=a.process_output)
    ref = llamacpp_imatrix(str(llm.path), chunks, a.process_output, llm.engine.max_context)
    ref.check(llm.gguf.tensors)
    if a.output:
        ref.datasets.append(a.text)
        ref.save(a.output, chunk_size=a.ctx)
    return 1 if compare(ours, ref, a.rtol) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Reference image embeddings and prompts from llama.cpp's libmtmd (llama-cpp-python) for the random text +
projector pairs of tests/vision_zoo.py: tests/golden/vision.json.
usage: python benchmarks/make_vision_golden.py [OUT.json]        (default tests/golden/vision.json)

For each family: write the pair to a temp dir (recording both files' sha256, so a test can check that its own
freshly written files are the ones these numbers belong to), open the text model (llama.cpp, 2 threads) and the
projector (mtmd_init_from_file, CPU, default parameters: flash attention on, as users get it), and for each test
image (vision_zoo.test_image at several sizes: the encoder's native size, smaller, larger, wide, tall) tokenize the
prompt "A<__media__>B" (add_special, parse_special) and keep every chunk: a text chunk's token ids, an image
chunk's embedding rows (mtmd_encode_chunk, mtmd_get_output_embd; rounded to 6 digits), its n_tokens and n_pos
and whether libmtmd decodes it non-causally; then evaluate the whole prompt (mtmd_helper_eval_chunks) and keep
the top-20 ids and logits of the last position and the row's log-sum-exp.

Needs llama-cpp-python (built with its mtmd library) and the repository's tests directory; not a test dependency.
Run it from the repository root."""
import ctypes
import hashlib
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import llama_cpp  # noqa: E402
import llama_cpp.mtmd_cpp as mtmd  # noqa: E402
import vision_zoo  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "golden", "vision.json")
SIZES = [(64, 64), (48, 48), (100, 100), (120, 70), (50, 90)]  # (width, height): native, smaller, larger, wide, tall
TOP = 20
R = lambda x: round(float(x), 6)  # noqa: E731


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def run_family(family: str, folder: str) -> dict:
    text, proj = vision_zoo.write_pair(family, folder)
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(text.encode(), mp)
    assert model, text
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
    cp.n_threads = cp.n_threads_batch = 2
    lctx = llama_cpp.llama_init_from_model(model, cp)
    p = mtmd.mtmd_context_params_default()
    p.use_gpu, p.n_threads, p.print_timings = False, 2, False
    mctx = mtmd.mtmd_init_from_file(proj.encode(), model, p)
    assert mctx, proj
    n_embd = llama_cpp.llama_model_n_embd_inp(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    cases = []
    for (w, h) in SIZES:
        rgb = vision_zoo.test_image(h, w)
        buf = (ctypes.c_uint8 * rgb.size).from_buffer_copy(np.ascontiguousarray(rgb).tobytes())
        bmp = mtmd.mtmd_bitmap_init(w, h, buf)
        prompt = ("A" + mtmd.mtmd_default_marker().decode() + "B").encode()
        txt = mtmd.mtmd_input_text(prompt, len(prompt), True, True)
        chunks = mtmd.mtmd_input_chunks_init()
        bmps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bmp)
        assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(txt), bmps, 1) == 0
        out = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            ch = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(ch) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                tp = mtmd.mtmd_input_chunk_get_tokens_text(ch, ctypes.byref(n))
                out.append({"text": [int(tp[j]) for j in range(n.value)]})
            else:
                nt = mtmd.mtmd_input_chunk_get_n_tokens(ch)
                assert mtmd.mtmd_encode_chunk(mctx, ch) == 0
                emb = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(mctx), shape=(nt, n_embd)).copy()
                out.append({"image": [[R(v) for v in row] for row in emb], "n_pos": int(mtmd.mtmd_input_chunk_get_n_pos(ch)),
                            "non_causal": bool(mtmd.mtmd_decode_use_non_causal(mctx, ch))})
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(lctx), True)
        n_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, cp.n_batch, True, ctypes.byref(n_past)) == 0
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).astype(np.float64)
        top = np.argsort(-logits, kind="stable")[:TOP]
        lse = float(logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        cases.append({"size": [w, h], "chunks": out, "n_past": int(n_past.value),
                      "last": {"ids": [int(t) for t in top], "logits": [R(logits[t]) for t in top], "lse": R(lse)}})
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bmp)
    mtmd.mtmd_free(mctx)
    llama_cpp.llama_free(lctx)
    llama_cpp.llama_model_free(model)
    return {"text_sha256": sha256(text), "mmproj_sha256": sha256(proj), "cases": cases}


def main():
    llama_cpp.llama_backend_init()
    out = {"engine": f"llama.cpp's libmtmd via llama-cpp-python {llama_cpp.__version__} (CPU, 2 threads)",
           "prompt": "A<__media__>B", "families": {}}
    with tempfile.TemporaryDirectory() as d:
        for family in vision_zoo.PAIRS:
            out["families"][family] = run_family(family, d)
            print(family, "ok", flush=True)
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()

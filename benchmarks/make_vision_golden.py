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
the top-20 ids and logits of the last position and the row's log-sum-exp, then a greedy continuation of 8 tokens
(argmax, one llama_decode each, not stopped at EOS) with the top1-top2 margin of each step.

"pixels": the preprocessing alone, byte for byte. A projector with no layers and identity matrices (patch 4, the
zoo's image size, mean, std and longest edge; gemma3's with one more channel of constant K so the RMS norm can be
undone, and pooling 1) makes libmtmd output each encoder input it built; inverted to bytes (exact: the half-float
rounding of a normalised value is under a tenth of a level) they are recorded as sha256 of each (H, W, 3) uint8
input, in libmtmd's order, for noise images (the hardest case for a resampler) of several sizes.

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
from gguf.constants import GGMLQuantizationType  # noqa: E402

F32 = GGMLQuantizationType.F32

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "golden", "vision.json")
SIZES = [(64, 64), (48, 48), (100, 100), (120, 70), (50, 90)]  # (width, height): native, smaller, larger, wide, tall
TOP, N_GEN = 20, 8
R = lambda x: round(float(x), 6)  # noqa: E731


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def mtmd_chunks(mctx, rgb: np.ndarray, prompt: bytes, add_special: bool = False):
    """libmtmd's chunks of prompt (a media marker where the image goes) with one RGB image (H, W, 3) uint8:
    (chunks, bitmap), both to be freed."""
    h, w = rgb.shape[:2]
    buf = (ctypes.c_uint8 * rgb.size).from_buffer_copy(np.ascontiguousarray(rgb).tobytes())
    bmp = mtmd.mtmd_bitmap_init(w, h, buf)
    txt = mtmd.mtmd_input_text(prompt, len(prompt), add_special, True)
    chunks = mtmd.mtmd_input_chunks_init()
    assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(txt), (mtmd.mtmd_bitmap_p_ctypes * 1)(bmp), 1) == 0
    return chunks, bmp


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
        prompt = ("A" + mtmd.mtmd_default_marker().decode() + "B").encode()
        chunks, bmp = mtmd_chunks(mctx, vision_zoo.test_image(h, w), prompt, add_special=True)
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
                out.append({"image": [[R(v) for v in row] for row in emb],
                            "n_pos": int(mtmd.mtmd_input_chunk_get_n_pos(ch)),
                            "non_causal": bool(mtmd.mtmd_decode_use_non_causal(mctx, ch))})
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(lctx), True)
        n_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, cp.n_batch, True, ctypes.byref(n_past)) == 0
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).astype(np.float64)
        top = np.argsort(-logits, kind="stable")[:TOP]
        lse = float(logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        greedy, margins, row = [], [], logits
        for _ in range(N_GEN):
            order = np.argsort(-row, kind="stable")
            greedy.append(int(order[0]))
            margins.append(R(row[order[0]] - row[order[1]]))
            tok = (llama_cpp.llama_token * 1)(order[0])
            assert llama_cpp.llama_decode(lctx, llama_cpp.llama_batch_get_one(tok, 1)) == 0
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).astype(np.float64)
        cases.append({"size": [w, h], "chunks": out, "n_past": int(n_past.value),
                      "last": {"ids": [int(t) for t in top], "logits": [R(logits[t]) for t in top], "lse": R(lse)},
                      "greedy": {"output_ids": greedy, "top1_top2_margins": margins}})
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bmp)
    mtmd.mtmd_free(mctx)
    llama_cpp.llama_free(lctx)
    llama_cpp.llama_model_free(model)
    return {"text_sha256": sha256(text), "mmproj_sha256": sha256(proj), "cases": cases}


PIX_SIZES = [(64, 64), (100, 37), (37, 100), (131, 257), (250, 40), (17, 23)]  # (width, height)
PIX_P, PIX_K = 4, 30.0


def write_pixel_projector(family: str, path: str, preproc: bool = True) -> int:
    """The identity projector of `family` (see the docstring); returns the text width it needs."""
    import gguf

    p = PIX_P
    c = 3 * p * p + (1 if family == "gemma3" else 0)
    s = 1 if family == "gemma3" else 2
    d = -(-(c * s * s) // 4) * 4
    w = gguf.GGUFWriter(path, "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", family)
    keys = [("embedding_length", c), ("feed_forward_length", c), ("block_count", 0), ("attention.head_count", 1),
            ("projection_dim", d), ("image_size", 64), ("patch_size", p), ("projector.scale_factor", s)]
    if family == "idefics3" and preproc:  # without: libmtmd's other preprocessing (older SmolVLM files)
        keys.append(("preproc_image_size", 128))
    for k, v in keys:
        w.add_uint32("clip.vision." + k, v)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.45, 0.4])
    w.add_array("clip.vision.image_std", [0.5, 0.55, 0.6])
    w.add_bool("clip.use_gelu", True)
    pe = np.zeros((c, 3 * p * p), np.float32)
    pe[:3 * p * p] = np.eye(3 * p * p)
    w.add_tensor("v.patch_embd.weight", pe.reshape(c, 3, p, p))
    if family == "gemma3":
        b = np.zeros(c, np.float32)
        b[-1] = PIX_K
        w.add_tensor("v.patch_embd.bias", b)
        proj = np.zeros((c, d), np.float32)
        proj[:, :c] = np.eye(c)
        w.add_tensor("mm.input_projection.weight", proj)
        w.add_tensor("mm.soft_emb_norm.weight", np.ones(c, np.float32))
    else:
        fc = np.zeros((d, c * s * s), np.float32)
        fc[:c * s * s] = np.eye(c * s * s)
        w.add_tensor("mm.model.fc.weight", fc)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d


def pixels(family: str, folder: str, preproc: bool = True) -> list:
    proj = os.path.join(folder, f"{family}-pixels{'' if preproc else '-fallback'}.gguf")
    d = write_pixel_projector(family, proj, preproc)
    text = os.path.join(folder, f"{family}-pixels-text.gguf")
    vision_zoo.write_tiny_llama(text, dim=d, n_head=1, n_kv=1, qtype=F32, embd_type=F32,
                                extra_specials=vision_zoo.IDEFICS3_SPECIALS + ("\n\n",))
    model = llama_cpp.llama_model_load_from_file(text.encode(), llama_cpp.llama_model_default_params())
    p = mtmd.mtmd_context_params_default()
    p.use_gpu, p.n_threads, p.print_timings, p.flash_attn_type = False, 2, False, 0
    mctx = mtmd.mtmd_init_from_file(proj.encode(), model, p)
    assert mctx, proj
    mean, std = np.array([0.5, 0.45, 0.4]), np.array([0.5, 0.55, 0.6])
    side, c = 64 // PIX_P, 3 * PIX_P * PIX_P
    out = []
    for (w, h) in PIX_SIZES:
        rgb = np.random.default_rng(w * 1000 + h).integers(0, 256, (h, w, 3), dtype=np.uint8)
        chunks, bmp = mtmd_chunks(mctx, rgb, mtmd.mtmd_default_marker())
        digests = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            ch = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(ch) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                continue
            nt = mtmd.mtmd_input_chunk_get_n_tokens(ch)
            assert mtmd.mtmd_encode_chunk(mctx, ch) == 0
            e = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(mctx), shape=(nt, d)).astype(np.float64)
            if family == "gemma3":  # undo the RMS norm by the constant channel
                patches = e[:, :c] * (PIX_K / e[:, c])[:, None]
            else:  # undo the pixel shuffle (2 x 2 blocks of patches in a row)
                z = e[:, :4 * c].reshape(side // 2, side // 2, 2, 2, c)
                patches = z.transpose(0, 2, 1, 3, 4).reshape(side * side, c)
            img = patches.reshape(side, side, 3, PIX_P, PIX_P).transpose(0, 3, 1, 4, 2).reshape(64, 64, 3)
            u8 = np.rint((img * std + mean) * 255.0)
            assert np.all((u8 >= 0) & (u8 <= 255))
            digests.append(hashlib.sha256(u8.astype(np.uint8).tobytes()).hexdigest())
        out.append({"size": [w, h], "inputs": digests})
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bmp)
    mtmd.mtmd_free(mctx)
    llama_cpp.llama_model_free(model)
    return out


def main():
    llama_cpp.llama_backend_init()
    out = {"engine": f"llama.cpp's libmtmd via llama-cpp-python {llama_cpp.__version__} (CPU, 2 threads)",
           "prompt": "A<__media__>B", "families": {}}
    with tempfile.TemporaryDirectory() as d:
        for family in vision_zoo.PAIRS:
            out["families"][family] = run_family(family, d)
            out["families"][family]["pixels"] = pixels(family, d)
            if family == "idefics3":
                out["families"][family]["pixels_fallback"] = pixels(family, d, preproc=False)
            print(family, "ok", flush=True)
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()

"""Encoding one image: edgeinfer's vision encoder against llama.cpp's libmtmd (llama-cpp-python), side by side.

    python benchmarks/vision_encode.py [--shapes smolvlm gemma3] [--rounds 3] [--threads 2]

Random projectors of the released models' encoder shapes (tests/vision_zoo.py: SmolVLM-256M's SigLIP-base at 512
pixels, 1,024 patches -> 64 rows; Gemma 3 4B's SigLIP-so400m at 896 pixels, 4,096 patches -> 256 rows), F16 as
released, each beside a tiny text model of the projector's output width (libmtmd needs one). One native-size image
(one tile). Each round runs each engine in a process of its own, alternating (in one process, one engine's
threads still spinning after its encode slow the other's): a warm-up encode, then the median of three; the table
gives the median over rounds.
Ours: VisionEncoder.encode on the preprocessed tile (what a request pays once its image is decoded). llama.cpp's:
mtmd_encode_chunk of the image's chunk (its preprocessing done at tokenize). Results: a table and
benchmarks/results/vision_encode-*.json. Needs llama-cpp-python with its mtmd library."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import vision_zoo  # noqa: E402
from results_io import save  # noqa: E402

SHAPES = {"smolvlm": (vision_zoo.write_smolvlm_bench_mmproj, 576, 512),
          "gemma3": (vision_zoo.write_gemma3_bench_mmproj, 2560, 896)}


def llama_side(proj: str, text: str, side: int, threads: int):
    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(text.encode(), llama_cpp.llama_model_default_params())
    p = mtmd.mtmd_context_params_default()
    p.use_gpu, p.n_threads, p.print_timings = False, threads, False
    ctx = mtmd.mtmd_init_from_file(proj.encode(), model, p)
    assert ctx, proj
    from make_vision_golden import mtmd_chunks

    chunks, _ = mtmd_chunks(ctx, vision_zoo.test_image(side, side), mtmd.mtmd_default_marker())
    image = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))
             if mtmd.mtmd_input_chunk_get_type(mtmd.mtmd_input_chunks_get(chunks, i)) == 1]

    def run():
        t0 = time.perf_counter()
        for ch in image[:1]:  # the first tile (for gemma3: the image)
            assert mtmd.mtmd_encode_chunk(ctx, ch) == 0
        return time.perf_counter() - t0
    return run


def our_side(proj: str, side: int, threads: int):
    from edgeinfer import images
    from edgeinfer.kernels import get_backend
    from edgeinfer.models.clip import VisionEncoder

    kb = get_backend("cpu")
    kb.set_threads(threads)
    enc = VisionEncoder(proj, kb)
    x = images.prepare(images.from_rgb(vision_zoo.test_image(side, side)), enc.cfg).inputs[0]

    def run():
        t0 = time.perf_counter()
        enc.encode(x)
        return time.perf_counter() - t0
    return run


def one(engine: str, proj: str, text: str, side: int, threads: int) -> float:
    run = our_side(proj, side, threads) if engine == "ours" else llama_side(proj, text, side, threads)
    run()  # warm-up: compile, first touch
    return statistics.median(run() for _ in range(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", nargs=4, metavar=("ENGINE", "PROJ", "TEXT", "SIDE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        engine, proj, text, side = args.one
        print("SECONDS", one(engine, proj, text, int(side), args.threads), flush=True)
        return
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for shape in args.shapes:
            write, text_dim, side = SHAPES[shape]
            proj, text = f"{d}/{shape}-mmproj.gguf", f"{d}/{shape}-text.gguf"
            write(proj)
            vision_zoo.write_tiny_llama(text, dim=text_dim, n_head=8, n_kv=8, n_layer=1, ffn=256)

            def timed(engine):
                out = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--one", engine, proj,
                                      text, str(side)], capture_output=True, text=True, check=True).stdout
                return float(out.split("SECONDS")[-1])
            t_ours, t_llama = [], []
            for _ in range(args.rounds):
                t_ours.append(timed("ours"))
                t_llama.append(timed("llama"))
            a, b = statistics.median(t_ours), statistics.median(t_llama)
            rows.append({"shape": shape, "ours_s": round(a, 4), "llama_cpp_s": round(b, 4), "ratio": round(b / a, 3),
                         "ours_all": [round(t, 4) for t in t_ours], "llama_cpp_all": [round(t, 4) for t in t_llama]})
            print(f"{shape:8s} ours {a:7.3f} s  llama.cpp {b:7.3f} s  ({b / a:.2f}x)", flush=True)
    save("vision_encode", {"threads": args.threads, "rounds": args.rounds, "results": rows})


if __name__ == "__main__":
    main()

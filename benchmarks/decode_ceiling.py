"""How close decode is to what the memory allows: this machine's read bandwidth, each model's weight bytes
per decode token, and the matmuls of one step (every layer's, a mixture of experts' k chosen experts', and
the output's, in order, read from DRAM) for 1 to 8 tokens.

A decode step reads every weight once, so bytes per token / read bandwidth is the fastest decode can be
(the "ceiling"); the matmul pass at 1 token against it says how much of the step the kernels' arithmetic
still costs, the passes at 2-8 tokens what a small batch (several streams, a speculative verification)
adds to one token, and a real decode step (one stream, timed alternately with the 1-token pass) what
everything that is not a matmul costs (attention, norms, RoPE, quantizing activations, launching the
parallel regions):

    python benchmarks/decode_ceiling.py --models qwen2.5-coder-1.5b-instruct --threads 2

The read bandwidth is a streaming read of 1 GiB with the kernels' own 32-byte loads (a vpmaddubsw per
two, so it cannot be optimised away), per thread count, median of 7. Results: a table and
benchmarks/results/decode_ceiling-*.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from results_io import save

MODELS = ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma3-270m"]
TOKENS = (1, 2, 4, 8)


def read_bandwidth(threads: int, nbytes: int = 2**30, repeats: int = 7) -> float:
    """GB/s of a streaming read of nbytes by `threads` threads."""
    import numba
    from numba import njit, prange

    from edgeinfer.kernels.cpu import simd

    @njit(parallel=True, cache=False)
    def read(a, nt):
        per = a.size // nt // 128 * 128
        out = np.zeros(nt, np.float32)
        for t in prange(nt):
            acc = simd.zero32()
            for o in range(t * per, (t + 1) * per, 128):
                acc = simd.add32(acc, simd.madd(simd.maddubs(simd.load32(a, o), simd.load32(a, o + 32)), simd.ones16()))
                acc = simd.add32(acc, simd.madd(simd.maddubs(simd.load32(a, o + 64), simd.load32(a, o + 96)),
                                                simd.ones16()))
            out[t] = simd.hsum_f(simd.cvt8(acc))
        return out

    a = np.ones(nbytes, np.uint8)
    numba.set_num_threads(threads)
    read(a, threads)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        read(a, threads)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def step_matrices(model, seed: int = 0) -> list[tuple[str, object]]:
    """(name, matrix) of every quantized matrix a decode step reads, once each, in the order it reads them: each
    layer's attention or recurrent mixer's projections, its FFN (a mixture-of-experts layer's: the experts one
    token picks, k of them drawn at random, seeded), then the output matrix. Float tensors (norms, a router's
    dim x n_expert float32 matrix, convolution taps) are left out: a few percent of a step's bytes at most."""
    from edgeinfer.kernels.cpu.parts import attention, deltanet, ffn, mamba2, per_layer, shortconv

    rng = np.random.default_rng(seed)
    out = []
    for i, lw in enumerate(model.layers):
        seen = set()  # a name in two parts' lists (ssm_out: the delta net's and Mamba2's) is one matrix
        for part in (attention, shortconv, deltanet, mamba2, ffn, per_layer):
            for f in part.MATS:
                w = getattr(lw, f, None)
                if w is not None and hasattr(w, "nbytes") and f not in seen:
                    seen.add(f)
                    out.append((f"{f}.{i}", w))
            if part is ffn and getattr(lw, "exp_gate", None):
                k = int(model.cfg.n_expert_used)
                for e in sorted(rng.choice(len(lw.exp_gate), k, replace=False)):
                    out += [(f"exp_{f}.{i}.{e}", getattr(lw, f"exp_{f}")[e]) for f in ("gate", "up", "down")]
    out.append(("output", model.output))
    return out


def type_name(w) -> str:
    return getattr(getattr(w, "ggml_type", None), "name", "F32")


def matmul_pass(kb, mats, tokens: int, repeats: int = 5) -> tuple[float, dict[str, float]]:
    """Median seconds of one pass over mats for `tokens` tokens, and its split by (matrix, type)."""
    rng = np.random.default_rng(0)
    xs, outs = {}, {}
    for name, w in mats:
        k = w.shape[1]
        if k not in xs:
            qx = kb.quantize_input(rng.standard_normal((tokens, k)).astype(np.float32))
            qx.q8(), qx.q8k()
            xs[k] = qx
        outs[name] = np.empty((tokens, w.shape[0]), np.float32)
    totals, split = [], {}
    for r in range(repeats + 1):  # the first pass warms up
        t0 = time.perf_counter()
        for name, w in mats:
            a = time.perf_counter()
            kb.matmul(w, xs[w.shape[1]], outs[name])
            if r:
                key = f"{name.split('.')[0]} {type_name(w)}"
                split[key] = split.get(key, 0.0) + (time.perf_counter() - a) / repeats
        if r:
            totals.append(time.perf_counter() - t0)
    return statistics.median(totals), split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    args = ap.parse_args()

    from edgeinfer import LLM
    from edgeinfer import bench as eb
    from edgeinfer.kernels.cpu import backend, simd
    from edgeinfer.system import cpu_name, path_label

    bw = {n: read_bandwidth(n) for n in sorted({1, args.threads})}
    ceiling = bw[args.threads]
    report = {"cpu": cpu_name(), "kernel_path": backend.KERNEL_PATH, "small_kernel_path": backend.SMALL_PATH,
              "small_tokens": simd.SMALL_TOKENS,
              "small_tokens_k_quants": simd.SMALL_TOKENS_KX8, "threads": args.threads,
              "read_gb_s": {str(k): v for k, v in bw.items()}, "models": {}}
    print(f"{cpu_name()}, kernel path {path_label(report)}")
    print("read bandwidth: " + ", ".join(f"{n} thread{'s' * (n > 1)} {v:.1f} GB/s" for n, v in bw.items()))
    for name in args.models:
        llm = LLM(name, threads=args.threads, progress=False)
        mats = step_matrices(llm.model)
        nbytes = sum(w.nbytes for _, w in mats)
        backend.set_threads(args.threads)
        print(f"\n{name}: {nbytes / 1e6:.1f} MB of weights per decode step, ceiling {ceiling * 1e9 / nbytes:.1f} tok/s")
        rows = {}
        for t in args.tokens:
            sec, split = matmul_pass(backend, mats, t)
            rows[t] = {"pass_ms": sec * 1e3, "gb_s": nbytes / sec / 1e9, "of_ceiling": nbytes / sec / 1e9 / ceiling,
                       "split_ms": {k: v * 1e3 for k, v in sorted(split.items(), key=lambda kv: -kv[1])}}
            extra = "" if t == 1 else f", {(sec / (rows[1]['pass_ms'] / 1e3) - 1) / (t - 1) * 100:.0f}% of a 1-token pass per extra token" \
                if 1 in rows else ""
            print(f"  {t} token{'s' * (t > 1)}: matmuls {sec * 1e3:7.2f} ms, {rows[t]['gb_s']:5.1f} GB/s "
                  f"({rows[t]['of_ceiling'] * 100:.0f}% of the read ceiling){extra}")
        # a real decode step, alternating with the 1-token matmul pass
        rng = np.random.default_rng(1)
        steps, passes = [], []
        for _ in range(3):
            steps.append(1 / eb.decode_tok_s(llm, 1, 64, rng))
            passes.append(matmul_pass(backend, mats, 1, repeats=3)[0])
        step, mm = statistics.median(steps), statistics.median(passes)
        print(f"  decode step {step * 1e3:.2f} ms ({1 / step:.1f} tok/s), of which matmuls {mm * 1e3:.2f} ms: "
              f"{(step - mm) * 1e3:.2f} ms ({(step - mm) / step * 100:.0f}%) is everything else")
        top = list(rows[args.tokens[0]]["split_ms"].items())[:6]
        print("  where the first pass goes: " + ", ".join(f"{k} {v:.2f} ms" for k, v in top))
        report["models"][name] = {"bytes_per_token": nbytes, "ceiling_tok_s": ceiling * 1e9 / nbytes,
                                  "decode_step_ms": step * 1e3, "matmul_pass_ms": mm * 1e3,
                                  "passes": {str(k): v for k, v in rows.items()}}
        del llm
    save("decode_ceiling", report)


if __name__ == "__main__":
    main()

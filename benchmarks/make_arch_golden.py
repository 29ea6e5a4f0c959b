"""Reference logits from llama.cpp (llama-cpp-python) for the tiny random models of tests/arch_zoo.py:
tests/golden/arch_zoo.json.
usage: python benchmarks/make_arch_golden.py [OUT.json]        (default tests/golden/arch_zoo.json)
       python benchmarks/make_arch_golden.py --only NAME...    (those models' entries again, the rest kept)

For every zoo model but the benchmarks-only ones (NAME_bench): write it to a temp dir (recording its sha256, so a test can check
that its own freshly written file is the model these numbers belong to), open it with
Llama(n_threads=2, n_ctx=N_CTX[name], logits_all=True), and for 3 prompts of random token ids (lengths
7, 24, 40; fixed seed; no BOS) evaluate the prompt in one batch and keep, for every position, the top-20
ids and logits and the log-sum-exp of the whole row; then a greedy continuation of 24 tokens (argmax,
one token per eval, not stopped at EOS) with the top1-top2 margin of each step.

phi3 is run twice: at n_ctx 512 (> rope.scaling.original_context_length 256, so llama.cpp uses
rope_factors_long) and, under "short_context", at n_ctx 256 (rope_factors_short). llama.cpp pads n_ctx up
to a multiple of 256, so these are the two smallest contexts that select each set.

"checks" records probes of llama.cpp's semantics made with variants of the zoo models (a key removed, a
tensor replaced): the largest logit difference they make over the prompts (0 means llama.cpp ignores what
was changed). Needs llama-cpp-python and the repository's tests directory; not a test dependency.
Run it from the repository root (the tests dir is put on sys.path; edgeinfer must be importable)."""
import contextlib, hashlib, json, math, os, sys, tempfile
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import arch_zoo  # noqa: E402
import gguf  # noqa: E402
import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "golden", "arch_zoo.json")
LENGTHS, N_GEN, TOP, SEED = (7, 24, 40), 24, 20, 1234
N_CTX = {name: 256 for name in arch_zoo.GOLDEN}
N_CTX["phi3"] = 512  # > original_context_length 256: rope_factors_long
PHI3_SHORT_CTX = 256  # <= 256: rope_factors_short
R = lambda x: round(float(x), 5)  # noqa: E731


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# the hybrid models (recurrent layers) also get a prompt longer than llama.cpp's delta-net chunk (64)
LONGER = {name: 100 for name in ("lfm2", "lfm2moe", "mamba2", "granitehybrid", "nemotron_h", "qwen35", "qwen35moe",
                                  "qwen3next", "falcon-h1")}


def prompts(name, vocab):
    rng = np.random.default_rng([SEED, arch_zoo.GOLDEN.index(name)])
    lengths = LENGTHS + ((LONGER[name],) if name in LONGER else ())
    return [[int(t) for t in rng.integers(8, vocab, n)] for n in lengths]  # ids >= 8: no control tokens


def open_model(path, n_ctx):
    return Llama(model_path=str(path), n_threads=2, n_ctx=n_ctx, n_batch=512, logits_all=True, verbose=False)


def run_prompt(llm, ids, greedy=True):
    llm.reset(); llm.eval(ids)
    rows = np.array(llm.scores[:len(ids)], dtype=np.float64)
    positions = []
    for row in rows:
        top = np.argsort(-row, kind="stable")[:TOP]
        m = row.max()
        positions.append({"top_ids": [int(i) for i in top], "top_logits": [R(row[i]) for i in top],
                          "logsumexp": R(m + math.log(np.exp(row - m).sum()))})
    out = {"ids": ids, "positions": positions}
    if greedy:
        gen, margins = [], []
        for _ in range(N_GEN):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            t = int(np.argmax(row)); gen.append(t)
            top2 = np.partition(row, -2)[-2:]; margins.append(round(float(top2[1] - top2[0]), 4))
            llm.eval([t])
        out["greedy"] = {"output_ids": gen, "top1_top2_margins": margins}
    return out, rows


def all_rows(path, n_ctx, ps):
    llm = open_model(path, n_ctx)
    rows = [run_prompt(llm, ids, greedy=False)[1] for ids in ps]
    del llm
    return rows


@contextlib.contextmanager
def variant(drop_keys=(), replace=None, drop_tensors=()):
    """While active, arch_zoo writers skip the GGUFWriter methods in drop_keys and the tensors in
    drop_tensors, and write replace[name] = other_name's data for tensor `name` (same shapes)."""
    W, add = gguf.GGUFWriter, arch_zoo._add
    class V(W):
        pass
    for k in drop_keys:
        setattr(V, k, lambda self, *a, **kw: None)
    seen = {}
    def _add(w, name, x, qtype=gguf.GGMLQuantizationType.F32):
        seen[name] = x
        if name in drop_tensors:
            return None
        src = (replace or {}).get(name)
        if src is not None and src in seen:
            x = seen[src]
        return add(w, name, x, qtype)
    gguf.GGUFWriter, arch_zoo._add = V, _add
    try:
        yield
    finally:
        gguf.GGUFWriter, arch_zoo._add = W, add


def max_diff(a, b, first=0, last=None):
    """largest |a - b| over positions first..last-1 of every prompt"""
    return R(max(float(np.abs(x[first:last] - y[first:last]).max()) if len(x) > first else 0.0 for x, y in zip(a, b)))


QUANTIZED = ["lfm2", "lfm2moe", "mamba2", "granitehybrid", "nemotron_h", "qwen35", "qwen35moe", "qwen3next",
             "falcon-h1", "smollm3", "granite",
             "granitemoe", "mistral3", "gemma4", "gemma4moe", "gemma3n"]  # zoo models whose F16 form llama-quantize makes Q4_K_M of (quantize-model's check)


# zoo models llama-quantize makes another mix of: the key llama_quantize_<mix>_sha256, llama.cpp's ftype
MIXES = {"gpt-oss": ("mxfp4_moe", 38)}  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE: gpt-oss's experts MXFP4, the rest Q8_0


def quantized_sha256(d, name, mix="q4_k_m", ftype=15):
    """sha256 of llama-quantize's `mix` (Q4_K_M: ftype 15) of zoo model `name` in its F16 form (arch_zoo.write_f16)."""
    src, dst = os.path.join(d, f"{name}-f16.gguf"), os.path.join(d, f"{name}-{mix}.gguf")
    arch_zoo.write_f16(name, src, os.path.join(d, f"{name}-scratch.gguf"))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = ftype, 2
    assert llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p) == 0
    return sha256(dst)


def only(names):
    """Add (or make again) these models' entries in OUT, keeping every other entry and the checks."""
    out = json.load(open(OUT))
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            out["models"][name] = model_entry(d, name)[0]
            if name in QUANTIZED:
                out["models"][name]["llama_quantize_q4_k_m_sha256"] = quantized_sha256(d, name)
            if name in MIXES:
                mix, ftype = MIXES[name]
                out["models"][name][f"llama_quantize_{mix}_sha256"] = quantized_sha256(d, name, mix, ftype)
    json.dump(out, open(OUT, "w"), separators=(",", ":"))
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


def model_entry(d, name):
    """(the golden entry of zoo model `name`, written in folder d, and its logit rows)"""
    path = os.path.join(d, f"{name}.gguf")
    arch_zoo.write(name, path)
    arch_zoo.write(name, path + ".again")
    assert sha256(path) == sha256(path + ".again"), f"{name}: the writer is not deterministic"
    llm = open_model(path, N_CTX[name])
    vocab = llm.n_vocab()
    ps = prompts(name, vocab)
    entry = {"sha256": sha256(path), "file_bytes": os.path.getsize(path), "n_ctx": llm.n_ctx(),
             "n_vocab": vocab, "rope_type": int(llama_cpp.llama_model_rope_type(llm._model.model)),
             "prompts": []}
    rows = []
    for ids in ps:
        p, r = run_prompt(llm, ids)
        entry["prompts"].append(p); rows.append(r)
    del llm
    if name == "phi3":
        llm = open_model(path, PHI3_SHORT_CTX)
        entry["rope_factors"] = "long"
        entry["short_context"] = {"n_ctx": llm.n_ctx(), "rope_factors": "short",
                                  "prompts": [run_prompt(llm, ids)[0] for ids in ps]}
        del llm
    print(name, "n_ctx", entry["n_ctx"], "rope_type", entry["rope_type"], "sha256", entry["sha256"][:16],
          "min greedy margin", min(min(p["greedy"]["top1_top2_margins"]) for p in entry["prompts"]), flush=True)
    return entry, rows


def main():
    out = {"engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (CPU, 2 threads)",
           "made_by": "benchmarks/make_arch_golden.py",
           "prompts": f"random ids (numpy default_rng([{SEED}, index of the model in arch_zoo.GOLDEN]), "
                      f"ids in [8, vocab), lengths {list(LENGTHS)}, no BOS); top-{TOP} per position; "
                      f"greedy {N_GEN} tokens",
           "models": {}, "checks": {}}
    with tempfile.TemporaryDirectory() as d:
        base_rows = {}
        for name in arch_zoo.GOLDEN:
            out["models"][name], base_rows[name] = model_entry(d, name)
            if name in QUANTIZED:
                out["models"][name]["llama_quantize_q4_k_m_sha256"] = quantized_sha256(d, name)
            if name in MIXES:
                mix, ftype = MIXES[name]
                out["models"][name][f"llama_quantize_{mix}_sha256"] = quantized_sha256(d, name, mix, ftype)

        # --- probes of llama.cpp's semantics
        def probe(key, name, n_ctx, note, first=0, last=None, **kw):
            path = os.path.join(d, f"{name}-{key}.gguf")
            with variant(**kw):
                arch_zoo.write(name, path)
            ref = base_rows[name] if n_ctx == N_CTX[name] else all_rows(os.path.join(d, f"{name}.gguf"), n_ctx,
                                                                       prompts(name, out["models"][name]["n_vocab"]))
            diff = max_diff(ref, all_rows(path, n_ctx, prompts(name, out["models"][name]["n_vocab"])), first, last)
            out["checks"][key] = {"model": name, "n_ctx": n_ctx, "max_abs_logit_diff": diff, "note": note}
            print(key, diff, flush=True)

        probe("llama_swa_without_sliding_window", "llama_swa", 256, "0: llama.cpp ignores llama.attention.sliding_window",
              drop_keys=["add_sliding_window"])
        probe("phi3_without_sliding_window", "phi3", 512, "0: llama.cpp disables phi3's sliding window",
              drop_keys=["add_sliding_window"])
        probe("phi3_ctx512_long_replaced_by_short", "phi3", 512, "> 0: at n_ctx 512 rope_factors_long is used",
              replace={"rope_factors_long.weight": "rope_factors_short.weight"})
        probe("phi3_ctx512_short_replaced_by_long", "phi3", 512, "0: at n_ctx 512 rope_factors_short is unused",
              replace={"rope_factors_short.weight": "rope_factors_long.weight"})
        probe("phi3_ctx256_long_replaced_by_short", "phi3", 256, "0: at n_ctx 256 rope_factors_long is unused",
              replace={"rope_factors_long.weight": "rope_factors_short.weight"})
        probe("phi3_without_attn_factor", "phi3", 512, "> 0: rope.scaling.attn_factor is applied",
              drop_keys=["add_rope_scaling_attn_factors"])
        probe("gemma2_without_sliding_window_positions_0_7", "gemma2", 256,
              "0: positions 0..7 see all their keys with a window of 8 or the default 4096 (key removed)",
              drop_keys=["add_sliding_window"], last=8)
        probe("gemma2_without_sliding_window_positions_8_on", "gemma2", 256,
              "> 0: the window of 8 is applied (on layers 0 and 2) from position 8 on",
              drop_keys=["add_sliding_window"], first=8)
        probe("llama3_without_rope_freqs", "llama3", 256, "> 0: rope_freqs.weight (Llama 3 scaling) is applied",
              drop_tensors=["rope_freqs.weight"])
    json.dump(out, open(OUT, "w"), separators=(",", ":"))
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--only":
        OUT = os.path.join(ROOT, "tests", "golden", "arch_zoo.json")
        only(sys.argv[2:])
    else:
        main()

"""LoRA adapters' cost in decode, side by side with llama.cpp's single global adapter (issue 62's targets).
usage: python benchmarks/lora_speed.py [MODEL] [--threads N] [--repeats R] [--rank 16]

Writes random rank-R F16 adapters (convert_lora_to_gguf.py's default type) on every matrix of MODEL's layers
(attn_q/k/v/output, ffn_gate/up/down; tests/lora_zoo.py) to a temp dir, then, alternating in each repeat:
- edgeinfer: one stream's decode (128 tokens) without an adapter and with one (LLM(lora=[a0])); 8 streams (64
  tokens) without adapters and with 8 different ones, one per stream (SamplingParams.lora), in one batch;
- llama.cpp (llama-cpp-python, f16 KV): one stream without and with adapter a0 set through its C API
  (llama_adapter_lora_init, llama_set_adapters_lora), the same prompt lengths.
Prints medians and the ratios the targets name; writes benchmarks/results/lora_speed.json."""
import argparse, ctypes, json, os, statistics, sys, tempfile, time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from compare_llamacpp import LlamaCpp  # noqa: E402
from lora_zoo import write_random_adapter  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    a = ap.parse_args()
    from edgeinfer import LLM, registry
    from edgeinfer import bench as eb

    path = str(registry.resolve(a.model))
    d = tempfile.mkdtemp()
    ads = []
    for i in range(8):
        ads.append(os.path.join(d, f"a{i}.gguf"))
        write_random_adapter(path, ads[-1], a.rank, 2.0 * a.rank, T.F16, KINDS, 100 + i, 0.05)
    base = LLM(path, threads=a.threads, kv_type="f16", max_context=2048, progress=False)
    one = LLM(path, threads=a.threads, kv_type="f16", max_context=2048, progress=False, lora=[ads[0]])
    many = LLM(path, threads=a.threads, kv_type="f16", max_context=2048, progress=False,
               lora=[(p, 0.0) for p in ads])
    lc = LlamaCpp(path, a.threads, n_ctx=2048)
    lca = LlamaCpp(path, a.threads, n_ctx=2048)
    import llama_cpp as L

    ad = L.llama_adapter_lora_init(lca.model, ads[0].encode())
    assert ad, "llama.cpp refused the adapter"
    assert L.llama_set_adapters_lora(lca.ctx, (L.llama_adapter_lora_p_ctypes * 1)(ad), 1,
                                     (ctypes.c_float * 1)(1.0)) == 0
    rng = np.random.default_rng(0)
    runs = {k: [] for k in ("ei_1", "ei_1_lora", "ei_8", "ei_8_lora", "lc_1", "lc_1_lora")}
    per_stream = [{i: 1.0} for i in range(8)]
    for llm in (base, one, many):
        eb.decode_tok_s(llm, 1, 8, rng)  # warm-up (compiles)
    for r in range(a.repeats):
        order = [("ei_1", lambda: eb.decode_tok_s(base, 1, 128, rng)),
                 ("ei_1_lora", lambda: eb.decode_tok_s(one, 1, 128, rng)),
                 ("lc_1", lambda: lc.decode_tok_s([eb.random_prompt(base, 16, rng)], 128)),
                 ("lc_1_lora", lambda: lca.decode_tok_s([eb.random_prompt(base, 16, rng)], 128)),
                 ("ei_8", lambda: eb.decode_tok_s(base, 8, 64, rng)),
                 ("ei_8_lora", lambda: eb.decode_tok_s(many, 8, 64, rng, lora=per_stream))]
        for key, fn in (order if r % 2 == 0 else order[::-1]):
            time.sleep(0.5)
            runs[key].append(fn())
            print(f"run {r + 1}: {key} {runs[key][-1]:.2f} tok/s", file=sys.stderr, flush=True)
    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    out = {"model": os.path.basename(path), "threads": a.threads, "rank": a.rank, "repeats": a.repeats,
           "system": eb.system_info(), "median_tok_s": med, "runs": runs,
           "one_stream_slowdown": round(1 - med["ei_1_lora"] / med["ei_1"], 3),
           "eight_streams_slowdown": round(1 - med["ei_8_lora"] / med["ei_8"], 3),
           "one_stream_over_llamacpp_with_adapter": round(med["ei_1_lora"] / med["lc_1_lora"], 3),
           "llamacpp_slowdown": round(1 - med["lc_1_lora"] / med["lc_1"], 3)}
    print(json.dumps(out, indent=1))
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "lora_speed.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

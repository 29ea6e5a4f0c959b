"""Constrained-decoding libraries side by side on our vocabularies: llguidance against xgrammar.

For each GGUF model and each of the 20 schemas in schemas.json it measures, with both libraries:
- the time to build the library's tokenizer index (once per model);
- the compile time of each schema (first compile, and a second one of the same schema);
- the mask time per token along one token sequence (a seeded walk through llguidance's masks,
  then replayed through xgrammar, so both compute masks for the same states).

Both use the same JSON format: no free whitespace, separators ", " and ": ".
xgrammar needs torch, triton and transformers (about 2 GB): run this in a scratch environment
(`pip install -e . xgrammar`), not in the project's own.

    python benchmarks/structured/compare_libs.py smollm2-135m-instruct gemma3-270m

The figures are printed, and saved as JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import results_io  # noqa: E402  benchmarks/results_io.py: JSON to benchmarks/results/NAME-TIME.json


def ms(s):
    return round(s * 1e3, 3)


def walk(matcher, vocab_size, seed, limit=400):
    """A seeded random path of allowed tokens (EOS only when nothing else is allowed)."""
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    rng = np.random.default_rng(seed)
    mask = allocate_token_bitmask(1, vocab_size)
    out = []
    while not matcher.is_stopped() and len(out) < limit:
        fill_next_token_bitmask(matcher, mask)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab_size])
        tid = int(rng.choice(allowed))
        if not matcher.consume_token(tid):
            raise RuntimeError(matcher.get_error())
        out.append(tid)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()

    import llguidance as llg
    import torch
    import xgrammar as xgr
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    from edgeinfer import registry
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.structured import llg_tokenizer
    from edgeinfer.tokenizer import Tokenizer

    torch.set_num_threads(1)
    schemas = json.load(open(os.path.join(HERE, "schemas.json")))
    record = {"llguidance": llg.__version__, "xgrammar": importlib.metadata.version("xgrammar"), "models": {}}
    for model in args.models:
        tok = Tokenizer(GGUFFile(registry.resolve(model, progress=False)))
        t0 = time.perf_counter()
        lt = llg_tokenizer(tok)
        t_llg_tok = time.perf_counter() - t0
        t0 = time.perf_counter()
        vocab = [tok.token_bytes(i, special=True) for i in range(tok.vocab_size)]
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=tok.vocab_size,
                                 stop_token_ids=sorted(tok.stop_ids))
        compiler = xgr.GrammarCompiler(info, max_threads=1)
        t_xgr_tok = time.perf_counter() - t0
        rows = {}
        for name, case in schemas.items():
            schema = case["schema"]
            row = {}
            # llguidance: grammar text -> matcher (compile), twice
            comp = []
            for _ in range(2):
                t0 = time.perf_counter()
                g = llg.LLMatcher.grammar_from_json_schema(
                    schema, overrides={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
                m = llg.LLMatcher(lt, g)
                comp.append(time.perf_counter() - t0)
                assert not m.is_error(), m.get_error()
            row["llg_compile_ms"] = [ms(c) for c in comp]
            path = walk(m.deep_copy(), tok.vocab_size, seed=len(name))
            row["tokens"] = len(path)
            mask = allocate_token_bitmask(1, tok.vocab_size)
            m = llg.LLMatcher(lt, g)
            times = []
            for t in path:
                t0 = time.perf_counter()
                fill_next_token_bitmask(m, mask)
                times.append(time.perf_counter() - t0)
                m.consume_token(t)
            row["llg_mask_us_median"] = round(statistics.median(times) * 1e6, 1)
            row["llg_mask_us_mean"] = round(statistics.fmean(times) * 1e6, 1)
            # xgrammar: compile (its cache off for the second, to time a real compile), replay the path
            comp = []
            for i in range(2):
                compiler.clear_cache()
                t0 = time.perf_counter()
                cg = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
                comp.append(time.perf_counter() - t0)
            row["xgr_compile_ms"] = [ms(c) for c in comp]
            xm = xgr.GrammarMatcher(cg)
            bm = xgr.allocate_token_bitmask(1, tok.vocab_size)
            times, accepted = [], 0
            for t in path:
                t0 = time.perf_counter()
                xm.fill_next_token_bitmask(bm)
                times.append(time.perf_counter() - t0)
                if not xm.accept_token(t):
                    break
                accepted += 1
            row["xgr_replayed"] = accepted
            row["xgr_mask_us_median"] = round(statistics.median(times) * 1e6, 1)
            row["xgr_mask_us_mean"] = round(statistics.fmean(times) * 1e6, 1)
            rows[name] = row
            print(model, name, row, flush=True)

        def med(key, idx=None):
            vals = [r[key][idx] if idx is not None else r[key] for r in rows.values()]
            return round(statistics.median(vals), 3), round(max(vals), 3)

        summary = {
            "vocab": tok.vocab_size,
            "llg_tokenizer_s": round(t_llg_tok, 3), "xgr_tokenizer_s": round(t_xgr_tok, 3),
            "llg_compile_ms_median_max": med("llg_compile_ms", 0), "xgr_compile_ms_median_max": med("xgr_compile_ms", 1),
            "llg_mask_us_median_max": med("llg_mask_us_mean"), "xgr_mask_us_median_max": med("xgr_mask_us_mean"),
            "xgr_replayed_all": all(r["xgr_replayed"] == r["tokens"] for r in rows.values()),
        }
        print(model, "summary", summary, flush=True)
        record["models"][model] = {"summary": summary, "schemas": rows}
    results_io.save("structured-libs", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())

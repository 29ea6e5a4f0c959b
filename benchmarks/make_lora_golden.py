"""Reference logits from llama.cpp (llama-cpp-python) for the random LoRA adapters of tests/lora_zoo.py on the
arch zoo's models: tests/golden/lora.json.
usage: python benchmarks/make_lora_golden.py [OUT.json]        (default tests/golden/lora.json)

For every case of lora_zoo.CASES: write its base model and adapters to a temp dir (recording their sha256), open
the model with Llama(n_threads=2, n_ctx=256, logits_all=True), load each adapter through llama.cpp's C API
(llama_adapter_lora_init, which returns NULL for an adapter llama.cpp refuses: checked, as the binding's
Llama(lora_path=...) is not used) and set them with their scales (llama_set_adapters_lora, checked for 0);
then, as make_arch_golden.py does, 3 prompts of random ids (lengths 7, 24, 40) evaluated in one batch: the
top-20 ids and logits and the log-sum-exp at every position, and 24 greedy tokens after each. Each case also
records how far its logits are from the base model's (so the adapters visibly change the output).
Needs llama-cpp-python and the repository's tests directory; not a test dependency. Run it from the repository
root."""
import ctypes, json, os, sys, tempfile
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import arch_zoo  # noqa: E402
import lora_zoo  # noqa: E402
import llama_cpp  # noqa: E402
from make_arch_golden import open_model, run_prompt, sha256  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "golden", "lora.json")
LENGTHS, SEED, N_CTX = (7, 24, 40), 4321, 256


def prompts(case, vocab):
    rng = np.random.default_rng([SEED, list(lora_zoo.CASES).index(case)])
    return [[int(t) for t in rng.integers(8, vocab, n)] for n in LENGTHS]


def set_adapters(llm, paths_scales):
    ptrs = []
    for path, _ in paths_scales:
        ad = llama_cpp.llama_adapter_lora_init(llm._model.model, str(path).encode())
        if not ad:
            raise SystemExit(f"llama.cpp refused the adapter {path}")
        ptrs.append(ad)
    arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(ptrs))(*ptrs)
    scales = (ctypes.c_float * len(ptrs))(*[s for _, s in paths_scales])
    rc = llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(ptrs), scales)
    if rc != 0:
        raise SystemExit(f"llama_set_adapters_lora returned {rc}")
    return ptrs


def main():
    out = {"engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (CPU, 2 threads), adapters through "
                     "llama_adapter_lora_init and llama_set_adapters_lora",
           "made_by": "benchmarks/make_lora_golden.py",
           "prompts": f"random ids (numpy default_rng([{SEED}, index of the case in lora_zoo.CASES]), "
                      f"ids in [8, vocab), lengths {list(LENGTHS)}, no BOS); top-20 per position; greedy 24 tokens",
           "adapters": {}, "cases": {}}
    with tempfile.TemporaryDirectory() as d:
        for name in lora_zoo.ADAPTERS:
            base = lora_zoo.ADAPTERS[name][0]
            bpath = os.path.join(d, base + ".gguf")
            if not os.path.exists(bpath):
                arch_zoo.write(base, bpath)
            lora_zoo.write_adapter(name, bpath, os.path.join(d, name + ".gguf"))
            out["adapters"][name] = {"base": base, "base_sha256": sha256(bpath),
                                     "sha256": sha256(os.path.join(d, name + ".gguf"))}
        for case, adapters in lora_zoo.CASES.items():
            bpath = os.path.join(d, lora_zoo.base_of(case) + ".gguf")
            llm = open_model(bpath, N_CTX)
            ps = prompts(case, llm.n_vocab())
            base_rows = [run_prompt(llm, ids, greedy=False)[1] for ids in ps]
            set_adapters(llm, [(os.path.join(d, a + ".gguf"), s) for a, s in adapters])
            entries, shift = [], 0.0
            for ids, br in zip(ps, base_rows):
                entry, rows = run_prompt(llm, ids)
                entries.append(entry)
                shift = max(shift, float(np.abs(rows - br).max()))
            out["cases"][case] = {"base": lora_zoo.base_of(case), "adapters": [[a, s] for a, s in adapters],
                                  "n_ctx": N_CTX, "max_abs_logit_change_from_base": round(shift, 4), "prompts": entries}
            print(case, "change from base", round(shift, 3), "min greedy margin",
                  min(min(p["greedy"]["top1_top2_margins"]) for p in entries), flush=True)
            del llm
    json.dump(out, open(OUT, "w"), separators=(",", ":"))
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()

"""The real models against llama.cpp's outputs in tests/golden (see its README)."""

import json

import numpy as np
import pytest

from conftest import golden_path, real_model_path
from edgeinfer import LLM, SamplingParams

pytestmark = pytest.mark.model

MODELS = {
    "smollm2-135m-instruct": "smollm2-135m-instruct-q4_1.json",
    "gemma3-270m": "gemma3-270m-q4_k_m.json",
    "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b-instruct.json",
}
# Greedy picks are compared up to the first step where the top-two gap is below this, in llama.cpp's
# logits or in ours: below it the pick is decided by rounding, not by the model.
TIE_MARGIN = 0.25
# Both engines round activations to 8 bits inside the quantized dot products (llama.cpp's Q8_0/Q8_1/Q8_K,
# which our int8 kernels reproduce), but llama.cpp also keeps K and V in float16, rounds Q to float16 for
# the attention scores and accumulates in other orders. On these short prompts the models amplify such
# rounding differences into a shift shared by all logits (the hidden state's scale before the output
# matrix): variants of our own that differ only in rounding (float32 or float16 KV, the portable and the
# SIMD kernel paths, three accumulation orders of the int8 matmuls) moved the mean of the top 20 logits
# by up to 0.61 and the log-sum-exp by up to 0.70 away from llama.cpp's, while the shape of the
# distribution held: the log-probabilities of the top 20 (logit minus log-sum-exp) stayed within 0.48
# of llama.cpp's. So the log-probabilities are checked tightly, just above that spread; the raw logits
# and the log-sum-exp, which carry the shared shift, loosely; and the best token must be the same.
LOGPROB_TOL = 0.6
LOGIT_TOL = 1.2
LSE_TOL = 1.0


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    name = request.param
    real_model_path(name)
    with open(golden_path(MODELS[name])) as f:
        gold = json.load(f)
    return LLM(name, progress=False), gold


def test_tokenization_matches_llama_cpp(case):
    llm, gold = case
    for t in gold["tokenize"]:
        assert llm.tokenize(t["text"]) == t["ids"], t["text"]
        assert llm.tokenize(t["text"], parse_special=True) == t["ids_parse_special"], t["text"]
        assert llm.detokenize(t["ids"]) == t["detok"], t["text"]
    for g in gold["greedy"]:
        assert llm.tokenizer.encode(g["prompt"], parse_special=g["parse_special"]) == g["prompt_ids"]
        assert llm.detokenize(g["output_ids"]) == g["output_text"]


def test_top_logits_match_llama_cpp(case):
    llm, gold = case
    from edgeinfer.engine.kv_cache import KVCache
    from edgeinfer.engine.model_runner import Batch

    cfg = llm.config
    llm.kernels.ready()  # a direct forward: the background compile a first run started is done first
    for entry in gold["logits"]:
        ids = entry["prompt_ids"]
        assert llm.tokenizer.encode(entry["prompt"]) == ids
        t = len(ids)
        cache = KVCache(cfg.n_layer, 4, 16, cfg.n_kv_head, cfg.head_dim, cfg.v_head_dim, kb=llm.kernels)
        pos = np.arange(t)
        logits = llm.model.forward(Batch(ids, pos, np.zeros(t), pos, np.arange(4)[None], [t - 1]), cache)[0]
        top = np.array(entry["top_logits"])
        ours = logits[entry["top_ids"]]
        assert np.abs(ours - top).max() < LOGIT_TOL, (entry["prompt"], np.abs(ours - top).max())
        assert int(np.argmax(logits)) == entry["top_ids"][0]
        lse = float(np.log(np.exp(logits - logits.max()).sum()) + logits.max())
        assert abs(lse - entry["logsumexp"]) < LSE_TOL
        logprob_err = np.abs((ours - lse) - (top - entry["logsumexp"])).max()
        assert logprob_err < LOGPROB_TOL, (entry["prompt"], logprob_err)


def test_greedy_continuations_match_llama_cpp(case):
    llm, gold = case
    compare_greedy(llm, gold)


def compare_greedy(llm, gold):
    """Our greedy continuations against llama.cpp's, token for token up to either side's first near-tie."""
    prompts = [g["prompt_ids"] for g in gold["greedy"]]
    n = max(len(g["output_ids"]) for g in gold["greedy"])
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, logprobs=2))
    compared = 0
    # steps before llama.cpp's first near-tie; our own near-ties may end a comparison earlier
    possible = sum(next((i for i, m in enumerate(g["top1_top2_margins"]) if m < TIE_MARGIN), len(g["output_ids"]))
                   for g in gold["greedy"])
    for g, out in zip(gold["greedy"], outs):
        for step, want in enumerate(g["output_ids"]):
            ours_margin = out.logprobs[step]["top"][0][1] - out.logprobs[step]["top"][1][1]
            if g["top1_top2_margins"][step] < TIE_MARGIN or ours_margin < TIE_MARGIN:
                break
            assert out.token_ids[step] == want, (g["prompt"], step)
            compared += 1
    assert compared >= 0.4 * possible, (compared, possible)  # the check is not vacuous
    return compared, possible


def test_qwen_1_5b_greedy_matches_llama_cpp():
    """The 1.5B model's own small reference (made with benchmarks/make_golden.py from
    qwen2.5-coder-1.5b-cases.json): four code and chat prompts, 48 greedy tokens each."""
    real_model_path("qwen2.5-coder-1.5b-instruct")
    with open(golden_path("qwen2.5-coder-1.5b-instruct.json")) as f:
        gold = json.load(f)
    llm = LLM("qwen2.5-coder-1.5b-instruct", progress=False)
    for g in gold["greedy"]:
        assert llm.tokenizer.encode(g["prompt"], parse_special=g["parse_special"]) == g["prompt_ids"]
    compared, possible = compare_greedy(llm, gold)
    assert compared >= 60, (compared, possible)


def test_perplexity_within_one_percent(case):
    llm, gold = case
    p = gold["perplexity"]
    with open(golden_path(p["file"]), encoding="utf-8") as f:
        text = f.read()
    r = llm.perplexity_details(text, n_ctx=p["n_ctx"], chunks=p["chunks"])
    assert r["n_scored"] == p["n_scored"]
    assert abs(r["ppl"] / p["ppl"] - 1) < 0.01, (r["ppl"], p["ppl"])


def test_q8_0_kv_perplexity_within_half_a_percent_of_f16(case):
    """The quantized KV cache costs next to nothing in quality: within 0.5% of f16 KV's perplexity. On
    Gemma 3 a single 512-token chunk moves by up to 1.8% either way between the two (measured over all 66
    chunks of the text: +0.12% in all), so 4 chunks cannot resolve 0.5% (they gave +0.75%); 16 chunks
    (4,080 scored tokens) can."""
    llm, gold = case
    assert llm.engine.config.kv_dtype == "f16"
    p = gold["perplexity"]
    with open(golden_path(p["file"]), encoding="utf-8") as f:
        text = f.read()
    f16 = llm.perplexity_details(text, n_ctx=p["n_ctx"], chunks=16)["ppl"]
    q8 = LLM(str(llm.path), kv_type="q8_0", progress=False).perplexity_details(text, n_ctx=p["n_ctx"], chunks=16)["ppl"]
    assert abs(q8 / f16 - 1) < Q8_KV_TOLERANCE.get(llm.config.arch, 0.005), (q8, f16)


# Qwen2.5's k biases put outliers of tens into every key row, and a q8_0 block's one scale then rounds
# the rest of its block coarsely, even after the Walsh-Hadamard rotation that spreads them (llama.cpp's, which
# ours follows: kernels/cpu/kv_rotation.py). On the 0.5B model, 16 chunks: llama.cpp's own q8_0 KV (flash
# attention) costs +1.2% (f16 42.53 -> 43.06), ours +1.0% (42.53 -> 42.96; +2.2% before the rotation).
Q8_KV_TOLERANCE = {"qwen2": 0.015}

"""LoRA adapters (models/lora.py, kernels/cpu/lora.py) on the arch zoo's random models with the random adapters
of tests/lora_zoo.py, against llama.cpp's outputs with the same adapters set through its C API
(tests/golden/lora.json, made by benchmarks/make_lora_golden.py): every position's top-20 logits and greedy
continuations, with the zoo's tolerances; then what an adapter file that does not fit its model says."""

import hashlib
import json

import numpy as np
import pytest

from conftest import golden_path, written_on_first_use
from edgeinfer import LLM, SamplingParams
from edgeinfer.engine.kv_cache import KVCache
from edgeinfer.engine.model_runner import Batch
from edgeinfer.errors import EdgeInferError
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend
from edgeinfer.models import load_model
from edgeinfer.models.lora import attach
from lora_zoo import ADAPTERS, CASES, base_of, write_adapter
from test_golden import LOGIT_TOL, LOGPROB_TOL, LSE_TOL, TIE_MARGIN, compare_greedy

with open(golden_path("lora.json")) as f:
    GOLD = json.load(f)

kb = get_backend("cpu")


@pytest.fixture(scope="session")
def adapters(zoo, tmp_path_factory):
    """adapters(name): the path of lora_zoo's adapter `name`, written on first use."""
    return written_on_first_use(tmp_path_factory, "lora", lambda name, path: write_adapter(name, zoo(ADAPTERS[name][0]),
                                                                                           path))


def _loras(adapters, case):
    return [(str(adapters(a)), s) for a, s in CASES[case]]


def _all_logits(m, ids):
    t = len(ids)
    pos = np.arange(t)
    return m.forward(Batch(ids, pos, np.zeros(t), pos, np.arange(16)[None], pos),
                     KVCache.for_model(m.cfg, 16, 16, kb=kb))


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_the_zoo_writes_the_adapters_llama_cpp_ran(zoo, adapters, name):
    want = GOLD["adapters"][name]
    assert hashlib.sha256(zoo(want["base"]).read_bytes()).hexdigest() == want["base_sha256"]
    assert hashlib.sha256(adapters(name).read_bytes()).hexdigest() == want["sha256"]


@pytest.mark.parametrize("case", list(CASES))
def test_the_compiled_step_runs_the_adapters_with_the_per_op_bits(zoo, adapters, case, monkeypatch):
    """The compiled step runs the adapters itself (no row falls back to the per-op forward) and gives the per-op
    forward's logits bit for bit: every row at the adapters' own scales, and rows at scales of their own (one
    batch mixing adapters and none); a row's scales change its logits."""
    gf = GGUFFile(zoo(base_of(case)))
    m = load_model(gf, kb, n_ctx=64)
    lora = attach(m, gf, _loras(adapters, case))
    assert lora.step is not None and m.stack is not None
    monkeypatch.setattr(kb, "step_ready", lambda: True)
    per_op_calls, per_op = [], m.forward_per_op
    ids = GOLD["cases"][case]["prompts"][0]["ids"]
    t = len(ids)
    rows = np.tile(lora.scales, (t, 1))
    rows[::3] = 0.0  # the base model
    rows[1::3] *= np.float32(0.5)

    def logits(step, scales=None, keep=None):
        pos = np.arange(t)
        b = Batch(ids, pos, np.zeros(t), pos, np.arange(16)[None], np.arange(t) if keep is None else keep)
        b.lora = scales
        return (m.forward if step else per_op)(b, KVCache.for_model(m.cfg, 16, 16, kb=kb))

    m.forward_per_op = lambda *a, **k: per_op_calls.append(1)
    last = np.array([t - 2, t - 1])  # the last layer's rows past attention: the kept ones alone
    got = [logits(True), logits(True, rows), logits(True, rows, last)]
    assert not per_op_calls
    want = [logits(False), logits(False, rows), logits(False, rows, last)]
    for g, w in zip(got, want):
        assert np.array_equal(g, w), np.abs(g - w).max()
    assert np.array_equal(got[2], got[1][last])
    moved = np.abs(got[0] - got[1]).max(axis=1)
    assert (moved[1::3] > 1e-3).all() and (moved[::3] > 1e-3).all()


@pytest.mark.parametrize("case", list(CASES))
def test_top_logits_with_adapters_match_llama_cpp(zoo, adapters, case):
    gold = GOLD["cases"][case]
    gf = GGUFFile(zoo(base_of(case)))
    m = load_model(gf, kb, n_ctx=gold["n_ctx"])
    attach(m, gf, _loras(adapters, case))
    for p in gold["prompts"]:
        logits = _all_logits(m, p["ids"])
        for i, want in enumerate(p["positions"]):
            row = logits[i].astype(np.float64)
            top, ours = np.array(want["top_logits"]), row[want["top_ids"]]
            lse = float(np.log(np.exp(row - row.max()).sum()) + row.max())
            where = (case, len(p["ids"]), i)
            assert np.abs(ours - top).max() < LOGIT_TOL, (where, np.abs(ours - top).max())
            assert abs(lse - want["logsumexp"]) < LSE_TOL, (where, lse, want["logsumexp"])
            assert np.abs((ours - lse) - (top - want["logsumexp"])).max() < LOGPROB_TOL, where
            if top[0] - top[1] >= TIE_MARGIN and np.diff(np.sort(row)[-2:])[0] >= TIE_MARGIN:
                assert int(np.argmax(row)) == want["top_ids"][0], where


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_continuations_with_adapters_match_llama_cpp(zoo, adapters, case):
    gold = GOLD["cases"][case]
    llm = LLM(str(zoo(base_of(case))), max_context=gold["n_ctx"], progress=False, lora=_loras(adapters, case))
    compare_greedy(llm, {"greedy": [{"prompt": p["ids"], "prompt_ids": p["ids"], **p["greedy"]}
                                    for p in gold["prompts"]]})


def test_adapters_change_the_output_and_scale_zero_is_the_base_model(zoo, adapters):
    path, ids = str(zoo("llama3")), list(range(8, 40))
    params = SamplingParams(temperature=0, max_tokens=12)
    base = LLM(path, progress=False).generate([ids], params)[0].token_ids
    assert LLM(path, progress=False, lora=[(str(adapters("llama3_all")), 0.0)]).generate([ids], params)[0].token_ids \
        == base
    assert LLM(path, progress=False, lora=[str(adapters("llama3_all"))]).generate([ids], params)[0].token_ids != base


def test_two_sequences_with_adapters_batched_equal_each_alone_bit_for_bit(zoo, adapters):
    llm = LLM(str(zoo("llama3")), progress=False, lora=_loras(adapters, "llama3_stacked"))
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=1)
    a, b = list(range(10, 31)), list(range(50, 57))
    together = llm.generate([a, b], params)
    for prompt, got in zip((a, b), together):
        alone = llm.generate([prompt], params)[0]
        assert alone.token_ids == got.token_ids
        assert [x["logprob"] for x in alone.logprobs] == [x["logprob"] for x in got.logprobs]


def _rewrite(src, dst, *, drop=(), arch=None, kv=None, reshape=None, rename=None):
    # a copy of adapter src with tensors dropped, reshaped or renamed, another architecture, or other metadata
    import gguf

    with GGUFFile(src) as gf:
        w = gguf.GGUFWriter(str(dst), arch or gf.architecture)
        w.add_type(kv.get("general.type", "adapter") if kv else "adapter")
        w.add_string("adapter.type", (kv or {}).get("adapter.type", "lora"))
        for name in gf.tensors:
            if name in drop:
                continue
            x = np.array(gf.tensor(name), np.float32)
            if reshape and name in reshape:
                x = x[tuple(slice(0, n) for n in reshape[name])]
            w.add_tensor((rename or {}).get(name, name), x)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


@pytest.mark.parametrize("change, message", [
    (dict(drop=("blk.1.attn_q.weight.lora_b",)), "'blk.1.attn_q.weight' has no blk.1.attn_q.weight.lora_b"),
    (dict(arch="qwen3"), "is an adapter for 'qwen3' models, not for this 'llama' model"),
    (dict(kv={"general.type": "model"}), "is not an adapter (general.type 'model'"),
    (dict(kv={"adapter.type": "ia3"}), "adapter.type is 'ia3'"),
    (dict(reshape={"blk.0.ffn_up.weight.lora_a": (4, 256)}), "'blk.0.ffn_up.weight' does not fit the model"),
])
def test_an_adapter_that_does_not_fit_is_a_one_line_error_naming_the_tensor(zoo, adapters, tmp_path, change, message):
    bad = tmp_path / "bad.gguf"
    _rewrite(adapters("llama3_f16" if "reshape" not in change else "llama3_all"), bad, **change)
    with pytest.raises(EdgeInferError) as e:
        LLM(str(zoo("llama3")), progress=False, lora=[str(bad)])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_adapter_for_a_tensor_the_model_lacks_or_a_broken_file_is_refused(zoo, adapters, tmp_path):
    lacks = tmp_path / "lacks.gguf"
    _rewrite(adapters("llama3_f16"), lacks, rename={f"blk.0.attn_q.weight.lora_{x}": f"blk.9.attn_q.weight.lora_{x}"
                                                    for x in "ab"})
    with pytest.raises(EdgeInferError, match="'blk.9.attn_q.weight' is not a matrix of this model"):
        LLM(str(zoo("llama3")), progress=False, lora=[str(lacks)])
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(adapters("llama3_f16").read_bytes()[:200])
    with pytest.raises(EdgeInferError, match="not a readable GGUF adapter"):
        LLM(str(zoo("llama3")), progress=False, lora=[str(broken)])
    with pytest.raises(EdgeInferError, match="no adapter file"):
        LLM(str(zoo("llama3")), progress=False, lora=[str(tmp_path / "missing.gguf")])
    with pytest.raises(EdgeInferError, match="not a number"):
        LLM(str(zoo("llama3")), progress=False, lora=[(str(adapters("llama3_f16")), "x")])


def test_requests_choose_their_adapters_and_run_batched_each_as_alone_bit_for_bit(zoo, adapters):
    """One LLM with two adapters at scale 0 (the base model unless a request names them); requests with different
    adapters (by name or index, stacked, none) in one continuous batch each get what an LLM with just their
    adapters gives alone, bit for bit, and the same prompt under other adapters does not hit their cached
    prefix."""
    path, a, f = str(zoo("llama3")), str(adapters("llama3_all")), str(adapters("llama3_f16"))
    llm = LLM(path, progress=False, lora=[(a, 0.0), (f, 0.0)])
    prompt = list(range(10, 50))  # two full blocks: a prefix the cache keeps
    choices = [None, {"llama3_all": 1.0}, [(0, 0.5), (1, 1.5)], {1: 0.7}]
    params = [SamplingParams(temperature=0, max_tokens=8, logprobs=1, lora=c) for c in choices]
    together = llm.generate([prompt] * len(choices), params)
    alone = [LLM(path, progress=False, lora=loras).generate([prompt], SamplingParams(temperature=0, max_tokens=8,
                                                                                     logprobs=1))[0]
             for loras in ([(a, 0.0)], [a], [(a, 0.5), (f, 1.5)], [(f, 0.7)])]
    for got, want in zip(together, alone):
        assert got.token_ids == want.token_ids
        assert [x["logprob"] for x in got.logprobs] == [x["logprob"] for x in want.logprobs]
    assert len({tuple(c.token_ids) for c in together}) == len(choices)  # the adapters made a difference
    again = llm.generate([prompt, prompt], [params[1], params[0]])  # now from the cache: still each its own
    assert [c.token_ids for c in again] == [together[1].token_ids, together[0].token_ids]


def test_a_request_naming_an_adapter_the_model_lacks_is_refused(zoo, adapters):
    llm = LLM(str(zoo("llama3")), progress=False, lora=[(str(adapters("llama3_f16")), 0.0)])
    with pytest.raises(ValueError, match=r"lora: no adapter 'nope' \(loaded: 0 'llama3_f16'\)"):
        llm.generate([[10, 11, 12]], SamplingParams(max_tokens=2, lora={"nope": 1.0}))
    with pytest.raises(ValueError, match="lora: no adapter 3"):
        llm.generate([[10, 11, 12]], SamplingParams(max_tokens=2, lora=[(3, 1.0)]))
    with pytest.raises(ValueError, match="this model has no LoRA adapters loaded"):
        LLM(str(zoo("llama3")), progress=False).generate([[10, 11]], SamplingParams(max_tokens=2, lora={0: 1.0}))
    with pytest.raises(ValueError, match="lora has scale 'x'"):
        SamplingParams(lora={0: "x"})


def test_base_requests_after_adapter_requests_are_the_base_models(zoo, adapters):
    """The adapters' scales of one forward never reach the next (the output matrix is adapted here too)."""
    path = str(zoo("llama3"))
    llm = LLM(path, progress=False, lora=[(str(adapters("llama3_all")), 0.0)])
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=1)
    llm.generate([list(range(30, 45))], SamplingParams(temperature=0, max_tokens=3, lora={0: 1.0}))
    prompts = [list(range(10, 31)), list(range(50, 57))]
    got, want = llm.generate(prompts, params), LLM(path, progress=False).generate(prompts, params)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert [x["logprob"] for x in g.logprobs] == [x["logprob"] for x in w.logprobs]


def test_the_low_rank_kernel_against_numpy_on_awkward_shapes():
    """lora.apply on shapes the zoo's models do not reach: an odd input width, outputs not a multiple of 8 or 32,
    ranks 3 and 20 (padded to 8 and 24) on one matrix, float32 values and float16 ones, three matrices in one call
    (two sharing A, as a fused matrix's splits), rows at scale 0 left as they were, against float64 numpy."""
    from edgeinfer.kernels.cpu import lora as kl

    rng = np.random.default_rng(5)
    K, T = 517, 5
    half = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    a0, a1 = rng.standard_normal((K, 3)).astype(np.float32), half(rng.standard_normal((K, 20)))
    ns = (45, 300, 7)
    bs = [(rng.standard_normal((3, n)).astype(np.float32), half(rng.standard_normal((20, n)))) for n in ns]
    mats = [[(0, a0, bs[i][0], 6.0, 3), (1, a1, bs[i][1], 0.0, 20)] for i in range(2)] + [[(1, a1, bs[2][1], 0.0, 20)]]
    lo = kl.pack(mats)
    assert lo.w16.size > 8 and lo.w32.size > 8  # both kinds held
    x = rng.standard_normal((T, K)).astype(np.float32)
    scales = np.array([[1, 0], [0, 0], [0.5, 2], [0, 1], [-1, 0.25]], np.float32)
    outs = [rng.standard_normal((T, n)).astype(np.float32) for n in ns]
    before = [o.copy() for o in outs]
    kl.apply(x, lo, 0, 1, 2, outs[0], outs[1], outs[2], scales)
    for i, (o, b0) in enumerate(zip(outs, before)):
        want = b0.astype(np.float64)
        for (j, at, bt, alpha, rank) in mats[i]:
            s = scales[:, j].astype(np.float64) * (alpha / rank if alpha else 1.0)
            want += s[:, None] * ((x.astype(np.float64) @ at) @ bt)
        assert np.abs(o - want).max() < 1e-3 * np.abs(want).max(), i
        assert np.array_equal(o[1], b0[1])  # a row at scale 0 for every adapter: untouched
    # one matrix at a time, the same bits (the shared A computed once or twice)
    alone = [b.copy() for b in before]
    for i in range(3):
        kl.apply(x, lo, i, -1, -1, alone[i], alone[i], alone[i], scales)
        assert np.array_equal(alone[i], outs[i])

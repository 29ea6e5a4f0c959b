"""The architectures with no real weights here (Qwen3, Llama 3.x RoPE scaling, a Mistral-style llama with a
sliding window, Phi-3 with LongRoPE, Gemma 2, OLMo 2, and the mixture-of-experts Qwen3-MoE, OLMoE and
Qwen2-MoE) on the small random models of tests/arch_zoo.py, against llama.cpp's own outputs on the same
files (tests/golden/arch_zoo.json, made by benchmarks/make_arch_golden.py): the top-20 logits at every
position of three prompts and 24 greedy tokens after each, with the tolerances of the real-model golden
checks (test_golden.py). Then what must hold bit for bit: the compiled step against the per-op reference,
chunked prefill against one pass, two sequences batched against each alone."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from arch_zoo import GOLDEN
from conftest import golden_path
from edgeinfer import LLM, SamplingParams
from edgeinfer.engine.kv_cache import KVCache
from edgeinfer.engine.model_runner import Batch
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend, kinds
from edgeinfer.models import load_model
from test_golden import LOGIT_TOL, LOGPROB_TOL, LSE_TOL, TIE_MARGIN, compare_greedy

with open(golden_path("arch_zoo.json")) as f:
    GOLD = json.load(f)["models"]

kb = get_backend("cpu")
BS = 16  # KV block size


def _cache(m, n_blocks=8):
    # f32 KV; two slots of recurrent state (a hybrid model's: a Batch's rows use slots 0, 1, ...)
    return KVCache.for_model(m.cfg, n_blocks, BS, kb=kb, n_state_slots=2)


def _all_logits(m, ids, per_op=False):
    # logits at every position of one sequence's prompt, in one pass
    t = len(ids)
    pos = np.arange(t)
    b = Batch(ids, pos, np.zeros(t), pos, np.arange(8)[None], pos)
    return (m.forward_per_op if per_op else m.forward)(b, _cache(m))


def _cases(name):
    # (n_ctx, prompts) pairs llama.cpp answered for this model: phi3 also at a context that picks the
    # short rope factors
    g = GOLD[name]
    out = [(g["n_ctx"], g["prompts"])]
    if "short_context" in g:
        out.append((g["short_context"]["n_ctx"], g["short_context"]["prompts"]))
    return out


@pytest.mark.parametrize("name", GOLDEN)
def test_the_zoo_writes_the_file_llama_cpp_ran(zoo, name):
    assert hashlib.sha256(zoo(name).read_bytes()).hexdigest() == GOLD[name]["sha256"]


def check_top_logits(name, path):
    """Every position's top 20 against llama.cpp's; returns the largest log-probability error."""
    worst = 0.0
    for n_ctx, prompts in _cases(name):
        m = load_model(GGUFFile(path), kb, n_ctx=n_ctx)
        for p in prompts:
            logits = _all_logits(m, p["ids"])
            for i, want in enumerate(p["positions"]):
                row = logits[i].astype(np.float64)
                top = np.array(want["top_logits"])
                ours = row[want["top_ids"]]
                lse = float(np.log(np.exp(row - row.max()).sum()) + row.max())
                where = (name, n_ctx, len(p["ids"]), i)
                assert np.abs(ours - top).max() < LOGIT_TOL, (where, np.abs(ours - top).max())
                assert abs(lse - want["logsumexp"]) < LSE_TOL, (where, lse, want["logsumexp"])
                err = np.abs((ours - lse) - (top - want["logsumexp"])).max()
                assert err < LOGPROB_TOL, (where, err)
                worst = max(worst, err)
                ours_top2 = np.sort(row)[-2:]
                if top[0] - top[1] >= TIE_MARGIN and ours_top2[1] - ours_top2[0] >= TIE_MARGIN:
                    # the best token, where neither side's top two are within rounding (as compare_greedy)
                    assert int(np.argmax(row)) == want["top_ids"][0], where
    return worst


@pytest.mark.parametrize("name", GOLDEN)
def test_top_logits_match_llama_cpp(zoo, name):
    check_top_logits(name, zoo(name))


@pytest.mark.parametrize("name", GOLDEN)
def test_greedy_continuations_match_llama_cpp(zoo, name):
    for n_ctx, prompts in _cases(name):
        llm = LLM(str(zoo(name)), max_context=n_ctx, progress=False)
        gold = {"greedy": [{"prompt": p["ids"], "prompt_ids": p["ids"], **p["greedy"]} for p in prompts]}
        compare_greedy(llm, gold)


@pytest.mark.parametrize("name", GOLDEN)
def test_compiled_step_equals_per_op_bit_for_bit(zoo, name):
    m = load_model(GGUFFile(zoo(name)), kb)
    # the F16 model takes the per-op path only; the hybrids' mixers (short convolutions, delta nets in Qwen3.5's
    # and Qwen3-Next's layouts, Mamba2 alone or beside attention, FFN layers), NoPE attention, lfm2moe's scored
    # routing and dense first layers, granitehybrid's ungated shared expert, Gemma 3n's streams are in the step
    if name == "olmo2":
        assert m.stack is None
        return
    assert m.stack is not None
    ids = GOLD[name]["prompts"][2]["ids"]
    assert np.array_equal(_all_logits(m, ids), _all_logits(m, ids, per_op=True))


@pytest.mark.parametrize("name", GOLDEN)
def test_chunked_prefill_and_decode_equal_one_pass_bit_for_bit(zoo, name):
    m = load_model(GGUFFile(zoo(name)), kb)
    ids = np.array(GOLD[name]["prompts"][2]["ids"])
    full = _all_logits(m, ids)
    cache = _cache(m)
    table = np.arange(8)[None]
    out, start = [], 0
    for n in (5, 1, 17, 1, 1, 15):  # prefill chunks and single-token steps
        pos = np.arange(start, start + n)
        out.append(m.forward(Batch(ids[start:start + n], pos, np.zeros(n), pos, table, np.arange(n)), cache))
        start += n
    assert start == len(ids)
    assert np.array_equal(np.concatenate(out), full)


@pytest.mark.parametrize("name", GOLDEN)
def test_two_sequences_batched_equal_each_alone_bit_for_bit(zoo, name):
    m = load_model(GGUFFile(zoo(name)), kb)
    a = np.array(GOLD[name]["prompts"][1]["ids"])
    b = np.array(GOLD[name]["prompts"][2]["ids"][:13])
    alone = [_all_logits(m, a), _all_logits(m, b)]
    ids = np.concatenate([a, b])
    pos = np.concatenate([np.arange(len(a)), np.arange(len(b))])
    seq = np.repeat([0, 1], [len(a), len(b)])
    tables = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    slots = tables[seq, pos // BS] * BS + pos % BS
    both = m.forward(Batch(ids, pos, seq, slots, tables, np.arange(len(ids))), _cache(m))
    assert np.array_equal(both[:len(a)], alone[0])
    assert np.array_equal(both[len(a):], alone[1])


@pytest.mark.parametrize("n_expert", [6, 8, 12, 40, 60, 64, 128])
def test_moe_router_picks_the_most_probable_experts(n_expert):
    """The router's choice against a plain numpy softmax and sort, renormalised and not, for expert
    counts that exercise every accumulator of its 32-expert blocks and the experts past a multiple of 8,
    an input length that is not a multiple of 8, and a batch that takes the parallel path."""
    rng = np.random.default_rng(n_expert)
    for t in (9, 40):
        h = rng.standard_normal((t, 67)).astype(np.float32)
        r = rng.standard_normal((n_expert, 67)).astype(np.float32)
        logits = h.astype(np.float64) @ r.T.astype(np.float64)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        want = np.argsort(-p, axis=1, kind="stable")[:, :3]
        for norm in (False, True):
            ids, wts = kb.moe_route(h, np.ascontiguousarray(r.T), 3, norm, 0.0)
            assert np.array_equal(ids, want)
            w = np.take_along_axis(p, want, 1)
            if norm:
                w /= w.sum(1, keepdims=True)
            assert np.allclose(wts, w, rtol=1e-4)
        offsets, order, pos = kb.moe_plan(ids, n_expert)
        assert offsets[-1] == 3 * t and np.all(np.diff(offsets) >= 0)
        for i in range(t):
            for j in range(3):
                s = pos[i, j]
                assert order[s] == i and offsets[ids[i, j]] <= s < offsets[ids[i, j] + 1]


def test_moe_router_ties_go_to_the_lower_expert():
    r = np.zeros((67, 12), np.float32)  # every expert the same logit
    ids, wts = kb.moe_route(np.ones((2, 67), np.float32), r, 4, False, 0.0)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2 and np.allclose(wts, 1 / 12)


@pytest.mark.parametrize("n_expert", [8, 32, 40])
def test_gpt_oss_router_weights_the_k_largest_biased_logits_by_a_softmax_over_them(n_expert):
    """gpt-oss's routing (llama.cpp's softmax_weight gating) against numpy: the k largest of h R^T + b, most
    first, weighted by a softmax over those k alone; the parallel path for a batch, ties to the lower expert."""
    rng = np.random.default_rng(n_expert)
    for t in (3, 40):
        h = rng.standard_normal((t, 67)).astype(np.float32)
        r = rng.standard_normal((n_expert, 67)).astype(np.float32)
        b = rng.standard_normal(n_expert).astype(np.float32)
        logits = h.astype(np.float64) @ r.T.astype(np.float64) + b
        want = np.argsort(-logits, axis=1, kind="stable")[:, :4]
        ids, wts = kb.moe_route_topk_softmax(h, np.ascontiguousarray(r.T), b, 4)
        assert np.array_equal(ids, want)
        top = np.take_along_axis(logits, want, 1)
        w = np.exp(top - top[:, :1])
        assert np.allclose(wts, w / w.sum(1, keepdims=True), rtol=1e-4)
    ids, wts = kb.moe_route_topk_softmax(np.ones((2, 67), np.float32), np.zeros((67, 12), np.float32),
                                         np.zeros(12, np.float32), 4)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2 and np.allclose(wts, 0.25)


def test_quantized_olmo2_runs_the_compiled_step_bit_for_bit(zoo, tmp_path):
    """The zoo's olmo2 is F16 (per-op only); quantized, its layers (post-norms only, q/k norms over the
    whole projection) run in the compiled step, which must agree with the per-op path."""
    from edgeinfer.quant.tool import quantize_model

    p = tmp_path / "olmo2-q8.gguf"
    quantize_model(GGUFFile(zoo("olmo2")), p, "Q8_0", progress=False)
    m = load_model(GGUFFile(p), kb)
    assert m.stack is not None
    ids = GOLD["olmo2"]["prompts"][2]["ids"]
    assert np.array_equal(_all_logits(m, ids), _all_logits(m, ids, per_op=True))


@pytest.mark.skipif(os.environ.get("EDGEINFER_KERNELS") == "portable", reason="this is the portable run")
def test_top_logits_match_llama_cpp_on_the_portable_path():
    """The same golden checks with the portable kernels (the ARM and fallback path), in a process of
    their own (the kernel path is chosen once per process)."""
    env = dict(os.environ, EDGEINFER_KERNELS="portable")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                        "-k", "test_top_logits_match_llama_cpp and not portable"],
                       env=env, capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"{len(GOLDEN)} passed" in p.stdout, p.stdout[-2000:]


def _rewrite(src, dst, *, drop=(), meta=None, arch=None):
    """A copy of the GGUF file src without the tensors in `drop`, with metadata values replaced by `meta`
    ({key: value}, the value's type kept) and the architecture renamed to `arch`."""
    import gguf

    from arch_zoo import copy_fields

    r = gguf.GGUFReader(str(src))
    old_arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    arch = arch or old_arch
    w = gguf.GGUFWriter(str(dst), arch)
    copy_fields(r, w, meta, old_arch, arch)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name, change, message", [
    ("qwen3moe", {"drop": ["blk.1.ffn_up_exps.weight"]}, "missing tensor 'blk.1.ffn_up_exps.weight'"),
    ("qwen3moe", {"meta": {"qwen3moe.expert_count": 6}}, "tensor 'blk.0.ffn_gate_inp.weight' has shape"),
    ("qwen3moe", {"meta": {"qwen3moe.expert_used_count": 9}}, "asks for 9 experts per token out of 8"),
    ("qwen2moe", {"drop": ["blk.0.ffn_gate_inp_shexp.weight"]}, "missing tensor 'blk.0.ffn_gate_inp_shexp.weight'"),
    ("phi3", {"meta": {"phi3.attention.head_count_kv": 4}}, "tensor 'blk.0.attn_qkv.weight' has shape"),
    ("olmo2", {"drop": ["blk.2.attn_k_norm.weight"]}, "missing tensor 'blk.2.attn_k_norm.weight'"),
    ("gemma2", {"drop": ["blk.0.post_ffw_norm.weight"]}, "missing tensor 'blk.0.post_ffw_norm.weight'"),
    ("qwen3", {"arch": "qwen9"}, "unsupported architecture 'qwen9'"),
    ("lfm2", {"drop": ["blk.2.shortconv.conv.weight"]}, "missing tensor 'blk.2.shortconv.conv.weight'"),
    ("lfm2", {"drop": ["blk.0.shortconv.in_proj.weight"]}, "missing tensor 'blk.0.shortconv.in_proj.weight'"),
    ("lfm2", {"meta": {"lfm2.shortconv.l_cache": 4}}, "tensor 'blk.0.shortconv.conv.weight' has shape"),
    ("lfm2", {"meta": {"lfm2.shortconv.l_cache": 1}}, "lfm2.shortconv.l_cache is 1"),
    ("mamba2", {"drop": ["blk.1.ssm_a"]}, "missing tensor 'blk.1.ssm_a'"),
    ("mamba2", {"drop": ["blk.2.ssm_norm.weight"]}, "missing tensor 'blk.2.ssm_norm.weight'"),
    ("mamba2", {"meta": {"mamba2.ssm.state_size": 16}}, "tensor 'blk.0.ssm_in.weight' has shape"),
    ("mamba2", {"meta": {"mamba2.ssm.time_step_rank": 7}}, "ssm.inner_size 512 must be a multiple of"),
    ("granitehybrid", {"drop": ["blk.2.ffn_up_shexp.weight"]}, "missing tensor 'blk.2.ffn_up_shexp.weight'"),
    ("granitehybrid", {"drop": ["blk.0.ssm_dt.bias"]}, "missing tensor 'blk.0.ssm_dt.bias'"),
    ("nemotron_h", {"drop": ["blk.4.ffn_down.weight"]}, "missing tensor 'blk.4.ffn_down.weight'"),
    ("nemotron_h", {"drop": ["blk.2.attn_k.weight"]}, "missing tensor 'blk.2.attn_k.weight'"),
    ("qwen35", {"drop": ["blk.1.ssm_beta.weight"]}, "missing tensor 'blk.1.ssm_beta.weight'"),
    ("qwen35", {"drop": ["blk.0.ssm_a"]}, "missing tensor 'blk.0.ssm_a'"),
    ("qwen35", {"meta": {"qwen35.ssm.inner_size": 512}}, "ssm.inner_size 512 must be ssm.time_step_rank 4 value heads"),
    ("qwen35", {"meta": {"qwen35.full_attention_interval": 2}}, "missing tensor 'blk.1.attn_q.weight'"),
    ("qwen35moe", {"drop": ["blk.3.ffn_gate_inp_shexp.weight"]}, "missing tensor 'blk.3.ffn_gate_inp_shexp.weight'"),
    ("qwen3next", {"drop": ["blk.0.ssm_ba.weight"]}, "missing tensor 'blk.0.ssm_ba.weight'"),
    ("lfm2moe", {"drop": ["blk.2.exp_probs_b.bias"]}, "missing tensor 'blk.2.exp_probs_b.bias'"),
    ("lfm2moe", {"meta": {"lfm2moe.expert_gating_func": 3}}, "lfm2moe.expert_gating_func is 3"),
    ("falcon-h1", {"drop": ["blk.1.ffn_norm"]}, "missing tensor 'blk.1.ffn_norm'"),
    ("falcon-h1", {"drop": ["blk.2.attn_v.weight"]}, "missing tensor 'blk.2.attn_v.weight'"),
    ("nemotron_h", {"meta": {"nemotron_h.ssm.group_count": 3}}, "must be a multiple of ssm.time_step_rank 8, and that of "
                                                                "ssm.group_count 3"),
    ("mamba2", {"meta": {"mamba2.ssm.time_step_rank": 128}}, "heads of 4 channels (ssm.inner_size 512 / "
                                                             "ssm.time_step_rank 128) are not supported"),
    ("qwen35", {"meta": {"qwen35.ssm.state_size": 4, "qwen35.ssm.inner_size": 16}}, "heads of 4 channels"),
    ("gpt-oss", {"drop": ["blk.1.attn_sinks.weight"]}, "missing tensor 'blk.1.attn_sinks.weight'"),
    ("gpt-oss", {"drop": ["blk.0.ffn_down_exps.bias"]}, "missing tensor 'blk.0.ffn_down_exps.bias'"),
    ("gpt-oss", {"drop": ["blk.3.ffn_gate_inp.bias"]}, "missing tensor 'blk.3.ffn_gate_inp.bias'"),
    ("gpt-oss", {"meta": {"gpt-oss.attention.head_count": 8}}, "tensor 'blk.0.attn_q.weight' has shape"),
    ("gpt-oss", {"meta": {"gpt-oss.rope.scaling.factor": -4.0}}, "YaRN RoPE scaling needs a positive"),
    ("gemma4", {"drop": ["per_layer_model_proj.weight"]}, "missing tensor 'per_layer_model_proj.weight'"),
    ("gemma4", {"drop": ["blk.2.inp_gate.weight"]}, "missing tensor 'blk.2.inp_gate.weight'"),
    ("gemma4", {"drop": ["blk.3.attn_k.weight"]}, "missing tensor 'blk.3.attn_k.weight'"),
    ("gemma4", {"meta": {"gemma4.attention.shared_kv_layers": 3}}, "layer 3 would read layer 2's KV"),
    ("gemma4", {"meta": {"gemma4.attention.key_length_swa": 32}}, "layer 0: 4 heads of 32 over 2 KV heads (values 64), 64 rotated"),
    ("gemma4", {"meta": {"gemma4.attention.value_length_swa": 32}}, "tensor 'blk.0.attn_v.weight' has shape"),
    ("gemma4", {"meta": {"gemma4.embedding_length_per_layer_input": 16}}, "has shape"),
    ("gemma4moe", {"drop": ["blk.1.ffn_gate_inp.scale"]}, "missing tensor 'blk.1.ffn_gate_inp.scale'"),
    ("gemma4moe", {"drop": ["blk.4.pre_ffw_norm_2.weight"]}, "missing tensor 'blk.4.pre_ffw_norm_2.weight'"),
    ("gemma4moe", {"meta": {"gemma4.expert_feed_forward_length": 128}}, "tensor 'blk.0.ffn_gate_up_exps.weight' has"),
    ("gemma3n", {"drop": ["blk.3.laurel_r.weight"]}, "missing tensor 'blk.3.laurel_r.weight'"),
    ("gemma3n", {"drop": ["altup_unembd_proj.weight"]}, "missing tensor 'altup_unembd_proj.weight'"),
    ("gemma3n", {"drop": ["blk.0.laurel_l.weight"]}, "a blk.0.laurel_l.weight matrix"),
    ("gemma3n", {"meta": {"gemma3n.altup.active_idx": 4}}, "altup.active_idx 4"),
    ("gemma3n", {"meta": {"gemma3n.embedding_length_per_layer_input": 0}}, "need their per-layer inputs"),
    ("gemma4", {"meta": {"gemma4.attention.sliding_window": 0}}, "it must be the window's length"),
])
def test_a_broken_file_of_a_new_architecture_is_a_one_line_error(zoo, tmp_path, name, change, message):
    p = tmp_path / "broken.gguf"
    _rewrite(zoo(name), p, **change)
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "generate", str(p), "hi", "--max-tokens", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    err = r.stderr.split("\x1b[K")[-1].strip()  # after any compile progress line
    assert len(err.splitlines()) == 1 and message in err, r.stderr[-2000:]


def test_a_gemma4_draft_model_addresses_its_own_window_pool_as_the_full_one(zoo):
    """A runner given no window pool (a draft model's) still gets one for Gemma 4's sliding layers (their rows
    are of their own shape), addressed by the block tables, not the target's window tables."""
    from edgeinfer.engine.model_runner import ModelRunner

    m = load_model(GGUFFile(zoo("gemma4")), kb)
    r = ModelRunner(m, 8, BS, "f32")
    assert r.cache.n_window_blocks == 8 and not r.window
    assert ModelRunner(m, 8, BS, "f32", n_window_blocks=4).window


def test_moe_on_the_cuda_backend_is_a_one_line_error(zoo):
    pytest.importorskip("numba.cuda")
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("the CUDA backend is tested on numba's simulator")
    from edgeinfer.models.common import ModelLoadError

    with pytest.raises(ModelLoadError, match="qwen3moe is a mixture-of-experts model: the cuda backend cannot run"):
        load_model(GGUFFile(zoo("qwen3moe")), get_backend("cuda"))


@pytest.mark.parametrize("name, message", [("gemma4", "gemma4's layers of their own shapes.* are not on the cuda backend yet"),
                                           ("gemma3n", "gemma3n is not on the cuda backend yet")])
def test_gemma_4_and_3n_on_the_cuda_backend_are_a_one_line_error(zoo, name, message):
    pytest.importorskip("numba.cuda")
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("the CUDA backend is tested on numba's simulator")
    from edgeinfer.models.common import ModelLoadError

    with pytest.raises(ModelLoadError, match=message):
        load_model(GGUFFile(zoo(name)), get_backend("cuda"))


@pytest.mark.parametrize("name", ["llama3", "phi3"])
def test_rope_factor_models_load_on_the_cuda_backend(zoo, name):
    """Llama 3's rope_freqs and LongRoPE's factors are read on the host and divide the frequencies before
    their upload, on every backend."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("the CUDA backend is tested on numba's simulator")
    gpu = load_model(GGUFFile(zoo(name)), get_backend("cuda"))
    cpu = load_model(GGUFFile(zoo(name)), kb)
    assert np.allclose(gpu.inv_freq.copy_to_host(), cpu.inv_freq, rtol=1e-6)


def test_the_parallel_compile_plans_the_step_signature_models_run(zoo):
    """The worker processes compile the step for the argument types LayerStack.run passes (a mismatch
    makes a first run compile it again in the main process), dense and MoE models alike; a model with
    experts also gets the experts unit (its FFN, compiled beside the step), a dense model never does."""
    from edgeinfer.kernels.cpu import parallel_compile, step
    from edgeinfer.kernels.cpu.parts import moe as moe_part
    from edgeinfer.kernels.cpu.parts import deltanet, mamba2, shortconv
    from edgeinfer.models.common import has_experts, step_mixers

    from edgeinfer.kernels.cpu import altup

    units = {}
    for name in ("qwen3", "qwen3moe", "lfm2", "qwen35", "mamba2", "gemma3n"):
        gf = GGUFFile(zoo(name))
        m = load_model(gf, kb)
        cache = KVCache.for_model(m.cfg, 8, BS, "f16", kb=kb, n_state_slots=1)
        m.forward(Batch([5, 6], [0, 1], [0, 0], [0, 1], np.arange(8)[None], [1]), cache)
        jobs = {j.name: j for j in parallel_compile.plan("avx2", {kinds.Q8_0}, ["f16"], experts=has_experts(gf),
                                                         mixers=step_mixers(gf))}
        assert ("experts" in jobs) == (name == "qwen3moe") and ("mixer shortconv" in jobs) == (name == "lfm2")
        assert ("mixer deltanet" in jobs) == (name == "qwen35") and ("mixer mamba2" in jobs) == (name == "mamba2")
        assert ("altup walk (f16 KV)" in jobs) == (name == "gemma3n") != ("step (f16 KV)" in jobs)  # one or the other
        units.update(jobs)
    assert parallel_compile.step_sig("f16") in {tuple(s) for s in step.forward_layers.signatures}
    assert units["experts"].sig in {tuple(s) for s in moe_part.forward.signatures}
    assert units["mixer shortconv"].sig in {tuple(s) for s in shortconv.forward.signatures}
    assert units["mixer deltanet"].sig in {tuple(s) for s in deltanet.forward.signatures}
    assert units["mixer mamba2"].sig in {tuple(s) for s in mamba2.forward.signatures}
    assert units["altup walk (f16 KV)"].sig in {tuple(s) for s in altup.forward_layers.signatures}  # Gemma 3n's


def test_qwen3_thinking_switch_reaches_the_template(zoo):
    llm = LLM(str(zoo("qwen3")), progress=False)
    msgs = [{"role": "user", "content": "hi"}]
    on = llm.render_chat(msgs)
    off = llm.render_chat(msgs, template_vars={"enable_thinking": False})
    assert off == on + llm.tokenize("<think>\n\n</think>\n\n", parse_special=True)

"""Hybrid models (recurrent layers beside attention) in the engine, on the arch zoo's LFM2, Mamba2, Granite 4 H
Nemotron-H, Qwen3.5 and Falcon-H1: each running
sequence holds a slot of recurrent state; continuous batching, chunked prefill, preemption and aborts give
what each request alone gives; prefix caching reuses a prefix only from a checkpoint of the state at its
end; memory counts KV for the attention layers alone and the state per sequence. (Their golden checks
against llama.cpp and broken-file errors are test_arch_zoo's.)"""

import subprocess
import sys

import numpy as np
import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.engine.block_manager import BlockManager
from edgeinfer.engine.sequence import Sequence
from edgeinfer.file_estimate import estimate_file
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend
from edgeinfer.models import load_model

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(8, 260, n)] for i, n in enumerate((5, 23, 40, 9, 17, 31))]


@pytest.fixture(scope="module")
def lfm2(zoo):
    return str(zoo("lfm2"))


@pytest.fixture(scope="module", params=["lfm2", "lfm2moe", "mamba2", "granitehybrid", "nemotron_h", "qwen35",
                                        "qwen35moe", "qwen3next", "falcon-h1"])
def model(request, zoo):
    return str(zoo(request.param))


@pytest.fixture(scope="module")
def llm(model):
    return LLM(model, engine_config=EngineConfig(max_seqs=4, num_kv_blocks=64, block_size=4), progress=False)


def _alone(llm, prompts, params=GREEDY):
    return [llm.generate(p, params)[0].token_ids for p in prompts]


def test_the_config_says_which_layers_keep_what(lfm2, zoo):
    cfg = load_model(GGUFFile(lfm2), get_backend("cpu")).cfg
    assert cfg.mixers == ("shortconv", "attention", "shortconv", "attention", "shortconv")
    assert cfg.kv_layers == (1, 3) and cfg.conv_layers == (0, 2, 4) and cfg.recurrent
    assert cfg.state_bytes_per_seq == 3 * cfg.dim * (cfg.conv_l_cache - 1) * 4
    m = load_model(GGUFFile(zoo("mamba2")), get_backend("cpu")).cfg
    assert m.mixers == ("mamba2",) * 3 and m.kv_layers == () and m.ssm_layers == (0, 1, 2)
    # per layer: the convolution's last 3 inputs of x, B and C, and 8 heads' (64, 32) matrices
    assert m.state_bytes_per_seq == 3 * 4 * (3 * (512 + 2 * 2 * 32) + 512 * 32)
    n = load_model(GGUFFile(zoo("nemotron_h")), get_backend("cpu"))
    assert n.cfg.mixers == ("mamba2", "mlp", "attention", "mamba2", "mlp") and n.cfg.kv_layers == (2,)
    assert not n.cfg.rope and n.stack is not None and n.cfg.ffn_dim == 512  # NoPE in the step: angles 0
    g = load_model(GGUFFile(zoo("granitehybrid")), get_backend("cpu"))
    assert g.cfg.mixers == ("mamba2", "attention", "mamba2", "mamba2") and not g.cfg.rope
    assert g.spec.moe and g.spec.shared_expert and not g.spec.shared_gate and g.cfg.n_expert == 8
    assert (g.cfg.embed_scale, g.cfg.residual_scale, g.cfg.attn_scale, g.cfg.logit_scale) == \
        tuple(float(np.float32(v)) for v in (8.0, 0.5, 0.09, 4.0))


def test_batched_sequences_equal_each_alone_with_more_requests_than_state_slots(llm):
    alone = _alone(llm, PROMPTS)
    batched = [c.token_ids for c in llm.generate(PROMPTS, GREEDY)]  # 6 requests, 4 slots: some wait
    assert batched == alone
    bm = llm.engine.block_manager
    assert bm.num_used == 0 and len(bm.free_states) == bm.num_state_slots == 4


def test_chunked_prefill_equals_one_pass(model, llm):
    chunked = LLM(model, engine_config=EngineConfig(max_seqs=4, num_kv_blocks=64, block_size=4,
                                                   max_num_batched_tokens=7), progress=False)
    assert [c.token_ids for c in chunked.generate(PROMPTS[:3], GREEDY)] == _alone(llm, PROMPTS[:3])


def test_preemption_recomputes_the_state(model, llm):
    tight = LLM(model, engine_config=EngineConfig(num_kv_blocks=16, block_size=4, max_seqs=4), progress=False)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    got = [c.token_ids for c in tight.generate(PROMPTS[:4], params)]
    assert tight.stats()["preemptions"] > 0
    assert got == _alone(llm, PROMPTS[:4], params)
    tight.engine.block_manager.check_invariants([])


def test_a_repeated_prompt_reuses_its_prefix_from_a_state_checkpoint(model, llm):
    """The prompt's prefill stops at its last block boundary and the state there is checkpointed: the same
    prompt again computes only its last partial block, with the same output as an engine that never cached."""
    eng = llm.engine
    assert eng.block_manager.enable_prefix_caching and eng.block_manager.num_checkpoints == 4
    prompt = PROMPTS[2]  # 40 tokens: blocks of 4, the hit ends at the boundary before its last token (36)
    fresh = LLM(model, engine_config=EngineConfig(max_seqs=4, num_kv_blocks=64, block_size=4), progress=False)
    want = fresh.generate(prompt, GREEDY)[0].token_ids
    assert llm.generate(prompt, GREEDY)[0].token_ids == want
    before = eng.runner.num_forward_tokens
    assert llm.generate(prompt, GREEDY)[0].token_ids == want
    assert eng.runner.num_forward_tokens - before == (len(prompt) - 36) + GREEDY.max_tokens - 1
    eng.block_manager.check_invariants([])


def test_the_next_turn_of_a_conversation_reuses_the_last_one(model, llm):
    """A follow-up whose prompt is the previous prompt and answer plus new tokens starts from the state the
    answer's decoding checkpointed at its last block boundary, and gives what a fresh engine gives."""
    eng = llm.engine
    first = PROMPTS[1]
    answer = llm.generate(first, GREEDY)[0].token_ids
    follow = first + answer + PROMPTS[3]
    fresh = LLM(model, engine_config=EngineConfig(max_seqs=4, num_kv_blocks=64, block_size=4), progress=False)
    before = eng.runner.num_forward_tokens
    assert llm.generate(follow, GREEDY)[0].token_ids == fresh.generate(follow, GREEDY)[0].token_ids
    computed_before_answer_end = (len(first) + len(answer) - 1) // 4 * 4  # the answer's last boundary
    assert eng.runner.num_forward_tokens - before == len(follow) - computed_before_answer_end + GREEDY.max_tokens - 1


def test_state_checkpoints_cut_a_hit_back_to_a_saved_state_and_evict_least_recently_used():
    bm = BlockManager(64, 4, num_state_slots=2, num_checkpoints=2)
    a = Sequence(list(range(100, 113)), GREEDY)  # 13 tokens: 3 full blocks before the last token
    bm.allocate(a)
    bm.plan_checkpoint(a, 5)  # tokens 0-4 cross the boundary at 4: the kernels save the state there
    assert a.snapshot == (2, 4)  # slots 0, 1: sequences'; 2, 3: checkpoints
    bm.plan_checkpoint(a, 13)  # planned again (the whole prompt): its last boundary before its last token
    assert a.snapshot == (2, 12) and bm.free_checkpoints == [3]
    a.num_computed_tokens = 13
    bm.commit(a)
    bm.checkpoint(a)
    assert a.snapshot is None and len(bm.checkpoints) == 1
    bm.free_seq(a)
    b = Sequence(list(range(100, 114)), GREEDY)  # a's 13 tokens and one more: KV and the state after 12
    assert bm.allocate(b) == 12 and bm.take_restores() == [(2, b.state_slot)] and bm.restores == []
    bm.free_seq(b)
    c = Sequence(list(range(200, 213)), GREEDY)  # nothing cached: nothing restored
    assert bm.allocate(c) == 0 and bm.restores == []
    for n in (4, 8):  # two checkpoints while decoding: the least recently used (a's, used by b) goes first
        bm.plan_checkpoint(c, 4)
        c.num_computed_tokens = n
        bm.commit(c)
        bm.checkpoint(c)
    bm.check_invariants([c])
    assert len(bm.checkpoints) == 2
    d = Sequence(list(range(100, 113)), GREEDY)  # a's blocks still cached, its checkpoint evicted: recomputed
    assert bm.allocate(d) == 0 and bm.restores == []
    bm.plan_checkpoint(d, 2)  # no boundary crossed: no plan
    assert d.snapshot is None
    bm.plan_checkpoint(d, 4)
    bm.free_seq(d)  # a plan of a sequence that goes (aborted, preempted) gives its slot back
    bm.check_invariants([c])


def test_an_abort_frees_the_state_slot(llm):
    eng = llm.engine
    rid = eng.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(3):
        eng.step()
    s = eng.stats()
    # 4 slots for running sequences and 4 for prefix caching's checkpoints
    assert (s["state_slots_used"], s["state_slots_total"]) == (1, 4) and s["state_bytes"] == 8 * llm.config.state_bytes_per_seq
    assert len(eng.block_manager.free_states) == 3
    eng.abort(rid)
    eng.step()
    assert not eng.has_unfinished() and len(eng.block_manager.free_states) == 4


def test_admission_waits_for_a_state_slot():
    bm = BlockManager(64, 4, num_state_slots=2)
    seqs = [Sequence([1, 2, 3], GREEDY) for _ in range(3)]
    for s in seqs[:2]:
        assert bm.can_allocate(s)
        bm.allocate(s)
    assert {s.state_slot for s in seqs[:2]} == {0, 1}
    assert not bm.can_allocate(seqs[2])  # blocks to spare, no slot
    bm.free_seq(seqs[0])
    assert bm.can_allocate(seqs[2]) and seqs[0].state_slot == -1
    bm.allocate(seqs[2])
    bm.check_invariants(seqs[1:])


def test_speculation_on_a_hybrid_model_from_the_cli(lfm2):
    args = [sys.executable, "-m", "edgeinfer.cli.main", "generate", lfm2, "hi", "--max-tokens", "6", "--temperature", "0"]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=300)
    spec = subprocess.run(args + ["--speculate", "lookup"], capture_output=True, text=True, timeout=300)
    assert plain.returncode == spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout  # (test_hybrid_speculation.py checks the rollback itself)


def test_memory_counts_kv_of_the_attention_layers_alone(lfm2):
    est = estimate_file(GGUFFile(lfm2), EngineConfig())
    cfg = load_model(GGUFFile(lfm2), get_backend("cpu")).cfg
    assert est.kv_per_token["f32"] == 2 * cfg.n_kv_head * (cfg.head_dim + cfg.v_head_dim) * 4  # 2 of 5 layers


def test_a_hybrid_model_on_the_cuda_backend_is_a_one_line_error(lfm2):
    pytest.importorskip("numba.cuda")
    from edgeinfer.models.common import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"lfm2 has recurrent layers \(shortconv\): the cuda backend cannot run those yet"):
        load_model(GGUFFile(lfm2), get_backend("cuda"))


def test_inspect_memory_reports_the_state_apart_from_the_kv(lfm2):
    import json

    runs = {}
    for ctx in (256, 512):
        r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "inspect", lfm2, "--memory", "--json",
                            "--max-context", str(ctx)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        runs[ctx] = json.loads(r.stdout)
    cfg = load_model(GGUFFile(lfm2), get_backend("cpu")).cfg
    mem = runs[256]["memory"] if "memory" in runs[256] else runs[256]
    assert mem["recurrent_state_mb_per_seq"] == round(2 * cfg.state_bytes_per_seq / 2**20, 3)  # and its checkpoint
    per_1k = mem["kv_mb_per_1k_tokens"][mem["default_kv_type"]]
    assert per_1k == round(2 * cfg.n_kv_head * (cfg.head_dim + cfg.v_head_dim) * 2 * 1000 / 2**20, 2)  # f16, 2 layers
    other = runs[512]["memory"] if "memory" in runs[512] else runs[512]
    assert other["recurrent_state_mb"] == mem["recurrent_state_mb"]  # constant in the context


@pytest.mark.parametrize("name, taps", [("lfm2", "blk.0.shortconv.conv.weight"), ("mamba2", "blk.0.ssm_conv1d.weight"),
                                        ("granitehybrid", "blk.0.ssm_conv1d.weight"),
                                        ("nemotron_h", "blk.3.ssm_conv1d.weight"), ("qwen35", "blk.0.ssm_conv1d.weight"),
                                        ("qwen35moe", "blk.1.ssm_conv1d.weight"),
                                        ("qwen3next", "blk.2.ssm_conv1d.weight"),
                                        ("lfm2moe", "blk.0.shortconv.conv.weight"),
                                        ("falcon-h1", "blk.1.ssm_conv1d.weight")])
def test_quantize_model_writes_llama_quantizes_file_byte_for_byte(tmp_path, name, taps):
    """Q4_K_M of the LFM2 and Mamba2 zoo models' F16 forms: the convolution taps kept F32 (llama.cpp never
    quantizes them), the rest by the usual rules, tensors in llama-quantize's order; sha256 from llama.cpp
    (benchmarks/make_arch_golden.py)."""
    import json

    from arch_zoo import quantize_model_q4_k_m
    from conftest import golden_path

    want = json.load(open(golden_path("arch_zoo.json")))["models"][name]["llama_quantize_q4_k_m_sha256"]
    sha, dst = quantize_model_q4_k_m(name, tmp_path)
    assert sha == want and GGUFFile(dst).tensors[taps].ggml_type.name == "F32"


def test_n_choices_and_priorities_on_a_hybrid_model(llm):
    """n choices each get a state slot of their own (no shared prefix: each computes the prompt), and a
    high-priority request admitted past waiting ones gives what it gives alone."""
    params = SamplingParams(temperature=0.8, max_tokens=8, seed=7, ignore_eos=True)
    eng = llm.engine
    rid = eng.add_request(PROMPTS[2], params, n=3)
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == rid:
                outs.setdefault(o.index, []).extend(o.new_token_ids)
    assert sorted(outs) == [0, 1, 2] and all(len(v) == 8 for v in outs.values())
    alone = _alone(llm, [PROMPTS[3]])[0]
    low = [eng.add_request(p, GREEDY, priority=5) for p in PROMPTS[:4]]
    hi = eng.add_request(PROMPTS[3], GREEDY, priority=0)
    got = {}
    while eng.has_unfinished():
        for o in eng.step():
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert got[hi] == alone and all(len(got[r]) == GREEDY.max_tokens for r in low)


def test_a_memory_budget_counts_the_state_of_every_sequence():
    """A state-space model's sequences are cut to the states its budget holds (the KV pool of a model with
    no attention is empty): each sequence's state comes out of the budget."""
    from edgeinfer import memory
    from edgeinfer.memory import MB, RUNTIME_BYTES

    est = memory.Estimate(weights=100 * MB, kv_per_token={"f16": 0}, buffers=10 * MB, max_context=4096,
                          state_per_seq=50 * MB)
    for extra, seqs in ((0, 1), (120, 3), (1000, 8)):  # MB beyond one sequence's needs
        budget = (RUNTIME_BYTES + 160 * MB) // MB + extra
        (cfg,) = memory.fit_budget([est], [EngineConfig(kv_dtype="f16", max_seqs=8)], budget)
        assert cfg.max_seqs == seqs
        assert RUNTIME_BYTES + est.weights + est.buffers + cfg.max_seqs * est.state_per_seq <= budget * MB


def test_older_qwen3next_files_with_one_ssm_in_projection_give_the_same_logits(zoo, tmp_path):
    """Qwen3-Next files from before the converter split the delta net's input projection hold q, k, v and z in
    one ssm_in, grouped by key head (llama.cpp's legacy path): the same rows regrouped give the same logits,
    bit for bit."""
    import gguf

    from arch_zoo import copy_fields

    src, dst = zoo("qwen3next"), tmp_path / "legacy.gguf"
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "qwen3next")
    copy_fields(r, w)
    cfg = load_model(GGUFFile(src), get_backend("cpu")).cfg
    nk, dk, rep = cfg.ssm_groups, cfg.ssm_state, cfg.ssm_heads // cfg.ssm_groups
    tensors = {t.name: t for t in r.tensors}
    for t in r.tensors:
        if t.name.endswith("attn_gate.weight"):
            continue
        if not t.name.endswith("attn_qkv.weight"):
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        qkv, z = np.asarray(t.data), np.asarray(tensors[t.name.replace("attn_qkv", "attn_gate")].data)
        key = nk * dk
        rows = []
        for g in range(nk):  # per key head: its q, its k, its value heads' v, their z
            rows += [qkv[g * dk:(g + 1) * dk], qkv[key + g * dk:key + (g + 1) * dk],
                     qkv[2 * key + g * rep * dk:2 * key + (g + 1) * rep * dk], z[g * rep * dk:(g + 1) * rep * dk]]
        data = np.concatenate(rows)
        w.add_tensor(t.name.replace("attn_qkv", "ssm_in"), data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from edgeinfer.engine.kv_cache import KVCache
    from edgeinfer.engine.model_runner import Batch

    kb = get_backend("cpu")
    models = [load_model(GGUFFile(p), kb) for p in (src, dst)]
    assert models[1].layers[0].ssm_in is not None and models[1].layers[0].ssm_qkv is None
    ids, outs = PROMPTS[2], []
    for m in models:
        cache = KVCache.for_model(m.cfg, 64, 4, "f16", kb=kb, n_state_slots=1)
        n = len(ids)
        batch = Batch(ids, list(range(n)), [0] * n, list(range(n)), np.arange(64)[None], list(range(n)))
        outs.append(m.forward(batch, cache))
    assert np.array_equal(outs[0], outs[1])


def test_inspect_names_the_layer_kinds_of_a_hybrid_model(zoo):
    from edgeinfer.info import summarize

    q = summarize(GGUFFile(zoo("qwen35")))
    assert q["layer_kinds"] == "3 deltanet, 1 attention"
    assert "fused_tensors" not in q and "norms" not in q  # attn_qkv and post_attention_norm are the delta net's, the FFN's
    assert summarize(GGUFFile(zoo("nemotron_h")))["layer_kinds"] == "2 mamba2, 2 mlp, 1 attention"
    assert "layer_kinds" not in summarize(GGUFFile(zoo("qwen3")))


def test_qwen35_layers_from_recurrent_layers_before_the_interval(zoo, tmp_path):
    """Files converted from a config with layer_types say which layers are linear in
    attention.recurrent_layers, which llama.cpp reads before full_attention_interval."""
    import gguf

    from arch_zoo import copy_fields

    src, dst = zoo("qwen35"), tmp_path / "layers.gguf"
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "qwen35")
    copy_fields(r, w, {"qwen35.full_attention_interval": 2})  # wrong on purpose: the per-layer flags win
    w.add_array("qwen35.attention.recurrent_layers", [True, True, True, False])
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    kb = get_backend("cpu")
    assert load_model(GGUFFile(dst), kb).cfg.mixers == ("deltanet",) * 3 + ("attention",)
    ids = PROMPTS[1]
    assert LLM(str(dst), progress=False).generate(ids, GREEDY)[0].token_ids == \
        LLM(str(src), progress=False).generate(ids, GREEDY)[0].token_ids

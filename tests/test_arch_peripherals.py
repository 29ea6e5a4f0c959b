"""The new architectures' peripherals on the arch zoo's models: quantize-model on 3-D experts and fused
tensors, the memory estimate (every expert's bytes, KV rows of attention.key_length) and inspect's facts."""

import json

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf.constants import GGMLQuantizationType as T

from edgeinfer import memory
from edgeinfer.cli.main import main
from edgeinfer.config import EngineConfig
from edgeinfer import file_estimate
from edgeinfer.file_estimate import estimate_file
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.info import summarize
from edgeinfer.quant.mixes import TYPES
from edgeinfer.quant.tool import make_plan, quantize_model


@pytest.fixture(scope="module")
def f32(zoo, tmp_path_factory):
    """f32(name): the zoo model with every quantizable tensor dequantized to F32: a clean source."""
    d = tmp_path_factory.mktemp("f32")
    paths = {}

    def get(name):
        if name not in paths:
            paths[name] = d / f"{name}-f32.gguf"
            with GGUFFile(zoo(name)) as gf:
                quantize_model(gf, paths[name], "F32", progress=False, warn=lambda m: None)
        return paths[name]

    return get


def floats(gf: GGUFFile, name: str) -> np.ndarray:
    """A tensor dequantized to float32, numpy shape (reversed ggml shape)."""
    t = gf.tensors[name]
    x = gguf.quants.dequantize(np.array(gf.tensor_bytes(name)), t.ggml_type)
    return np.asarray(x, np.float32).reshape(tuple(reversed(t.shape)))


def rel_rmse(y, x):
    return float(np.sqrt(((y - x) ** 2).mean() / (x ** 2).mean()))


def test_qwen3moe_q4_k_m_quantizes_each_expert_and_keeps_shapes(f32, tmp_path):
    src_path, dst = f32("qwen3moe"), tmp_path / "qwen3moe-q4_k_m.gguf"
    with GGUFFile(src_path) as gf:
        quantize_model(gf, dst, "Q4_K_M", progress=False)
    src, out = GGUFFile(src_path), GGUFFile(dst)
    assert out.metadata["general.file_type"] == int(TYPES["Q4_K_M"][0])
    assert {n: t.shape for n, t in out.tensors.items()} == {n: t.shape for n, t in src.tensors.items()}
    types = {n: t.ggml_type for n, t in out.tensors.items()}
    # 3 layers: use_more_bits(i, 3) only for layer 2; 8 experts: llama.cpp's Mixtral bumps of attention
    for i in range(3):
        b = f"blk.{i}."
        assert out.tensors[b + "ffn_gate_exps.weight"].shape == (256, 256, 8)  # ggml (cols, rows, n_expert)
        assert types[b + "ffn_gate_exps.weight"] == types[b + "ffn_up_exps.weight"] == T.Q4_K
        assert types[b + "ffn_down_exps.weight"] == (T.Q6_K if i == 2 else T.Q4_K)
        assert types[b + "attn_v.weight"] == types[b + "attn_k.weight"] == T.Q8_0
        assert types[b + "attn_output.weight"] == T.Q5_K and types[b + "attn_q.weight"] == T.Q4_K
        for kept in ("ffn_gate_inp", "attn_q_norm", "attn_k_norm", "attn_norm", "ffn_norm"):
            assert types[b + kept + ".weight"] == T.F32
            assert np.array_equal(out.tensor_bytes(b + kept + ".weight"), src.tensor_bytes(b + kept + ".weight"))
    assert types["output.weight"] == T.Q6_K and types["token_embd.weight"] == T.Q4_K
    # each expert's slice is that expert, quantized: the stacking keeps the experts' order
    for name, bound in (("blk.0.ffn_up_exps.weight", 0.085), ("blk.2.ffn_down_exps.weight", 0.021)):
        x, y = floats(src, name), floats(out, name)
        errs = [[rel_rmse(y[e], x[f]) for f in range(8)] for e in range(8)]
        assert all(errs[e][e] < bound and min(errs[e][:e] + errs[e][e + 1:]) > 0.5 for e in range(8))
    # gguf's own reader agrees on the 3-D tensors
    r = {t.name: t for t in gguf.GGUFReader(dst).tensors}
    assert [int(d) for d in r["blk.1.ffn_down_exps.weight"].shape] == [256, 256, 8]
    assert r["blk.1.ffn_down_exps.weight"].tensor_type == T.Q4_K


def test_quantized_experts_requantize_expert_by_expert(zoo, tmp_path):
    # a Q4_K/Q6_K source (the zoo's own file): each expert dequantized and requantized to Q8_0
    dst = tmp_path / "q8.gguf"
    with GGUFFile(zoo("qwen2moe")) as gf:
        quantize_model(gf, dst, "Q8_0", progress=False, threads=2, warn=lambda m: None)
    src, out = GGUFFile(zoo("qwen2moe")), GGUFFile(dst)
    for name in ("blk.0.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_down_shexp.weight"):
        assert out.tensors[name].ggml_type == T.Q8_0 and out.tensors[name].shape == src.tensors[name].shape
        assert rel_rmse(floats(out, name), floats(src, name)) < 0.007
    for kept in ("blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp_shexp.weight"):
        assert out.tensors[kept].ggml_type == T.F32 and out.tensors[kept].shape == src.tensors[kept].shape


def test_phi3_fused_tensors_and_rope_factors(f32, tmp_path):
    dst = tmp_path / "phi3-q4_k_m.gguf"
    with GGUFFile(f32("phi3")) as gf:
        quantize_model(gf, dst, "Q4_K_M", progress=False)
    src, out = GGUFFile(f32("phi3")), GGUFFile(dst)
    assert {n: t.shape for n, t in out.tensors.items()} == {n: t.shape for n, t in src.tensors.items()}
    types = {n: t.ggml_type for n, t in out.tensors.items()}
    # attn_qkv takes attn_v's rule: use_more_bits(i, 2) is layer 1 only
    assert [types[f"blk.{i}.attn_qkv.weight"] for i in range(2)] == [T.Q4_K, T.Q6_K]
    assert [types[f"blk.{i}.ffn_down.weight"] for i in range(2)] == [T.Q4_K, T.Q6_K]
    ffn = src.metadata["phi3.feed_forward_length"]
    assert out.tensors["blk.0.ffn_up.weight"].shape == (256, 2 * ffn) and types["blk.0.ffn_up.weight"] == T.Q4_K
    for name in ("rope_factors_short.weight", "rope_factors_long.weight"):
        assert types[name] == T.F32 and np.array_equal(out.tensor_bytes(name), src.tensor_bytes(name))
    assert rel_rmse(floats(out, "blk.1.attn_qkv.weight"), floats(src, "blk.1.attn_qkv.weight")) < 0.021


def test_llama3_rope_freqs_and_qwen3_norms_are_kept(zoo):
    for name, kept in (("llama3", ["rope_freqs.weight"]), ("qwen3", ["blk.0.attn_q_norm.weight"]),
                       ("olmo2", ["blk.0.attn_k_norm.weight", "blk.0.post_ffw_norm.weight"]),
                       ("gemma2", ["blk.0.post_attention_norm.weight"])):
        with GGUFFile(zoo(name)) as gf:
            p = {x.name: x for x in make_plan(gf, "Q4_K_M")}
        for k in kept:
            assert p[k].dst_type == T.F32 and p[k].note == "kept", (name, k)


def test_dry_run_prints_the_experts_shape(f32, tmp_path):
    r = CliRunner().invoke(main, ["quantize-model", str(f32("qwen3moe")), str(tmp_path / "o.gguf"), "--type",
                                  "Q4_K_M", "--dry-run"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("blk.2.ffn_down_exps.weight"))
    assert "256x256x8" in line and "Q6_K" in line
    gate = next(x for x in r.output.splitlines() if x.startswith("blk.0.ffn_gate_inp.weight"))
    assert "F32 -> F32" in gate and "kept" in gate


def _expert_bytes(gf):
    return sum(t.n_bytes for t in gf.tensors.values() if "_exps." in t.name)


def test_q6_k_counts_six_bits_where_the_kernels_read_them_and_a_byte_elsewhere(zoo, monkeypatch):
    """The estimate counts the layout the weights load in: Q6_K in the file's 210 bytes a block on the CPU's SIMD
    paths, 274 (its values a byte each) on the portable path and on CUDA; every other type the same."""
    with GGUFFile(zoo("qwen3moe")) as gf:  # Q6_K output, attn_v and ffn_down_exps on the more_bits layers
        blocks = sum(t.n_bytes // 210 for t in gf.tensors.values() if t.ggml_type == T.Q6_K)
        simd_host = file_estimate._interleaved()  # this host's path is a SIMD one (not portable)
        on_cpu = estimate_file(gf, EngineConfig()).weights
        on_cuda = file_estimate.weight_bytes(gf, "cuda")
        monkeypatch.setenv("EDGEINFER_KERNELS", "portable")
        portable = file_estimate.weight_bytes(gf)
    assert blocks > 0 and not file_estimate._interleaved()
    assert on_cuda == portable
    assert on_cpu == portable - (64 * blocks if simd_host else 0)


@pytest.mark.parametrize("name,n_used,n_expert", [("qwen3moe", 2, 8), ("olmoe", 2, 8), ("qwen2moe", 2, 6)])
def test_memory_counts_every_expert(zoo, name, n_used, n_expert):
    with GGUFFile(zoo(name)) as gf:
        est = estimate_file(gf, EngineConfig())
        total = sum(t.n_bytes for t in gf.tensors.values())
        experts = _expert_bytes(gf)
        # as repacked: the file's bytes, K-quant scales a byte each, Q6_K values a byte each row-major
        # (quant/repack.loaded_bytes), for this host's kernels
        x8 = file_estimate._interleaved()
        loaded = sum(file_estimate._loaded(t, x8) for t in gf.tensors.values())
        loaded_experts = sum(file_estimate._loaded(t, x8) for t in gf.tensors.values() if "_exps." in t.name)
    assert experts > total / 2  # these models are mostly experts
    assert total <= loaded <= total * 1.31
    assert est.weights == loaded  # all experts, not only the active ones
    assert est.active_weights == loaded - loaded_experts + loaded_experts * n_used // n_expert
    rep = memory.report(est, EngineConfig())
    assert rep["weights_mb"] == round(loaded / memory.MB, 1) and rep["active_weights_mb"] < rep["weights_mb"]


@pytest.mark.parametrize("name,head_dim", [("qwen3moe", 128), ("gemma2", 128), ("qwen3", 64), ("phi3", 64),
                                           ("olmo2", 64), ("olmoe", 64)])
def test_kv_per_token_uses_the_key_length(zoo, name, head_dim):
    with GGUFFile(zoo(name)) as gf:
        a = gf.architecture
        n_layer, n_kv = gf.metadata[f"{a}.block_count"], gf.metadata[f"{a}.attention.head_count_kv"]
        est = estimate_file(gf, EngineConfig())
    # every layer holds K and V of head_dim; gemma2's sliding ones (every other) in the window pool, per
    # sequence rather than per token
    full = n_layer // 2 if name == "gemma2" else n_layer
    assert est.kv_per_token["f32"] == full * n_kv * 2 * head_dim * 4
    assert est.kv_per_token["f16"] == est.kv_per_token["f32"] // 2
    if name == "gemma2":
        assert est.window_kv_per_token["f32"] == (n_layer - full) * n_kv * 2 * head_dim * 4
        assert est.window_blocks_per_seq > 0


def test_memory_budget_names_the_experts_weights(zoo):
    with GGUFFile(zoo("qwen3moe")) as gf:
        est = estimate_file(gf, EngineConfig())
    with pytest.raises(memory.MemoryBudgetError, match=rf"weights {est.weights / memory.MB:.0f} MB"):
        memory.fit_budget([est], [EngineConfig()], 100)


def test_inspect_shows_the_moe_facts(zoo):
    r = CliRunner().invoke(main, ["inspect", str(zoo("qwen3moe")), "--json", "--memory"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    with GGUFFile(zoo("qwen3moe")) as gf:
        total = sum(t.n_elements for t in gf.tensors.values())
        experts = sum(t.n_elements for t in gf.tensors.values() if "_exps." in t.name)
    assert (s["experts"], s["experts_used"], s["expert_feed_forward_size"], s["head_dim"]) == (8, 2, 256, 128)
    assert s["parameters"] == total and s["active_parameters"] == total - experts + experts * 2 // 8
    assert s["qk_norm"] == "per head" and "shared_expert_feed_forward_size" not in s
    assert s["memory"]["active_weights_mb"] < s["memory"]["weights_mb"]
    text = CliRunner().invoke(main, ["inspect", str(zoo("qwen3moe")), "--memory"]).output
    assert "active_parameters" in text and "weights read per token (MoE)" in text and "experts_used" in text


@pytest.mark.parametrize("name,facts", [
    ("qwen2moe", {"experts": 6, "experts_used": 2, "expert_feed_forward_size": 256,
                  "shared_expert_feed_forward_size": 512, "shared_expert_gate": True}),
    ("olmoe", {"experts": 8, "expert_feed_forward_size": 256, "qk_norm": "whole projection"}),  # from the tensor
    ("gemma2", {"sliding_window": 8, "attention_softcap": 50.0, "final_softcap": 30.0, "head_dim": 128,
                "norms": "pre- and post-norms"}),
    ("phi3", {"fused_tensors": "attn_qkv, ffn_up (gate and up)", "rope_dimensions": "48 of 64",
              "rope_factors": "rope_factors_short (24), rope_factors_long (24)"}),
    ("llama3", {"rope_factors": "rope_freqs (32)", "rope_freq_base": 500000.0}),
    ("olmo2", {"norms": "post-norms only", "qk_norm": "whole projection"}),
    ("qwen3", {"qk_norm": "per head", "head_dim": 64}),
    ("gpt-oss", {"experts": 8, "experts_used": 4, "expert_feed_forward_size": 256, "sliding_window": 8,
                 "head_dim": 64, "rope_scaling": "yarn, factor 4, from 16 tokens", "norms": None}),
])
def test_inspect_shows_each_architectures_facts(zoo, name, facts):
    with GGUFFile(zoo(name)) as gf:
        s = summarize(gf)
    assert {k: s.get(k) for k in facts} == facts
    if "experts" not in facts:
        assert "active_parameters" not in s and "experts" not in s


def test_inspect_tolerates_odd_expert_metadata(tmp_path, zoo):
    # an expert count that is not a number, or fewer experts than used: no active figure, no traceback
    src = GGUFFile(zoo("olmoe"))
    for bad in ("eight", 0):
        p = tmp_path / f"odd-{bad}.gguf"
        w = gguf.GGUFWriter(str(p), "olmoe")
        for key, value in src.metadata.items():
            if key.startswith("olmoe.") and key != "olmoe.expert_count":
                w.add_key_value(key, value, src.metadata_types[key][0], sub_type=src.metadata_types[key][1])
        if isinstance(bad, str):
            w.add_string("olmoe.expert_count", bad)
        else:
            w.add_uint32("olmoe.expert_count", bad)
        for name in ("token_embd.weight", "blk.0.ffn_gate_exps.weight"):
            t = src.tensors[name]
            w.add_tensor(name, np.array(src.tensor_bytes(name)), raw_shape=src.tensor_bytes(name).shape,
                         raw_dtype=t.ggml_type)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        r = CliRunner().invoke(main, ["inspect", str(p), "--json"])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        s = json.loads(r.output)
        assert "active_parameters" not in s and s["parameters"] > 0
        with GGUFFile(p) as gf:  # the quantize plan reads the count from the experts' shape instead
            assert any(x.dst_type == T.Q4_K for x in make_plan(gf, "Q4_K_M") if "_exps." in x.name)

"""quantize-model: quantizers against gguf's reference, llama.cpp's mix rules, and the tool end to end."""


import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf.constants import GGMLQuantizationType as T

from edgeinfer import LLM, SamplingParams
from edgeinfer.cli.main import main
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.quant import kquants
from edgeinfer.quant.mixes import TYPES, plan
from edgeinfer.quant.tool import QuantizeError, quantize_model, quantize_rows
from tiny_models import write_tiny_llama

rng = np.random.default_rng(0)
# rows of mixed magnitudes, like real weight matrices (scale varies by row)
X = (rng.standard_normal((48, 512)) * np.exp(rng.standard_normal((48, 1)))).astype(np.float32)


def rel_rmse(y, x):
    return float(np.sqrt(((y - x) ** 2).mean() / (x ** 2).mean()))


@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16])
def test_32_block_types_are_bit_exact_with_gguf(t):
    assert np.array_equal(np.asarray(quantize_rows(X, t)).view(np.uint8),
                          np.asarray(gguf.quants.quantize(X, t)).view(np.uint8))


# Relative RMSE bounds for Gaussian-like rows: 4 bits leave about 7%, 5 bits 3.5%, 6 bits 1.8%, 8 bits
# 0.5% (measured: 7.3%, 3.7%, 1.8%, 0.5%); the bounds leave ~15% headroom.
@pytest.mark.parametrize("t,bound", [(T.Q4_K, 0.085), (T.Q5_K, 0.043), (T.Q6_K, 0.021), (T.Q8_0, 0.007),
                                     (T.F16, 1e-3)])
def test_round_trip_through_gguf_dequantize(t, bound):
    q = quantize_rows(X, t)
    y = gguf.quants.dequantize(np.asarray(q).view(np.uint8).reshape(X.shape[0], -1), t).reshape(X.shape)
    assert rel_rmse(y, X) < bound


def test_k_quants_beat_naive_min_max():
    # naive: each 32-block's own min and max, scales kept in full float precision (more than Q4_K stores)
    xb = X.reshape(-1, 32)
    lo = np.minimum(xb.min(1, keepdims=True), 0)
    s = (xb.max(1, keepdims=True) - lo) / 15
    naive = (np.clip(np.rint((xb - lo) / s), 0, 15) * s + lo).reshape(X.shape)
    q4k = gguf.quants.dequantize(kquants.quantize_q4_k(X), T.Q4_K).reshape(X.shape)
    assert rel_rmse(q4k, X) < rel_rmse(naive, X)


def test_k_quants_handle_zero_and_constant_blocks():
    x = np.zeros((2, 256), np.float32)
    x[1] = 3.0
    for t in (T.Q4_K, T.Q5_K, T.Q6_K):
        y = gguf.quants.dequantize(quantize_rows(x, t), t).reshape(x.shape)
        assert np.isfinite(y).all() and np.abs(y[0]).max() == 0
        assert np.abs(y[1] - 3.0).max() < 0.1


def _gemma_like_tensors():
    """Gemma 3 270M's tensor list: 18 layers, 640-wide rows except ffn_down (2048) and attn_output (1024)."""
    ts = [("token_embd.weight", (640, 262144), T.F16)]
    for i in range(18):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight", (640,), T.F32), (p + "attn_q.weight", (640, 1024), T.F16),
               (p + "attn_k.weight", (640, 256), T.F16), (p + "attn_v.weight", (640, 256), T.F16),
               (p + "attn_output.weight", (1024, 640), T.F16), (p + "ffn_gate.weight", (640, 2048), T.F16),
               (p + "ffn_up.weight", (640, 2048), T.F16), (p + "ffn_down.weight", (2048, 640), T.F16)]
    return ts


def test_q4_k_m_plan_follows_llama_cpp_rules():
    p = {x.name: x.dst_type for x in plan(_gemma_like_tensors(), "Q4_K_M")}
    more_bits = [0, 1, 4, 7, 10, 13, 15, 16, 17]  # i < 18 // 8, i >= 7 * 18 // 8, (i - 18 // 8) % 3 == 2
    assert p["token_embd.weight"] == T.Q8_0  # tied output, 640-wide rows: Q6_K falls back to Q8_0
    for i in range(18):
        b = f"blk.{i}."
        assert p[b + "attn_norm.weight"] == T.F32
        assert p[b + "attn_q.weight"] == p[b + "attn_k.weight"] == p[b + "ffn_up.weight"] == T.Q5_0  # Q4_K -> Q5_0
        assert p[b + "attn_output.weight"] == T.Q4_K  # 1024-wide rows take Q4_K
        assert p[b + "attn_v.weight"] == (T.Q8_0 if i in more_bits else T.Q5_0)  # Q6_K -> Q8_0 fallback
        assert p[b + "ffn_down.weight"] == (T.Q6_K if i in more_bits else T.Q4_K)


def test_other_mixes():
    ts = _gemma_like_tensors()
    q4ks = {x.name: x.dst_type for x in plan(ts, "Q4_K_S")}
    assert q4ks["blk.0.ffn_down.weight"] == T.Q5_K and q4ks["blk.2.ffn_down.weight"] == T.Q4_K  # i < 18 // 8
    assert q4ks["blk.3.attn_v.weight"] == T.Q5_1 and q4ks["blk.4.attn_v.weight"] == T.Q5_0  # first 4, fallback
    q5km = {x.name: x.dst_type for x in plan(ts, "Q5_K_M")}
    assert q5km["blk.1.ffn_down.weight"] == T.Q6_K and q5km["blk.3.ffn_down.weight"] == T.Q5_K
    q6k = {x.name: x.dst_type for x in plan(ts, "Q6_K")}
    assert q6k["blk.3.ffn_down.weight"] == T.Q6_K and q6k["blk.3.ffn_up.weight"] == T.Q8_0
    pure = {x.name: x.dst_type for x in plan(ts, "Q4_K_M", pure=True)}
    assert pure["blk.0.ffn_down.weight"] == T.Q4_K and pure["token_embd.weight"] == T.Q5_0
    q40 = {x.name: x.dst_type for x in plan(ts, "Q4_0")}
    assert q40["token_embd.weight"] == T.Q8_0 and q40["blk.0.ffn_down.weight"] == T.Q4_0


def test_untied_output_gets_q6_k_and_overrides():
    ts = [("token_embd.weight", (256, 100), T.F32), ("output.weight", (256, 100), T.F32),
          ("blk.0.attn_v.weight", (256, 64), T.F32)]
    p = {x.name: x.dst_type for x in plan(ts, "Q4_K_M")}
    assert p["output.weight"] == T.Q6_K and p["token_embd.weight"] == T.Q4_K
    p = {x.name: x.dst_type for x in plan(ts, "Q4_K_M", output_type=T.Q8_0, token_embedding_type=T.F16)}
    assert p["output.weight"] == T.Q8_0 and p["token_embd.weight"] == T.F16


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    p = tmp_path_factory.mktemp("q") / "src-f32.gguf"
    write_tiny_llama(p, qtype=T.F32, embd_type=T.F32, dim=256, n_head=4, n_kv=2, ffn=512, tied=False)
    return p


@pytest.mark.parametrize("type_name", sorted(TYPES))
def test_each_type_quantizes_loads_and_runs(f32_model, tmp_path, type_name):
    dst = tmp_path / f"{type_name}.gguf"
    with GGUFFile(f32_model) as gf:
        s = quantize_model(gf, dst, type_name, progress=False)
    out = GGUFFile(dst)
    assert out.metadata["general.file_type"] == int(TYPES[type_name][0])
    assert out.metadata["general.quantization_version"] == gguf.GGML_QUANT_VERSION
    assert out.metadata["tokenizer.ggml.tokens"] == GGUFFile(f32_model).metadata["tokenizer.ggml.tokens"]
    assert s.dst_bytes == dst.stat().st_size
    llm = LLM(str(dst), progress=False)
    c = llm.generate("the hen", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(c.token_ids) == 4
    # the quantized model stays close to the float one: same greedy first token for 4+ bits
    ref = LLM(str(f32_model), progress=False).generate("the hen", SamplingParams(temperature=0, max_tokens=1))[0]
    if type_name in ("F32", "F16", "BF16", "Q8_0", "Q6_K"):
        assert c.token_ids[0] == ref.token_ids[0]


def test_cli_dry_run_and_summary(f32_model, tmp_path):
    r = CliRunner().invoke(main, ["quantize-model", str(f32_model), str(tmp_path / "o.gguf"), "--type", "q4_k_m",
                                  "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "output.weight" in r.output and "Q6_K" in r.output and "estimated tensor data" in r.output
    assert not (tmp_path / "o.gguf").exists()
    r = CliRunner().invoke(main, ["quantize", str(f32_model), str(tmp_path / "o.gguf"), "--type", "Q8_0"])
    assert r.exit_code == 0, r.output
    assert "bits per weight" in r.output and (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("args,fragment", [
    (["--type", "Q3_X"], "unknown type 'Q3_X'"),
    (["--type", "Q8_0", "--output-type", "IQ9"], "unknown type 'IQ9'"),
])
def test_cli_bad_options(f32_model, tmp_path, args, fragment):
    r = CliRunner().invoke(main, ["quantize-model", str(f32_model), str(tmp_path / "o.gguf"), *args])
    assert r.exit_code != 0 and fragment in r.output and "Traceback" not in r.output


def test_existing_output_needs_force(f32_model, tmp_path):
    dst = tmp_path / "exists.gguf"
    dst.write_bytes(b"keep me")
    r = CliRunner().invoke(main, ["quantize-model", str(f32_model), str(dst), "--type", "Q8_0"])
    assert r.exit_code == 1 and "--force" in r.output and dst.read_bytes() == b"keep me"
    r = CliRunner().invoke(main, ["quantize-model", str(f32_model), str(dst), "--type", "Q8_0", "--force"])
    assert r.exit_code == 0 and GGUFFile(dst).metadata["general.file_type"] == 7


def test_unsupported_source_type(tmp_path):
    src = tmp_path / "iq.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 66), np.uint8), raw_shape=(4, 66), raw_dtype=T.IQ2_XXS)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with GGUFFile(src) as gf, pytest.raises(QuantizeError, match="unsupported source tensor type IQ2_XXS"):
        quantize_model(gf, tmp_path / "o.gguf", "Q8_0", progress=False)
    assert not (tmp_path / "o.gguf").exists()


def test_interrupted_write_leaves_nothing(f32_model, tmp_path, monkeypatch):
    import edgeinfer.quant.tool as tool

    calls = {"n": 0}
    real = tool.quantize_rows

    def failing(x, t, weights=None):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real(x, t, weights)

    monkeypatch.setattr(tool, "quantize_rows", failing)
    with GGUFFile(f32_model) as gf, \
            pytest.raises(tool.QuantizeError, match="No space left on device; nothing was saved"):
        quantize_model(gf, tmp_path / "o.gguf", "Q4_K_M", progress=False, threads=1)
    assert list(tmp_path.iterdir()) == []  # no output, no temporary file


def test_requantizing_warns(tiny_llama_path, tmp_path):
    warnings = []
    with GGUFFile(tiny_llama_path) as gf:
        quantize_model(gf, tmp_path / "o.gguf", "Q4_0", progress=False, warn=warnings.append)
    assert warnings and "re-quantizing loses quality" in warnings[0]


@pytest.mark.model
def test_q4_k_m_plan_on_gemma3_matches_the_real_file():
    from conftest import real_model_path

    with GGUFFile(real_model_path("gemma3-270m")) as gf:
        tensors = [(t.name, tuple(t.shape), T.F16 if t.ggml_type != T.F32 else T.F32) for t in gf.tensors.values()]
        actual = {t.name: t.ggml_type for t in gf.tensors.values()}
    planned = {x.name: x.dst_type for x in plan(tensors, "Q4_K_M")}
    assert planned == actual  # llama.cpp made this file: same rules, same types for all 236 tensors


# -- the new architectures' tensors (llama.cpp's llama-quant.cpp: tensor_get_category, category_is_attn_v,
# tensor_allows_quantization, layer_info) ------------------------------------------------------------

MORE_BITS_16 = [0, 1, 4, 7, 10, 13, 14, 15]  # _more_bits(i, 16): i < 2, i >= 14, (i - 2) % 3 == 2


def _phi3_like_tensors(n_layer=16):
    """Phi-3.5-mini's layout at a smaller width: fused qkv, fused gate+up (2 * ffn rows), LongRoPE factors."""
    ts = [("rope_factors_long.weight", (48,), T.F32), ("rope_factors_short.weight", (48,), T.F32),
          ("token_embd.weight", (512, 1000), T.F16)]
    for i in range(n_layer):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight", (512,), T.F32), (p + "attn_qkv.weight", (512, 1536), T.F16),
               (p + "attn_output.weight", (512, 512), T.F16), (p + "ffn_norm.weight", (512,), T.F32),
               (p + "ffn_up.weight", (512, 2048), T.F16), (p + "ffn_down.weight", (1024, 512), T.F16)]
    return ts + [("output_norm.weight", (512,), T.F32), ("output.weight", (512, 1000), T.F16)]


def test_fused_qkv_takes_the_attn_v_rules():
    # current llama.cpp counts attn_qkv among the attn_v tensors (category_is_attn_v): the same
    # use_more_bits bumps for Q4_K_M / Q5_K_M and first-4 bump for Q4_K_S, on attn_v's counter
    ts = _phi3_like_tensors()
    for mix, base, bumped in (("Q4_K_M", T.Q4_K, T.Q6_K), ("Q5_K_M", T.Q5_K, T.Q6_K)):
        p = {x.name: x.dst_type for x in plan(ts, mix)}
        for i in range(16):
            assert p[f"blk.{i}.attn_qkv.weight"] == (bumped if i in MORE_BITS_16 else base), (mix, i)
            assert p[f"blk.{i}.ffn_up.weight"] == p[f"blk.{i}.attn_output.weight"] == base  # fused gate+up: plain
    q4ks = {x.name: x.dst_type for x in plan(ts, "Q4_K_S")}
    assert [q4ks[f"blk.{i}.attn_qkv.weight"] for i in range(6)] == [T.Q5_K] * 4 + [T.Q4_K] * 2
    for p in (plan(ts, "Q4_K_M"), plan(ts, "Q8_0"), plan(ts, "F16")):
        kept = {x.name: x for x in p if "rope_factors" in x.name}
        assert all(x.dst_type == T.F32 and x.note == "kept" for x in kept.values()) and len(kept) == 2


def _moe_tensors(n_layer=16, n_expert=128, shared=False, router_2d_shexp=False):
    """Qwen3-30B-A3B's layout (qwen2moe's with shared=True) at a smaller width: 3-D experts, an F32 router."""
    d, fe = 256, 512
    ts = [("token_embd.weight", (d, 1000), T.BF16)]
    for i in range(n_layer):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight", (d,), T.F32), (p + "attn_q.weight", (d, 512), T.BF16),
               (p + "attn_k.weight", (d, 256), T.BF16), (p + "attn_v.weight", (d, 256), T.BF16),
               (p + "attn_q_norm.weight", (128,), T.F32), (p + "attn_k_norm.weight", (128,), T.F32),
               (p + "attn_output.weight", (512, d), T.BF16), (p + "ffn_norm.weight", (d,), T.F32),
               (p + "ffn_gate_inp.weight", (d, n_expert), T.F32),
               (p + "ffn_gate_exps.weight", (d, fe, n_expert), T.BF16),
               (p + "ffn_up_exps.weight", (d, fe, n_expert), T.BF16),
               (p + "ffn_down_exps.weight", (fe, d, n_expert), T.BF16)]
        if shared:
            ts += [(p + "ffn_gate_inp_shexp.weight", (d, 1) if router_2d_shexp else (d,), T.F32),
                   (p + "ffn_gate_shexp.weight", (d, 1024), T.BF16), (p + "ffn_up_shexp.weight", (d, 1024), T.BF16),
                   (p + "ffn_down_shexp.weight", (1024, d), T.BF16)]
    return ts + [("output_norm.weight", (d,), T.F32), ("output.weight", (d, 1000), T.BF16)]


def test_moe_experts_routers_and_norms():
    ts = _moe_tensors()
    planned = {x.name: x for x in plan(ts, "Q4_K_M", n_expert=128)}
    for i in range(16):
        b = f"blk.{i}."
        for name in ("ffn_gate_inp", "attn_q_norm", "attn_k_norm"):  # routers and q/k norms: never quantized
            assert planned[b + name + ".weight"].dst_type == T.F32 and planned[b + name + ".weight"].note == "kept"
        # ffn_down_exps: the layer read from the name, n = the block count (llama.cpp's layer_info for MoE)
        assert planned[b + "ffn_down_exps.weight"].dst_type == (T.Q6_K if i in MORE_BITS_16 else T.Q4_K)
        assert planned[b + "ffn_gate_exps.weight"].dst_type == planned[b + "ffn_up_exps.weight"].dst_type == T.Q4_K
        assert planned[b + "attn_v.weight"].dst_type == (T.Q6_K if i in MORE_BITS_16 else T.Q4_K)
        assert planned[b + "attn_k.weight"].dst_type == planned[b + "attn_output.weight"].dst_type == T.Q4_K
    exps = planned["blk.0.ffn_up_exps.weight"]
    assert exps.shape == (256, 512, 128) and exps.n_bytes == 128 * 512 * (256 // 256 * 144)  # every expert
    assert planned["output.weight"].dst_type == T.Q6_K and planned["token_embd.weight"].dst_type == T.Q4_K


def test_shared_expert_tensors_are_like_their_dense_counterparts():
    for two_d in (False, True):  # the shared expert's gate is a vector; kept even if a file made it 2-D
        ts = _moe_tensors(n_expert=60, shared=True, router_2d_shexp=two_d)
        planned = {x.name: x.dst_type for x in plan(ts, "Q4_K_M", n_expert=60)}
        for i in range(16):
            b = f"blk.{i}."
            assert planned[b + "ffn_gate_inp_shexp.weight"] == T.F32
            assert planned[b + "ffn_down_shexp.weight"] == planned[b + "ffn_down_exps.weight"] \
                == (T.Q6_K if i in MORE_BITS_16 else T.Q4_K)
            assert planned[b + "ffn_gate_shexp.weight"] == planned[b + "ffn_up_shexp.weight"] == T.Q4_K


def test_eight_experts_bump_attention_as_llama_cpp():
    ts = _moe_tensors(n_layer=4, n_expert=8)
    q4km = {x.name: x.dst_type for x in plan(ts, "Q4_K_M", n_expert=8)}
    assert all(q4km[f"blk.{i}.attn_v.weight"] == q4km[f"blk.{i}.attn_k.weight"] == T.Q8_0 for i in range(4))
    assert all(q4km[f"blk.{i}.attn_output.weight"] == T.Q5_K for i in range(4))
    q5km = {x.name: x.dst_type for x in plan(ts, "Q5_K_M", n_expert=8)}
    assert q5km["blk.1.attn_v.weight"] == q5km["blk.1.attn_k.weight"] == T.Q8_0  # bumped under Q5_K_M too
    assert {x.name: x.dst_type for x in plan(ts, "Q5_K_M", n_expert=0)}["blk.1.attn_k.weight"] == T.Q5_K
    dense = {x.name: x.dst_type for x in plan(ts, "Q4_K_M", n_expert=0)}
    assert dense["blk.1.attn_k.weight"] == dense["blk.1.attn_output.weight"] == T.Q4_K
    assert {x.name: x.dst_type for x in plan(ts, "Q4_K_M", n_expert=8, pure=True)}["blk.1.attn_v.weight"] == T.Q4_K

"""The low-bit mixes of quantize-model (Q2_K, Q3_K_S/M/L, IQ4_NL, IQ4_XS, and plain Q3_K) against
llama.cpp's per-tensor rules (src/llama-quant.cpp: llama_tensor_get_type_impl, tensor_type_fallback).

Each expectation below was worked out by hand from the C rules for the model at hand, layer by layer,
and is written out as data: the tests do not call the rules' helpers."""

import numpy as np
import pytest
from click.testing import CliRunner
from gguf.constants import GGMLQuantizationType as T, LlamaFileType as FT

from edgeinfer.cli.main import main
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.quant.mixes import FALLBACK, QUANTIZED, TENSOR_TYPES, TYPES, plan
from edgeinfer.quant.tool import make_plan
from tiny_models import write_tiny_llama

Q2, Q3, Q4, Q5, Q6, Q8 = T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0
NL, XS = T.IQ4_NL, T.IQ4_XS
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _dense(n_layer, dim, kv_dim, ffn, vocab, tied=True):
    """A Qwen2/Llama-style dense model's tensors in file order (ggml shapes: (cols, rows)), with the
    biases and norms that stay as they are."""
    ts = [("token_embd.weight", (dim, vocab), T.BF16)]
    for i in range(n_layer):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", (dim,), T.F32),
               (b + "attn_q.weight", (dim, dim), T.BF16), (b + "attn_q.bias", (dim,), T.F32),
               (b + "attn_k.weight", (dim, kv_dim), T.BF16), (b + "attn_k.bias", (kv_dim,), T.F32),
               (b + "attn_v.weight", (dim, kv_dim), T.BF16), (b + "attn_v.bias", (kv_dim,), T.F32),
               (b + "attn_output.weight", (dim, dim), T.BF16),
               (b + "ffn_norm.weight", (dim,), T.F32),
               (b + "ffn_gate.weight", (dim, ffn), T.BF16), (b + "ffn_up.weight", (dim, ffn), T.BF16),
               (b + "ffn_down.weight", (ffn, dim), T.BF16)]
    ts.append(("output_norm.weight", (dim,), T.F32))
    if not tied:
        ts.append(("output.weight", (dim, vocab), T.BF16))
    return ts


def qwen2_1_5b(tied=True):
    """Qwen2.5-1.5B: 28 layers, 1536 wide (12 query heads, 2 KV heads of 128: GQA 6), FFN 8960; every
    row length a multiple of 256 (1536 = 6 * 256, 8960 = 35 * 256)."""
    return _dense(28, 1536, 256, 8960, 151936, tied)


def smollm2_135m():
    """SmolLM2-135M: 30 layers, 576 wide (9 query heads, 3 KV heads of 64: GQA 3), FFN 1536, tied. 576 is
    a multiple of 32, not of 256; ffn_down's 1536-long rows are a multiple of 256."""
    return _dense(30, 576, 192, 1536, 49152)


def types(ts, mix, **kw):
    return {x.name: x.dst_type for x in plan(ts, mix, **kw)}


def layer_table(p, n_layer):
    """{role: [type of layer 0, layer 1, ...]}"""
    return {r: [p[f"blk.{i}.{r}.weight"] for i in range(n_layer)] for r in ROLES}


def check_kept(ts, p):
    for name, shape, src in ts:
        if len(shape) == 1:
            assert p[name] == src, name


QWEN = dict(n_head=12, n_head_kv=2)  # GQA 6
SMOL = dict(n_head=9, n_head_kv=3)  # GQA 3


def test_new_types_are_registered():
    assert {T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS} <= QUANTIZED
    for name in ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"):
        assert TENSOR_TYPES[name] == T[name]  # --output-type / --token-embedding-type
    assert TYPES["Q2_K"] == (FT.MOSTLY_Q2_K, T.Q2_K, True)
    assert TYPES["Q3_K_S"] == (FT.MOSTLY_Q3_K_S, T.Q3_K, True)
    assert TYPES["Q3_K_M"] == (FT.MOSTLY_Q3_K_M, T.Q3_K, True)
    assert TYPES["Q3_K_L"] == (FT.MOSTLY_Q3_K_L, T.Q3_K, True)
    assert TYPES["IQ4_NL"] == (FT.MOSTLY_IQ4_NL, T.IQ4_NL, True)
    assert TYPES["IQ4_XS"] == (FT.MOSTLY_IQ4_XS, T.IQ4_XS, True)
    assert TYPES["Q3_K"] == (FT.MOSTLY_Q3_K_S, T.Q3_K, False)  # plain, like Q4_K
    # Q2_K_S (which llama.cpp makes only with an importance matrix) is not offered yet
    assert "Q2_K_S" not in TYPES


# Qwen2.5-1.5B (28 layers: n/8 = 3, n/16 = 1, GQA 6, tied embeddings), layer by layer
QWEN_EXPECTED = {
    # Q2_K: attn_v Q4_K (GQA >= 4), attn_output and ffn_down Q3_K, the rest Q2_K
    "Q2_K": {"attn_q": [Q2] * 28, "attn_k": [Q2] * 28, "attn_v": [Q4] * 28, "attn_output": [Q3] * 28,
             "ffn_gate": [Q2] * 28, "ffn_up": [Q2] * 28, "ffn_down": [Q3] * 28},
    # Q3_K_S: no bumps for a dense model
    "Q3_K_S": {r: [Q3] * 28 for r in ROLES},
    # Q3_K_M: the first two attn_v Q5_K, then Q4_K; ffn_down Q5_K in layer 0 (< 28/16), then Q4_K;
    # attn_output Q4_K
    "Q3_K_M": {"attn_q": [Q3] * 28, "attn_k": [Q3] * 28, "attn_v": [Q5, Q5] + [Q4] * 26,
               "attn_output": [Q4] * 28, "ffn_gate": [Q3] * 28, "ffn_up": [Q3] * 28,
               "ffn_down": [Q5] + [Q4] * 27},
    # Q3_K_L: attn_v, attn_output and ffn_down all Q5_K
    "Q3_K_L": {"attn_q": [Q3] * 28, "attn_k": [Q3] * 28, "attn_v": [Q5] * 28, "attn_output": [Q5] * 28,
               "ffn_gate": [Q3] * 28, "ffn_up": [Q3] * 28, "ffn_down": [Q5] * 28},
    # IQ4_NL / IQ4_XS: attn_v Q5_K (GQA >= 4); ffn_down Q5_K in layers 0-2 (< 28/8, no imatrix)
    "IQ4_NL": {"attn_q": [NL] * 28, "attn_k": [NL] * 28, "attn_v": [Q5] * 28, "attn_output": [NL] * 28,
               "ffn_gate": [NL] * 28, "ffn_up": [NL] * 28, "ffn_down": [Q5] * 3 + [NL] * 25},
    "IQ4_XS": {"attn_q": [XS] * 28, "attn_k": [XS] * 28, "attn_v": [Q5] * 28, "attn_output": [XS] * 28,
               "ffn_gate": [XS] * 28, "ffn_up": [XS] * 28, "ffn_down": [Q5] * 3 + [XS] * 25},
    # plain Q3_K: every tensor
    "Q3_K": {r: [Q3] * 28 for r in ROLES},
}


@pytest.mark.parametrize("mix", sorted(QWEN_EXPECTED))
def test_qwen2_1_5b_plan(mix):
    ts = qwen2_1_5b()
    p = types(ts, mix, **QWEN)
    assert layer_table(p, 28) == QWEN_EXPECTED[mix]
    # tied embeddings take the output tensor's rule: Q6_K (1536 is a multiple of 256); plain Q3_K: Q3_K
    assert p["token_embd.weight"] == (Q3 if mix == "Q3_K" else Q6)
    check_kept(ts, p)


@pytest.mark.parametrize("mix,embd", [("Q2_K", Q2), ("Q3_K_S", Q3), ("Q3_K_M", Q3), ("Q3_K_L", Q3),
                                      ("IQ4_NL", NL), ("IQ4_XS", XS)])
def test_untied_output_is_q6_k_and_token_embd_the_default(mix, embd):
    p = types(qwen2_1_5b(tied=False), mix, **QWEN)
    assert p["output.weight"] == Q6 and p["token_embd.weight"] == embd
    # the overrides still win
    p = types(qwen2_1_5b(tied=False), mix, output_type=T.Q8_0, token_embedding_type=T.Q4_K, **QWEN)
    assert p["output.weight"] == Q8 and p["token_embd.weight"] == Q4


def test_attn_v_without_enough_gqa():
    ts = qwen2_1_5b()
    # the same model with full multi-head attention (GQA 1), or with no head counts given (GQA 0)
    for kw in (dict(n_head=12, n_head_kv=12), dict(n_head=12, n_head_kv=6), {}):  # GQA 1, 2, unknown
        assert [types(ts, "Q2_K", **kw)[f"blk.{i}.attn_v.weight"] for i in range(28)] == [Q3] * 28
        assert [types(ts, "IQ4_NL", **kw)[f"blk.{i}.attn_v.weight"] for i in range(28)] == [NL] * 28
        assert [types(ts, "IQ4_XS", **kw)[f"blk.{i}.attn_v.weight"] for i in range(28)] == [XS] * 28
    # GQA exactly 4 takes the bump; n_head_kv absent means as many KV heads as query heads
    assert types(ts, "Q2_K", n_head=16, n_head_kv=4)["blk.5.attn_v.weight"] == Q4
    assert types(ts, "IQ4_XS", n_head=16, n_head_kv=4)["blk.5.attn_v.weight"] == Q5
    assert types(ts, "Q2_K", n_head=12, n_head_kv=None)["blk.5.attn_v.weight"] == Q3
    # a per-layer head_count_kv array: its first layer's, as llama.cpp's n_gqa()
    assert types(ts, "Q2_K", n_head=12, n_head_kv=np.array([2] * 28, np.int32))["blk.5.attn_v.weight"] == Q4
    assert types(ts, "Q2_K", n_head=[12] * 28, n_head_kv=[12] * 28)["blk.5.attn_v.weight"] == Q3


def test_gqa_does_not_change_the_other_mixes():
    ts = qwen2_1_5b()
    for mix in ("Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0"):
        assert types(ts, mix, **QWEN) == types(ts, mix)


def test_pure_gives_every_tensor_the_default():
    ts = qwen2_1_5b()
    for mix, t in (("Q2_K", Q2), ("Q3_K_M", Q3), ("Q3_K_L", Q3), ("IQ4_NL", NL), ("IQ4_XS", XS)):
        p = types(ts, mix, pure=True, **QWEN)
        assert set(layer_table(p, 28)) == set(ROLES)
        assert all(v == [t] * 28 for v in layer_table(p, 28).values()) and p["token_embd.weight"] == t


# SmolLM2-135M (30 layers: n/8 = 3, n/16 = 1; GQA 3): the 576-wide rows fall back from 256-block types
# (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, IQ4_XS -> IQ4_NL), ffn_down's 1536-long rows do not
SMOL_EXPECTED = {
    # Q2_K: attn_v Q3_K (GQA 3 < 4) -> Q4_0; attn_output Q3_K -> Q4_0; ffn_down Q3_K
    "Q2_K": {"attn_q": [T.Q4_0] * 30, "attn_k": [T.Q4_0] * 30, "attn_v": [T.Q4_0] * 30,
             "attn_output": [T.Q4_0] * 30, "ffn_gate": [T.Q4_0] * 30, "ffn_up": [T.Q4_0] * 30,
             "ffn_down": [Q3] * 30},
    "Q3_K_S": {**{r: [T.Q4_0] * 30 for r in ROLES}, "ffn_down": [Q3] * 30},
    # Q3_K_M: attn_v Q5_K -> Q5_1 for the first two, then Q4_K -> Q5_0; attn_output Q4_K -> Q5_0
    "Q3_K_M": {"attn_q": [T.Q4_0] * 30, "attn_k": [T.Q4_0] * 30, "attn_v": [T.Q5_1] * 2 + [T.Q5_0] * 28,
               "attn_output": [T.Q5_0] * 30, "ffn_gate": [T.Q4_0] * 30, "ffn_up": [T.Q4_0] * 30,
               "ffn_down": [Q5] + [Q4] * 29},
    "Q3_K_L": {"attn_q": [T.Q4_0] * 30, "attn_k": [T.Q4_0] * 30, "attn_v": [T.Q5_1] * 30,
               "attn_output": [T.Q5_1] * 30, "ffn_gate": [T.Q4_0] * 30, "ffn_up": [T.Q4_0] * 30,
               "ffn_down": [Q5] * 30},
    # IQ4_NL: a 32-block type, no fallback; attn_v stays IQ4_NL (GQA 3)
    "IQ4_NL": {**{r: [NL] * 30 for r in ROLES}, "ffn_down": [Q5] * 3 + [NL] * 27},
    # IQ4_XS -> IQ4_NL on 576-long rows; ffn_down keeps IQ4_XS after its first three layers' Q5_K
    "IQ4_XS": {**{r: [NL] * 30 for r in ROLES}, "ffn_down": [Q5] * 3 + [XS] * 27},
    "Q3_K": {**{r: [T.Q4_0] * 30 for r in ROLES}, "ffn_down": [Q3] * 30},
}


@pytest.mark.parametrize("mix", sorted(SMOL_EXPECTED))
def test_smollm2_135m_plan(mix):
    ts = smollm2_135m()
    planned = {x.name: x for x in plan(ts, mix, **SMOL)}
    p = {k: x.dst_type for k, x in planned.items()}
    assert layer_table(p, 30) == SMOL_EXPECTED[mix]
    # the tied embeddings (output rule): 576 is not a multiple of a 256-block default -> Q8_0; IQ4_NL's
    # block is 32, so Q6_K, which then falls back to Q8_0; plain Q3_K -> Q4_0
    assert p["token_embd.weight"] == (T.Q4_0 if mix == "Q3_K" else Q8)
    note = planned["blk.3.attn_q.weight"].note
    if mix != "IQ4_NL":
        assert note.startswith("row 576 not a multiple of 256")
        assert note.endswith(f"-> {p['blk.3.attn_q.weight'].name}")
    check_kept(ts, p)


@pytest.mark.parametrize("t,fb576", [(Q2, T.Q4_0), (Q3, T.Q4_0), (Q4, T.Q5_0), (Q5, T.Q5_1), (Q6, Q8), (XS, NL)])
def test_row_fallbacks(t, fb576):
    assert FALLBACK[t] == fb576
    ts = [("blk.0.ffn_gate.weight", (576, 64), T.F32), ("blk.0.ffn_up.weight", (40, 64), T.F32),
          ("blk.0.ffn_down.weight", (512, 64), T.F32)]
    # through --pure, with a --type whose default tensor type is t
    mix = {Q2: "Q2_K", Q3: "Q3_K", Q4: "Q4_K", Q5: "Q5_K", Q6: "Q6_K", XS: "IQ4_XS"}[t]
    p = types(ts, mix, pure=True)
    assert p["blk.0.ffn_gate.weight"] == fb576  # 576 = 18 * 32
    assert p["blk.0.ffn_up.weight"] == T.F16  # 40: not even a multiple of 32
    assert p["blk.0.ffn_down.weight"] == t  # 512 = 2 * 256


def test_iq4_nl_rows_of_40_take_f16():
    # IQ4_NL's block is 32: a 576 row is fine, a 40 row has nothing to fall back to but F16
    # (llama.cpp has no fallback for a 32-block type and stops; quantize-model writes F16)
    ts = [("blk.0.ffn_gate.weight", (576, 64), T.F32), ("blk.0.ffn_up.weight", (40, 64), T.F32)]
    p = types(ts, "IQ4_NL", pure=True)
    assert p["blk.0.ffn_gate.weight"] == NL and p["blk.0.ffn_up.weight"] == T.F16


def test_output_tensor_of_40_columns():
    # output rule: 40 is not a multiple of the default's block -> Q8_0, whose 32 does not divide 40 either:
    # F16 (llama.cpp defines no fallback for Q8_0 and stops; quantize-model writes F16)
    ts = [("token_embd.weight", (40, 1000), T.F32), ("blk.0.attn_v.weight", (256, 256), T.F32)]
    for mix in ("Q2_K", "Q3_K_M", "IQ4_NL", "IQ4_XS"):
        assert types(ts, mix)["token_embd.weight"] == T.F16


def _mixtral_like(n_layer=32):
    """Mixtral-8x7B's tensor list: 4096 wide, 32 query / 8 KV heads (GQA 4), 8 experts of FFN 14336."""
    ts = [("token_embd.weight", (4096, 32000), T.BF16)]
    for i in range(n_layer):
        b = f"blk.{i}."
        ts += [(b + "attn_q.weight", (4096, 4096), T.BF16), (b + "attn_k.weight", (4096, 1024), T.BF16),
               (b + "attn_v.weight", (4096, 1024), T.BF16), (b + "attn_output.weight", (4096, 4096), T.BF16),
               (b + "ffn_gate_inp.weight", (4096, 8), T.F32),
               (b + "ffn_gate_exps.weight", (4096, 14336, 8), T.BF16),
               (b + "ffn_down_exps.weight", (14336, 4096, 8), T.BF16),
               (b + "ffn_up_exps.weight", (4096, 14336, 8), T.BF16)]
    ts.append(("output.weight", (4096, 32000), T.BF16))
    return ts


# 8 experts: attn_v and attn_k Q8_0 in every mix; attn_output Q5_K except in Q3_K_L (not in that list)
MIXTRAL_EXPECTED = {
    # mix: (attn_q, attn_output, ffn_gate/up_exps, ffn_down_exps per layer (32 layers: n/8 = 4, n/16 = 2))
    "Q2_K": (Q2, Q5, Q2, [Q3] * 32),
    "Q3_K_S": (Q3, Q5, Q3, [Q3] * 32),
    "Q3_K_M": (Q3, Q5, Q3, [Q5] * 2 + [Q4] * 30),
    "Q3_K_L": (Q3, Q3, Q3, [Q5] * 32),
    "IQ4_NL": (NL, Q5, NL, [Q5] * 4 + [NL] * 28),
    "IQ4_XS": (XS, Q5, XS, [Q5] * 4 + [XS] * 28),
}


@pytest.mark.parametrize("mix", sorted(MIXTRAL_EXPECTED))
def test_eight_experts(mix):
    q, o, gate_up, down = MIXTRAL_EXPECTED[mix]
    p = types(_mixtral_like(), mix, n_expert=8, n_head=32, n_head_kv=8)
    for i in range(32):
        b = f"blk.{i}."
        assert p[b + "attn_v.weight"] == p[b + "attn_k.weight"] == Q8
        assert p[b + "attn_q.weight"] == q and p[b + "attn_output.weight"] == o
        assert p[b + "ffn_gate_exps.weight"] == p[b + "ffn_up_exps.weight"] == gate_up
        assert p[b + "ffn_gate_inp.weight"] == T.F32
    assert [p[f"blk.{i}.ffn_down_exps.weight"] for i in range(32)] == down
    assert p["output.weight"] == Q6


def test_fused_qkv_takes_the_attn_v_rules_of_q3_k_m():
    # Phi-3 style: attn_qkv counts as attn_v (the first two Q5_K, then Q4_K)
    ts = []
    for i in range(6):
        ts += [(f"blk.{i}.attn_qkv.weight", (3072, 9216), T.F16), (f"blk.{i}.ffn_down.weight", (8192, 3072), T.F16)]
    p = types(ts, "Q3_K_M", n_head=32, n_head_kv=32)
    assert [p[f"blk.{i}.attn_qkv.weight"] for i in range(6)] == [Q5, Q5, Q4, Q4, Q4, Q4]
    assert [p[f"blk.{i}.ffn_down.weight"] for i in range(6)] == [Q4] * 6  # 6 // 16 == 0: no first-layer bump


@pytest.fixture(scope="module")
def gqa_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    paths = {}
    for name, n_kv in (("gqa4", 2), ("mha", 8), ("per_layer", [2, 2])):
        paths[name] = d / f"{name}.gguf"
        write_tiny_llama(paths[name], qtype=T.F32, embd_type=T.F32, dim=256, n_head=8, n_kv=n_kv, ffn=512,
                         tied=False)
    return paths


def test_make_plan_reads_the_head_counts(gqa_models):
    for name, v2k, v4xs in (("gqa4", Q4, Q5), ("mha", Q3, XS), ("per_layer", Q4, Q5)):
        with GGUFFile(gqa_models[name]) as gf:
            p = {x.name: x.dst_type for x in make_plan(gf, "Q2_K")}
            assert p["blk.0.attn_v.weight"] == p["blk.1.attn_v.weight"] == v2k, name
            assert p["blk.0.attn_output.weight"] == p["blk.0.ffn_down.weight"] == Q3
            assert p["blk.0.attn_q.weight"] == Q2 and p["output.weight"] == Q6
            p = {x.name: x.dst_type for x in make_plan(gf, "IQ4_XS")}
            assert p["blk.0.attn_v.weight"] == v4xs, name


def test_cli_dry_run_accepts_the_new_mixes(gqa_models, tmp_path):
    for t in ("q2_k", "Q3_K_S", "q3_k_m", "Q3_K_L", "iq4_nl", "IQ4_XS", "q3_k"):
        r = CliRunner().invoke(main, ["quantize-model", str(gqa_models["gqa4"]), str(tmp_path / "o.gguf"),
                                      "--type", t, "--dry-run"])
        assert r.exit_code == 0, r.output
        assert "estimated tensor data" in r.output and not (tmp_path / "o.gguf").exists()
    r = CliRunner().invoke(main, ["quantize-model", str(gqa_models["gqa4"]), str(tmp_path / "o.gguf"),
                                  "--type", "Q3_K_M", "--output-type", "iq4_xs", "--dry-run"])
    assert r.exit_code == 0 and "IQ4_XS" in r.output


def test_an_imatrix_changes_the_ffn_down_rules_as_in_llama_cpp():
    # IQ4_NL/IQ4_XS raise the first n/8 ffn_down layers to Q5_K only without an imatrix; Q4_0/Q5_0 raise
    # them to Q4_1/Q5_1 only with one (llama.cpp's guard for those layers); n = 28: layers 0-2
    ts = qwen2_1_5b()
    n = 28
    for mix in ("IQ4_XS", "IQ4_NL"):
        plain = layer_table(types(ts, mix, **QWEN), n)["ffn_down"]
        weighted = layer_table(types(ts, mix, has_imatrix=True, **QWEN), n)["ffn_down"]
        assert plain[:4] == [T.Q5_K] * 3 + [T[mix]]
        assert weighted == [T[mix]] * n
    for mix, up in (("Q4_0", T.Q4_1), ("Q5_0", T.Q5_1)):
        plain = layer_table(types(ts, mix, **QWEN), n)["ffn_down"]
        weighted = layer_table(types(ts, mix, has_imatrix=True, **QWEN), n)["ffn_down"]
        assert plain == [T[mix]] * n
        assert weighted[:4] == [up] * 3 + [T[mix]]


@pytest.mark.parametrize("mix", ["IQ4_NL", "Q4_K_M", "Q3_K_M", "Q2_K"])
def test_layers_are_counted_in_block_order_whatever_the_file_order(mix):
    # llama.cpp's loader walks tensors by block number (weight_name_comparer), so a file written in name order
    # (blk.0, blk.1, blk.10, ..., blk.2, ...) gets its bumps on the same layers as one written in block order
    ts = qwen2_1_5b()
    by_name = sorted(ts, key=lambda t: t[0])
    assert [t[0] for t in by_name] != [t[0] for t in ts]
    want = types(ts, mix, **QWEN)
    p = plan(by_name, mix, **QWEN)
    assert [x.name for x in p] == [t[0] for t in by_name]  # the plan keeps the file's order
    assert {x.name: x.dst_type for x in p} == want

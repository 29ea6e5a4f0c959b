"""The compiled step's arguments by name (kernels/cpu/parts/, step.LayerStack) and a layer's tensors as
its parts' (models/parts/): each part names where its layers' matrices are, the precompile's signature is
what a real model passes, and the layer tensors are the parts' in block order. No step is compiled here."""

import numba
import numpy as np
from gguf.constants import MODEL_TENSOR as TN

from edgeinfer.engine.kv_cache import KVCache
from edgeinfer.engine.model_runner import Batch
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend
from edgeinfer.kernels.cpu import parallel_compile
from edgeinfer.kernels.cpu.parts import attention, ffn
from edgeinfer.models import load_model
from edgeinfer.models.decoder import layer_tensors
from edgeinfer.models.llama import SPEC as LLAMA
from edgeinfer.models.moe import QWEN2MOE

kb = get_backend("cpu")


def _same(a, b) -> bool:
    # two (kind, qs, qh, sc, d, m) tuples over the same arrays
    return a[0] == b[0] and all(np.shares_memory(x, y) for x, y in zip(a[1:], b[1:]) if x.size)


def test_each_part_names_where_its_layers_matrices_are(tiny_llama_path):
    m = load_model(GGUFFile(tiny_llama_path), kb)
    s = m.stack
    for part, names in ((s.attn, attention.MATS), (s.ffn, ffn.MATS)):
        for name in names:
            for i, lw in enumerate(m.layers):
                w = getattr(lw, name)
                assert _same(s.lists()[0][getattr(part, name)[i]], (w.kind, w.qs, w.qh, w.sc, w.d, w.m)), (name, i)


def test_moe_layers_name_their_first_expert(zoo):
    m = load_model(GGUFFile(zoo("qwen2moe")), kb)
    s = m.stack
    assert s.moe.n_expert == m.cfg.n_expert and s.ffn.shared == 1
    for i, lw in enumerate(m.layers):
        for e in range(m.cfg.n_expert):
            for j, w in enumerate((lw.exp_gate[e], lw.exp_up[e], lw.exp_down[e])):
                assert _same(s.lists()[1][s.moe.first[i] + 3 * e + j], (w.kind, w.qs, w.qh, w.sc, w.d, w.m))


def test_the_precompiled_signature_is_what_models_pass(tiny_llama_path, zoo):
    """parallel_compile.step_sig, typed from a stand-in stack, against the types of a real model's
    arguments, dense and MoE, for every KV type the model can have."""
    for m in (load_model(GGUFFile(tiny_llama_path), kb), load_model(GGUFFile(zoo("qwen3moe")), kb)):
        c = m.cfg
        for kv in ("f32", "f16", "q8_0", "q8_0/f16", "f16/f32", "q4_1/bf16") if c.head_dim % 32 == 0 else ("f32", "f16",
                                                                                                  "f32/f16"):
            cache = KVCache(c.n_layer, 4, 16, c.n_kv_head, c.head_dim, c.v_head_dim, dtype=kv, kb=kb)
            batch = Batch([5, 6], [0, 1], [0, 0], [0, 1], np.arange(4)[None], [1])
            args = m.stack.args(np.zeros((2, c.dim), np.float32), batch, cache,
                                m.stack.units_for(cache.k.dtype, cache.v.dtype))
            assert tuple(numba.typeof(a) for a in args) == parallel_compile.step_sig(kv), (c.arch, kv)


def test_a_layers_tensors_are_its_parts_in_block_order():
    from edgeinfer.config import ModelConfig

    cfg = ModelConfig(arch="llama", n_layer=1, dim=8, n_head=2, n_kv_head=2, head_dim=4, v_head_dim=4, ffn_dim=16,
                      vocab_size=10, context_length=32, norm_eps=1e-5, rope_base=1e4, rope_dim=4, rope_neox=False)
    got = [t[1] for t in layer_tensors(LLAMA, cfg)]
    assert got == [TN.ATTN_NORM, TN.ATTN_Q, TN.ATTN_K, TN.ATTN_V, TN.ATTN_OUT, TN.FFN_NORM, TN.FFN_GATE, TN.FFN_UP,
                   TN.FFN_DOWN]
    fused = [t[0] for t in layer_tensors(LLAMA, cfg, lambda t: t == TN.ATTN_QKV)]
    assert fused[1] == ("wq", "wk", "wv")
    moe = [t[1] for t in layer_tensors(QWEN2MOE, cfg)]
    assert moe[-8:] == [TN.FFN_GATE_INP, TN.FFN_GATE_EXP, TN.FFN_UP_EXP, TN.FFN_DOWN_EXP, TN.FFN_GATE_INP_SHEXP,
                        TN.FFN_GATE_SHEXP, TN.FFN_UP_SHEXP, TN.FFN_DOWN_SHEXP]

"""The compiled step's arguments by name (kernels/cpu/parts/, step.LayerStack): each part names where its
layers' matrices are, and the precompile's signature is what a real model passes. No step is compiled here."""

import numba
import numpy as np

from edgeinfer.engine.kv_cache import KVCache
from edgeinfer.engine.model_runner import Batch
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend
from edgeinfer.kernels.cpu import parallel_compile
from edgeinfer.kernels.cpu.parts import attention, ffn
from edgeinfer.models import load_model

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
                assert _same(s.mats[getattr(part, name)[i]], (w.kind, w.qs, w.qh, w.sc, w.d, w.m)), (name, i)


def test_moe_layers_name_their_first_expert(zoo):
    m = load_model(GGUFFile(zoo("qwen2moe")), kb)
    s = m.stack
    assert s.moe.n_expert == m.cfg.n_expert and s.ffn.shared == 1
    for i, lw in enumerate(m.layers):
        for e in range(m.cfg.n_expert):
            for j, w in enumerate((lw.exp_gate[e], lw.exp_up[e], lw.exp_down[e])):
                assert _same(s.experts[s.moe.first[i] + 3 * e + j], (w.kind, w.qs, w.qh, w.sc, w.d, w.m))


def test_the_precompiled_signature_is_what_models_pass(tiny_llama_path, zoo):
    """parallel_compile.step_sig, typed from a stand-in stack, against the types of a real model's
    arguments, dense and MoE, for every KV type the model can have."""
    for m in (load_model(GGUFFile(tiny_llama_path), kb), load_model(GGUFFile(zoo("qwen3moe")), kb)):
        c = m.cfg
        for kv in ("f32", "f16", "q8_0") if c.head_dim % 32 == 0 else ("f32", "f16"):
            cache = KVCache(c.n_layer, 4, 16, c.n_kv_head, c.head_dim, c.v_head_dim, dtype=kv)
            batch = Batch([5, 6], [0, 1], [0, 0], [0, 1], np.arange(4)[None], [1])
            args = m.stack.args(np.zeros((2, c.dim), np.float32), batch, cache, m.stack.units_for(cache.k.dtype))
            assert tuple(numba.typeof(a) for a in args) == parallel_compile.step_sig(kv), (c.arch, kv)


"""A mixture of experts as a part of the compiled step (the kernels are ../moe.py's): route, sort the
(token, slot) pairs by expert, every active expert's gate/up in one parallel region and its down in
another, the weighted sum. A shared expert, where the architecture has one, is the FFN part (ffn.py)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .. import int8, moe
from . import stack
from .ffn import act_quantize
from .rows import alloc_q, needs, quantize


class MoePart(NamedTuple):
    """A model's mixture-of-experts layers (n_expert 0: none; its arrays are then empty stand-ins)."""

    n_expert: int  # E
    k: int  # experts per token
    ffn: int  # an expert's FFN width
    norm_w: int  # 1: the chosen experts' weights renormalised to sum 1
    w_scale: np.float32  # the weights' multiplier, 0: none
    gelu: int  # 1: GELU (tanh) gates, else SiLU
    router: np.ndarray  # (n_layer, dim, E) float32, each router matrix transposed
    sh_gate: np.ndarray  # (n_layer, dim) float32: the shared expert's gate (zeros without one)
    first: np.ndarray  # (n_layer,) int64: where each layer's expert 0 is in the experts' typed list
    need_gate_up: np.ndarray  # (n_layer,) int64: the quantizations of the input the gates and ups read
    need_down: np.ndarray  # (n_layer,) int64: those of the down projections' input


def build(cfg, layers, experts: list, gelu: bool, moe_layers: bool) -> MoePart:
    """The MoE part of these layers; their experts' matrices are appended to `experts`, expert e of a
    layer at first + 3 e + (0 gate, 1 up, 2 down) (moe.expert_matmuls)."""
    n, e = cfg.n_layer, (int(cfg.n_expert) if moe_layers else 0)
    first = np.zeros(n, np.int64)
    need_gu, need_d = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for i, lw in enumerate(layers):
        first[i] = len(experts)
        for x in range(e):
            for j, w in enumerate((lw.exp_gate[x], lw.exp_up[x], lw.exp_down[x])):
                experts.append(int8.as_tuple(w))
                if j == 2:
                    need_d[i] |= needs(w.kind)
                else:
                    need_gu[i] |= needs(w.kind)
    router = np.stack([lw.router if e else np.zeros((cfg.dim, 0), np.float32) for lw in layers]).astype(np.float32)
    return MoePart(e, int(cfg.n_expert_used), int(cfg.expert_ffn_dim), int(cfg.expert_norm), np.float32(cfg.expert_scale),
                   int(gelu), router, stack(layers, "sh_gate", cfg.dim, 0.0), first, need_gu, need_d)


@njit(nogil=True, cache=True)
def forward(h, out, experts, p, layer, luts, threads, table):
    # the mixture-of-experts FFN of h (T, dim) -> out (T, dim) of layer `layer` (p: MoePart)
    k, fe = p.k, p.ffn
    T, dim = h.shape
    ids = np.empty((T, k), np.int64)
    wts = np.empty((T, k), np.float32)
    moe.route(h, p.router[layer], k, p.norm_w != 0, p.w_scale, ids, wts)
    offsets, order, pos = moe.plan(ids, p.n_expert)
    # each token quantized once, its rows then gathered: the same bits as quantizing the gathered rows
    q8, q8k = quantize(h, p.need_gate_up[layer])
    a8 = (q8[0][order], q8[1][order], q8[2][order])
    a8k = (q8k[0][order], q8k[1][order], q8k[2][order], q8k[3][order])
    gate = np.empty((T * k, fe), np.float32)
    up = np.empty((T * k, fe), np.float32)
    base = p.first[layer]
    moe.expert_matmuls(experts, base, 0, offsets, a8, a8k, luts, gate, up, threads, table)
    d8, d8k = alloc_q(T * k, fe, p.need_down[layer])
    act_quantize(gate, up, p.gelu, p.need_down[layer], d8, d8k)
    y = np.empty((T * k, dim), np.float32)
    moe.expert_matmuls(experts, base, 2, offsets, d8, d8k, luts, y, y, threads, table)
    moe.combine(y, pos, wts, out)

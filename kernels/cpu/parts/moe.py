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
    gelu: int  # 1: GELU (tanh) gates, 2: gpt-oss's clamped SwiGLU, else SiLU
    router: np.ndarray  # (n_layer, dim, E) float32, each router matrix transposed
    sh_gate: np.ndarray  # (n_layer, dim) float32: the shared expert's gate (zeros without one)
    first: np.ndarray  # (n_layer,) int64: where each layer's expert 0 is in the experts' typed list
    need_gate_up: np.ndarray  # (n_layer,) int64: the quantizations of the input the gates and ups read
    need_down: np.ndarray  # (n_layer,) int64: those of the down projections' input
    oai: int  # 1: gpt-oss's experts: a biased router, a softmax over the k chosen, biases on the experts' outputs
    router_b: np.ndarray  # (n_layer, E) float32 (oai; (n_layer, 0) else)
    gate_b: np.ndarray  # (n_layer, E, ffn) float32: each expert's gate bias (oai; (n_layer, 0, 0) else)
    up_b: np.ndarray  # (n_layer, E, ffn)
    down_b: np.ndarray  # (n_layer, E, dim)
    scored: int  # 1: lfm2moe's routing (moe.route_scored): a sigmoid (or softmax) score, a selection bias
    sigmoid: int  # with scored: 1 each expert's sigmoid, 0 a softmax over the experts
    sel_bias: np.ndarray  # (n_layer, E) float32: the selection bias (scored; (n_layer, 0) else)
    sh_gated: int  # 1: the shared expert's output times sigmoid(h . sh_gate) (qwen2moe); 0: added as it is
    on: np.ndarray  # (n_layer,) int64: 1 where the layer's FFN is the experts (lfm2moe's first layers: dense)
    # Gemma 4's experts (g4 1): beside the dense FFN (post-normed by post1), their input normed by pre2, their sum by
    # post2; the router reads the layer's input RMS-normed without weights (ones), times rdiv and rscale; each
    # expert's output times down_s (ones where the file has none)
    g4: int
    post1: np.ndarray  # (n_layer, dim) float32
    pre2: np.ndarray
    post2: np.ndarray
    rscale: np.ndarray
    rdiv: np.float32
    ones: np.ndarray  # (dim,) float32
    down_s: np.ndarray  # (n_layer, E) float32


def build(cfg, layers, experts: list, gelu: bool, moe_layers: bool, oai: bool = False, scored: bool = False,
          shared_gate: bool = True, g4: bool = False) -> MoePart:
    """The MoE part of these layers; their experts' matrices are appended to `experts`, expert e of a
    layer at first + 3 e + (0 gate, 1 up, 2 down) (moe.expert_matmuls)."""
    n, e = cfg.n_layer, (int(cfg.n_expert) if moe_layers else 0)
    first = np.zeros(n, np.int64)
    need_gu, need_d = np.zeros(n, np.int64), np.zeros(n, np.int64)
    on = np.array([int(e > 0 and bool(lw.exp_gate)) for lw in layers], np.int64)
    for i, lw in enumerate(layers):
        first[i] = len(experts)
        for x in range(e if on[i] else 0):
            for j, w in enumerate((lw.exp_gate[x], lw.exp_up[x], lw.exp_down[x])):
                experts.append(int8.as_tuple(w))
                if j == 2:
                    need_d[i] |= needs(w.kind)
                else:
                    need_gu[i] |= needs(w.kind)
    router = np.stack([lw.router if on[i] else np.zeros((cfg.dim, e), np.float32)
                       for i, lw in enumerate(layers)]).astype(np.float32)
    oai = bool(oai and e)

    def per_expert(name, size):  # a layer's experts' biases (E, size), stacked over the layers
        if not oai:
            return np.zeros((n, 0) if size is None else (n, 0, 0), np.float32)
        return np.stack([np.asarray(getattr(lw, name), np.float32) for lw in layers])

    return MoePart(e, int(cfg.n_expert_used), int(cfg.expert_ffn_dim), int(cfg.expert_norm), np.float32(cfg.expert_scale),
                   2 if oai else int(gelu), router, stack(layers, "sh_gate", cfg.dim, 0.0), first, need_gu, need_d,
                   int(oai), per_expert("router_b", None), per_expert("exp_gate_b", 0), per_expert("exp_up_b", 0),
                   per_expert("exp_down_b", 0), int(scored and e > 0), int(getattr(cfg, "expert_sigmoid", False)),
                   stack(layers, "exp_bias", e, 0.0) if scored and e else np.zeros((n, 0), np.float32),
                   int(shared_gate), on, int(g4 and e > 0), stack(layers, "post_ffn_norm_1", cfg.dim),
                   stack(layers, "pre_ffn_norm_2", cfg.dim), stack(layers, "post_ffn_norm_2", cfg.dim),
                   stack(layers, "router_scale", cfg.dim), np.float32(1.0) / np.float32(np.sqrt(np.float32(cfg.dim))),
                   np.ones(cfg.dim, np.float32), stack(layers, "exp_down_scale", e))


@njit(nogil=True, cache=True)
def forward(h, r, out, experts, p, layer, luts, threads, table):
    # the mixture-of-experts FFN of h (T, dim) -> out (T, dim) of layer `layer` (p: MoePart), routed on r (T, dim)
    # (h itself but for Gemma 4's)
    k, fe = p.k, p.ffn
    T, dim = h.shape
    ids = np.empty((T, k), np.int64)
    wts = np.empty((T, k), np.float32)
    if p.oai:
        moe.route_topk_softmax(r, p.router[layer], p.router_b[layer], k, ids, wts)
    elif p.scored:
        moe.route_scored(r, p.router[layer], k, p.sigmoid != 0, p.sel_bias[layer], p.norm_w != 0, p.w_scale, ids, wts)
    else:
        moe.route(r, p.router[layer], k, p.norm_w != 0, p.w_scale, ids, wts)
    offsets, order, pos = moe.plan(ids, p.n_expert)
    # each token quantized once, its rows then gathered: the same bits as quantizing the gathered rows
    q8, q8k = quantize(h, p.need_gate_up[layer])
    a8 = (q8[0][order], q8[1][order], q8[2][order])
    a8k = (q8k[0][order], q8k[1][order], q8k[2][order], q8k[3][order])
    gate = np.empty((T * k, fe), np.float32)
    up = np.empty((T * k, fe), np.float32)
    base = p.first[layer]
    moe.expert_matmuls(experts, base, 0, offsets, a8, a8k, luts, gate, up, threads, table)
    if p.oai:
        _expert_bias(gate, offsets, p.gate_b[layer])
        _expert_bias(up, offsets, p.up_b[layer])
    d8, d8k = alloc_q(T * k, fe, p.need_down[layer])
    act_quantize(gate, up, p.gelu, p.need_down[layer], d8, d8k)
    y = np.empty((T * k, dim), np.float32)
    moe.expert_matmuls(experts, base, 2, offsets, d8, d8k, luts, y, y, threads, table)
    if p.oai:
        _expert_bias(y, offsets, p.down_b[layer])
    if p.g4:
        _expert_scale(y, offsets, p.down_s[layer])
    moe.combine(y, pos, wts, out)


@njit(nogil=True, cache=True)
def _expert_scale(x, offsets, s):
    # each expert's rows of x (sorted by expert: offsets, moe.plan) times that expert's scale s[e]
    for e in range(offsets.shape[0] - 1):
        for r in range(offsets[e], offsets[e + 1]):
            x[r] *= s[e]


@njit(nogil=True, cache=True)
def _expert_bias(x, offsets, b):
    # each expert's rows of x (sorted by expert: offsets, moe.plan) plus that expert's bias b[e]
    for e in range(offsets.shape[0] - 1):
        for r in range(offsets[e], offsets[e + 1]):
            for i in range(x.shape[1]):
                x[r, i] += b[e, i]

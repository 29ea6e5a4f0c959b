"""The gated FFN as a part of the compiled step: down(act(gate h) * up h), act SiLU or GELU (tanh); also a
mixture-of-experts layer's shared expert. The gated activation and its quantization for the down
projection (`act_quantize`) serve the experts too (moe.py)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from .. import int8, lora, ops, units
from . import gather
from .rows import alloc_q, quantize

_NONE = np.int64(-1)  # no matrix (lora.call_lora's)

# the matrices of a layer, by name -> the input each reads
MATS = {"w_gate": "gate_up", "w_up": "gate_up", "w_down": "down"}


class FfnPart(NamedTuple):
    """A model's dense FFNs (or its MoE layers' shared experts)."""

    ffn: int  # the FFN's width (the widest layer's)
    gelu: int  # 1: GELU (tanh) gates, else SiLU
    dense: int  # 1: the layers' FFN (else the MoE layers' shared expert, if `shared`)
    shared: int  # 1: MoE layers with a shared expert
    w_gate: np.ndarray  # (n_layer,) int64: where each layer's matrix is in the step's typed list (-1: none)
    w_up: np.ndarray
    w_down: np.ndarray
    need_gate_up: np.ndarray  # (n_layer,) int64: the quantizations of the input gate and up read (rows.needs)
    need_down: np.ndarray  # (n_layer,) int64: those of the down projection's input
    block: int  # 1: a feed-forward block after the mixer in every layer (0: Mamba2, Nemotron-H)
    mlp: np.ndarray  # (n_layer,) int64: 1 where the layer's mixer is itself an FFN, down(relu(up h)^2) (`mlp`)
    width: np.ndarray  # (n_layer,) int64: each layer's FFN width (Gemma 4's last layers' are twice the others')


def build(cfg, layers, mats: list, gelu: bool, moe: bool, shared_expert: bool, block: bool = True) -> FfnPart:
    """The FFN part of these layers; their matrices are appended to mats."""
    at, need = gather(layers, MATS, mats)
    n = cfg.n_layer
    mlp = np.array([int(cfg.mixer(i) == "mlp") if hasattr(cfg, "mixer") else 0 for i in range(n)], np.int64)
    dense = not moe or getattr(cfg, "dense_lead", 0) > 0  # (lfm2moe: its first layers' FFNs are dense)
    width = np.array([cfg.at(i).ffn_dim if hasattr(cfg, "at") else cfg.ffn_dim for i in range(n)], np.int64)
    return FfnPart(int(max(cfg.ffn_dim, *width)), int(gelu), int(dense), int(shared_expert), at["w_gate"], at["w_up"],
                   at["w_down"], need["gate_up"], need["down"], int(block), mlp, width)


@njit(inline="always", nogil=True, cache=True)
def scratch_size(T, f):
    # floats of room for the gate and up outputs of T rows (`forward`'s scratch), 0 without a dense FFN
    return 2 * T * f.ffn if f.dense or f.shared else 0


@njit(nogil=True, cache=True)
def _act_quantize_chunk(gate, up, gelu, need, a, b, chunk, per_row, i):
    # chunk i (of per_row per row) of the gated activation and its quantization
    t = i // per_row
    c = i % per_row
    ops.gated_act_range(gate, up, gate, gelu, t, c * chunk, (c + 1) * chunk)
    if need & 1:
        int8.quantize_q8_blocks(gate, a[0], a[1], a[2], t, c * chunk // 32, (c + 1) * chunk // 32)
    if need & 2:
        int8.quantize_q8k_blocks(gate, b[0], b[1], b[2], b[3], t, c * chunk // 256, (c + 1) * chunk // 256)


@njit(parallel=True, nogil=True, cache=True)
def _act_quantize_par(gate, up, gelu, need, a, b, chunk, per_row):
    for i_ in prange(gate.shape[0] * per_row):
        _act_quantize_chunk(gate, up, gelu, need, a, b, chunk, per_row, np.int64(i_))


# below this many elements the gated activation runs in a plain loop (a decode step's few rows): a
# parallel region's launch and wake-up cost more than the work
PAR_ACT = 8192


@njit(nogil=True, cache=True)
def act_quantize(gate, up, gelu, need, a, b):
    # gate = act(gate) * up, then quantized into a (Q8) and/or b (Q8_K), in chunks of 256 elements, in
    # parallel for many: the widest row-wise op of a layer, done where the work is (the same arithmetic,
    # per element and per block, as gated_act_row followed by the quantize_*_row functions)
    T, F = gate.shape
    chunk = 256 if F % 256 == 0 else 32
    per_row = F // chunk
    if T * F >= PAR_ACT:
        _act_quantize_par(gate, up, gelu, need, a, b, chunk, per_row)
    else:
        for i in range(T * per_row):
            _act_quantize_chunk(gate, up, gelu, need, a, b, chunk, per_row, i)


@njit(nogil=True, cache=True)
def forward(h, out, mats, f, layer, luts, threads, table, scratch, lo, lr):
    # the gated FFN of h (T, dim) -> out (T, dim), with layer `layer`'s matrices (f: FfnPart); scratch: room
    # for gate and up (scratch_size), allocated once for every layer: a prompt's are tens of MB, which the
    # allocator would otherwise hand back to the system and fault in again, page by page, per layer; lo, lr: LoRA
    # adapters and the rows' scales of them (step.forward_layers; lo.on 0: none)
    gate, up = gate_up(h, mats, f, layer, luts, threads, table, scratch, lo, lr)
    down(gate, up, out, mats, f, layer, luts, threads, table, lo, lr)


@njit(nogil=True, cache=True)
def gate_up(h, mats, f, layer, luts, threads, table, scratch, lo, lr):
    # the FFN's gate and up projections of h (T, dim), in scratch: (gate, up), each (T, width)
    T = h.shape[0]
    ffn = f.width[layer]
    wg, wu = mats[f.w_gate[layer]], mats[f.w_up[layer]]
    g8, g8k = quantize(h, f.need_gate_up[layer])
    gate = scratch[: T * ffn].reshape(T, ffn)
    up = scratch[T * ffn: 2 * T * ffn].reshape(T, ffn)
    int8.matmuls(wg, wu, wu, np.int64(2), g8, g8k, luts, gate, up, up, threads, table)
    if lo.on:
        lora.call_lora(table[units.LORA], h, lo, lo.of_mat[f.w_gate[layer]], lo.of_mat[f.w_up[layer]], _NONE, gate, up,
                       up, lr)
    return gate, up


@njit(nogil=True, cache=True)
def down(gate, up, out, mats, f, layer, luts, threads, table, lo, lr):
    # out (T, dim) = the down projection of act(gate) * up
    T, ffn = gate.shape
    wd = mats[f.w_down[layer]]
    d8, d8k = alloc_q(T, ffn, f.need_down[layer])
    act_quantize(gate, up, f.gelu, f.need_down[layer], d8, d8k)
    int8.matmuls(wd, wd, wd, np.int64(1), d8, d8k, luts, out, out, out, threads, table)
    if lo.on:
        lora.call_lora(table[units.LORA], gate, lo, lo.of_mat[f.w_down[layer]], _NONE, _NONE, out, out, out, lr)


@njit(nogil=True, cache=True)
def mlp(h, out, mats, f, layer, luts, threads, table):
    # a layer whose mixer is an FFN alone (Nemotron-H): down(relu(up h)^2) of h (T, dim) -> out (T, dim)
    T = h.shape[0]
    wu, wd = mats[f.w_up[layer]], mats[f.w_down[layer]]
    a8, a8k = quantize(h, f.need_gate_up[layer])
    u = np.empty((T, f.width[layer]), np.float32)
    int8.matmuls(wu, wu, wu, np.int64(1), a8, a8k, luts, u, u, u, threads, table)
    for t in range(T):
        for i in range(u.shape[1]):
            v = u[t, i]
            if v < 0:
                v = np.float32(0.0)
            u[t, i] = v * v
    d8, d8k = quantize(u, f.need_down[layer])
    int8.matmuls(wd, wd, wd, np.int64(1), d8, d8k, luts, out, out, out, threads, table)

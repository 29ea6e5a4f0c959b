"""Self-attention as a part of the compiled step: q/k/v projections (with biases and q/k norms where the
architecture has them), RoPE, the KV writes, paged attention over the cache, the output projection.

The step runs it in two halves: `project` for every row of the batch (every token's K and V go into the
cache) and `attend` for the rows that go on (in the last layer only those that get logits).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from .. import int8, lora, ops, units
from . import gather, stack
from .rows import PAR_ROWS, add_bias, norm, quantize

_NONE = np.int64(-1)  # no matrix (lora.call_lora's)

# the matrices of a layer, by name -> the input each reads
MATS = {"wq": "qkv", "wk": "qkv", "wv": "qkv", "wo": "o"}


class AttnPart(NamedTuple):
    """A model's attention layers: sizes and switches, then per-layer arrays (n_layer, ...)."""

    n_head: int
    n_kv: int
    head_dim: int
    v_head_dim: int
    rope_dim: int
    neox: int  # 1: RoPE rotates (i, i + n/2) pairs, else (2i, 2i + 1)
    qk_norm: int  # 0: none; 1: an RMS norm on each q and k head; 2: over each token's whole q and k
    qkv_bias: int  # 1: biases on the q, k and v projections
    eps: np.float32  # of the q/k norms
    scale: np.float32  # of the scores
    softcap: np.float32  # of the scores, 0: none
    mscale: np.float32  # RoPE's cos and sin multiplier
    wq: np.ndarray  # (n_layer,) int64: where each layer's matrix is in the step's typed list
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    need_qkv: np.ndarray  # (n_layer,) int64: the quantizations of the input q, k and v read (rows.needs)
    need_o: np.ndarray  # (n_layer,) int64: those of the output projection's input
    q_norm: np.ndarray  # (n_layer, head_dim) float32, or (n_layer, n_head * head_dim) for qk_norm 2
    k_norm: np.ndarray  # (n_layer, head_dim), or (n_layer, n_kv * head_dim)
    bq: np.ndarray  # (n_layer, n_head * head_dim) float32 (zeros, and skipped, without qkv_bias)
    bk: np.ndarray  # (n_layer, n_kv * head_dim)
    bv: np.ndarray  # (n_layer, n_kv * v_head_dim)
    inv_freq: np.ndarray  # (n_layer, rope_dim / 2) float64: each layer's RoPE inverse frequencies
    window: np.ndarray  # (n_layer,) int64: sliding window, 0: global
    temp_scale: np.float32  # the queries' temperature past the original context (ops.attn_temperature); 0: none
    temp_floor: np.float64
    sinks: np.ndarray  # (n_layer, n_head) float32: each head's attention sink (gpt-oss), (n_layer, 0): none
    out_bias: int  # 1: a bias on the output projection
    bo: np.ndarray  # (n_layer, dim) float32 (zeros, and skipped, without out_bias)
    gate: int  # 1: wq projects each head's query then its gate, the output times sigmoid(gate) (qwen35)
    # each layer's (n_head, n_kv, head_dim, v_head_dim, rope_dim) (Gemma 4's differ by layer; the sizes above:
    # the largest, which the step's buffers hold), (n_layer, 5) int64
    dims: np.ndarray
    own: np.ndarray  # (n_layer,) int64: 1 where the layer writes KV of its own (0: it reads an earlier layer's)
    v_norm: int  # 1: V RMS-normed without weights (Gemma 4), and V = K's projection where a layer has no wv
    v_ones: np.ndarray  # (v_head_dim,) float32 ones: that norm's weights


def build(cfg, layers, mats: list, inv_freqs, qk_norm: int, qkv_bias: bool, sinks: bool = False,
          gate: bool = False, v_norm: bool = False) -> AttnPart:
    """The attention part of these layers; their matrices are appended to mats."""
    n = cfg.n_layer
    at, need = gather(layers, MATS, mats)
    dims = np.array([[c.n_head, c.n_kv_head, c.head_dim, c.v_head_dim, c.rope_dim]
                     for c in (cfg.at(i) if hasattr(cfg, "at") else cfg for i in range(n))], np.int64).reshape(n, 5)
    nh, nkv, hd, vd, rd = (int(max(d, *dims[:, j])) for j, d in
                           enumerate((cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.v_head_dim, cfg.rope_dim)))
    qn, kn = (nh * hd, nkv * hd) if qk_norm == 2 else (hd, hd)
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / np.sqrt(max(cfg.head_dim, 1))  # (0: no attention)
    temp = getattr(cfg, "attn_temp", ()) or (0.0, 1.0)
    kv_of = getattr(cfg, "kv_of", lambda i: i)
    freqs = np.zeros((n, max([len(f) for f in inv_freqs] + [0])), np.float64)  # each layer's, from the left
    for i, f in enumerate(inv_freqs):
        freqs[i, :len(f)] = f
    return AttnPart(nh, nkv, hd, vd, rd, int(cfg.rope_neox), int(qk_norm),
                    int(qkv_bias), np.float32(cfg.norm_eps), np.float32(scale), np.float32(cfg.attn_softcap),
                    np.float32(cfg.rope_mscale), at["wq"], at["wk"], at["wv"], at["wo"], need["qkv"], need["o"],
                    _padded(layers, "q_norm", qn), _padded(layers, "k_norm", kn),
                    stack(layers, "bq", nh * hd, 0.0), stack(layers, "bk", nkv * hd, 0.0), stack(layers, "bv", nkv * vd, 0.0),
                    freqs, np.array([cfg.sliding_window if cfg.is_sliding(i) else 0 for i in range(n)], np.int64),
                    np.float32(temp[0]), np.float64(temp[1]),
                    stack(layers, "sinks", nh, 0.0) if sinks else np.zeros((n, 0), np.float32), int(sinks),
                    stack(layers, "bo", cfg.dim, 0.0), int(gate), dims,
                    np.array([int(kv_of(i) == i) for i in range(n)], np.int64), int(v_norm), np.ones(vd, np.float32))


def _padded(layers, name: str, size: int) -> np.ndarray:
    # the layers' vectors `name` (each its layer's head size, Gemma 4's differ) from the left of (n_layer, size)
    # rows of ones
    out = np.ones((len(layers), size), np.float32)
    for i, lw in enumerate(layers):
        w = getattr(lw, name, None)
        if w is not None:
            out[i, :len(w)] = w
    return out


@njit(parallel=True, nogil=True, cache=True)
def _rope_kv_rows(q, k, v, positions, inv_freq, neox, rope_dim, mscale, slot_mapping, kc, vc):
    for t_ in prange(q.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        ops.rope_row(q[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
        ops.rope_row(k[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
        ops.write_kv_row(k, v, slot_mapping, kc, vc, t)


@njit(nogil=True, cache=True)
def _rope_kv(q, k, v, positions, inv_freq, neox, rope_dim, mscale, slot_mapping, kc, vc):
    # RoPE on q and k, then k and v into their KV slots
    if q.shape[0] >= PAR_ROWS:
        _rope_kv_rows(q, k, v, positions, inv_freq, neox, rope_dim, mscale, slot_mapping, kc, vc)
    else:
        for t in range(q.shape[0]):
            ops.rope_row(q[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
            ops.rope_row(k[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
            ops.write_kv_row(k, v, slot_mapping, kc, vc, t)


@njit(nogil=True, cache=True)
def _rope_q(q, positions, inv_freq, neox, rope_dim, mscale):
    # RoPE on q alone (a layer that reads an earlier layer's KV)
    for t in range(q.shape[0]):
        ops.rope_row(q[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)


@njit(inline="always", nogil=True, cache=True)
def project(h, q, k, v, gate, positions, slot_mapping, kc, vc, mats, a, layer, luts, threads, table, lo, lr):
    # h (T, dim) -> q (T, H, D), k (T, KVH, D), v (T, KVH, Dv) of layer `layer` (a: AttnPart; q, k and v shaped
    # as its a.dims), with RoPE on q and k, and k and v written to the layer's KV cache kc/vc at slot_mapping;
    # gate (T, H D): the output gates where a.gate (each head's query and gate projected side by side, split
    # here). A layer that reads an earlier layer's KV (a.own 0) projects and rotates q alone. lo, lr: LoRA adapters
    # and the rows' scales of them (step.forward_layers; lo.on 0: none)
    T = h.shape[0]
    nh, nkv, hd, vd, rd = a.dims[layer, 0], a.dims[layer, 1], a.dims[layer, 2], a.dims[layer, 3], a.dims[layer, 4]
    q2 = q.reshape(T, nh * hd)
    k2 = k.reshape(T, nkv * hd)
    v2 = v.reshape(T, nkv * vd)
    own = a.own[layer] != 0
    a8, a8k = quantize(h, a.need_qkv[layer])
    qg = np.empty((T, 2 * nh * hd), np.float32) if a.gate else q2
    wq = mats[a.wq[layer]]
    adapt = lo.on
    if not own:
        int8.matmuls(wq, wq, wq, np.int64(1), a8, a8k, luts, qg, qg, qg, threads, table)
        if adapt:
            lora.call_lora(table[units.LORA], h, lo, lo.of_mat[a.wq[layer]], _NONE, _NONE, qg, qg, qg, lr)
    elif a.wv[layer] < 0:  # Gemma 4's layers without wv: V is K's projection, before K's norm
        wk = mats[a.wk[layer]]
        int8.matmuls(wq, wk, wk, np.int64(2), a8, a8k, luts, qg, k2, k2, threads, table)
        if adapt:
            lora.call_lora(table[units.LORA], h, lo, lo.of_mat[a.wq[layer]], lo.of_mat[a.wk[layer]], _NONE, qg, k2, k2,
                               lr)
        v2[:] = k2
    else:
        int8.matmuls(wq, mats[a.wk[layer]], mats[a.wv[layer]], np.int64(3), a8, a8k, luts, qg, k2, v2, threads, table)
        if adapt:
            lora.call_lora(table[units.LORA], h, lo, lo.of_mat[a.wq[layer]], lo.of_mat[a.wk[layer]],
                           lo.of_mat[a.wv[layer]], qg, k2, v2, lr)
    if a.gate:
        _split_gate(qg, q2, gate, nh, hd)
    if a.qkv_bias:
        add_bias(q2, a.bq[layer])
        add_bias(k2, a.bk[layer])
        add_bias(v2, a.bv[layer])
    if a.qk_norm == 1:  # per head
        qf = q.reshape(T * nh, hd)
        norm(qf, a.q_norm[layer, :hd], a.eps, qf)
        if own:
            kf = k.reshape(T * nkv, hd)
            norm(kf, a.k_norm[layer, :hd], a.eps, kf)
    elif a.qk_norm == 2:  # over each token's whole projection
        norm(q2, a.q_norm[layer], a.eps, q2)
        norm(k2, a.k_norm[layer], a.eps, k2)
    if a.v_norm and own:
        vf = v.reshape(T * nkv, vd)
        norm(vf, a.v_ones[:vd], a.eps, vf)
    freqs = a.inv_freq[layer, :rd // 2] if a.inv_freq.shape[1] else a.inv_freq[layer]
    if own:
        _rope_kv(q, k, v, positions, freqs, a.neox, rd, a.mscale, slot_mapping, kc, vc)
    else:
        _rope_q(q, positions, freqs, a.neox, rd, a.mscale)
    if a.temp_scale != 0:
        ops.attn_temperature(q, positions, a.temp_scale, a.temp_floor)


@njit(nogil=True, cache=True)
def _split_gate(qg, q2, gate, n_head, d):
    # qg (T, H 2 D), each head's query then its gate -> q2 (T, H D), gate (T, H D)
    for t in range(qg.shape[0]):
        for hh in range(n_head):
            for i in range(d):
                q2[t, hh * d + i] = qg[t, 2 * hh * d + i]
                gate[t, hh * d + i] = qg[t, (2 * hh + 1) * d + i]


@njit(inline="always", nogil=True, cache=True)
def attend(q, gate, positions, token_seq, block_tables, block_size, kc, vc, mats, a, layer, luts, threads, table,
           out, lo, lr):
    # attention of q (T, H, D) over the layer's KV cache, times sigmoid(gate) where a.gate, then the output
    # projection -> out (T, dim)
    T = q.shape[0]
    nh, vd = a.dims[layer, 0], a.dims[layer, 3]
    att = np.empty((T, nh, vd), np.float32)
    units.call_attention(table[units.ATTENTION], q, kc, vc, token_seq, positions, block_tables, block_size, a.scale,
                         a.window[layer], a.softcap, a.sinks[layer], att, threads)
    if a.gate:
        ops.sigmoid_mul_(att.reshape(T, nh * vd), gate)
    o8, o8k = quantize(att.reshape(T, nh * vd), a.need_o[layer])
    wo = mats[a.wo[layer]]
    int8.matmuls(wo, wo, wo, np.int64(1), o8, o8k, luts, out, out, out, threads, table)
    if lo.on:
        lora.call_lora(table[units.LORA], att.reshape(T, nh * vd), lo, lo.of_mat[a.wo[layer]], _NONE, _NONE, out, out,
                       out, lr)
    if a.out_bias:
        add_bias(out, a.bo[layer])

"""Gemma 3n's layers in one compiled call: the compiled step (step.py) for a residual of several streams (AltUp)
with LAuReL beside the attention and sparse FFN gates. The row functions here are also the per-op path's
(the backend's altup_* and sparsify_ kernels, which models/gemma3n.py calls), so the two agree bit for bit;
the attention, the FFN and the per-layer inputs are the step's own parts (parts/).

A layer: the router's modalities of the active stream predict every stream from all of them; the active
prediction goes through the attention (its norm, LAuReL beside it, post-norm, the two averaged), the FFN (the
first layers' gates sparse) and its post-norm; the modalities of that output correct every prediction by the
innovation; the per-layer input, gated by the corrected active stream, is added to the other streams. The
streams' projections in (before the first layer) and out (after the last) run per op around this call."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba import njit

from ..kinds import is_dense
from . import lora, quant
from .parts import attention, ffn, per_layer
from .parts.rows import add, norm
from .step import layer_views


class AltupPart(NamedTuple):
    """What the compiled walk reads of a model's AltUp and LAuReL tensors, stacked over the layers."""

    active: int  # the stream the layers run on
    router_norm: np.ndarray  # (n_layer, dim) float32
    router: np.ndarray  # (n_layer, n, dim) float32: the modalities' router
    predict: np.ndarray  # (n_layer, n * n, n) float32: the prediction's coefficients from the modalities
    correct: np.ndarray  # (n_layer, n, n) float32: the correction's
    correct_scale: np.ndarray  # (n_layer, dim) float32: the corrected active stream's scale for the per-layer input
    laurel_kind: int  # F16 or BF16 (matmul_half's row of the lookup table)
    laurel_l: np.ndarray  # (n_layer, rank, dim) uint16: LAuReL's two matrices' bit patterns
    laurel_r: np.ndarray  # (n_layer, dim, rank) uint16
    laurel_norm: np.ndarray  # (n_layer, dim) float32
    sparse: np.ndarray  # (n_layer,) float32: the FFN gates' cut in standard deviations above the mean (0: none)
    inv_sqrt2: np.float32  # the attention and LAuReL averaged: times this


def build(cfg, layers, sparse_layers: int, sparse_std: np.float32):
    """The part for these layers, or None where LAuReL's matrices are not F16/BF16 of one kind (per op)."""
    kinds = {getattr(w, "kind", None) for lw in layers for w in (lw.laurel_l, lw.laurel_r)}
    if len(kinds) != 1 or None in kinds or not is_dense(next(iter(kinds))):
        return None

    def stacked(name, dtype=np.float32, attr=None):
        rows = [getattr(getattr(lw, name), attr) if attr else getattr(lw, name) for lw in layers]
        return np.ascontiguousarray(np.stack([np.asarray(r) for r in rows]).astype(dtype))

    sparse = np.array([sparse_std if i < sparse_layers else 0.0 for i in range(cfg.n_layer)], np.float32)
    return AltupPart(int(cfg.altup_active), stacked("altup_router_norm"), stacked("altup_router"),
                     stacked("altup_predict_coef"), stacked("altup_correct_coef"), stacked("altup_correct_scale"),
                     int(next(iter(kinds))), stacked("laurel_l", np.uint16, "d"), stacked("laurel_r", np.uint16, "d"),
                     stacked("laurel_norm"), sparse, np.float32(1.0) / np.float32(np.sqrt(np.float32(2.0))))


# -- the row functions (the per-op kernels too) -----------------------------------------------------------


@njit(nogil=True, cache=True)
def modalities(x, router_norm, router, eps, out):
    # out (T, n) = tanh(router . (rmsnorm(x) / dim)) of x (T, dim): each a sum over dim in order
    T, dim = x.shape
    r = np.empty((T, dim), np.float32)
    norm(x, router_norm, eps, r)
    inv = np.float32(1.0) / np.float32(dim)
    for t in range(T):
        for i in range(dim):
            r[t, i] *= inv
        for j in range(router.shape[0]):
            s = np.float32(0.0)
            for i in range(dim):
                s += r[t, i] * router[j, i]
            out[t, j] = np.tanh(s)


@njit(nogil=True, cache=True)
def _coefs(mod, coef, t, j):
    # sum over the modalities of row t: mod[t] . coef[j]
    s = np.float32(0.0)
    for m in range(mod.shape[1]):
        s += mod[t, m] * coef[j, m]
    return s


@njit(nogil=True, cache=True)
def predict(streams, mod, coef, out):
    # out[j] = streams[j] + sum_k c[t, j, k] streams[k] (streams, out (n, T, dim)), c[t, j, k] = mod[t] . coef[j n + k]
    n, T, dim = streams.shape
    c = np.empty(n, np.float32)
    for j in range(n):
        for t in range(T):
            for k in range(n):
                c[k] = _coefs(mod, coef, t, j * n + k)
            for i in range(dim):
                s = np.float32(0.0)
                for k in range(n):
                    s += c[k] * streams[k, t, i]
                out[j, t, i] = s + streams[j, t, i]


@njit(nogil=True, cache=True)
def correct(pred, act, active, mod, coef, out):
    # out[j] = pred[j] + (act - pred[active]) (mod . coef[j] + 1): every prediction moved by the innovation
    n, T, dim = pred.shape
    for j in range(n):
        for t in range(T):
            c = _coefs(mod, coef, t, j) + np.float32(1.0)
            for i in range(dim):
                out[j, t, i] = (act[t, i] - pred[active, t, i]) * c + pred[j, t, i]


@njit(nogil=True, cache=True)
def sparsify(g, std_mul):
    # each row of g (T, F) less (its mean + std_mul standard deviations, over F - 1), below 0 cut to 0
    T, F = g.shape
    for t in range(T):
        s = np.float32(0.0)
        for i in range(F):
            s += g[t, i]
        mean = s / np.float32(F)
        v = np.float32(0.0)
        for i in range(F):
            d = g[t, i] - mean
            v += d * d
        cut = mean + np.sqrt(v / np.float32(F - 1)) * std_mul
        for i in range(F):
            g[t, i] = max(g[t, i] - cut, np.float32(0.0))


@njit(nogil=True, cache=True)
def laurel(h, kind, wl, wr, wn, eps, luts, out):
    # out (T, dim) = rmsnorm(wr (wl h)) + h: LAuReL's low-rank residual beside the attention (wl, wr: F16/BF16 bits)
    mid = np.empty((h.shape[0], wl.shape[0]), np.float32)
    quant.matmul_half(kind, wl, luts, h, mid)
    quant.matmul_half(kind, wr, luts, mid, out)
    norm(out, wn, eps, out)
    add(out, h)


# -- the layer walk ----------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def forward_layers(streams, positions, token_seq, slot_mapping, block_tables, window_slots, window_tables, keep,
                   block_size, where, k_cache, v_cache, wk, wv, mats, nm, at, ff, luts, threads, table, ple, pl, au, lo,
                   lr):
    # streams (n, T, dim) through every layer -> the rows `keep` of every stream (n, L, dim). The arguments are
    # step.forward_layers' of the same names (a dense model's: no experts, no recurrent mixers); ple (n_layer,
    # T, E): each layer's per-layer input; au: AltupPart; lo, lr: no LoRA adapters (lo.on 0: models/lora.py refuses
    # AltUp models), the step's stand-ins. In the last layer only the kept rows go past the KV
    # writes.
    n, T, dim = streams.shape
    n_layer = where.shape[0]
    eps = nm.eps
    qbuf = np.empty(T * at.n_head * at.head_dim, np.float32)
    kbuf = np.empty(T * at.n_kv * at.head_dim, np.float32)
    vbuf = np.empty(T * at.n_kv * at.v_head_dim, np.float32)
    scratch = np.empty(ffn.scratch_size(T, ff), np.float32)
    for layer in range(n_layer):
        mod = np.empty((T, n), np.float32)
        modalities(streams[au.active], au.router_norm[layer], au.router[layer], eps, mod)
        pred = np.empty((n, T, dim), np.float32)
        predict(streams, mod, au.predict[layer], pred)
        h = np.empty((T, dim), np.float32)
        norm(pred[au.active], nm.attn[layer], eps, h)
        lau = np.empty((T, dim), np.float32)
        laurel(h, au.laurel_kind, au.laurel_l[layer], au.laurel_r[layer], au.laurel_norm[layer], eps, luts, lau)
        kc, vc, slots, tables, q, k, v = layer_views(where, layer, k_cache, v_cache, wk, wv, slot_mapping,
                                                     block_tables, window_slots, window_tables, at, qbuf, kbuf, vbuf, T)
        attention.project(h, q, k, v, np.empty((T, 0), np.float32), positions, slots, kc, vc, mats, at, layer, luts,
                          threads, table, lo, lr)
        inp = ple[layer]
        if layer == n_layer - 1:  # the kept rows alone from here
            T = keep.shape[0]
            pred, lau, inp, q = _rows3(pred, keep), lau[keep], inp[keep], q[keep]
            pos, seq = positions[keep], token_seq[keep]
        else:
            pos, seq = positions, token_seq
        y = np.empty((T, dim), np.float32)
        attention.attend(q, np.empty((T, 0), np.float32), pos, seq, tables, block_size, kc, vc, mats, at, layer,
                         luts, threads, table, y, lo, lr)
        norm(y, nm.post_attn[layer], eps, y)
        add(y, pred[au.active])
        add(y, lau)
        y *= au.inv_sqrt2
        h2 = np.empty((T, dim), np.float32)
        norm(y, nm.ffn[layer], eps, h2)
        g, u = ffn.gate_up(h2, mats, ff, layer, luts, threads, table, scratch, lo, lr)
        if au.sparse[layer] != 0:
            sparsify(g, au.sparse[layer])
        f = np.empty((T, dim), np.float32)
        ffn.down(g, u, f, mats, ff, layer, luts, threads, table, lo, lr)
        norm(f, nm.post_ffn[layer], eps, f)
        add(f, y)
        mod2 = np.empty((T, n), np.float32)
        modalities(f, au.router_norm[layer], au.router[layer], eps, mod2)
        streams = np.empty((n, T, dim), np.float32)
        correct(pred, f, au.active, mod2, au.correct[layer], streams)
        first = streams[au.active] * au.correct_scale[layer]
        p = np.empty((T, dim), np.float32)
        per_layer.project(first, inp, mats, pl, layer, luts, threads, table, p)
        for j in range(n):
            if j != 0:  # (llama.cpp: every stream but the first)
                add(streams[j], p)
    return streams


@njit(nogil=True, cache=True)
def _rows3(x, keep):
    # x (n, T, dim) -> its rows keep (n, L, dim)
    out = np.empty((x.shape[0], keep.shape[0], x.shape[2]), np.float32)
    for j in range(x.shape[0]):
        for r in range(keep.shape[0]):
            out[j, r] = x[j, keep[r]]
    return out


def run(stack, part: AltupPart, streams, batch, cache, ple) -> np.ndarray:
    """streams (n, T, dim) through every layer (step.LayerStack `stack`, its AltUp `part`) -> the rows
    batch.logits_idx selects of every stream, (n, L, dim); ple: every layer's per-layer inputs (n_layer, T, E)."""
    return forward_layers(streams, batch.positions, batch.token_seq, batch.slot_mapping, batch.block_tables,
                          batch.window_slots, batch.window_tables, batch.logits_idx, cache.block_size, cache.where,
                          cache.k, cache.v, cache.wk, cache.wv, stack.lists()[0], stack.norms, stack.attn, stack.ffn,
                          quant.HALF_TO_F32, numba.get_num_threads(), stack.units_for(cache.k.dtype, cache.v.dtype),
                          ple, stack.ple, part, lora.off(), lora.NO_ROWS)

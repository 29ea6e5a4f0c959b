"""LFM2's gated short convolution as a part of the compiled step (the mixer of its recurrent layers):
in_proj, c * conv(b * x) over the sequence's state, out_proj; the per-op reference is
models/parts/shortconv.py, the convolution kernels/cpu/recurrent.py's `shortconv`, the same function both
run. A unit of its own (step.call_mixer), compiled only for models with these layers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .. import int8, recurrent
from . import gather
from .rows import quantize

# the matrices of a layer, by name -> the input each reads
MATS = {"conv_in": "conv_in", "conv_out": "conv_out"}


class ConvPart(NamedTuple):
    """A model's short-convolution layers (none: every array's layers marked 0, its taps empty)."""

    kind: np.ndarray  # (n_layer,) int64: 1 where the layer's mixer is a short convolution
    conv_in: np.ndarray  # (n_layer,) int64: where each layer's matrix is in the step's typed list (-1: none)
    conv_out: np.ndarray
    need_in: np.ndarray  # (n_layer,) int64: the quantizations of the input in_proj reads (rows.needs)
    need_out: np.ndarray  # (n_layer,) int64: those of out_proj's input
    taps: np.ndarray  # (n_layer, L, dim) float32: each layer's taps, transposed (zeros for the others)
    state: np.ndarray  # (n_layer,) int64: each layer's index in the cache's conv state (-1: none)


def build(cfg, layers, mats: list) -> ConvPart:
    """The short-convolution part of these layers; their matrices are appended to mats."""
    n = cfg.n_layer
    at, need = gather(layers, MATS, mats)
    convs = tuple(getattr(cfg, "conv_layers", ()))
    kind = np.array([int(i in convs) for i in range(n)], np.int64)
    taps = np.zeros((n, cfg.conv_l_cache, cfg.dim) if convs else (n, 0, 0), np.float32)
    for i in convs:
        taps[i] = layers[i].conv_w
    state = np.full(n, -1, np.int64)
    state[list(convs)] = np.arange(len(convs))
    return ConvPart(kind, at["conv_in"], at["conv_out"], need["conv_in"], need["conv_out"], taps, state)


@njit(nogil=True, cache=True)
def forward(h, out, mats, p, layer, conv, ssm_conv, ssm, token_seq, positions, slots, snap, luts, threads, table):
    # the short convolution of layer `layer` (p: ConvPart) on h (T, dim) -> out (T, dim), every row in order
    # through its sequence's state (conv: the cache's, (n_conv_layers, n_slots, L - 1, dim)); ssm_conv and
    # ssm, the other mixers' state, are not read
    T, dim = h.shape
    a8, a8k = quantize(h, p.need_in[layer])
    w = mats[p.conv_in[layer]]
    bcx = np.empty((T, 3 * dim), np.float32)
    int8.matmuls(w, w, w, np.int64(1), a8, a8k, luts, bcx, bcx, bcx, threads, table)
    y = np.empty((T, dim), np.float32)
    recurrent.shortconv(bcx, p.taps[layer], conv[p.state[layer]], token_seq, positions, slots, snap, y)
    o8, o8k = quantize(y, p.need_out[layer])
    wo = mats[p.conv_out[layer]]
    int8.matmuls(wo, wo, wo, np.int64(1), o8, o8k, luts, out, out, out, threads, table)

"""Gemma 4's end of a layer as a part of the compiled step: the layer's per-layer input added to its output,
x += norm(proj(gelu(gate x) * inp)), then the output times the layer's scale. The inputs themselves (every
layer's slice, from the token ids and the embeddings) are made before the step by the per-op code,
models/per_layer.py, which is also this part's per-op reference."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .. import int8, ops
from . import gather, stack
from .rows import add, norm, quantize

# the matrices of a layer, by name -> the input each reads
MATS = {"ple_gate": "ple_in", "ple_proj": "ple_out"}


class PerLayerPart(NamedTuple):
    """A model's per-layer inputs and output scales (none: every layer's matrices -1 and scale 0)."""

    on: int  # 1: per-layer inputs
    ple_gate: np.ndarray  # (n_layer,) int64: where each layer's matrix is in the step's typed list (-1: none)
    ple_proj: np.ndarray
    need_ple_in: np.ndarray  # (n_layer,) int64: the quantizations of x the gate reads (rows.needs)
    need_ple_out: np.ndarray  # those of the gated input the projection reads
    norm: np.ndarray  # (n_layer, dim) float32: the projection's norm
    eps: np.float32
    scale: np.ndarray  # (n_layer,) float32: the layer's output times it (0: none)


def build(cfg, layers, mats: list) -> PerLayerPart:
    at, need = gather(layers, MATS, mats)
    scale = np.array([float(lw.out_scale[0]) if getattr(lw, "out_scale", None) is not None else 0.0 for lw in layers],
                     np.float32)
    return PerLayerPart(int(getattr(cfg, "per_layer_dim", 0) > 0), at["ple_gate"], at["ple_proj"], need["ple_in"],
                        need["ple_out"], stack(layers, "ple_norm", cfg.dim), np.float32(cfg.norm_eps), scale)


@njit(nogil=True, cache=True)
def project(x, inp, mats, p, layer, luts, threads, table, y):
    # layer `layer`'s per-layer input inp (T, E) through x (T, dim): y = norm(proj(gelu(gate x) * inp)) (T, dim)
    T = x.shape[0]
    E = inp.shape[1]
    g = np.empty((T, E), np.float32)
    wg, wp = mats[p.ple_gate[layer]], mats[p.ple_proj[layer]]
    a8, a8k = quantize(x, p.need_ple_in[layer])
    int8.matmuls(wg, wg, wg, np.int64(1), a8, a8k, luts, g, g, g, threads, table)
    ops.gated_act(g, inp, g, True)
    b8, b8k = quantize(g, p.need_ple_out[layer])
    int8.matmuls(wp, wp, wp, np.int64(1), b8, b8k, luts, y, y, y, threads, table)
    norm(y, p.norm[layer], p.eps, y)


@njit(nogil=True, cache=True)
def forward(x, inp, mats, p, layer, luts, threads, table):
    # the end of layer `layer` on its output x (T, dim) in place: its per-layer input inp (T, E) where p.on,
    # then its scale where it has one
    if p.on:
        y = np.empty(x.shape, np.float32)
        project(x, inp, mats, p, layer, luts, threads, table, y)
        add(x, y)
    if p.scale[layer] != 0:
        x *= p.scale[layer]

"""Mamba2's selective state-space mixer as a part of the compiled step (Mamba2, Nemotron-H, Falcon-H1 beside
its attention): the input projection, the causal convolution, the scan over the sequence's state, the gated
group norm, the output projection; the per-op reference is models/parts/mamba2.py, whose kernels
(kernels/cpu/recurrent.py: ssm_conv, ssm_scan, gated_group_norm) this runs as they are. A unit of its own
(step.call_mixer), compiled only for models with these layers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .. import int8, ops, recurrent
from . import gather, stack
from .rows import quantize

# the matrices of a layer, by name -> the input each reads
MATS = {"ssm_in": "in", "ssm_out": "out"}


class Mamba2Part(NamedTuple):
    """A model's Mamba2 layers (none: every layer marked 0, the per-layer arrays empty)."""

    kind: np.ndarray  # (n_layer,) int64: 1 where the mixer is Mamba2, 2 where it runs beside attention (Falcon-H1)
    groups: int  # G, the groups of B and C (and of the norm)
    inner: int  # d_inner, H heads of P
    conv_dim: int  # the convolution's channels: x, B and C
    eps: float  # of the group norm (float64, as the per-op path passes it)
    ssm_in: np.ndarray  # (n_layer,) int64: where each layer's matrix is in the step's typed list (-1: none)
    ssm_out: np.ndarray
    need_in: np.ndarray  # (n_layer,) int64: the quantizations of the input in_proj reads (rows.needs)
    need_out: np.ndarray  # (n_layer,) int64: those of out_proj's input
    taps: np.ndarray  # (n_layer, d_conv, conv_dim) float32: each layer's convolution taps, transposed
    conv_b: np.ndarray  # (n_layer, conv_dim) float32
    dt_b: np.ndarray  # (n_layer, H) float32
    a: np.ndarray  # (n_layer, H) float32
    d: np.ndarray  # (n_layer, H) float32
    has_norm: np.ndarray  # (n_layer,) int64: 1 where the layer has the group norm (else silu(z) y alone)
    norm: np.ndarray  # (n_layer, d_inner) float32
    state: np.ndarray  # (n_layer,) int64: each layer's index in the cache's ssm_conv and ssm (-1: none)


def build(cfg, layers, mats: list) -> Mamba2Part:
    """The Mamba2 part of these layers; their matrices are appended to mats."""
    n = cfg.n_layer
    at, need = gather(layers, MATS, mats)
    mixers = [cfg.mixer(i) for i in range(n)] if hasattr(cfg, "mixer") else ["attention"] * n
    kind = np.array([{"mamba2": 1, "attn_mamba2": 2}.get(m, 0) for m in mixers], np.int64)
    mine = [i for i in range(n) if kind[i]]
    state = np.full(n, -1, np.int64)
    ssm = list(getattr(cfg, "ssm_layers", ()))
    for i in mine:
        state[i] = ssm.index(i)
    h, e, conv = (cfg.ssm_heads, cfg.ssm_inner, cfg.ssm_conv_dim) if mine else (0, 0, 0)
    taps = np.zeros((n, cfg.ssm_conv if mine else 0, conv), np.float32)
    for i in mine:
        taps[i] = layers[i].ssm_conv1d
    own = [lw if i in mine else None for i, lw in enumerate(layers)]  # (delta-net layers have vectors of these names)
    has_norm = np.array([int(getattr(lw, "ssm_norm", None) is not None) for lw in own], np.int64)
    return Mamba2Part(kind, int(cfg.ssm_groups) if mine else 1, int(e), int(conv), float(cfg.norm_eps), at["ssm_in"],
                      at["ssm_out"], need["in"], need["out"], taps, stack(own, "ssm_conv1d_b", conv, 0.0),
                      stack(own, "ssm_dt_b", h, 0.0), stack(own, "ssm_a", h, 0.0), stack(own, "ssm_d", h, 0.0),
                      has_norm, stack(own, "ssm_norm", e), state)


@njit(nogil=True, cache=True)
def forward(h, out, mats, p, layer, conv, ssm_conv, ssm, token_seq, positions, slots, snap, luts, threads, table):
    # the Mamba2 mixer of layer `layer` (p: Mamba2Part) on h (T, dim) -> out (T, dim), every row in order
    # through its sequence's state (ssm_conv, ssm: the cache's); conv, the short convolutions', is not read
    T = h.shape[0]
    e, c = p.inner, p.conv_dim
    a8, a8k = quantize(h, p.need_in[layer])
    w = mats[p.ssm_in[layer]]
    zxbcdt = np.empty((T, e + c + p.a.shape[1]), np.float32)  # z, x B C, dt
    int8.matmuls(w, w, w, np.int64(1), a8, a8k, luts, zxbcdt, zxbcdt, zxbcdt, threads, table)
    i = p.state[layer]
    xbc = np.empty((T, c), np.float32)
    recurrent.ssm_conv(zxbcdt[:, e:e + c], p.taps[layer], p.conv_b[layer], ssm_conv[i], token_seq, positions, slots,
                       snap, xbc)
    y = np.empty((T, e), np.float32)
    recurrent.ssm_scan(xbc, zxbcdt[:, e + c:], p.dt_b[layer], p.a[layer], p.d[layer], p.groups, ssm[i], token_seq,
                       positions, slots, snap, y)
    if p.has_norm[layer]:
        recurrent.gated_group_norm(y, zxbcdt[:, :e], p.norm[layer], p.groups, p.eps, y)
    else:  # Falcon-H1 files without the norm: the gate alone
        ops.gated_act(np.ascontiguousarray(zxbcdt[:, :e]), y, y, False)  # ops.silu_mul
    o8, o8k = quantize(y, p.need_out[layer])
    wo = mats[p.ssm_out[layer]]
    int8.matmuls(wo, wo, wo, np.int64(1), o8, o8k, luts, out, out, out, threads, table)

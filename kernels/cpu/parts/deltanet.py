"""Qwen3.5's gated delta net as a part of the compiled step (the mixer of its linear-attention layers): the
projections, the causal convolution, the gated delta rule over the sequence's state, the gated per-head norm,
the output projection; the per-op reference is models/parts/deltanet.py, whose kernels (kernels/cpu/recurrent.py:
ssm_conv, delta_rule, norm_gate) this runs as they are. A unit of its own (step.call_mixer), compiled only
for models with these layers. Qwen3-Next's newer layout (beta and alpha in one ssm_ba) too; its older files'
single ssm_in (q, k, v and z grouped by key head) take the per-op path."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .. import int8, recurrent
from . import gather, stack
from .rows import quantize

# the matrices of a layer, by name -> the input each reads
MATS = {"ssm_qkv": "in", "ssm_z": "in", "ssm_beta": "in", "ssm_alpha": "in", "ssm_ba": "in", "ssm_out": "out"}


class DeltaPart(NamedTuple):
    """A model's delta-net layers (none: every layer marked 0, the per-layer arrays empty)."""

    kind: np.ndarray  # (n_layer,) int64: 1 where the layer's mixer is a gated delta net
    n_kheads: int  # key heads Hk (ssm.group_count)
    heads: int  # value heads H (ssm.time_step_rank)
    conv_dim: int  # the convolution's channels: q, k (Hk Dk each) and v (H Dv)
    inner: int  # H Dv
    eps: float  # of the q/k L2 norms and the output norm (float64, as the per-op path passes it)
    ssm_qkv: np.ndarray  # (n_layer,) int64: where each layer's matrix is in the step's typed list (-1: none)
    ssm_z: np.ndarray
    ssm_beta: np.ndarray
    ssm_alpha: np.ndarray
    ssm_out: np.ndarray
    need_in: np.ndarray  # (n_layer,) int64: the quantizations of the input the projections read (rows.needs)
    need_out: np.ndarray  # (n_layer,) int64: those of the output projection's input
    taps: np.ndarray  # (n_layer, d_conv, conv_dim) float32: each layer's convolution taps, transposed
    dt_b: np.ndarray  # (n_layer, H) float32
    a: np.ndarray  # (n_layer, H) float32
    norm: np.ndarray  # (n_layer, Dv) float32: the output norm's weights
    state: np.ndarray  # (n_layer,) int64: each layer's index in the cache's ssm_conv and ssm (-1: none)
    next: int  # 1: Qwen3-Next's layout: beta and alpha in one ssm_ba grouped by key head, value heads interleaved
    ssm_ba: np.ndarray  # (n_layer,) int64 (next)


def build(cfg, layers, mats: list) -> DeltaPart:
    """The delta-net part of these layers; their matrices are appended to mats."""
    n = cfg.n_layer
    at, need = gather(layers, MATS, mats)
    mine = [i for i in range(n) if cfg.mixer(i) == "deltanet"] if hasattr(cfg, "mixer") else []
    kind = np.zeros(n, np.int64)
    kind[mine] = 1
    state = np.full(n, -1, np.int64)
    ssm = list(getattr(cfg, "ssm_layers", ()))
    for i in mine:
        state[i] = ssm.index(i)
    h, conv = (cfg.ssm_heads, cfg.ssm_conv_dim) if mine else (0, 0)
    taps = np.zeros((n, cfg.ssm_conv if mine else 0, conv), np.float32)
    for i in mine:
        taps[i] = layers[i].ssm_conv1d
    own = [lw if i in mine else None for i, lw in enumerate(layers)]  # (Mamba2 layers have vectors of these names)
    return DeltaPart(kind, int(cfg.ssm_groups) if mine else 1, int(h), int(conv), int(cfg.ssm_inner) if mine else 0,
                     float(cfg.norm_eps), at["ssm_qkv"], at["ssm_z"], at["ssm_beta"], at["ssm_alpha"], at["ssm_out"],
                     need["in"], need["out"], taps, stack(own, "ssm_dt_b", h, 0.0), stack(own, "ssm_a", h, 0.0),
                     stack(own, "ssm_norm", cfg.ssm_state if mine else 0), state,
                     int(any(getattr(lw, "ssm_ba", None) is not None for lw in own if lw is not None)), at["ssm_ba"])


@njit(nogil=True, cache=True)
def forward(h, out, mats, p, layer, conv, ssm_conv, ssm, token_seq, positions, slots, snap, luts, threads, table):
    # the gated delta net of layer `layer` (p: DeltaPart) on h (T, dim) -> out (T, dim), every row in order
    # through its sequence's state (ssm_conv, ssm: the cache's); conv, the short convolutions', is not read
    T = h.shape[0]
    a8, a8k = quantize(h, p.need_in[layer])
    qkv = np.empty((T, p.conv_dim), np.float32)
    z = np.empty((T, p.inner), np.float32)
    beta = np.empty((T, p.heads), np.float32)
    alpha = np.empty((T, p.heads), np.float32)
    if p.next:  # Qwen3-Next: beta and alpha of each key head's value heads side by side in one projection
        ba = np.empty((T, 2 * p.heads), np.float32)
        int8.matmuls(mats[p.ssm_qkv[layer]], mats[p.ssm_z[layer]], mats[p.ssm_ba[layer]], np.int64(3), a8, a8k, luts,
                     qkv, z, ba, threads, table)
        r = p.heads // p.n_kheads
        for t in range(T):
            for g in range(p.n_kheads):
                for j in range(r):
                    beta[t, g * r + j] = ba[t, 2 * g * r + j]
                    alpha[t, g * r + j] = ba[t, (2 * g + 1) * r + j]
    else:
        wa = mats[p.ssm_alpha[layer]]
        int8.matmuls(mats[p.ssm_qkv[layer]], mats[p.ssm_z[layer]], mats[p.ssm_beta[layer]], np.int64(3), a8, a8k,
                     luts, qkv, z, beta, threads, table)
        int8.matmuls(wa, wa, wa, np.int64(1), a8, a8k, luts, alpha, alpha, alpha, threads, table)
    i = p.state[layer]
    x = np.empty((T, p.conv_dim), np.float32)
    recurrent.ssm_conv(qkv, p.taps[layer], np.zeros(p.conv_dim, np.float32), ssm_conv[i], token_seq, positions, slots,
                       snap, x)
    y = np.empty((T, p.inner), np.float32)
    recurrent.delta_rule(x, alpha, beta, p.dt_b[layer], p.a[layer], p.n_kheads, p.next != 0, p.eps, ssm[i], token_seq,
                         positions, slots, snap, y)
    recurrent.norm_gate(y, z, p.norm[layer], p.heads, p.eps, y)
    o8, o8k = quantize(y, p.need_out[layer])
    wo = mats[p.ssm_out[layer]]
    int8.matmuls(wo, wo, wo, np.int64(1), o8, o8k, luts, out, out, out, threads, table)

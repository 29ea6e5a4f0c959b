"""Mamba2's selective state-space mixer as a part of a decoder layer, per op (llama.cpp's
build_mamba2_layer, src/models/mamba-base.cpp):

    z, xBC, dt = in_proj(h)                      (d_inner, d_inner + 2 G N, H columns)
    xBC = silu(conv(xBC) + conv_bias)            (a causal depthwise convolution of d_conv taps)
    y = scan(x, dt, A, B, C) + D x               (per head: s = s exp(softplus(dt + dt_bias) A) + dt' x B,
                                                  y = s . C)
    y = rmsnorm_per_group(silu(z) y) * norm      (G groups of d_inner / G channels; Falcon-H1 files may have
                                                  no norm: silu(z) y)
    out = out_proj(y)

The convolution's last d_conv - 1 inputs and the scan's (H, P, N) matrix (in the kernel's blocks of
channels) are the sequence's recurrent state (cache.ssm_conv, cache.ssm), in its state slot."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The Mamba2 layer's tensors (parts.LayerTensor). "flat": a float32 vector of a 2-D tensor's values
    (A and D: (H, 1); the norm: (G, d_inner / G))."""
    d, e, h, conv = cfg.dim, cfg.ssm_inner, cfg.ssm_heads, cfg.ssm_conv_dim
    return [(("ssm_in",), TN.SSM_IN, "weight", (e + conv + h, d), None),
            (("ssm_conv1d",), TN.SSM_CONV1D, "weight", (conv, cfg.ssm_conv), "float"),
            (("ssm_conv1d_b",), TN.SSM_CONV1D, "bias", (conv,), None),
            (("ssm_dt_b",), TN.SSM_DT, "bias", (h,), None),
            (("ssm_a",), TN.SSM_A, "", (h, 1), "flat"),
            (("ssm_d",), TN.SSM_D, "", (h, 1), "flat"),
            *([(("ssm_norm",), TN.SSM_NORM, "weight", (cfg.ssm_groups, e // cfg.ssm_groups), "flat")]
              if has(TN.SSM_NORM) or not spec.ssm_norm_optional else []),
            (("ssm_out",), TN.SSM_OUT, "weight", (d, e), None)]


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where):
    """The Mamba2 mixer of layer at.layer for the batch: h (T, dim) -> (T, dim)."""
    batch, cache = at.batch, at.cache
    i = cache.state_index[at.layer]
    t, e, conv = h.shape[0], cfg.ssm_inner, cfg.ssm_conv_dim
    zxbcdt = kb.matmul(lw.ssm_in, kb.quantize_input(h))
    xbc = kb.empty((t, conv))
    kb.ssm_conv(zxbcdt[:, e:e + conv], lw.ssm_conv1d, lw.ssm_conv1d_b, cache.ssm_conv[i], batch.token_seq,
                batch.positions, batch.state_slots, batch.state_snap, xbc)
    y = kb.empty((t, e))
    kb.ssm_scan(xbc, zxbcdt[:, e + conv:], lw.ssm_dt_b, lw.ssm_a, lw.ssm_d, cfg.ssm_groups, cache.ssm[i],
                batch.token_seq, batch.positions, batch.state_slots, batch.state_snap, y)
    if lw.ssm_norm is not None:
        kb.gated_group_norm(y, zxbcdt[:, :e], lw.ssm_norm, cfg.ssm_groups, cfg.norm_eps, y)
    else:  # Falcon-H1 files without the norm: the gate alone
        kb.silu_mul(np.ascontiguousarray(zxbcdt[:, :e]), y, y)
    return kb.matmul(lw.ssm_out, y)

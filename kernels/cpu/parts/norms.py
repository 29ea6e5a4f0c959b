"""The layer's RMS norms as a part of the compiled step: before the mixer and the FFN (pre_norms) and on
their outputs before each residual add (post_norms), their weights stacked over the layers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import stack


class NormsPart(NamedTuple):
    """A model's layer norms; a norm its layers lack is all ones, never read."""

    eps: np.float32
    pre: int  # 1: norms before the mixer and the FFN (else their input is x itself)
    post: int  # 1: norms on the mixer's and the FFN's outputs
    attn: np.ndarray  # (n_layer, dim) float32, before the mixer
    ffn: np.ndarray  # (n_layer, dim), before the FFN
    post_attn: np.ndarray  # (n_layer, dim), on the mixer's output
    post_ffn: np.ndarray  # (n_layer, dim), on the FFN's output
    res_scale: np.float32  # each block's output times this before its residual add (Granite); 0: none


def build(cfg, layers, pre_norms: bool, post_norms: bool) -> NormsPart:
    d = cfg.dim
    return NormsPart(np.float32(cfg.norm_eps), int(pre_norms), int(post_norms), stack(layers, "attn_norm", d),
                     stack(layers, "ffn_norm", d), stack(layers, "post_attn_norm", d), stack(layers, "post_ffn_norm", d),
                     np.float32(getattr(cfg, "residual_scale", 0.0)))

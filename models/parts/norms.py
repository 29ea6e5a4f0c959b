"""A layer's RMS norms: before each residual block's part (pre_norms) and on its output (post_norms). The
per-op code is parts.residual; the compiled step's is kernels/cpu/parts/norms.py."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec

# each block's (pre-norm, post-norm): (field, gguf tensor)
BLOCKS = {"mixer": (("attn_norm", TN.ATTN_NORM), ("post_attn_norm", TN.ATTN_POST_NORM)),
          "ffn": (("ffn_norm", TN.FFN_NORM), ("post_ffn_norm", TN.FFN_POST_NORM))}


def pre(spec: ArchSpec, cfg: ModelConfig, block: str) -> list:
    """The norm before `block`'s part ("mixer" or "ffn"), where the architecture has one."""
    (field, tensor), _ = BLOCKS[block]
    part = "weight"
    if block == "ffn":  # qwen35 names it post_attention_norm; Falcon-H1's has no suffix
        tensor, part = spec.ffn_norm, spec.ffn_norm_part
    return [((field,), tensor, part, (cfg.dim,), None)] if spec.pre_norms else []


def post(spec: ArchSpec, cfg: ModelConfig, block: str) -> list:
    """The norm on `block`'s output, where the architecture has one."""
    _, (field, tensor) = BLOCKS[block]
    return [((field,), tensor, "weight", (cfg.dim,), None)] if spec.post_norms else []


@cache
def ones(kb, n: int):
    """A weightless RMS norm's weights (n ones), uploaded once per backend and size."""
    return kb.upload(np.ones(n, np.float32))

"""Attention and a Mamba2 mixer side by side as the mixer of one layer (Falcon-H1), per op: both read the
same normed input, and their outputs are summed, attention's first (llama.cpp's falcon-h1.cpp):

    out = attention(h) + mamba2(h)

The layer keeps both kinds of memory: paged KV and a recurrent state per sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import attention, mamba2

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The attention's tensors, then the Mamba2 mixer's (parts.LayerTensor)."""
    return attention.tensors(spec, cfg, has) + mamba2.tensors(spec, cfg, has)


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where):
    """attention(h) + mamba2(h) for layer at.layer: h (T, dim) -> (T, dim)."""
    out = attention.forward(kb, cfg, spec, lw, h, at)
    kb.add_(out, mamba2.forward(kb, cfg, spec, lw, h, at))
    return out

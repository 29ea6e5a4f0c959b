"""A layer that is a feed-forward block alone (Nemotron-H's "-" layers), as the mixer of its layer, per op:

    out = down(relu(up h)^2)

no gate, no memory (llama.cpp's build_ffn with LLM_FFN_RELU_SQR, src/models/nemotron-h.cpp)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf.constants import MODEL_TENSOR as TN

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The up and down projections (parts.LayerTensor)."""
    d, f = cfg.dim, cfg.ffn_dim
    return [(("w_up",), TN.FFN_UP, "weight", (f, d), None), (("w_down",), TN.FFN_DOWN, "weight", (d, f), None)]


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where = None):
    """down(relu(up h)^2) of h (T, dim) -> (T, dim)."""
    u = kb.matmul(lw.w_up, kb.quantize_input(h))
    kb.relu_sqr_(u)
    return kb.matmul(lw.w_down, u)

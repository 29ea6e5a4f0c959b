"""The gated FFN as a part of a decoder layer, per op: down(act(gate h) * up h), act SiLU (SwiGLU) or GELU
(tanh; GeGLU); the gate and up projections in one fused tensor where the architecture has it (phi3). The
compiled step's code of it is kernels/cpu/parts/ffn.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf.constants import MODEL_TENSOR as TN

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The FFN's layer tensors (parts.LayerTensor)."""
    d, f = cfg.dim, cfg.ffn_dim
    if spec.fused_gate_up:
        return [(("w_gate", "w_up"), TN.FFN_UP, "weight", (2 * f, d), (f, f)),
                (("w_down",), TN.FFN_DOWN, "weight", (d, f), None)]
    return [(("w_gate",), TN.FFN_GATE, "weight", (f, d), None), (("w_up",), TN.FFN_UP, "weight", (f, d), None),
            (("w_down",), TN.FFN_DOWN, "weight", (d, f), None)]


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where = None):
    """The gated FFN of h (T, dim) with the layer's matrices -> (T, dim)."""
    return gated(kb, spec, h, lw.w_gate, lw.w_up, lw.w_down)


def gated(kb, spec: ArchSpec, h, w_gate, w_up, w_down):
    """down(act(gate h) * up h) of h (T, dim) with these matrices (a dense FFN's, an expert's)."""
    act = kb.gelu_tanh_mul if spec.activation == "gelu_tanh" else kb.silu_mul
    g, u = kb.matmul_many([w_gate, w_up], h)  # one quantized activation, one parallel region
    act(g, u, g)
    return kb.matmul(w_down, g)

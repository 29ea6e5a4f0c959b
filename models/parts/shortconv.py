"""LFM2's gated short convolution as a part of a decoder layer (the mixer of its recurrent layers), per op:

    b, c, x = in_proj(h)                      (three (T, dim) thirds of one projection)
    y = c * conv(b * x)                       (a causal depthwise convolution of l_cache taps per channel)
    out = out_proj(y)

The convolution reads each sequence's last l_cache - 1 values of b * x from its recurrent state (cache.conv,
in the sequence's state slot), zeros where the sequence starts, and leaves the newest there: no KV. As
llama.cpp's lfm2.cpp (build_shortconv_block, ggml_ssm_conv)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf.constants import MODEL_TENSOR as TN

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The short convolution's layer tensors (parts.LayerTensor): the taps stay float32, transposed."""
    d = cfg.dim
    return [(("conv_in",), TN.SHORTCONV_INPROJ, "weight", (3 * d, d), None),
            (("conv_w",), TN.SHORTCONV_CONV, "weight", (d, cfg.conv_l_cache), "float"),
            (("conv_out",), TN.SHORTCONV_OUTPROJ, "weight", (d, d), None)]


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where):
    """The short convolution of layer at.layer for the batch: h (T, dim) -> (T, dim)."""
    batch, cache = at.batch, at.cache
    bcx = kb.matmul(lw.conv_in, kb.quantize_input(h))
    y = kb.empty((h.shape[0], cfg.dim))
    kb.shortconv(bcx, lw.conv_w, cache.conv[cache.state_index[at.layer]], batch.token_seq, batch.positions,
                 batch.state_slots, batch.state_snap, y)
    return kb.matmul(lw.conv_out, y)

"""The parts of a decoder layer, one module per kind: norms.py, attention.py (the mixer), shortconv.py, mamba2.py and deltanet.py (recurrent mixers), mlp.py (a layer that
is a feed-forward block alone), parallel.py (attention and Mamba2 side by side), ffn.py, moe.py and gemma4_moe.py (the feed-forward: dense, or a mixture of experts).

A layer is two residual blocks, each a sequence of parts: a norm (pre_norms), the part, a norm on its
output (post_norms), the residual add; the first block's part is the mixer, the second's the
feed-forward. Each part's module declares
- `tensors(spec, cfg, has)`: the tensors it reads from a GGUF layer (decoder.layer_tensors lists them all);
- `forward(kb, cfg, spec, lw, h, at)`: its per-op reference, one backend call per op, so that it runs on
  any backend (cpu or cuda); `at` says where it runs (`Where`).
The compiled step's code of each part is kernels/cpu/parts/, held to these bit for bit by the tests. A new
kind of part (a recurrent mixer, a convolution) is a module here and one there; `mixer` and `feed_forward`
choose a layer's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from . import attention, deltanet, ffn, gemma4_moe, mamba2, mlp, moe, parallel, shortconv

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec


# A layer tensor: (fields, gguf tensor, "weight" or "bias", numpy shape, rows of each field). One field
# and rows None: the tensor as it is, a vector (size,) or a matrix (rows, cols). Several fields: a fused
# tensor whose rows are cut between them. "experts": a 3-D tensor (n_expert, rows, cols), one matrix each.
# "float": a matrix kept as float32, transposed (the router).
LayerTensor = tuple


class Where(NamedTuple):
    """Where a part runs: the layer's index, the batch and its KV cache (with the recurrent state), the
    layer's RoPE frequencies."""

    layer: int
    batch: Any  # engine.model_runner.Batch, prepared by the backend
    cache: Any  # engine.kv_cache.KVCache
    inv_freq: Any  # (rope_dim / 2,) float64, on the backend
    x: Any = None  # the residual stream before the block's norm (Gemma 4's experts read it)


MIXERS = {"attention": attention, "shortconv": shortconv, "mamba2": mamba2, "deltanet": deltanet, "mlp": mlp,
          "attn_mamba2": parallel}


def mixer(cfg: ModelConfig, layer: int):
    """The module of layer `layer`'s mixer: attention, or a hybrid model's recurrent one (cfg.mixers)."""
    return MIXERS[cfg.mixer(layer)]


def feed_forward(spec: ArchSpec, cfg: ModelConfig, layer: int):
    """The module of layer `layer`'s feed-forward part (an MoE model's first cfg.dense_lead layers: dense)."""
    if spec.gemma4_moe:
        return gemma4_moe
    return moe if spec.moe and layer >= cfg.dense_lead else ffn


def residual(kb, cfg: ModelConfig, spec: ArchSpec, part, lw, x, h, norm, post_norm, at: Where) -> None:
    """One residual block of a layer, per op: x += post_norm(part(norm(x))) (each norm where the
    architecture has it; times cfg.residual_scale where the model has one); h: room for the normed x
    (T, dim)."""
    if spec.pre_norms:
        kb.rmsnorm(x, norm, cfg.norm_eps, h)
    y = part.forward(kb, cfg, spec, lw, h if spec.pre_norms else x, at)
    if spec.post_norms:
        kb.rmsnorm(y, post_norm, cfg.norm_eps, y)
    if cfg.residual_scale:  # Granite
        kb.scale_(y, cfg.residual_scale)
    kb.add_(x, y)

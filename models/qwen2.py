"""The `qwen2` architecture (Qwen2, Qwen2.5): the llama layer with biases on q, k and v, NeoX RoPE
(a large base, 1,000,000 in Qwen2.5), GQA, SwiGLU, a separate or tied output matrix."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from . import llama
from .common import WeightLoader

ARCH = "qwen2"


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    return replace(llama.config_from_gguf(gf), rope_neox=True)


@dataclass
class LayerWeights(llama.LayerWeights):
    bq: np.ndarray = None  # (n_head * head_dim,)
    bk: np.ndarray = None  # (n_kv_head * head_dim,)
    bv: np.ndarray = None  # (n_kv_head * v_head_dim,)


def load_layer(ld: WeightLoader, cfg: ModelConfig, i: int) -> LayerWeights:
    base = llama.load_layer(ld, cfg, i)
    p = f"blk.{i}."
    return LayerWeights(
        **vars(base),
        bq=ld.vector(p + "attn_q.bias", cfg.n_head * cfg.head_dim),
        bk=ld.vector(p + "attn_k.bias", cfg.n_kv_head * cfg.head_dim),
        bv=ld.vector(p + "attn_v.bias", cfg.n_kv_head * cfg.v_head_dim),
    )


class Model(llama.Model):
    load_layer = staticmethod(load_layer)
    stack_flags = {"qkv_bias": True}

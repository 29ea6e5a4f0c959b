"""The `gemma3` architecture: scaled embeddings, q/k norms, GELU-gated FFN, post-norms,
sliding-window layers (every sixth global) with their own rope base."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from . import llama
from .common import Batch, KVCache, WeightLoader, attention, meta, rope_inv_freq

ARCH = "gemma3"
SWA_PATTERN = 6  # layers 5, 11, 17, ... are global
ROPE_BASE_LOCAL = 10000.0  # the sliding-window layers' rope base


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    base = llama.config_from_gguf(gf)
    a = gf.architecture
    from dataclasses import replace

    return replace(
        base,
        rope_neox=True,
        rope_base_local=ROPE_BASE_LOCAL,
        sliding_window=int(meta(gf, a, "attention.sliding_window", 0) or 0),
        swa_pattern=SWA_PATTERN,
        attn_scale=1.0 / np.sqrt(base.head_dim),
        attn_softcap=float(meta(gf, a, "attn_logit_softcapping", 0.0) or 0.0),
        final_softcap=float(meta(gf, a, "final_logit_softcapping", 0.0) or 0.0),
        embed_scale=float(np.sqrt(base.dim)),
    )


@dataclass
class LayerWeights(llama.LayerWeights):
    q_norm: np.ndarray = None  # (head_dim,)
    k_norm: np.ndarray = None  # (head_dim,)
    post_attn_norm: np.ndarray = None  # (dim,)
    post_ffn_norm: np.ndarray = None  # (dim,)


def load_layer(ld: WeightLoader, cfg: ModelConfig, i: int) -> LayerWeights:
    base = llama.load_layer(ld, cfg, i)
    p = f"blk.{i}."
    return LayerWeights(
        **vars(base),
        q_norm=ld.vector(p + "attn_q_norm.weight", cfg.head_dim),
        k_norm=ld.vector(p + "attn_k_norm.weight", cfg.head_dim),
        post_attn_norm=ld.vector(p + "post_attention_norm.weight", cfg.dim),
        post_ffn_norm=ld.vector(p + "post_ffw_norm.weight", cfg.dim),
    )


class Model(llama.Model):
    qk_norm = True
    load_layer = staticmethod(load_layer)
    stack_flags = {"qk_norm": True, "post_norms": True, "gelu": True}

    def __init__(self, gf: GGUFFile, kb, cfg: ModelConfig | None = None):
        cfg = cfg or config_from_gguf(gf)
        self.inv_freq_local = kb.upload(rope_inv_freq(cfg.rope_dim, cfg.rope_base_local))
        super().__init__(gf, kb, cfg)

    def layer_inv_freq(self, layer: int):
        return self.inv_freq_local if self.cfg.is_sliding(layer) else self.inv_freq

    def embed(self, token_ids):
        x = self.kb.embed(self.tok_embd, token_ids)
        self.kb.scale_(x, self.cfg.embed_scale)
        return x

    def forward_per_op(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        kb, cfg = self.kb, self.cfg
        batch = kb.prepare_batch(batch)
        x = self.embed(batch.token_ids)
        h = kb.empty(x.shape)
        ff = kb.empty((x.shape[0], cfg.ffn_dim))
        for i, lw in enumerate(self.layers):
            inv_freq = self.layer_inv_freq(i)
            kb.rmsnorm(x, lw.attn_norm, cfg.norm_eps, h)
            a = attention(kb, cfg, i, lw, h, batch, cache, inv_freq, True)
            kb.rmsnorm(a, lw.post_attn_norm, cfg.norm_eps, a)
            kb.add_(x, a)
            kb.rmsnorm(x, lw.ffn_norm, cfg.norm_eps, h)
            hq = kb.quantize_input(h)  # one quantized activation for gate and up
            kb.gelu_tanh_mul(kb.matmul(lw.w_gate, hq), kb.matmul(lw.w_up, hq), ff)
            f = kb.matmul(lw.w_down, ff)
            kb.rmsnorm(f, lw.post_ffn_norm, cfg.norm_eps, f)
            kb.add_(x, f)
        rows = kb.take_rows(x, batch.logits_idx)
        return self.normed(rows) if hidden else self.logits(rows)

"""The `llama` architecture (Llama 2/3, SmolLM2, ...): RMSNorm, RoPE, GQA, SwiGLU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from .common import Batch, KVCache, ModelLoadError, WeightLoader, attention, check_vocab, meta, rope_inv_freq

ARCH = "llama"


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    a = gf.architecture
    dim = meta(gf, a, "embedding_length", required=True)
    n_head = meta(gf, a, "attention.head_count", required=True)
    head_dim = meta(gf, a, "attention.key_length", dim // n_head)
    emb = gf.tensors.get("token_embd.weight")
    if emb is None:
        raise ModelLoadError("missing tensor 'token_embd.weight'")
    scaling = meta(gf, a, "rope.scaling.type", "none")
    factor = meta(gf, a, "rope.scaling.factor", 1.0) or 1.0
    if scaling not in ("none", "linear", None):
        raise ModelLoadError(f"rope scaling type {scaling!r} is not supported (supported: none, linear)")
    return ModelConfig(
        arch=a,
        n_layer=meta(gf, a, "block_count", required=True),
        dim=dim,
        n_head=n_head,
        n_kv_head=meta(gf, a, "attention.head_count_kv", n_head),
        head_dim=head_dim,
        v_head_dim=meta(gf, a, "attention.value_length", head_dim),
        ffn_dim=meta(gf, a, "feed_forward_length", required=True),
        vocab_size=int(emb.shape[1]),
        context_length=meta(gf, a, "context_length", 2048),
        norm_eps=float(meta(gf, a, "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(meta(gf, a, "rope.freq_base", 10000.0)),
        rope_dim=meta(gf, a, "rope.dimension_count", head_dim),
        rope_neox=False,
        rope_freq_scale=1.0 / float(factor) if scaling == "linear" else 1.0,
    )


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # (dim,)
    wq: object  # (n_head * head_dim, dim)
    wk: object  # (n_kv_head * head_dim, dim)
    wv: object  # (n_kv_head * v_head_dim, dim)
    wo: object  # (dim, n_head * v_head_dim)
    ffn_norm: np.ndarray  # (dim,)
    w_gate: object  # (ffn, dim)
    w_up: object  # (ffn, dim)
    w_down: object  # (dim, ffn)


def load_layer(ld: WeightLoader, cfg: ModelConfig, i: int) -> LayerWeights:
    p = f"blk.{i}."
    return LayerWeights(
        attn_norm=ld.vector(p + "attn_norm.weight", cfg.dim),
        wq=ld.matrix(p + "attn_q.weight", cfg.n_head * cfg.head_dim, cfg.dim),
        wk=ld.matrix(p + "attn_k.weight", cfg.n_kv_head * cfg.head_dim, cfg.dim),
        wv=ld.matrix(p + "attn_v.weight", cfg.n_kv_head * cfg.v_head_dim, cfg.dim),
        wo=ld.matrix(p + "attn_output.weight", cfg.dim, cfg.n_head * cfg.v_head_dim),
        ffn_norm=ld.vector(p + "ffn_norm.weight", cfg.dim),
        w_gate=ld.matrix(p + "ffn_gate.weight", cfg.ffn_dim, cfg.dim),
        w_up=ld.matrix(p + "ffn_up.weight", cfg.ffn_dim, cfg.dim),
        w_down=ld.matrix(p + "ffn_down.weight", cfg.dim, cfg.ffn_dim),
    )


class Model:
    """Weights plus the forward pass; every op goes through the kernel backend `kb`."""

    qk_norm = False

    def __init__(self, gf: GGUFFile, kb, cfg: ModelConfig | None = None):
        self.cfg = cfg = cfg or config_from_gguf(gf)
        self.kb = kb
        check_vocab(gf, cfg.vocab_size)
        ld = WeightLoader(gf, kb)
        self.tok_embd = ld.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)
        self.layers = [self.load_layer(ld, cfg, i) for i in range(cfg.n_layer)]
        self.output_norm = ld.vector("output_norm.weight", cfg.dim)
        self.output = ld.matrix("output.weight", cfg.vocab_size, cfg.dim) if ld.has("output.weight") else self.tok_embd
        ld.finish()
        factors = np.array(gf.tensor("rope_freqs.weight"), np.float32) if ld.has("rope_freqs.weight") else None
        self.inv_freq = kb.upload(rope_inv_freq(cfg.rope_dim, cfg.rope_base, cfg.rope_freq_scale, factors))
        # every layer in one compiled call where the backend has one; forward_per_op is the reference
        self.stack = kb.layer_stack(cfg, self.layers, [self.layer_inv_freq(i) for i in range(cfg.n_layer)],
                                    **self.stack_flags)

    load_layer = staticmethod(load_layer)
    stack_flags = {}

    def layer_inv_freq(self, layer: int):
        return self.inv_freq

    def forward(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """Logits (L, vocab), on the host, for the tokens batch.logits_idx selects; hidden: their final
        hidden states after the output norm (L, dim) instead (what llama.cpp's embeddings are)."""
        self.kb.ready()  # kernels compiling ahead (a first run) are done
        if self.stack is None:
            return self.forward_per_op(batch, cache, hidden)
        rows = self.stack.run(self.embed(batch.token_ids), batch, cache)
        return self.normed(rows) if hidden else self.logits(rows)

    def embed(self, token_ids):
        return self.kb.embed(self.tok_embd, token_ids)

    def forward_per_op(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """The reference forward: one backend call per op (the CUDA backend's path)."""
        kb, cfg = self.kb, self.cfg
        batch = kb.prepare_batch(batch)
        x = self.embed(batch.token_ids)
        h = kb.empty(x.shape)
        ff = kb.empty((x.shape[0], cfg.ffn_dim))
        for i, lw in enumerate(self.layers):
            kb.rmsnorm(x, lw.attn_norm, cfg.norm_eps, h)
            kb.add_(x, attention(kb, cfg, i, lw, h, batch, cache, self.inv_freq, self.qk_norm))
            kb.rmsnorm(x, lw.ffn_norm, cfg.norm_eps, h)
            hq = kb.quantize_input(h)  # one quantized activation for gate and up
            kb.silu_mul(kb.matmul(lw.w_gate, hq), kb.matmul(lw.w_up, hq), ff)
            kb.add_(x, kb.matmul(lw.w_down, ff))
        rows = kb.take_rows(x, batch.logits_idx)
        return self.normed(rows) if hidden else self.logits(rows)

    def normed(self, x) -> np.ndarray:
        """Hidden states after the output norm, on the host."""
        h = self.kb.empty(x.shape)
        self.kb.rmsnorm(x, self.output_norm, np.float32(self.cfg.norm_eps), h)
        return self.kb.to_host(h)

    def logits(self, x) -> np.ndarray:
        kb, cfg = self.kb, self.cfg
        h = kb.empty(x.shape)
        kb.rmsnorm(x, self.output_norm, np.float32(cfg.norm_eps), h)  # float32 eps: the step's own rmsnorm
        out = kb.matmul(self.output, h)
        if cfg.final_softcap > 0:
            kb.softcap(out, np.float32(cfg.final_softcap))
        return kb.to_host(out)

"""The decoder-only transformer every generative architecture here is, read from an ArchSpec.

An architecture module (llama.py, gemma3.py, qwen2.py) declares its SPEC: what its layer has beyond the
plain llama layer (pre-norm, RoPE, GQA attention, a SiLU-gated FFN). This module reads the spec three
times, and nowhere else is an architecture's shape stated:
- `config_from_gguf`: the GGUF metadata into a ModelConfig;
- `load_layer`: which tensors a layer has, under gguf's own tensor names (gguf.TENSOR_NAMES);
- `Model`: `forward_per_op`, the readable reference (one backend call per op, the CUDA backend's path),
  and the compiled step (kernels/cpu/step.py), which takes the spec's switches as flags.
Adding a llama-family architecture is a spec plus any op it genuinely adds; tests hold the compiled step
to forward_per_op.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN
from gguf.constants import TENSOR_NAMES

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from .common import ModelLoadError, WeightLoader, check_vocab, meta, rope_inv_freq

if TYPE_CHECKING:  # the engine's types, only named here: models never build them
    from ..engine.kv_cache import KVCache
    from ..engine.model_runner import Batch

ACTIVATIONS = ("silu", "gelu_tanh")  # the gated FFN's activation of the gate
ROPE_SCALINGS = ("none", "linear")  # rope.scaling.type values that are supported


@dataclass(frozen=True)
class ArchSpec:
    """What one decoder architecture's layer is, beyond the llama layer (the defaults)."""

    name: str  # the GGUF `general.architecture`
    rope_neox: bool = False  # rotate (i, i + n/2) pairs (NeoX) rather than (2i, 2i + 1)
    qkv_bias: bool = False  # biases on the q, k and v projections (qwen2)
    qk_norm: bool = False  # an RMS norm on each q and k head after the projection, before RoPE (gemma3)
    post_norms: bool = False  # RMS norms on the attention and FFN outputs before each residual add (gemma3)
    activation: str = "silu"  # the gated FFN's: silu (SwiGLU) or gelu_tanh (GeGLU)
    embed_scale: bool = False  # token embeddings multiplied by sqrt(dim) (gemma3)
    # sliding-window attention: every swa_pattern-th layer global, the others within
    # `attention.sliding_window` tokens, with their own RoPE base (0: every layer global)
    swa_pattern: int = 0
    rope_base_local: float | None = None
    softcaps: bool = False  # attention- and final-logit softcapping from the metadata (gemma2/3's keys)

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def stack_flags(self) -> dict:
        """The compiled step's switches (kernels.cpu.step.LayerStack)."""
        return {"qk_norm": self.qk_norm, "post_norms": self.post_norms, "gelu": self.activation == "gelu_tanh",
                "qkv_bias": self.qkv_bias}


def config_from_gguf(gf: GGUFFile, spec: ArchSpec) -> ModelConfig:
    a = gf.architecture
    dim = meta(gf, a, "embedding_length", required=True)
    n_head = meta(gf, a, "attention.head_count", required=True)
    head_dim = meta(gf, a, "attention.key_length", dim // n_head)
    emb = gf.tensors.get("token_embd.weight")
    if emb is None:
        raise ModelLoadError("missing tensor 'token_embd.weight'")
    scaling = meta(gf, a, "rope.scaling.type", "none")
    factor = meta(gf, a, "rope.scaling.factor", 1.0) or 1.0
    if scaling not in (*ROPE_SCALINGS, None):
        raise ModelLoadError(f"rope scaling type {scaling!r} is not supported (supported: {', '.join(ROPE_SCALINGS)})")
    cfg = ModelConfig(
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
        rope_neox=spec.rope_neox,
        rope_freq_scale=1.0 / float(factor) if scaling == "linear" else 1.0,
    )
    if spec.swa_pattern:
        cfg = replace(cfg, rope_base_local=spec.rope_base_local, swa_pattern=spec.swa_pattern,
                      sliding_window=int(meta(gf, a, "attention.sliding_window", 0) or 0))
    if spec.softcaps:
        cfg = replace(cfg, attn_softcap=float(meta(gf, a, "attn_logit_softcapping", 0.0) or 0.0),
                      final_softcap=float(meta(gf, a, "final_logit_softcapping", 0.0) or 0.0))
    if spec.embed_scale:
        cfg = replace(cfg, embed_scale=float(np.sqrt(dim)))
    return cfg


@dataclass
class LayerWeights:
    """One layer's tensors; a field the architecture does not have is None."""

    attn_norm: np.ndarray  # (dim,)
    wq: object  # (n_head * head_dim, dim)
    wk: object  # (n_kv_head * head_dim, dim)
    wv: object  # (n_kv_head * v_head_dim, dim)
    wo: object  # (dim, n_head * v_head_dim)
    ffn_norm: np.ndarray  # (dim,)
    w_gate: object  # (ffn, dim)
    w_up: object  # (ffn, dim)
    w_down: object  # (dim, ffn)
    q_norm: np.ndarray | None = None  # (head_dim,) qk_norm
    k_norm: np.ndarray | None = None  # (head_dim,)
    post_attn_norm: np.ndarray | None = None  # (dim,) post_norms
    post_ffn_norm: np.ndarray | None = None  # (dim,)
    bq: np.ndarray | None = None  # (n_head * head_dim,) qkv_bias
    bk: np.ndarray | None = None  # (n_kv_head * head_dim,)
    bv: np.ndarray | None = None  # (n_kv_head * v_head_dim,)


def layer_tensors(spec: ArchSpec, cfg: ModelConfig) -> list[tuple[str, TN, str, tuple[int, ...]]]:
    """(LayerWeights field, gguf tensor, "weight" or "bias", shape: (size,) or (rows, cols)) of the
    tensors a layer of this architecture has, in load order."""
    d, hq, hk, hv = cfg.dim, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.n_kv_head * cfg.v_head_dim
    out = [("attn_norm", TN.ATTN_NORM, "weight", (d,)), ("wq", TN.ATTN_Q, "weight", (hq, d)),
           ("wk", TN.ATTN_K, "weight", (hk, d)), ("wv", TN.ATTN_V, "weight", (hv, d)),
           ("wo", TN.ATTN_OUT, "weight", (d, cfg.n_head * cfg.v_head_dim)), ("ffn_norm", TN.FFN_NORM, "weight", (d,)),
           ("w_gate", TN.FFN_GATE, "weight", (cfg.ffn_dim, d)), ("w_up", TN.FFN_UP, "weight", (cfg.ffn_dim, d)),
           ("w_down", TN.FFN_DOWN, "weight", (d, cfg.ffn_dim))]
    if spec.qk_norm:
        out += [("q_norm", TN.ATTN_Q_NORM, "weight", (cfg.head_dim,)), ("k_norm", TN.ATTN_K_NORM, "weight", (cfg.head_dim,))]
    if spec.post_norms:
        out += [("post_attn_norm", TN.ATTN_POST_NORM, "weight", (d,)), ("post_ffn_norm", TN.FFN_POST_NORM, "weight", (d,))]
    if spec.qkv_bias:
        out += [("bq", TN.ATTN_Q, "bias", (hq,)), ("bk", TN.ATTN_K, "bias", (hk,)), ("bv", TN.ATTN_V, "bias", (hv,))]
    return out


def load_layer(ld: WeightLoader, spec: ArchSpec, cfg: ModelConfig, i: int) -> LayerWeights:
    got = {}
    for field, tensor, part, shape in layer_tensors(spec, cfg):
        name = f"{TENSOR_NAMES[tensor].format(bid=i)}.{part}"
        got[field] = ld.vector(name, *shape) if len(shape) == 1 else ld.matrix(name, *shape)
    return LayerWeights(**got)


class Model:
    """Weights plus the forward pass of a decoder architecture; every op goes through the kernel
    backend `kb`."""

    def __init__(self, gf: GGUFFile, kb, spec: ArchSpec, cfg: ModelConfig | None = None):
        self.spec = spec
        self.cfg = cfg = cfg or config_from_gguf(gf, spec)
        self.kb = kb
        check_vocab(gf, cfg.vocab_size)
        if cfg.rope_base_local is not None:
            self.inv_freq_local = kb.upload(rope_inv_freq(cfg.rope_dim, cfg.rope_base_local))
        ld = WeightLoader(gf, kb)
        self.tok_embd = ld.matrix("token_embd.weight", cfg.vocab_size, cfg.dim)
        self.layers = [load_layer(ld, spec, cfg, i) for i in range(cfg.n_layer)]
        self.output_norm = ld.vector("output_norm.weight", cfg.dim)
        self.output = ld.matrix("output.weight", cfg.vocab_size, cfg.dim) if ld.has("output.weight") else self.tok_embd
        ld.finish()
        factors = np.array(gf.tensor("rope_freqs.weight"), np.float32) if ld.has("rope_freqs.weight") else None
        self.inv_freq = kb.upload(rope_inv_freq(cfg.rope_dim, cfg.rope_base, cfg.rope_freq_scale, factors))
        # every layer in one compiled call where the backend has one; forward_per_op is the reference
        self.stack = kb.layer_stack(cfg, self.layers, [self.layer_inv_freq(i) for i in range(cfg.n_layer)],
                                    **spec.stack_flags)

    def layer_inv_freq(self, layer: int):
        return self.inv_freq_local if self.cfg.is_sliding(layer) else self.inv_freq

    def forward(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """Logits (L, vocab), on the host, for the tokens batch.logits_idx selects; hidden: their final
        hidden states after the output norm (L, dim) instead (what llama.cpp's embeddings are)."""
        self.kb.ready()  # kernels compiling ahead (a first run) are done
        if self.stack is None:
            return self.forward_per_op(batch, cache, hidden)
        rows = self.stack.run(self.embed(batch.token_ids), batch, cache)
        return self.normed(rows) if hidden else self.logits(rows)

    def embed(self, token_ids):
        x = self.kb.embed(self.tok_embd, token_ids)
        if self.spec.embed_scale:
            self.kb.scale_(x, self.cfg.embed_scale)
        return x

    def forward_per_op(self, batch: Batch, cache: KVCache, hidden: bool = False) -> np.ndarray:
        """The reference forward: one backend call per op (the CUDA backend's path)."""
        kb, cfg, spec = self.kb, self.cfg, self.spec
        act = kb.gelu_tanh_mul if spec.activation == "gelu_tanh" else kb.silu_mul
        batch = kb.prepare_batch(batch)
        x = self.embed(batch.token_ids)
        h = kb.empty(x.shape)
        ff = kb.empty((x.shape[0], cfg.ffn_dim))
        for i, lw in enumerate(self.layers):
            kb.rmsnorm(x, lw.attn_norm, cfg.norm_eps, h)
            a = attention(kb, cfg, spec, i, lw, h, batch, cache, self.layer_inv_freq(i))
            if spec.post_norms:
                kb.rmsnorm(a, lw.post_attn_norm, cfg.norm_eps, a)
            kb.add_(x, a)
            kb.rmsnorm(x, lw.ffn_norm, cfg.norm_eps, h)
            hq = kb.quantize_input(h)  # one quantized activation for gate and up
            act(kb.matmul(lw.w_gate, hq), kb.matmul(lw.w_up, hq), ff)
            f = kb.matmul(lw.w_down, ff)
            if spec.post_norms:
                kb.rmsnorm(f, lw.post_ffn_norm, cfg.norm_eps, f)
            kb.add_(x, f)
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


def attention(kb, cfg: ModelConfig, spec: ArchSpec, layer: int, lw: LayerWeights, h, batch: Batch,
              cache: KVCache, inv_freq) -> np.ndarray:
    """Self-attention of one layer for the batch: h (T, dim) -> (T, dim)."""
    t = h.shape[0]
    hq = kb.quantize_input(h)  # one quantized activation for q, k and v
    q2, k2, v2 = kb.matmul(lw.wq, hq), kb.matmul(lw.wk, hq), kb.matmul(lw.wv, hq)
    if spec.qkv_bias:
        kb.add_bias_(q2, lw.bq)
        kb.add_bias_(k2, lw.bk)
        kb.add_bias_(v2, lw.bv)
    q = q2.reshape(t, cfg.n_head, cfg.head_dim)
    k = k2.reshape(t, cfg.n_kv_head, cfg.head_dim)
    v = v2.reshape(t, cfg.n_kv_head, cfg.v_head_dim)
    if spec.qk_norm:
        qf = q.reshape(t * cfg.n_head, cfg.head_dim)
        kf = k.reshape(t * cfg.n_kv_head, cfg.head_dim)
        kb.rmsnorm(qf, lw.q_norm, cfg.norm_eps, qf)
        kb.rmsnorm(kf, lw.k_norm, cfg.norm_eps, kf)
    if cfg.rope_dim < cfg.head_dim:
        kb.rope(q[:, :, : cfg.rope_dim], batch.positions, inv_freq, cfg.rope_neox)
        kb.rope(k[:, :, : cfg.rope_dim], batch.positions, inv_freq, cfg.rope_neox)
    else:
        kb.rope(q, batch.positions, inv_freq, cfg.rope_neox)
        kb.rope(k, batch.positions, inv_freq, cfg.rope_neox)
    kc, vc = cache.k[layer], cache.v[layer]
    kb.write_kv(kb.kv_store(k, cache.dtype), kb.kv_store(v, cache.dtype), batch.slot_mapping, kc, vc)
    out = kb.empty((t, cfg.n_head, cfg.v_head_dim))
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / np.sqrt(cfg.head_dim)
    window = cfg.sliding_window if cfg.is_sliding(layer) else 0
    kb.paged_attention(q, kc, vc, batch.token_seq, batch.positions, batch.block_tables, cache.block_size,
                       np.float32(scale), window, np.float32(cfg.attn_softcap), out)
    return kb.matmul(lw.wo, out.reshape(t, cfg.n_head * cfg.v_head_dim))


__all__ = ["ArchSpec", "LayerWeights", "Model", "config_from_gguf", "layer_tensors", "load_layer"]

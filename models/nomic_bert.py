"""The `nomic-bert` architecture (nomic-embed-text): a bidirectional encoder that turns a text into one
vector. BERT's post-norm layers (LayerNorm with bias after attention and after the FFN), with RoPE
(NeoX pairs) in place of position embeddings, a fused QKV projection and a SwiGLU FFN; the token
embeddings get token type 0's row added and a LayerNorm; the vectors of a text's tokens are mean-pooled.

Encoders need no KV cache: every text is computed whole, all tokens at once. The weights are F16 in the
released files; `kernels.dense` multiplies by them (see the backend), and attention is the backend's
bidirectional `encoder_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..gguf_file import GGUFFile
from .common import ModelLoadError, WeightLoader, check_vocab, meta, rope_inv_freq

ARCH = "nomic-bert"
POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}  # llama.cpp's pooling_type values


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    a = gf.architecture
    dim = meta(gf, a, "embedding_length", required=True)
    n_head = meta(gf, a, "attention.head_count", required=True)
    emb = gf.tensors.get("token_embd.weight")
    if emb is None:
        raise ModelLoadError("missing tensor 'token_embd.weight'")
    if meta(gf, a, "attention.causal", False):
        raise ModelLoadError(f"{a}: a causal encoder is not supported")
    head_dim = dim // n_head
    return ModelConfig(
        arch=a,
        n_layer=meta(gf, a, "block_count", required=True),
        dim=dim,
        n_head=n_head,
        n_kv_head=n_head,
        head_dim=head_dim,
        v_head_dim=head_dim,
        ffn_dim=meta(gf, a, "feed_forward_length", required=True),
        vocab_size=int(emb.shape[1]),
        context_length=meta(gf, a, "context_length", 2048),
        norm_eps=float(meta(gf, a, "attention.layer_norm_epsilon", 1e-12)),
        rope_base=float(meta(gf, a, "rope.freq_base", 1000.0)),
        rope_dim=head_dim,
        rope_neox=True,
    )


@dataclass
class EncoderLayer:
    w_qkv: np.ndarray  # (3 * dim, dim)
    wo: np.ndarray  # (dim, dim)
    attn_norm: tuple  # (weight, bias), after the attention's residual
    w_up: np.ndarray  # (ffn, dim)
    w_gate: np.ndarray  # (ffn, dim)
    w_down: np.ndarray  # (dim, ffn)
    out_norm: tuple  # (weight, bias), after the FFN's residual


class Model:
    """Weights plus the encoder pass; every op goes through the kernel backend `kb`."""

    is_encoder = True

    def __init__(self, gf: GGUFFile, kb, cfg: ModelConfig | None = None):
        self.cfg = cfg = cfg or config_from_gguf(gf)
        if not hasattr(kb, "encoder_attention"):
            backend = getattr(kb, "__name__", "").split(".")[-2] if "." in getattr(kb, "__name__", "") else "this"
            raise ModelLoadError(f"the {backend} backend cannot run encoder models ({cfg.arch}) yet: use --device cpu")
        self.kb = kb
        check_vocab(gf, cfg.vocab_size)
        ld = WeightLoader(gf, kb)
        d, f = cfg.dim, cfg.ffn_dim

        def norm(name):  # LayerNorm: weight and bias
            return ld.vector(name + ".weight", d), ld.vector(name + ".bias", d)

        self.tok_embd = ld.float_matrix("token_embd.weight", cfg.vocab_size, d)
        types = ld.float_matrix("token_types.weight", None, d) if ld.has("token_types.weight") else None
        self.type0 = np.asarray(types[0], np.float32) if types is not None else np.zeros(d, np.float32)
        self.embd_norm = norm("token_embd_norm")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            self.layers.append(EncoderLayer(
                w_qkv=ld.float_matrix(p + "attn_qkv.weight", 3 * d, d),
                wo=ld.float_matrix(p + "attn_output.weight", d, d),
                attn_norm=norm(p + "attn_output_norm"),
                w_up=ld.float_matrix(p + "ffn_up.weight", f, d),
                w_gate=ld.float_matrix(p + "ffn_gate.weight", f, d),
                w_down=ld.float_matrix(p + "ffn_down.weight", d, f),
                out_norm=norm(p + "layer_output_norm"),
            ))
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_base).astype(np.float32)
        self.pooling = POOLING.get(int(meta(gf, cfg.arch, "pooling_type", 1)), "mean")

    def encode(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """The final hidden states of each token sequence, (len, dim) float32 each; the sequences are
        computed together (their tokens side by side through every matrix), attention within each."""
        kb, cfg = self.kb, self.cfg
        lens = [len(s) for s in seqs]
        starts = np.cumsum([0] + lens)
        ids = np.concatenate([np.asarray(s, np.int64) for s in seqs])
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        x = self.tok_embd[ids].astype(np.float32)
        x += self.type0
        x = kb.layernorm(x, *self.embd_norm, cfg.norm_eps)
        h, hd = cfg.n_head, cfg.head_dim
        scale = np.float32(1.0 / np.sqrt(hd))
        for lw in self.layers:
            qkv = kb.dense(lw.w_qkv, x)
            q = qkv[:, : cfg.dim].reshape(-1, h, hd)
            k = qkv[:, cfg.dim: 2 * cfg.dim].reshape(-1, h, hd)
            v = qkv[:, 2 * cfg.dim:].reshape(-1, h, hd)
            q = np.ascontiguousarray(q)
            k = np.ascontiguousarray(k)
            kb.rope(q, positions, self.inv_freq, True)
            kb.rope(k, positions, self.inv_freq, True)
            att = kb.encoder_attention(q, k, np.ascontiguousarray(v), starts, scale)
            x = kb.layernorm(kb.dense(lw.wo, att.reshape(-1, cfg.dim)) + x, *lw.attn_norm, cfg.norm_eps)
            ff = kb.silu(kb.dense(lw.w_gate, x))
            ff *= kb.dense(lw.w_up, x)
            x = kb.layernorm(kb.dense(lw.w_down, ff) + x, *lw.out_norm, cfg.norm_eps)
        return [x[starts[i]:starts[i + 1]] for i in range(len(seqs))]

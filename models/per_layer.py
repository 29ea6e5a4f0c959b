"""Gemma 4's per-layer token inputs (llama.cpp's build_inp_per_layer and project_per_layer_inputs, gemma4.cpp),
per op. Each token has, besides its embedding, a small vector for every layer: a row of per_layer_token_embd
(n_layer slices of per_layer_dim, times sqrt(per_layer_dim)) plus a projection of the scaled embedding
(per_layer_model_proj, times 1/sqrt(dim), each slice RMS-normed with per_layer_proj_norm), the sum times
1/sqrt(2). After its feed-forward block a layer adds norm(proj(gelu(gate x) * its slice)) to the residual."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PerLayer(NamedTuple):
    embd: object  # (vocab, n_layer * per_layer_dim): each token's slices
    model_proj: object  # (n_layer * per_layer_dim, dim)
    proj_norm: object  # (per_layer_dim,)


def load(ld, cfg) -> PerLayer:
    e = cfg.n_layer * cfg.per_layer_dim
    return PerLayer(ld.matrix("per_layer_token_embd.weight", cfg.vocab_size, e),
                    ld.matrix("per_layer_model_proj.weight", e, cfg.dim),
                    ld.vector("per_layer_proj_norm.weight", cfg.per_layer_dim))


def inputs(kb, cfg, p: PerLayer, token_ids, x):
    """Every layer's input slice for the batch's tokens (n_layer, T, per_layer_dim), from the token ids and
    their scaled embeddings x (T, dim); float32 scales as llama.cpp computes them."""
    f32 = np.float32
    t, n, e = x.shape[0], cfg.n_layer, cfg.per_layer_dim
    tok = kb.embed(p.embd, token_ids)
    kb.scale_(tok, f32(np.sqrt(f32(e))))
    proj = kb.matmul(p.model_proj, x)
    kb.scale_(proj, f32(1.0) / f32(np.sqrt(f32(cfg.dim))))
    flat = proj.reshape(t * n, e)
    kb.rmsnorm(flat, p.proj_norm, cfg.norm_eps, flat)
    kb.add_(proj, tok)
    kb.scale_(proj, f32(1.0) / f32(np.sqrt(f32(2.0))))
    return proj.reshape(t, n, e).transpose(1, 0, 2).copy()


def add(kb, cfg, lw, x, inp) -> None:
    """A layer's per-layer input into its output x (T, dim), in place: x += norm(proj(gelu(gate x) * inp))."""
    g = kb.matmul(lw.ple_gate, x)
    kb.gelu_tanh_mul(g, inp, g)
    y = kb.matmul(lw.ple_proj, g)
    kb.rmsnorm(y, lw.ple_norm, cfg.norm_eps, y)
    kb.add_(x, y)

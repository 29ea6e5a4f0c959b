"""Gemma 4's mixture-of-experts block (26B-A4B) as the feed-forward part of a decoder layer, per op (llama.cpp's
gemma4.cpp): a dense GELU FFN of the pre-normed input (ffn_norm), post-normed (post_ffw_norm_1), plus the experts
of the input normed apart (pre_ffw_norm_2), post-normed (post_ffw_norm_2). The router reads the layer's input
RMS-normed without weights, times 1/sqrt(dim) and a per-element scale (ffn_gate_inp.scale): a softmax over the
experts, the k most probable, their weights renormalised; each expert's output times its down scale
(ffn_down_exps.scale) where the file has one. The gate and up projections of the experts may be one fused
tensor (ffn_gate_up_exps: each expert's gate rows, then its up rows). The compiled step's code of it is in
kernels/cpu/step.py's _ffn_block and kernels/cpu/parts/moe.py (MoePart.g4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN

from . import ffn, norms

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    d, e, fe = cfg.dim, cfg.n_expert, cfg.expert_ffn_dim
    out = [*ffn.tensors(spec, cfg, has),
           (("post_ffn_norm_1",), TN.FFN_POST_NORM_1, "weight", (d,), None),
           (("pre_ffn_norm_2",), TN.FFN_PRE_NORM_2, "weight", (d,), None),
           (("post_ffn_norm_2",), TN.FFN_POST_NORM_2, "weight", (d,), None),
           (("router",), TN.FFN_GATE_INP, "weight", (e, d), "float"),
           (("router_scale",), TN.FFN_GATE_INP, "scale", (d,), None)]
    if has(TN.FFN_GATE_UP_EXP):
        out.append((("exp_gate", "exp_up"), TN.FFN_GATE_UP_EXP, "weight", (e, 2 * fe, d), "experts_halves"))
    else:
        out += [(("exp_gate",), TN.FFN_GATE_EXP, "weight", (e, fe, d), "experts"),
                (("exp_up",), TN.FFN_UP_EXP, "weight", (e, fe, d), "experts")]
    out.append((("exp_down",), TN.FFN_DOWN_EXP, "weight", (e, d, fe), "experts"))
    if has(TN.FFN_DOWN_EXP, "scale"):
        out.append((("exp_down_scale",), TN.FFN_DOWN_EXP, "scale", (e,), None))
    return out


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where):
    """h (T, dim): the layer's input after ffn_norm (at.x: before it) -> the block's output (T, dim), before the
    layer's post_ffw_norm."""
    f32, x = np.float32, at.x
    t, k = h.shape[0], cfg.n_expert_used
    dense = ffn.gated(kb, spec, h, lw.w_gate, lw.w_up, lw.w_down)
    kb.rmsnorm(dense, lw.post_ffn_norm_1, cfg.norm_eps, dense)
    r = kb.empty(x.shape)  # the router's input
    kb.rmsnorm(x, norms.ones(kb, cfg.dim), cfg.norm_eps, r)
    kb.scale_(r, f32(1.0) / f32(np.sqrt(f32(cfg.dim))))
    r *= lw.router_scale  # (the CPU's arrays: Gemma 4 runs there alone)
    ids, wts = kb.moe_route(r, lw.router, k, True, 0.0)
    e_in = kb.empty(x.shape)
    kb.rmsnorm(x, lw.pre_ffn_norm_2, cfg.norm_eps, e_in)
    offsets, order, pos = kb.moe_plan(ids, cfg.n_expert)
    hs = kb.take_rows(e_in, order)
    y = kb.empty((t * k, cfg.dim))
    for e in np.flatnonzero(np.diff(offsets)):
        r0, r1 = int(offsets[e]), int(offsets[e + 1])
        y[r0:r1] = ffn.gated(kb, spec, hs[r0:r1], lw.exp_gate[e], lw.exp_up[e], lw.exp_down[e])
        if lw.exp_down_scale is not None:
            kb.scale_(y[r0:r1], f32(kb.to_host(lw.exp_down_scale)[e]))
    out = kb.empty(x.shape)
    kb.moe_combine(y, pos, wts, out)
    kb.rmsnorm(out, lw.post_ffn_norm_2, cfg.norm_eps, out)
    kb.add_(out, dense)
    return out

"""A mixture of experts as the feed-forward part of a decoder layer, per op: the router's k experts per
token, each expert's tokens through its FFN together, the weighted sum; plus the shared expert (gated or not) where
the architecture has one (kernels/cpu/moe.py has the steps; the compiled step's code is
kernels/cpu/parts/moe.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN

from .ffn import gated

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The router, the experts and the shared expert's tensors (parts.LayerTensor)."""
    d, f, e, fe = cfg.dim, cfg.ffn_dim, cfg.n_expert, cfg.expert_ffn_dim
    out = [(("router",), TN.FFN_GATE_INP, "weight", (e, d), "float"),
           (("exp_gate",), TN.FFN_GATE_EXP, "weight", (e, fe, d), "experts"),
           (("exp_up",), TN.FFN_UP_EXP, "weight", (e, fe, d), "experts"),
           (("exp_down",), TN.FFN_DOWN_EXP, "weight", (e, d, fe), "experts")]
    if spec.moe_bias:
        out.append((("exp_bias",), TN.FFN_EXP_PROBS_B, "bias", (e,), None))
    if spec.oai_experts:  # gpt-oss: biases on the router and on every expert's matrices
        out += [(("router_b",), TN.FFN_GATE_INP, "bias", (e,), None),
                (("exp_gate_b",), TN.FFN_GATE_EXP, "bias", (e, fe), "plain"),
                (("exp_up_b",), TN.FFN_UP_EXP, "bias", (e, fe), "plain"),
                (("exp_down_b",), TN.FFN_DOWN_EXP, "bias", (e, d), "plain")]
    if spec.shared_expert:
        out += [(("sh_gate",), TN.FFN_GATE_INP_SHEXP, "weight", (d,), None)] if spec.shared_gate else []
        out += [(("w_gate",), TN.FFN_GATE_SHEXP, "weight", (f, d), None),
                (("w_up",), TN.FFN_UP_SHEXP, "weight", (f, d), None),
                (("w_down",), TN.FFN_DOWN_SHEXP, "weight", (d, f), None)]
    return out


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where = None):
    """The mixture-of-experts FFN of h (T, dim) -> (T, dim)."""
    t, k = h.shape[0], cfg.n_expert_used
    if spec.oai_experts:  # gpt-oss: the k largest biased logits, a softmax over them
        ids, wts = kb.moe_route_topk_softmax(h, lw.router, lw.router_b, k)
    elif spec.moe_bias:  # lfm2moe: sigmoid (or softmax) gating, the experts chosen with a selection bias
        ids, wts = kb.moe_route_scored(h, lw.router, k, cfg.expert_sigmoid, lw.exp_bias, cfg.expert_norm,
                                       cfg.expert_scale)
    else:
        ids, wts = kb.moe_route(h, lw.router, k, cfg.expert_norm, cfg.expert_scale)
    offsets, order, pos = kb.moe_plan(ids, cfg.n_expert)
    hs = kb.take_rows(h, order)  # (T * k, dim): each expert's tokens one run of rows
    y = kb.empty((t * k, cfg.dim))
    for e in np.flatnonzero(np.diff(offsets)):  # the experts some token chose
        r0, r1 = int(offsets[e]), int(offsets[e + 1])
        if spec.oai_experts:
            y[r0:r1] = _oai_expert(kb, lw, e, hs[r0:r1])
        else:
            y[r0:r1] = gated(kb, spec, hs[r0:r1], lw.exp_gate[e], lw.exp_up[e], lw.exp_down[e])
    out = kb.empty(h.shape)
    kb.moe_combine(y, pos, wts, out)
    if spec.shared_expert and spec.shared_gate:  # qwen2moe: gated by sigmoid(h . sh_gate)
        kb.moe_shared_add(out, gated(kb, spec, h, lw.w_gate, lw.w_up, lw.w_down), h, lw.sh_gate)
    elif spec.shared_expert:  # granitehybrid: added as it is
        kb.add_(out, gated(kb, spec, h, lw.w_gate, lw.w_up, lw.w_down))
    return out


def _oai_expert(kb, lw: LayerWeights, e: int, x):
    """gpt-oss's expert e on its tokens x (R, dim): down(swiglu_oai(gate x + b_g, up x + b_u)) + b_d."""
    g, u = kb.matmul_many([lw.exp_gate[e], lw.exp_up[e]], x)
    kb.add_bias_(g, lw.exp_gate_b[e])
    kb.add_bias_(u, lw.exp_up_b[e])
    kb.swiglu_oai(g, u, g)
    y = kb.matmul(lw.exp_down[e], g)
    kb.add_bias_(y, lw.exp_down_b[e])
    return y

"""The gated delta net (Qwen3.5's and Qwen3-Next's linear attention) as a part of a decoder layer, per op
(llama.cpp's src/models/qwen35.cpp build_layer_attn_linear, delta-net-base.cpp):

    qkv, z = attn_qkv(h), attn_gate(h)          (2 Hk Dk + H Dv, and H Dv columns; or one ssm_in)
    beta, alpha = ssm_beta(h), ssm_alpha(h)     (H columns each; or one ssm_ba)
    qkv = silu(conv(qkv))                       (a causal depthwise convolution of d_conv taps, no bias)
    y = delta_rule(l2norm(q), l2norm(k), v, softplus(alpha + dt_bias) a, sigmoid(beta))
    y = rmsnorm_per_head(y) * norm * silu(z)
    out = ssm_out(y)

The convolution's last d_conv - 1 inputs and each value head's (Dk, Dv) matrix (in the kernel's blocks of
columns) are the sequence's recurrent state (cache.ssm_conv, cache.ssm), in its state slot. Sizes from the ssm.* keys: state_size Dk
(= Dv), group_count Hk, time_step_rank H, inner_size H Dv."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The delta net's layer tensors (parts.LayerTensor); the taps stay float32, transposed. Qwen3-Next
    (spec.delta_next) projects beta and alpha in one ssm_ba, and its older files q, k, v and z in one ssm_in
    (both grouped by key head)."""
    d, e, h, conv = cfg.dim, cfg.ssm_inner, cfg.ssm_heads, cfg.ssm_conv_dim
    if spec.delta_next and has(TN.SSM_IN):
        out = [(("ssm_in",), TN.SSM_IN, "weight", (conv + e, d), None)]
    else:
        out = [(("ssm_qkv",), TN.ATTN_QKV, "weight", (conv, d), None), (("ssm_z",), TN.ATTN_GATE, "weight", (e, d), None)]
    out += [(("ssm_conv1d",), TN.SSM_CONV1D, "weight", (conv, cfg.ssm_conv), "float"),
            (("ssm_dt_b",), TN.SSM_DT, "bias", (h,), None),
            (("ssm_a",), TN.SSM_A, "", (h,), None)]
    if spec.delta_next:
        out.append((("ssm_ba",), TN.SSM_BETA_ALPHA, "weight", (2 * h, d), None))
    else:
        out += [(("ssm_beta",), TN.SSM_BETA, "weight", (h, d), None), (("ssm_alpha",), TN.SSM_ALPHA, "weight", (h, d), None)]
    return out + [(("ssm_norm",), TN.SSM_NORM, "weight", (cfg.ssm_state,), None),
                  (("ssm_out",), TN.SSM_OUT, "weight", (d, e), None)]


def _by_key_head(x, nk: int, sizes: list) -> list:
    # Qwen3-Next's projections grouped by key head, (T, nk * sum(sizes)) -> one (T, nk * size) array per part,
    # each the part of every key head in order
    t = x.shape[0]
    g = x.reshape(t, nk, sum(sizes))
    bounds = np.cumsum([0, *sizes])
    return [np.ascontiguousarray(g[:, :, a:b]).reshape(t, -1) for a, b in zip(bounds[:-1], bounds[1:])]


def projections(kb, cfg: ModelConfig, lw: LayerWeights, h):
    """(qkv (T, conv channels), z (T, H Dv), beta (T, H), alpha (T, H)) of h (T, dim), the projections that
    read h together in as few parallel regions as the kernels take (three matrices each)."""
    hq = kb.quantize_input(h)  # one quantized activation for every projection
    nk, dk, r = cfg.ssm_groups, cfg.ssm_state, cfg.ssm_heads // cfg.ssm_groups
    if lw.ssm_ba is None:  # Qwen3.5
        qkv, z, beta = kb.matmul_many([lw.ssm_qkv, lw.ssm_z, lw.ssm_beta], hq)
        return qkv, z, beta, kb.matmul(lw.ssm_alpha, hq)
    if lw.ssm_in is not None:  # older Qwen3-Next files: per key head q, k, its value heads' v and z
        mixed, ba = kb.matmul_many([lw.ssm_in, lw.ssm_ba], hq)
        q, k, v, z = _by_key_head(mixed, nk, [dk, dk, r * dk, r * dk])
        qkv = np.concatenate([q, k, v], axis=1)
    else:
        qkv, z, ba = kb.matmul_many([lw.ssm_qkv, lw.ssm_z, lw.ssm_ba], hq)
    beta, alpha = _by_key_head(ba, nk, [r, r])  # Qwen3-Next: per key head its value heads' beta, then alpha
    return qkv, z, beta, alpha


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where):
    """The gated delta net of layer at.layer for the batch: h (T, dim) -> (T, dim)."""
    batch, cache = at.batch, at.cache
    i = cache.state_index[at.layer]
    t, e, conv = h.shape[0], cfg.ssm_inner, cfg.ssm_conv_dim
    qkv, z, beta, alpha = projections(kb, cfg, lw, h)
    x = kb.empty((t, conv))
    kb.ssm_conv(qkv, lw.ssm_conv1d, kb.zeros((conv,), np.float32), cache.ssm_conv[i], batch.token_seq,
                batch.positions, batch.state_slots, batch.state_snap, x)
    y = kb.empty((t, e))
    kb.delta_rule(x, alpha, beta, lw.ssm_dt_b, lw.ssm_a, cfg.ssm_groups, spec.delta_next, cfg.norm_eps, cache.ssm[i],
                  batch.token_seq, batch.positions, batch.state_slots, batch.state_snap, y)
    kb.norm_gate(y, z, lw.ssm_norm, cfg.ssm_heads, cfg.norm_eps, y)
    return kb.matmul(lw.ssm_out, y)

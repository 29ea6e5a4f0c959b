"""Self-attention as a part of a decoder layer, per op: q/k/v projections (fused or not, with biases and
q/k norms where the architecture has them), RoPE, the KV writes, paged attention, the output projection.
The compiled step's code of it is kernels/cpu/parts/attention.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import MODEL_TENSOR as TN

from . import norms

if TYPE_CHECKING:
    from ...config import ModelConfig
    from ..decoder import ArchSpec, LayerWeights
    from . import Where


def tensors(spec: ArchSpec, cfg: ModelConfig, has) -> list:
    """The attention's layer tensors (parts.LayerTensor); has(tensor): whether the file holds it (a fused
    q/k/v projection)."""
    d, hq, hk, hv = cfg.dim, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.n_kv_head * cfg.v_head_dim
    if spec.attn_gate:  # each head's query then its gate
        hq *= 2
    if has(TN.ATTN_QKV) and spec.recurrent != "deltanet":  # (a delta net layer's attn_qkv is its own)
        out = [(("wq", "wk", "wv"), TN.ATTN_QKV, "weight", (hq + hk + hv, d), (hq, hk, hv))]
    elif spec.v_norm:  # Gemma 4: no attn_v where V is K; no attn_k (nor its norm) in a layer reading another's KV
        out = [(("wq",), TN.ATTN_Q, "weight", (hq, d), None)]
        out += [(("wk",), TN.ATTN_K, "weight", (hk, d), None)] if has(TN.ATTN_K) else []
        out += [(("wv",), TN.ATTN_V, "weight", (hv, d), None)] if has(TN.ATTN_V) else []
    else:
        out = [(("wq",), TN.ATTN_Q, "weight", (hq, d), None), (("wk",), TN.ATTN_K, "weight", (hk, d), None),
               (("wv",), TN.ATTN_V, "weight", (hv, d), None)]
    out.append((("wo",), TN.ATTN_OUT, "weight", (d, cfg.n_head * cfg.v_head_dim), None))
    if spec.qk_norm or spec.qk_norm_full:
        qn, kn = (hq, hk) if spec.qk_norm_full else (cfg.head_dim, cfg.head_dim)
        out.append((("q_norm",), TN.ATTN_Q_NORM, "weight", (qn,), None))
        if has(TN.ATTN_K) or not spec.v_norm:
            out.append((("k_norm",), TN.ATTN_K_NORM, "weight", (kn,), None))
    if spec.qkv_bias:
        out += [(("bq",), TN.ATTN_Q, "bias", (hq,), None), (("bk",), TN.ATTN_K, "bias", (hk,), None),
                (("bv",), TN.ATTN_V, "bias", (hv,), None)]
    if spec.attn_sinks:
        out += [(("sinks",), TN.ATTN_SINKS, "weight", (cfg.n_head,), None), (("bo",), TN.ATTN_OUT, "bias", (d,), None)]
    return out


def forward(kb, cfg: ModelConfig, spec: ArchSpec, lw: LayerWeights, h, at: Where):
    """Self-attention of layer at.layer for the batch: h (T, dim) -> (T, dim)."""
    batch, cache, layer = at.batch, at.cache, at.layer
    t = h.shape[0]
    hq = kb.quantize_input(h)  # one quantized activation for q, k and v
    own = cfg.kv_of(layer) == layer  # else the layer reads an earlier layer's KV (Gemma 4): q alone
    mats = [lw.wq, lw.wk, lw.wv] if own and lw.wv is not None else [lw.wq, lw.wk] if own else [lw.wq]
    q2, k2, v2 = (*kb.matmul_many(mats, hq), None, None)[:3]
    if own and lw.wv is None:  # Gemma 4's layers without attn_v: V is K's projection (before K's norm)
        v2 = k2.copy()
    if spec.attn_gate:  # qwen35: (T, heads, [query, gate], head_dim) -> the queries, and the gates for later
        qg = q2.reshape(t, cfg.n_head, 2, cfg.head_dim)
        q2 = np.ascontiguousarray(qg[:, :, 0]).reshape(t, cfg.n_head * cfg.head_dim)
        gate = np.ascontiguousarray(qg[:, :, 1]).reshape(t, cfg.n_head * cfg.head_dim)
    if spec.qkv_bias:
        kb.add_bias_(q2, lw.bq)
        kb.add_bias_(k2, lw.bk)
        kb.add_bias_(v2, lw.bv)
    if spec.qk_norm_full:  # over each token's whole projection
        kb.rmsnorm(q2, lw.q_norm, cfg.norm_eps, q2)
        kb.rmsnorm(k2, lw.k_norm, cfg.norm_eps, k2)
    q = q2.reshape(t, cfg.n_head, cfg.head_dim)
    if spec.qk_norm:
        qf = q.reshape(t * cfg.n_head, cfg.head_dim)
        kb.rmsnorm(qf, lw.q_norm, cfg.norm_eps, qf)
    if cfg.rope:  # else NoPE: no positions in q and k (Granite 4 H, Nemotron-H)
        kb.rope(q[:, :, : cfg.rope_dim] if cfg.rope_dim < cfg.head_dim else q, batch.positions, at.inv_freq,
                cfg.rope_neox, cfg.rope_mscale)
    if cfg.attn_temp:  # Mistral 3: the queries past the original context sharpened
        kb.attn_temperature(q, batch.positions, np.float32(cfg.attn_temp[0]), np.float64(cfg.attn_temp[1]))
    kc, vc = cache.layer(layer)
    slots, tables = (batch.window_slots, batch.window_tables) if cache.windowed(layer) else \
        (batch.slot_mapping, batch.block_tables)
    if own:
        k = k2.reshape(t, cfg.n_kv_head, cfg.head_dim)
        v = v2.reshape(t, cfg.n_kv_head, cfg.v_head_dim)
        if spec.qk_norm:
            kf = k.reshape(t * cfg.n_kv_head, cfg.head_dim)
            kb.rmsnorm(kf, lw.k_norm, cfg.norm_eps, kf)
        if spec.v_norm:  # Gemma 4: V RMS-normed, no weights
            vf = v.reshape(t * cfg.n_kv_head, cfg.v_head_dim)
            kb.rmsnorm(vf, norms.ones(kb, cfg.v_head_dim), cfg.norm_eps, vf)
        if cfg.rope:
            kb.rope(k[:, :, : cfg.rope_dim] if cfg.rope_dim < cfg.head_dim else k, batch.positions, at.inv_freq,
                    cfg.rope_neox, cfg.rope_mscale)
        kb.write_kv(kb.kv_store(k, cache.k_dtype), kb.kv_store(v, cache.v_dtype), slots, kc, vc)
    out = kb.empty((t, cfg.n_head, cfg.v_head_dim))
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / np.sqrt(cfg.head_dim)
    window = cfg.sliding_window if cfg.is_sliding(layer) else 0
    sinks = {"sinks": lw.sinks} if lw.sinks is not None else {}
    kb.paged_attention(q, kc, vc, batch.token_seq, batch.positions, tables, cache.block_size,
                       np.float32(scale), window, np.float32(cfg.attn_softcap), out, **sinks)
    for t0, t1 in getattr(batch, "spans", ()):  # rows attending to each other whatever their order (an image)
        _non_causal(kb, q, kc, vc, batch, tables, cache.block_size, np.float32(scale), window,
                    np.float32(cfg.attn_softcap), out, t0, t1, sinks)
    out = out.reshape(t, cfg.n_head * cfg.v_head_dim)
    if spec.attn_gate:
        kb.sigmoid_mul_(out, gate)
    y = kb.matmul(lw.wo, out)
    if lw.bo is not None:  # gpt-oss
        kb.add_bias_(y, lw.bo)
    return y


def _non_causal(kb, q, kc, vc, batch, tables, block_size, scale, window, softcap, out, t0, t1, sinks) -> None:
    """Rows t0..t1 of the batch again, each seeing its sequence's keys up to the last row's position (all of them
    are in the cache: the rows' pass wrote them) and, in a sliding-window layer, back to its own window's start,
    as llama.cpp's non-causal decode masks them: the same kernel with the causal end moved to the span's end and
    the window widened by as much. Rows whose window reaches position 0 go together; the others one at a time."""
    pos = batch.positions[t0:t1]
    end = int(pos[-1])
    whole = np.arange(t0, t1) if window <= 0 else np.arange(t0, t1)[pos - window + 1 <= 0]
    groups = [(whole, 0)] if len(whole) else []
    if window > 0:
        groups += [(np.array([t]), window + end - int(batch.positions[t])) for t in range(t0, t1)
                   if batch.positions[t] - window + 1 > 0]
    for rows, win in groups:
        part = kb.empty((len(rows), out.shape[1], out.shape[2]))
        kb.paged_attention(np.ascontiguousarray(q[rows]), kc, vc, np.ascontiguousarray(batch.token_seq[rows]),
                           np.full(len(rows), end, np.int64), tables, block_size, scale, win, softcap, part, **sinks)
        out[rows] = part

"""Numba kernels for everything but the weight matmuls: norms, RoPE, paged attention, activations."""

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

# float16 bit pattern -> float32, for KV caches stored as float16 bits (uint16)
F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def kv_load(cache, slot, g, i):
    """cache[slot, g, i] as float32, whether the cache holds float32 or float16 bits."""


@overload(kv_load, inline="always")
def _kv_load(cache, slot, g, i):
    if cache.dtype == types.uint16:
        def impl(cache, slot, g, i):
            return F16_TO_F32[cache[slot, g, i]]
    else:
        def impl(cache, slot, g, i):
            return cache[slot, g, i]
    return impl


@njit(parallel=True, nogil=True, cache=True, fastmath=True)
def rmsnorm(x, w, eps, out):
    # x (R, D) * w (D,) / rms(x) -> out (R, D); out may alias x
    R, D = x.shape
    for r in prange(R):
        ss = np.float32(0.0)
        for i in range(D):
            ss += x[r, i] * x[r, i]
        inv = np.float32(1.0) / np.sqrt(ss / D + eps)
        for i in range(D):
            out[r, i] = x[r, i] * inv * w[i]


@njit(parallel=True, nogil=True, cache=True, fastmath=True)
def rope(x, positions, inv_freq, neox):
    # x (T, H, D) rotated in place; positions (T,) int; inv_freq (n_rot/2,): angle = pos * inv_freq[i].
    # neox: pairs (i, i + n_rot/2) (GPT-NeoX, Gemma); else adjacent pairs (2i, 2i+1) (llama.cpp's llama).
    T, H, D = x.shape
    half = inv_freq.shape[0]
    for t in prange(T):
        p = np.float64(positions[t])
        for i in range(half):
            ang = p * inv_freq[i]
            c = np.float32(math.cos(ang))
            s = np.float32(math.sin(ang))
            for h in range(H):
                if neox:
                    a = x[t, h, i]
                    b = x[t, h, i + half]
                    x[t, h, i] = a * c - b * s
                    x[t, h, i + half] = a * s + b * c
                else:
                    a = x[t, h, 2 * i]
                    b = x[t, h, 2 * i + 1]
                    x[t, h, 2 * i] = a * c - b * s
                    x[t, h, 2 * i + 1] = a * s + b * c


@njit(parallel=True, nogil=True, cache=True)
def write_kv(k, v, slot_mapping, k_cache, v_cache):
    # k (T, KVH, D), v (T, KVH, Dv) -> k_cache/v_cache (n_slots, KVH, D|Dv) at slot_mapping (T,)
    for t in prange(k.shape[0]):
        s = slot_mapping[t]
        k_cache[s] = k[t]
        v_cache[s] = v[t]


@njit(parallel=True, nogil=True, cache=True, fastmath=True)
def paged_attention(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window,
                    softcap, out):
    # q (T, H, D); k_cache (n_slots, KVH, D); v_cache (n_slots, KVH, Dv), float32 or float16 bits
    # (uint16); token_seq (T,) row of
    # block_tables (S, max_blocks) for each token; positions (T,) -> out (T, H, Dv).
    # Causal: token at position p sees its sequence's keys at positions max(0, p - window + 1) .. p
    # (window <= 0: all). Keys are read through the block table: no contiguous copy.
    T, H, D = q.shape
    KVH = k_cache.shape[1]
    Dv = v_cache.shape[2]
    group = H // KVH
    for i in prange(T * H):
        t = i // H
        h = i % H
        g = h // group
        pos = positions[t]
        row = token_seq[t]
        lo = 0
        if window > 0 and pos - window + 1 > 0:
            lo = pos - window + 1
        mx = -np.inf
        denom = np.float32(0.0)
        acc = np.zeros(Dv, np.float32)
        for j in range(lo, pos + 1):
            slot = block_tables[row, j // block_size] * block_size + j % block_size
            s = np.float32(0.0)
            for dd in range(D):
                s += q[t, h, dd] * kv_load(k_cache, slot, g, dd)
            s *= scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            if s > mx:
                corr = np.exp(mx - s)
                denom *= corr
                for dd in range(Dv):
                    acc[dd] *= corr
                mx = s
            p = np.exp(s - mx)
            denom += p
            for dd in range(Dv):
                acc[dd] += p * kv_load(v_cache, slot, g, dd)
        for dd in range(Dv):
            out[t, h, dd] = acc[dd] / denom


@njit(parallel=True, nogil=True, cache=True, fastmath=True)
def silu_mul(g, u, out):
    # silu(g) * u, (T, F) -> out (T, F)
    T, F = g.shape
    for t in prange(T):
        for i in range(F):
            x = g[t, i]
            out[t, i] = x / (np.float32(1.0) + np.exp(-x)) * u[t, i]


@njit(parallel=True, nogil=True, cache=True, fastmath=True)
def gelu_tanh_mul(g, u, out):
    # gelu(g, tanh approximation) * u, (T, F) -> out (T, F)
    T, F = g.shape
    c = np.float32(math.sqrt(2.0 / math.pi))
    for t in prange(T):
        for i in range(F):
            x = g[t, i]
            out[t, i] = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x))) * u[t, i]


@njit(nogil=True, cache=True, fastmath=True)
def softcap(x, cap):
    # cap * tanh(x / cap), in place on x (R, V)
    R, V = x.shape
    for r in range(R):
        for i in range(V):
            x[r, i] = cap * np.tanh(x[r, i] / cap)

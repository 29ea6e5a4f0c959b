"""CUDA kernels over the repacked weights (quant/repack.py's row-major layout of every kind): the decode
of one element, and the matmuls and embedding lookups built on it (one thread per output element).
The CPU backend's twin is kernels/cpu/quant.py."""

import numpy as np
from gguf.quants import IQ4_NL
from numba import cuda, float32, int32

from .. import kinds

_GRID_ARRAY = np.array(IQ4_NL.kvalues, np.float32)  # IQ4_NL's 16 values


@cuda.jit(device=True, inline=True)
def _i8(v):
    return int32(v) - 256 if v > 127 else int32(v)


@cuda.jit(device=True)
def _dq(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W, for every kind (layouts: quant/repack.py)
    if kind == kinds.F16 or kind == kinds.BF16:
        return luts[kind, d[n, k]]
    g = k // 32
    j = k % 32
    if kind == kinds.Q8_0:
        return luts[0, d[n, g]] * float32(_i8(qs[n, k]))
    if kind == kinds.IQ4_NL:  # Q4_0's nibbles, each an index into the grid
        b = qs[n, g * 16 + j % 16]
        grid = cuda.const.array_like(_GRID_ARRAY)
        return luts[0, d[n, g]] * grid[(b & 15) if j < 16 else (b >> 4)]
    if kind == kinds.Q4_0 or kind == kinds.Q4_1:
        b = qs[n, g * 16 + j % 16]
        q = (b & 15) if j < 16 else (b >> 4)
        db = luts[0, d[n, g]]
        off = luts[0, m[n, g]] if kind == kinds.Q4_1 else float32(-8.0) * db
        return db * float32(q) + off
    if kind == kinds.Q5_0 or kind == kinds.Q5_1:
        b = qs[n, g * 16 + j % 16]
        q = int32((b & 15) if j < 16 else (b >> 4))
        q |= int32((qh[n, g * 4 + j // 8] >> (j % 8)) & 1) << 4
        db = luts[0, d[n, g]]
        off = luts[0, m[n, g]] if kind == kinds.Q5_1 else float32(-16.0) * db
        return db * float32(q) + off
    if kind == kinds.Q4_K or kind == kinds.Q5_K:
        sb = g // 8
        i = g % 8
        q = int32((qs[n, sb * 128 + (i // 2) * 32 + j] >> (4 * (i % 2))) & 15)
        if kind == kinds.Q5_K:
            q |= int32((qh[n, sb * 32 + j] >> i) & 1) << 4
        scale = luts[0, d[n, sb]] * float32(sc[n, sb * 16 + i])
        mn = luts[0, m[n, sb]] * float32(sc[n, sb * 16 + 8 + i])
        return scale * float32(q) - mn
    if kind == kinds.Q3_K or kind == kinds.Q2_K:  # two bits at 2 (i % 4) of qs byte 32 (i // 4) + j, i = g % 8
        sb = k // 256
        i = g % 8
        q = int32((qs[n, sb * 64 + (i // 4) * 32 + j] >> (2 * (i % 4))) & 3)
        s = sc[n, k // 16]
        db = luts[0, d[n, sb]]
        if kind == kinds.Q3_K:  # the hmask bit: set means no -4
            q |= int32((qh[n, sb * 32 + j] >> i) & 1) << 2
            return (db * float32(_i8(s))) * float32(q - 4)
        return (db * float32(s & 15)) * float32(q) - luts[0, m[n, sb]] * float32(s >> 4)
    # Q6_K: unpacked signed bytes, an int8 scale per 16
    return luts[0, d[n, k // 256]] * float32(_i8(sc[n, k // 16])) * float32(_i8(qs[n, k]))


@cuda.jit
def matmul_q(kind, qs, qh, sc, d, m, luts, x, out):
    # W (N,K) @ x (T,K) -> out (T,N); one thread per output element
    n, t = cuda.grid(2)
    if n < out.shape[1] and t < out.shape[0]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += _dq(kind, qs, qh, sc, d, m, luts, n, k) * x[t, k]
        out[t, n] = acc


@cuda.jit
def matmul_f32(w, x, out):
    n, t = cuda.grid(2)
    if n < out.shape[1] and t < out.shape[0]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += w[n, k] * x[t, k]
        out[t, n] = acc


@cuda.jit
def embed_q(kind, qs, qh, sc, d, m, luts, ids, out):
    i, k = cuda.grid(2)
    if i < out.shape[0] and k < out.shape[1]:
        out[i, k] = _dq(kind, qs, qh, sc, d, m, luts, ids[i], k)


@cuda.jit
def embed_f32(w, ids, out):
    i, k = cuda.grid(2)
    if i < out.shape[0] and k < out.shape[1]:
        out[i, k] = w[ids[i], k]

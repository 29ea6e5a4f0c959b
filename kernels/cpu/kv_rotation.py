"""The Walsh-Hadamard rotation a quantized KV cache's rows get, as llama.cpp's (its KV cache's attn_rot_k and
attn_rot_v, with ggml's fast transform for the product).

A row's values are spread evenly over its block by an orthonormal rotation before they are quantized, so one
large value no longer sets a whole block's scale (Qwen2's keys have such outliers: with q4_0 keys and no
rotation its perplexity is several times f16's). With a quantized K (q8_0 or a 4- or 5-bit type) of a head
size that is a multiple of 64, each query and key row is rotated in chunks of n values, n the largest power of
two that divides the head size; the dot products are unchanged (H is orthonormal), only the rounding moves.
With a quantized V the value rows are rotated in chunks of 64, and the attention output rotated back by the
same matrix (H H = I). f32, f16 and bf16 rows are stored as they are.

The transform is ggml's ggml_compute_forward_fwht on float32: each value times 1/sqrt(n), then the butterfly
passes (u + v, u - v) for strides 1, 2, 4 ... n/2, in that order: the same bits as llama.cpp's.
"""

import math

import numpy as np
from numba import njit

V_CHUNK = 64  # V's rotation size (llama.cpp found smaller rotations better for V)


@njit(inline="always", nogil=True, cache=True)
def k_chunk(d):
    """K's rotation size for head size d: the largest power of two (64 at least) dividing d; 0: none."""
    if d % 64:
        return 0
    n = 64
    while d % (2 * n) == 0:
        n *= 2
    return n


@njit(inline="always", nogil=True, cache=True)
def v_chunk(d):
    """V's rotation size for head size d: 64 where it divides d; 0: none."""
    return V_CHUNK if d % V_CHUNK == 0 else 0


@njit(nogil=True, cache=True)
def fwht(src, dst, n):
    # dst (d,) = src (d,) rotated in chunks of n (dst may be src)
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(n)))
    for c in range(0, src.shape[0], n):
        for j in range(n):
            dst[c + j] = src[c + j] * scale
        step = 1
        while step < n:
            for i in range(c, c + n, 2 * step):
                for j in range(i, i + step):
                    u = dst[j]
                    v = dst[j + step]
                    dst[j] = u + v
                    dst[j + step] = u - v
            step *= 2


@njit(nogil=True, cache=True)
def rotated(q, n):
    # a copy of q (T, H, D) with each head's row rotated in chunks of n
    out = np.empty_like(q)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            fwht(q[t, h], out[t, h], n)
    return out

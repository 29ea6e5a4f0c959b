"""Activation quantization, once per matmul input and per token row: Q8 (32-element blocks, for the
legacy weight types) and Q8_K (256-element super-blocks, for the K-quants), as llama.cpp computes them."""

import numpy as np
from numba import njit, prange

from .. import simd
from .common import EXACT

@njit(parallel=True, nogil=True, cache=True)
def quantize_q8(x, xq, xd, xs):
    # x (T, K) float32 -> xq (T, K) int8 as uint8, xd (T, K/32) float32 scale, xs (T, K/32) float32 d * sum(q).
    # llama.cpp's quantize_row_q8_1: d = max|x| / 127, q = round(x / d), s = d * sum(q) (for the offset terms).
    # d and s stay float32: rounding them to fp16 as llama.cpp's blocks store them was measured to move
    # the golden top logits further from llama.cpp's (0.42 -> 0.65 at worst), not closer.
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        quantize_q8_row(x, xq, xd, xs, t)


@njit(parallel=True, nogil=True, cache=True)
def quantize_q8k(x, xq, xd, xb, xb16):
    # x (T, K) float32 -> xq (T, K) int8 as uint8, xd (T, K/256) float32, xb (T, K/32) int32 sums per 32
    # (the K-quants' min terms need them per 32-element sub-block), xb16 (T, K/16) sums per 16 (as
    # llama.cpp's bsums: the interleaved Q6_K kernel's offset of 32 per 16-element group).
    # llama.cpp's quantize_row_q8_K: the value of largest magnitude maps to -127 (its sign flips the scale).
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        quantize_q8k_row(x, xq, xd, xb, xb16, t)


@njit(nogil=True, cache=True)
def quantize_q8_row(x, xq, xd, xs, t):
    # token t of quantize_q8
    quantize_q8_blocks(x, xq, xd, xs, t, np.int64(0), x.shape[1] // 32)


# The block loops are written so that LLVM vectorizes them (fastmath EXACT: no NaN, which lets a max be a
# vmaxps; nothing is reassociated but the exact integer sums and maxima): the same bits as one element at a time.
@njit(nogil=True, cache=True, fastmath=EXACT)
def quantize_q8_blocks(x, xq, xd, xs, t, g0, g1):
    # 32-blocks [g0, g1) of token t (see quantize_q8)
    K = x.shape[1]
    for g in range(g0, g1):
        o = t * K + g * 32
        amax = simd.absmax32(x, o)
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
        s = simd.round_store32(x, o, xq, o, inv)
        xd[t, g] = d
        xs[t, g] = d * np.float32(s)


@njit(nogil=True, cache=True)
def quantize_q8k_row(x, xq, xd, xb, xb16, t):
    # token t of quantize_q8k
    quantize_q8k_blocks(x, xq, xd, xb, xb16, t, np.int64(0), x.shape[1] // 256)


@njit(nogil=True, cache=True, fastmath=EXACT)
def quantize_q8k_blocks(x, xq, xd, xb, xb16, t, sb0, sb1):
    # 256-blocks [sb0, sb1) of token t (see quantize_q8k)
    K = x.shape[1]
    for sb in range(sb0, sb1):
        o = t * K + sb * 256
        amax = np.float32(0.0)
        for c in range(8):
            amax = max(amax, simd.absmax32(x, o + c * 32))
        vmax = np.float32(0.0)  # the first value of that magnitude, with its sign
        for c in range(8):
            if simd.absmax32(x, o + c * 32) == amax:
                for j in range(c * 32, c * 32 + 32):
                    if abs(x[t, sb * 256 + j]) == amax:
                        vmax = x[t, sb * 256 + j]
                        break
                break
        if amax == 0:
            xd[t, sb] = 0
            for j in range(256):
                xq[t, sb * 256 + j] = 0
            for j in range(8):
                xb[t, sb * 8 + j] = 0
                xb16[t, sb * 16 + 2 * j] = 0
                xb16[t, sb * 16 + 2 * j + 1] = 0
            continue
        iscale = np.float32(-127.0) / vmax
        for j in range(8):
            s0 = simd.round_store16c(x, o + j * 32, xq, o + j * 32, iscale)
            s1 = simd.round_store16c(x, o + j * 32 + 16, xq, o + j * 32 + 16, iscale)
            xb16[t, sb * 16 + 2 * j] = s0
            xb16[t, sb * 16 + 2 * j + 1] = s1
            xb[t, sb * 8 + j] = s0 + s1
        xd[t, sb] = np.float32(1.0) / iscale

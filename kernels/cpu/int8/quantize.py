"""Activation quantization, once per matmul input and per token row: Q8 (32-element blocks, for the
legacy weight types) and Q8_K (256-element super-blocks, for the K-quants), as llama.cpp computes them."""

import numpy as np
from numba import njit, prange

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


@njit(nogil=True, cache=True)
def quantize_q8_blocks(x, xq, xd, xs, t, g0, g1):
    # 32-blocks [g0, g1) of token t (see quantize_q8)
    for g in range(g0, g1):
        amax = np.float32(0.0)
        for j in range(32):
            amax = max(amax, abs(x[t, g * 32 + j]))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
        s = np.int32(0)
        for j in range(32):
            q = np.int32(np.rint(x[t, g * 32 + j] * inv))
            s += q
            xq[t, g * 32 + j] = np.uint8(q & 255)
        xd[t, g] = d
        xs[t, g] = d * np.float32(s)


@njit(nogil=True, cache=True)
def quantize_q8k_row(x, xq, xd, xb, xb16, t):
    # token t of quantize_q8k
    quantize_q8k_blocks(x, xq, xd, xb, xb16, t, np.int64(0), x.shape[1] // 256)


@njit(nogil=True, cache=True)
def quantize_q8k_blocks(x, xq, xd, xb, xb16, t, sb0, sb1):
    # 256-blocks [sb0, sb1) of token t (see quantize_q8k)
    for sb in range(sb0, sb1):
        amax = np.float32(0.0)
        vmax = np.float32(0.0)
        for j in range(256):
            v = x[t, sb * 256 + j]
            if abs(v) > amax:
                amax = abs(v)
                vmax = v
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
            s = np.int32(0)
            s16 = np.int32(0)
            for l in range(32):
                q = min(np.int32(127), np.int32(np.rint(iscale * x[t, sb * 256 + j * 32 + l])))
                s += q
                s16 += q
                if l == 15:
                    xb16[t, sb * 16 + 2 * j] = s16
                    s16 = np.int32(0)
                xq[t, sb * 256 + j * 32 + l] = np.uint8(q & 255)
            xb[t, sb * 8 + j] = s
            xb16[t, sb * 16 + 2 * j + 1] = s16
        xd[t, sb] = np.float32(1.0) / iscale

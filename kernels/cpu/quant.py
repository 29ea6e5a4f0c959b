"""Numba kernels over repacked quantized weights (fields qs, qh, sc, d, m; see quant/repack.py).

kind: 0 F16, 1 BF16, 2 Q8_0, 3 Q4_0, 4 Q4_1, 5 Q5_0, 6 Q5_1, 7 Q4_K, 8 Q5_K, 9 Q6_K.
"""

import numpy as np
from numba import njit, prange

# 16-bit pattern -> float32 value: row 0 reads it as float16 (the block scales, F16 weights),
# row 1 as bfloat16 (BF16 weights). 512 KiB, shared by every kernel.
_bits = np.arange(65536, dtype=np.uint32)
HALF_TO_F32 = np.stack([_bits.astype(np.uint16).view(np.float16).astype(np.float32),
                        (_bits << 16).view(np.float32)])
del _bits

ROWS_PER_TASK = 16  # rows handed to a thread at a time; each task owns one row buffer


@njit(inline="always", cache=True)
def _i8(v):
    # uint8 bit pattern -> signed value
    return np.int32(v) - 256 if v > 127 else np.int32(v)


@njit(cache=True, fastmath=True)
def dequant_row(kind, qs, qh, sc, d, m, luts, n, y):
    # row n of W -> y (K,) float32; luts: HALF_TO_F32
    K = y.shape[0]
    lut = luts[0]
    if kind == 0 or kind == 1:
        tab = luts[kind]
        for k in range(K):
            y[k] = tab[d[n, k]]
    elif kind == 2:  # Q8_0: 32 int8 per block
        for b in range(K // 32):
            db = lut[d[n, b]]
            for j in range(32):
                y[b * 32 + j] = db * _i8(qs[n, b * 32 + j])
    elif kind == 3:  # Q4_0: byte j holds elements j (low nibble) and j + 16 (high)
        for b in range(K // 32):
            db = lut[d[n, b]]
            for j in range(16):
                q = qs[n, b * 16 + j]
                y[b * 32 + j] = db * (np.int32(q & 15) - 8)
                y[b * 32 + j + 16] = db * (np.int32(q >> 4) - 8)
    elif kind == 4:  # Q4_1
        for b in range(K // 32):
            db = lut[d[n, b]]
            mb = lut[m[n, b]]
            for j in range(16):
                q = qs[n, b * 16 + j]
                y[b * 32 + j] = db * (q & 15) + mb
                y[b * 32 + j + 16] = db * (q >> 4) + mb
    elif kind == 5 or kind == 6:  # Q5_0 / Q5_1: fifth bit of element j is bit j of qh (u32 LE)
        for b in range(K // 32):
            db = lut[d[n, b]]
            h = (np.uint32(qh[n, b * 4]) | (np.uint32(qh[n, b * 4 + 1]) << 8)
                 | (np.uint32(qh[n, b * 4 + 2]) << 16) | (np.uint32(qh[n, b * 4 + 3]) << 24))
            if kind == 5:
                off = np.float32(-16.0) * db
            else:
                off = lut[m[n, b]]
            for j in range(16):
                q = qs[n, b * 16 + j]
                lo = np.int32(q & 15) | np.int32(((h >> j) & 1) << 4)
                hi = np.int32(q >> 4) | np.int32(((h >> (j + 16)) & 1) << 4)
                y[b * 32 + j] = db * lo + off
                y[b * 32 + j + 16] = db * hi + off
    elif kind == 7 or kind == 8:  # Q4_K / Q5_K: 4 groups of 64 per 256; 32 bytes of qs per group
        for b in range(K // 256):
            db = lut[d[n, b]]
            mb = lut[m[n, b]]
            for g in range(4):
                d1 = db * sc[n, b * 16 + 2 * g]
                m1 = mb * sc[n, b * 16 + 8 + 2 * g]
                d2 = db * sc[n, b * 16 + 2 * g + 1]
                m2 = mb * sc[n, b * 16 + 8 + 2 * g + 1]
                base = b * 256 + g * 64
                for l in range(32):
                    q = qs[n, b * 128 + g * 32 + l]
                    lo = np.int32(q & 15)
                    hi = np.int32(q >> 4)
                    if kind == 8:
                        h = qh[n, b * 32 + l]
                        lo |= np.int32((h >> (2 * g)) & 1) << 4
                        hi |= np.int32((h >> (2 * g + 1)) & 1) << 4
                    y[base + l] = d1 * lo - m1
                    y[base + 32 + l] = d2 * hi - m2
    elif kind == 9:  # Q6_K: two halves of 128; ql 64 bytes, qh 32 bytes, 8 scales per half
        for b in range(K // 256):
            db = lut[d[n, b]]
            for half in range(2):
                qlo = b * 128 + half * 64
                qho = b * 64 + half * 32
                so = b * 16 + half * 8
                base = b * 256 + half * 128
                for l in range(32):
                    s = l // 16
                    a = qs[n, qlo + l]
                    c = qs[n, qlo + l + 32]
                    h = qh[n, qho + l]
                    q1 = (np.int32(a & 15) | (np.int32(h & 3) << 4)) - 32
                    q2 = (np.int32(c & 15) | (np.int32((h >> 2) & 3) << 4)) - 32
                    q3 = (np.int32(a >> 4) | (np.int32((h >> 4) & 3) << 4)) - 32
                    q4 = (np.int32(c >> 4) | (np.int32((h >> 6) & 3) << 4)) - 32
                    y[base + l] = db * _i8(sc[n, so + s]) * q1
                    y[base + l + 32] = db * _i8(sc[n, so + s + 2]) * q2
                    y[base + l + 64] = db * _i8(sc[n, so + s + 4]) * q3
                    y[base + l + 96] = db * _i8(sc[n, so + s + 6]) * q4


@njit(parallel=True, cache=True, fastmath=True)
def dequant_rows(kind, qs, qh, sc, d, m, luts, rows, out):
    # W[rows] -> out (len(rows), K) float32; rows int64 (R,)
    for i in prange(rows.shape[0]):
        dequant_row(kind, qs, qh, sc, d, m, luts, rows[i], out[i])


@njit(parallel=True, cache=True, fastmath=True)
def dequant_range(kind, qs, qh, sc, d, m, luts, r0, out):
    # W[r0 : r0 + R] -> out (R, K) float32
    for i in prange(out.shape[0]):
        dequant_row(kind, qs, qh, sc, d, m, luts, r0 + i, out[i])


@njit(parallel=True, cache=True, fastmath=True)
def matmul_rows(kind, qs, qh, sc, d, m, luts, x, out):
    # W (N,K) @ x (T,K) -> out (T,N): each row is decoded once and dotted with every token,
    # so W is read once per call whatever T is (decode steps and small batches).
    N = out.shape[1]
    T, K = x.shape
    n_tasks = (N + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(n_tasks):
        y = np.empty(K, np.float32)
        for n in range(task * ROWS_PER_TASK, min(N, (task + 1) * ROWS_PER_TASK)):
            dequant_row(kind, qs, qh, sc, d, m, luts, n, y)
            for t in range(T):
                acc = np.float32(0.0)
                for k in range(K):
                    acc += y[k] * x[t, k]
                out[t, n] = acc

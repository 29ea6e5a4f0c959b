"""Numba kernels over repacked weights (fields qs, qh, sc, d, m; see quant/repack.py): decoding rows
(embeddings, dequantize) and the float matmul of F16/BF16 weights.

kind: every kind of kernels/kinds.py, row-major (quant/repack.py) and interleaved (layout.py).
"""

import numpy as np
from numba import njit, prange

from .. import kinds
from .simd import IQ4_GRID

_GRID = np.array(IQ4_GRID, np.float32)  # IQ4_NL's 16 values

_x8_has_qh = kinds.predicate("has_qh", within="x8")    # Q5_0_X8, Q5_1_X8
_x8_has_min = kinds.predicate("has_min", within="x8")  # Q4_1_X8, Q5_1_X8

# 16-bit pattern -> float32 value: row 0 reads it as float16 (the block scales, F16 weights),
# row 1 as bfloat16 (BF16 weights). 512 KiB, shared by every kernel.
_bits = np.arange(65536, dtype=np.uint32)
with np.errstate(invalid="ignore"):  # signalling NaNs set the invalid flag on aarch64 (numpy warns); kept as NaNs
    HALF_TO_F32 = np.stack([_bits.astype(np.uint16).view(np.float16).astype(np.float32),
                            (_bits << 16).view(np.float32)])
del _bits

ROWS_PER_TASK = 16  # rows handed to a thread at a time; each task owns one row buffer


@njit(inline="always", cache=True)
def _i8(v):
    # uint8 bit pattern -> signed value, branch-free (so loops over bytes vectorise)
    return (np.int32(v) ^ 128) - 128


@njit(inline="always", cache=True, fastmath=True)
def decode_group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    lut = luts[0]
    base = g * 32
    if kind == kinds.F16 or kind == kinds.BF16:
        tab = luts[kind]
        for j in range(32):
            y[j] = tab[d[n, base + j]]
    elif kinds.is_q8_0(kind):  # 32 int8 per block
        db = lut[d[n, g]]
        for j in range(32):
            y[j] = db * _i8(qs[n, base + j])
    elif kind == kinds.IQ4_NL:  # Q4_0's nibbles, each an index into the grid
        db = lut[d[n, g]]
        for j in range(16):
            q = qs[n, g * 16 + j]
            y[j] = db * _GRID[q & 15]
            y[j + 16] = db * _GRID[q >> 4]
    elif kind == kinds.Q4_0 or kind == kinds.Q4_1:  # byte j holds elements j (low nibble) and j + 16 (high)
        db = lut[d[n, g]]
        off = lut[m[n, g]] if kind == kinds.Q4_1 else np.float32(-8.0) * db
        for j in range(16):
            q = qs[n, g * 16 + j]
            y[j] = db * np.float32(q & 15) + off
            y[j + 16] = db * np.float32(q >> 4) + off
    elif kind == kinds.Q5_0 or kind == kinds.Q5_1:  # the fifth bit of element j is bit j of qh (u32 LE)
        db = lut[d[n, g]]
        off = lut[m[n, g]] if kind == kinds.Q5_1 else np.float32(-16.0) * db
        h = (np.uint32(qh[n, g * 4]) | (np.uint32(qh[n, g * 4 + 1]) << 8)
             | (np.uint32(qh[n, g * 4 + 2]) << 16) | (np.uint32(qh[n, g * 4 + 3]) << 24))
        for j in range(16):
            q = qs[n, g * 16 + j]
            lo = np.int32(q & 15) | np.int32(((h >> j) & 1) << 4)
            hi = np.int32(q >> 4) | np.int32(((h >> (j + 16)) & 1) << 4)
            y[j] = db * np.float32(lo) + off
            y[j + 16] = db * np.float32(hi) + off
    elif kind == kinds.Q4_K or kind == kinds.Q5_K:  # groups 2p, 2p+1 of a super-block share 32 bytes of qs
        sb = g // 8
        i = g % 8
        p = i // 2
        shift = 4 * (i % 2)
        scale = lut[d[n, sb]] * np.float32(sc[n, sb * 16 + i])
        mn = lut[m[n, sb]] * np.float32(sc[n, sb * 16 + 8 + i])
        for l in range(32):
            q = np.int32((qs[n, sb * 128 + p * 32 + l] >> shift) & 15)
            if kind == kinds.Q5_K:
                q |= np.int32((qh[n, sb * 32 + l] >> i) & 1) << 4
            y[l] = scale * np.float32(q) - mn
    elif kinds.is_k23(kind):  # Q3_K/Q2_K row-major: element 32 i + l of a super-block, bits at 2 (i % 4)
        sb = g // 8
        i = g % 8
        db = lut[d[n, sb]]
        for l in range(32):
            q = np.int32((qs[n, sb * 64 + (i // 4) * 32 + l] >> (2 * (i % 4))) & 3)
            s = sc[n, sb * 16 + 2 * i + l // 16]
            if kind == kinds.Q3_K:
                q |= np.int32((qh[n, sb * 32 + l] >> i) & 1) << 2
                y[l] = (db * np.float32(_i8(s))) * np.float32(q - 4)
            else:
                y[l] = (db * np.float32(s & 15)) * np.float32(q) - lut[m[n, sb]] * np.float32(s >> 4)
    elif kinds.is_k23x8(kind):  # eight rows interleaved (layout._k23): a plane of two-bit values per sub-block
        G = n // 8
        r = n % 8
        sb = g // 8
        db = lut[d[G, sb * 8 + r]]
        for l in range(32):
            j = (g % 8) * 2 + l // 16  # the sub-block of 16
            v = (l % 16) // 4
            e = l % 4
            q = np.int32((qs[G, ((sb * 16 + j) * 8 + r) * 4 + e] >> (2 * v)) & 3)
            s = sc[G, (sb * 16 + j) * 8 + r]
            if kind == kinds.Q3_K_X8:
                q |= np.int32((qh[G, ((sb * 8 + j // 2) * 8 + r) * 4 + e] >> (4 * (j % 2) + v)) & 1) << 2
                y[l] = (db * np.float32(_i8(s))) * np.float32(q - 4)
            else:
                y[l] = (db * np.float32(s & 15)) * np.float32(q) - lut[m[G, sb * 8 + r]] * np.float32(s >> 4)
    elif kinds.is_q8x8(kind):  # Q8_0, eight rows interleaved (layout._q8_8)
        G = n // 8
        r = n % 8
        db = lut[d[G, g * 8 + r]]
        for i in range(32):
            y[i] = db * _i8(qs[G, (g * 8 + i // 4) * 32 + r * 4 + i % 4])
    elif kind == kinds.Q4_K_X8 or kind == kinds.Q5_K_X8:  # eight rows interleaved (layout._k8)
        G = n // 8
        r = n % 8
        sb = g // 8
        j = g % 8
        scale = lut[d[G, sb * 8 + r]] * np.float32(sc[G, (sb * 16 + j) * 8 + r])
        mn = lut[m[G, sb * 8 + r]] * np.float32(sc[G, (sb * 16 + 8 + j) * 8 + r])
        for l in range(32):
            o = ((sb * 4 + j // 2) * 8 + l // 4) * 32 + r * 4 + l % 4
            q = np.int32(qs[G, o] & 15) if j % 2 == 0 else np.int32(qs[G, o] >> 4)
            if kind == kinds.Q5_K_X8:
                q |= np.int32((qh[G, (sb * 8 + l // 4) * 32 + r * 4 + l % 4] >> j) & 1) << 4
            y[l] = scale * np.float32(q) - mn
    elif kind == kinds.Q6_K_X8:  # eight rows interleaved, unsigned q (value q - 32)
        G = n // 8
        r = n % 8
        sb = g // 8
        db = lut[d[G, sb * 8 + r]]
        for h in range(2):
            s = db * np.float32(_i8(sc[G, (sb * 16 + (g % 8) * 2 + h) * 8 + r]))
            for l in range(16):
                i = (g % 8) * 32 + h * 16 + l
                y[h * 16 + l] = s * np.float32(np.int32(qs[G, (sb * 64 + i // 4) * 32 + r * 4 + i % 4]) - 32)
    elif kinds.is_interleaved(kind):  # the rest: Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL with eight rows interleaved (layout.interleave8)
        G = n // 8
        r = n % 8
        db = lut[d[G, g * 8 + r]]
        nl = kinds.is_nlx8(kind)
        five = not nl and _x8_has_qh(kind)
        off = lut[m[G, g * 8 + r]] if not nl and _x8_has_min(kind) else np.float32(-16.0 if five else -8.0) * db
        for i in range(32):
            v = i // 4
            b = qs[G, g * 128 + (v % 4) * 32 + r * 4 + i % 4]
            q = np.int32(b & 15) if v < 4 else np.int32(b >> 4)
            if nl:
                y[i] = db * _GRID[q]
                continue
            if five:
                q |= np.int32((qh[G, g * 32 + r * 4 + i % 4] >> v) & 1) << 4
            y[i] = db * np.float32(q) + off
    elif kinds.is_q6_k(kind):  # unpacked signed bytes; one int8 scale per 16 elements
        db = lut[d[n, g // 8]]
        for h in range(2):
            s = db * np.float32(_i8(sc[n, g * 2 + h]))
            for l in range(16):
                y[h * 16 + l] = s * np.float32(_i8(qs[n, base + h * 16 + l]))


@njit(nogil=True, cache=True, fastmath=True)
def dequant_row(kind, qs, qh, sc, d, m, luts, n, y):
    # row n of W -> y (K,) float32; luts: HALF_TO_F32
    K = y.shape[0]
    for g in range(K // 32):
        decode_group(kind, qs, qh, sc, d, m, luts, n, g, y[g * 32:(g + 1) * 32])
    if kinds.is_dense(kind):  # F16/BF16 rows need not be a multiple of 32 long
        for k in range(K // 32 * 32, K):
            y[k] = luts[kind][d[n, k]]


@njit(parallel=True, nogil=True, cache=True, fastmath=True)
def dequant_rows(kind, qs, qh, sc, d, m, luts, rows, out):
    # W[rows] -> out (len(rows), K) float32; rows int64 (R,)
    for i in prange(rows.shape[0]):
        dequant_row(kind, qs, qh, sc, d, m, luts, rows[i], out[i])


# -- float matmul for F16/BF16 weights (the quantized types go through int8/) -------------------
#
# W (N,K) @ x (T,K) -> out (T,N). Each 32-element group of a row adds w * x into 32 per-lane float
# accumulators, summed once per row. EXACT: fast-math without reassociation, so every output element
# is computed by the same sequence of float operations whatever T is: a token's result never depends
# on the rest of the batch.
EXACT = {"nnan", "ninf", "nsz", "arcp", "afn", "contract"}


@njit(inline="always", cache=True, fastmath=EXACT)
def _lane_sum(acc, t):
    s = np.float32(0.0)
    for j in range(32):
        s += acc[t * 32 + j]
    return s


@njit(parallel=True, nogil=True, cache=True, fastmath=EXACT)
def matmul_half(kind, d, luts, x, out):
    # F16 (kind 0) / BF16 (kind 1): d (N, K) uint16 bit patterns
    N = out.shape[1]
    T, K = x.shape
    tab = luts[kind]
    for task in prange((N + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        acc = np.empty(T * 32, np.float32)
        for n in range(task * ROWS_PER_TASK, min(N, (task + 1) * ROWS_PER_TASK)):
            acc[:] = 0
            for g in range(K // 32):
                for t in range(T):
                    for j in range(32):
                        acc[t * 32 + j] += tab[d[n, g * 32 + j]] * x[t, g * 32 + j]
            for k in range(K // 32 * 32, K):  # rows need not be a multiple of 32 long
                for t in range(T):
                    acc[t * 32 + k % 32] += tab[d[n, k]] * x[t, k]
            for t in range(T):
                out[t, n] = _lane_sum(acc, t)

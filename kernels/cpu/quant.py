"""Numba kernels over repacked weights (fields qs, qh, sc, d, m; see quant/repack.py): decoding rows
(embeddings, dequantize) and the float matmul of F16/BF16 weights.

kind: every kind of kernels/kinds.py, row-major (quant/repack.py) and interleaved (layout.py); how each is
decoded is its weight format's (kernels/formats).
"""

import numpy as np
from numba import njit, prange
from numba.extending import overload

from .. import formats, kinds
from . import simd

# 16-bit pattern -> float32 value: row 0 reads it as float16 (the block scales, F16 weights),
# row 1 as bfloat16 (BF16 weights). 512 KiB, shared by every kernel.
HALF_F16, HALF_BF16 = 0, 1  # matmul_half's kind: the row of HALF_TO_F32 its weights read
_bits = np.arange(65536, dtype=np.uint32)
with np.errstate(invalid="ignore"):  # signalling NaNs set the invalid flag on aarch64 (numpy warns); kept as NaNs
    HALF_TO_F32 = np.stack([_bits.astype(np.uint16).view(np.float16).astype(np.float32),
                            (_bits << 16).view(np.float32)])
del _bits

ROWS_PER_TASK = 16  # rows handed to a thread at a time; each task owns one row buffer

# decode_group(kind, qs, qh, sc, d, m, luts, n, g, y): elements [32 g, 32 g + 32) of row n of W -> y (32,)
# float32, for every kind: each weight format's decode (kernels/formats: `group`), compiled inline, behind a
# dispatch on the kind generated from the registry (`decode_group.py_func.source`). No cache of its own
# (generated code has no source file to key one): it is inlined into dequant_row, which is cached.
_GROUPS = {mod: njit(inline="always", fastmath=True)(mod.group) for mod in formats.MODULES}
decode_group = njit(inline="always", fastmath=True)(formats.dispatch(
    "decode_group", "kind, qs, qh, sc, d, m, luts, n, g, y", _GROUPS, range(kinds.COUNT), returns=False))


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


def dequant_rows_of(kind, qs, qh, sc, d, m, luts, rows, out, isa):
    """dequant_rows, one row after another, compiled for the one kind the type of `isa` names (simd.isa_tag):
    the embedding lookup of a model's own kind (units.embedding_unit), a fraction of the compile of every
    kind's decode. One thread: a prompt's rows take a millisecond or two, a decode step's one row less than
    waking the others would. A matrix of another kind leaves out untouched."""


@overload(dequant_rows_of, jit_options={"fastmath": True})
def _dequant_rows_of(kind, qs, qh, sc, d, m, luts, rows, out, isa):
    (own,) = simd.kinds_of(isa)
    decode = njit(inline="always", fastmath=True)(formats.dispatch(
        "decode_group", "kind, qs, qh, sc, d, m, luts, n, g, y", _GROUPS, (own,), returns=False))
    dense = kinds.is_dense(own)

    def impl(kind, qs, qh, sc, d, m, luts, rows, out, isa):
        if kind != own:
            return
        K = out.shape[1]
        for i in range(rows.shape[0]):
            n = rows[i]
            y = out[i]
            for g in range(K // 32):
                decode(kind, qs, qh, sc, d, m, luts, n, g, y[g * 32:(g + 1) * 32])
            if dense:  # as dequant_row: F16/BF16 rows need not be a multiple of 32 long
                for k in range(K // 32 * 32, K):
                    y[k] = luts[kind][d[n, k]]
    return impl


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


HALF_ROWS = 4  # rows of a task widened to float32 together


@njit(inline="always", cache=True)
def _lanes32(a, ao, x, xo, G, lanes):
    # lanes (32,) = the fused multiply-adds of a.flat[ao:] (float32, or F16 bits widened as read) and x.flat[xo:]
    # over G groups of 32, lane by lane in group order, from 0.0
    a0 = a1 = a2 = a3 = simd.zerof()
    for g in range(G):
        o = g * 32
        a0 = simd.fma8(simd.loadf8(a, ao + o), simd.loadf8(x, xo + o), a0)
        a1 = simd.fma8(simd.loadf8(a, ao + o + 8), simd.loadf8(x, xo + o + 8), a1)
        a2 = simd.fma8(simd.loadf8(a, ao + o + 16), simd.loadf8(x, xo + o + 16), a2)
        a3 = simd.fma8(simd.loadf8(a, ao + o + 24), simd.loadf8(x, xo + o + 24), a3)
    simd.storef8(lanes, 0, a0)
    simd.storef8(lanes, 8, a1)
    simd.storef8(lanes, 16, a2)
    simd.storef8(lanes, 24, a3)


@njit(parallel=True, nogil=True, cache=True, fastmath=EXACT)
def matmul_half(kind, d, luts, x, out):
    # F16 (kind 0) / BF16 (kind 1): d (N, K) uint16 bit patterns. Each row's values are widened once (not once a
    # token), then every output element is 32 lanes of fused multiply-adds over its row's groups of 32 in order
    # (four f32x8 vectors), its tail (K % 32) added to the first lanes, the lanes summed in order from 0.0: the
    # same bits whatever the tokens, and as the scalar loop with contracted multiply-adds computed them
    N = out.shape[1]
    T, K = x.shape
    tab = luts[kind]
    G = K // 32
    for task in prange((N + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        w = np.empty((HALF_ROWS, K), np.float32)
        lanes = np.empty(32, np.float32)
        end = min(N, (task + 1) * ROWS_PER_TASK)
        for n0 in range(task * ROWS_PER_TASK, end, HALF_ROWS):
            R = min(HALF_ROWS, end - n0)
            if kind != HALF_F16 or T > 1:  # (a token of F16: widened as it is read, vcvtph2ps, the same values)
                for r in range(R):
                    for k in range(K):
                        w[r, k] = tab[d[n0 + r, k]]
            for t in range(T):
                for r in range(R):
                    xo = t * K
                    if kind == HALF_F16 and T == 1:
                        _lanes32(d, (n0 + r) * K, x, xo, G, lanes)
                    else:
                        _lanes32(w, r * K, x, xo, G, lanes)
                    for k in range(G * 32, K):  # rows need not be a multiple of 32 long
                        lanes[k % 32] += tab[d[n0 + r, k]] * x[t, k]
                    s = np.float32(0.0)
                    for j in range(32):
                        s += lanes[j]
                    out[t, n0 + r] = s

"""The row-wise ops between a layer's matmuls (norms, quantization, residual adds, biases), shared by every
part of the compiled step.

Each runs in a plain loop for a few rows (decode: a parallel region's launch costs more than the work) and
in parallel from PAR_ROWS rows up (prefill). The row functions are the same either way, so the choice never
changes a result.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...kinds import is_dense, uses_q8k
from .. import int8, ops

PAR_ROWS = 16


def needs(kind: int) -> int:
    """Which quantization of its input a matrix of this kind reads: bit 0 Q8 (legacy types), bit 1 Q8_K
    (K-quants), 0 for a float matrix."""
    return 0 if is_dense(kind) else (2 if uses_q8k(kind) else 1)


@njit(nogil=True, cache=True)
def alloc_q(T, K, need):
    # room for x (T, K) quantized: (Q8 arrays, Q8_K arrays), empty where no matrix reading x needs one
    a = (np.empty((T, K if need & 1 else 0), np.uint8), np.empty((T, K // 32 if need & 1 else 0), np.float32),
         np.empty((T, K // 32 if need & 1 else 0), np.float32))
    b = (np.empty((T, K if need & 2 else 0), np.uint8), np.empty((T, K // 256 if need & 2 else 0), np.float32),
         np.empty((T, K // 32 if need & 2 else 0), np.int32), np.empty((T, K // 16 if need & 2 else 0), np.int32))
    return a, b


@njit(nogil=True, cache=True)
def norm(x, w, eps, out):
    # rmsnorm of every row of x (R, D) into out
    if x.shape[0] >= PAR_ROWS:
        ops.rmsnorm(x, w, eps, out)
    else:
        for r in range(x.shape[0]):
            ops.rmsnorm_row(x, w, eps, out, r)


@njit(parallel=True, nogil=True, cache=True)
def _quantize_rows(x, need, a, b):
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        if need & 1:
            int8.quantize_q8_row(x, a[0], a[1], a[2], t)
        if need & 2:
            int8.quantize_q8k_row(x, b[0], b[1], b[2], b[3], t)


@njit(nogil=True, cache=True)
def quantize(x, need):
    # x (T, K) -> (Q8 arrays, Q8_K arrays), each made only when some matrix reading x needs it
    T, K = x.shape
    a, b = alloc_q(T, K, need)
    if T >= PAR_ROWS:
        _quantize_rows(x, need, a, b)
    else:
        for t in range(T):
            if need & 1:
                int8.quantize_q8_row(x, a[0], a[1], a[2], t)
            if need & 2:
                int8.quantize_q8k_row(x, b[0], b[1], b[2], b[3], t)
    return a, b


@njit(parallel=True, nogil=True, cache=True)
def _add_rows(x, f):
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        ops.add_row(x, f, t)


@njit(nogil=True, cache=True)
def add(x, f):
    # x += f, row by row
    if x.shape[0] >= PAR_ROWS:
        _add_rows(x, f)
    else:
        for t in range(x.shape[0]):
            ops.add_row(x, f, t)


@njit(nogil=True, cache=True)
def add_bias(x, b):
    # x (T, D) += b (D,) on every row: a few thousand adds, in a plain loop even for prefill
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += b[i]

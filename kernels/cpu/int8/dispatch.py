"""The matmul entry point: W (N, K) @ x (T, K) -> out (T, N), each matrix to its family's kernel."""

import numpy as np
from numba import njit, prange
from numba.extending import overload

from ... import kinds
from .. import calls
from ..simd import kinds_of
from . import k23, k45, kx8, q6_k, q8_0, q8x8, q45, x8

# -- matmuls: W (N, K) @ x (T, K) -> out (T, N) --------------------------------------------------
#
# `matmuls` hands two tasks of rows per thread (`threads`: numba's thread count) to the threads;
# `rows_any` computes a task's rows for every token with the kernel of the matrix's kind. Every output
# element is reduced by one chain of operations whatever the batch, so a token's result never depends
# on the rest of the batch.


@njit(inline="always", cache=True)
def rows_per_task(n, threads):
    # two tasks per thread, a multiple of 16 rows each (interleaved weights come in groups of eight, and the
    # avx512 kernels take two groups per vector: an odd group would run a half-empty vector): a task is one
    # call with a dozen array arguments, whose reference counting is not free
    per = -(-n // (2 * threads))
    return max(16, -(-per // 16) * 16)


def as_tuple(w) -> tuple:
    """A repacked matrix (quant/repack.py's QTensor) as the (kind, qs, qh, sc, d, m) tuple `matmuls` takes."""
    return (np.int64(w.kind), w.qs, w.qh, w.sc, w.d, w.m)


def rows_any(w, q8, q8k, luts, out, n0, n1, isa):
    """Rows [n0, n1) of W @ x -> out (T, N) for every token. w: a quantized matrix as (kind, qs, qh, sc,
    d, m) (quant/repack.py's row-major kinds, layout.py's interleaved ones: kinds.py); q8, q8k: x quantized (quantize_q8,
    quantize_q8k). Only the kinds the type of `isa` names are compiled in (simd.isa_tag); a matrix of
    another kind leaves out untouched."""


@overload(rows_any)
def _rows_any(w, q8, q8k, luts, out, n0, n1, isa):
    ks = kinds_of(isa)
    # branches on these closure constants are pruned before typing: the kernels of absent kinds are
    # never compiled
    h = {fam: bool(ks & set(members)) for fam, members in kinds.FAMILIES.items()}
    h_q8_0, h_q45, h_k45, h_q6_k = h["q8_0"], h["q45"], h["k45"], h["q6_k"]
    h_x8, h_kx8, h_q8x8, h_nlx8 = h["x8"], h["kx8"], h["q8x8"], h["nlx8"]
    h_k23, h_k23x8 = h["k23"], h["k23x8"]
    h_mx4, h_mxx8 = h["mx4"], h["mxx8"]

    def impl(w, q8, q8k, luts, out, n0, n1, isa):
        kind, qs, qh, sc, d, m = w
        if h_x8:
            if kinds.is_x8(kind):
                x8.rows_x8(isa, kind, qs, qh, d, m, luts, q8[0], q8[1], q8[2], out, n0, n1)
        if h_kx8:
            if kinds.is_kx8(kind):
                kx8.rows_kx8(isa, kind, qs, qh, sc, d, m, luts, q8k[0], q8k[1], q8k[2], q8k[3], out, n0, n1)
        if h_q8x8 or h_nlx8 or h_mxx8:  # Q8_0, IQ4_NL and MXFP4: the same kernels, with their own weight loads
            if kinds.is_q8x8(kind) or kinds.is_nlx8(kind) or kinds.is_mxx8(kind):
                q8x8.rows_q8x8(isa, kind, qs, d, luts, q8[0], q8[1], out, n0, n1)
        if h_q8_0:
            if kinds.is_q8_0(kind):
                q8_0.rows_q8_0(isa, qs, d, luts, q8[0], q8[1], out, n0, n1)
        if h_q45:
            if kinds.is_q45(kind):
                q45.rows_q45(isa, kind, qs, qh if q45.has_qh(kind) else qs, d, m, luts, q8[0], q8[1], q8[2], out, n0, n1)
        if h_k45:
            if kinds.is_k45(kind):
                k45.rows_k45(isa, kind, qs, qh, sc, d, m, luts, q8k[0], q8k[1], q8k[2], out, n0, n1)
        if h_q6_k:
            if kinds.is_q6_k(kind):
                q6_k.rows_q6_k(isa, qs, sc, d, luts, q8k[0], q8k[1], out, n0, n1)
        if h_k23x8:
            if kinds.is_k23x8(kind):
                k23.rows_k23x8(isa, kind, qs, qh, sc, d, m, luts, q8k[0], q8k[1], q8k[3], out, n0, n1)
        if h_k23:
            if kinds.is_k23(kind):
                k23.rows_k23(isa, kind, qs, qh, sc, d, m, luts, q8k[0], q8k[1], q8k[3], out, n0, n1)
        if h_mx4:
            if kinds.is_mx4(kind):
                q8_0.rows_mx4(isa, qs, d, luts, q8[0], q8[1], out, n0, n1)
    return impl


@njit(parallel=True, nogil=True, cache=True)
def matmuls(w0, w1, w2, n_mats, q8, q8k, luts, o0, o1, o2, threads, table):
    # W_j (N_j, K) @ x (T, K) -> o_j (T, N_j) for the first n_mats of (w0, w1, w2), all reading the same x
    # (q/k/v, gate/up), in one parallel region: the matrices' rows one after another (each matrix starting at
    # a multiple of 16) are cut into equal tasks, a task running the rows of each matrix it spans. prange
    # gives each thread a contiguous run of tasks, so equal tasks are equal work whatever the matrices' sizes
    # (a task per matrix share, as q with its smaller k and v, left one thread most of the work). table:
    # units.Table's addresses; a task runs rows_any of its matrix's kind through the unit of that kind's
    # family (compiled apart, called by address), that of the small path for a few tokens (calls.slot)
    n0 = o0.shape[1]
    n1 = o1.shape[1] if n_mats > 1 else 0
    n2 = o2.shape[1] if n_mats > 2 else 0
    s1 = -(-n0 // 16) * 16  # where matrix 1's rows start in the joint row space
    s2 = s1 + -(-n1 // 16) * 16
    total = s2 + n2 if n_mats > 2 else (s1 + n1 if n_mats > 1 else n0)
    per = rows_per_task(total, threads)
    for task in prange(-(-total // per)):
        r0 = np.int64(task) * per
        r1 = min(total, r0 + per)
        _span(w0, o0, 0, n0, r0, r1, q8, q8k, luts, table)
        if n_mats > 1:
            _span(w1, o1, s1, n1, r0, r1, q8, q8k, luts, table)
        if n_mats > 2:
            _span(w2, o2, s2, n2, r0, r1, q8, q8k, luts, table)


@njit(inline="always", cache=True)
def _span(w, o, start, n, r0, r1, q8, q8k, luts, table):
    # the rows of one matrix (rows [start, start + n) of the joint row space) that task rows [r0, r1) cover
    a = max(r0, start) - start
    b = min(r1, start + n) - start
    if a < b:
        calls.call_rows(table[calls.slot(w[0], o.shape[0])], w, q8, q8k, luts, o, np.int64(a), np.int64(b))

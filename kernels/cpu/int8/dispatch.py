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
    # (q/k/v, gate/up), in one parallel region: each matrix's rows are cut into tasks, and all run together.
    # table: units.Table's addresses; a task runs rows_any of its matrix's kind through the unit of that
    # kind's family (compiled apart, called by address), that of the small path for a few tokens (calls.slot)
    per0 = rows_per_task(o0.shape[1], threads)
    per1 = rows_per_task(o1.shape[1], threads)
    per2 = rows_per_task(o2.shape[1], threads)
    t0 = -(-o0.shape[1] // per0)
    t1 = -(-o1.shape[1] // per1) if n_mats > 1 else 0
    t2 = -(-o2.shape[1] // per2) if n_mats > 2 else 0
    for task in prange(t0 + t1 + t2):
        if task < t0:
            calls.call_rows(table[calls.slot(w0[0], o0.shape[0])], w0, q8, q8k, luts, o0, np.int64(task * per0),
                            np.int64(min(o0.shape[1], (task + 1) * per0)))
        elif task < t0 + t1:
            i = task - t0
            calls.call_rows(table[calls.slot(w1[0], o1.shape[0])], w1, q8, q8k, luts, o1, np.int64(i * per1),
                            np.int64(min(o1.shape[1], (i + 1) * per1)))
        else:
            i = task - t0 - t1
            calls.call_rows(table[calls.slot(w2[0], o2.shape[0])], w2, q8, q8k, luts, o2, np.int64(i * per2),
                            np.int64(min(o2.shape[1], (i + 1) * per2)))

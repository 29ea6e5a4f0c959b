"""Low-rank adapters (LoRA) beside a matrix: W x + sum over adapters of s * B (A x), as llama.cpp's build_lora_mm.

The adapted matrix keeps its quantized weights as they are (never merged): its int8 matmul runs as always, and
each adapter adds its low-rank product after it, row by row with each row's own scale (0: the row's sequence
does not use that adapter), so one batch carries sequences with different adapters, or none (a gathered
low-rank product per sequence, as Punica's and S-LoRA's kernels). A model's adapters are packed once
(:func:`pack`, a :class:`LoraPart`): every adapted matrix by an id, its pairs in adapter order, A transposed and
B as float32 or, where every value of a tensor is a float16 (an F16 file's), as float16 bits widened as they
are read (half the memory traffic). The per-op forward (backend.matmul on an :class:`Adapted`) and the compiled
step (step.py: after each matmul of the attention and the FFN) call the same :func:`apply`; every row's sums run
in one fixed order, whatever else the batch holds and whichever of the two runs it: a request batched with
others gets the bits it gets alone.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from . import simd
from .calls import call_codegen, check

_KC = 512  # input columns of a partial sum of A x (a row's partial sums added in order after)
_NC = 256  # output columns a task of B u computes
PAR_WORK = 1 << 16  # multiply-adds of a product under which it runs in a plain loop (a decode step's few rows)


class LoraPart(NamedTuple):
    """A model's adapters packed for :func:`apply`: each adapted matrix (an id) with its adapters' pairs."""

    on: int  # 1: adapters are packed here (0: a stand-in, never read)
    first: np.ndarray  # (n_ids + 1,) int64: matrix id m's pairs are pairs[first[m]:first[m + 1]], in adapter order
    # (P, 7) int64 per pair: adapter, rank R, padded rank Rp (a multiple of 8), A's offset (A transposed, (K, Rp),
    # zeros past R), A held as float16 bits (1, in w16) or float32 (0, in w32), B's offset (B transposed in blocks of
    # 32 output columns, each (R, 32): `_tiles`), B held as halves
    pairs: np.ndarray
    alpha: np.ndarray  # (P,) float32: the adapter's alpha (0: none, the scale alone)
    rank: np.ndarray  # (P,) float32
    w32: np.ndarray  # float32 values
    w16: np.ndarray  # uint16 float16 bit patterns
    of_mat: np.ndarray  # (n_mats,) int64: the compiled step's matrix index -> the matrix id here (-1: none)


def _fits_half(a: np.ndarray) -> bool:
    return bool(np.array_equal(a.astype(np.float16).astype(np.float32), a))


def pack(matrices: list) -> LoraPart:
    """matrices: for each matrix id, its pairs [(adapter, A transposed (K, R), B transposed (R, N), alpha, rank)]
    -> the LoraPart (of_mat empty: LoraPart._replace it for a step). A transposed shared by several matrices (the
    splits of a fused one) is held once."""
    w32, w16, n32, n16 = [], [], 0, 0
    held = {}  # id of an A -> (offset, halves)

    def put(v):
        nonlocal n32, n16
        if _fits_half(v):
            w16.append(v.astype(np.float16).view(np.uint16).ravel())
            n16 += v.size
            return n16 - v.size, 1
        w32.append(np.ascontiguousarray(v, np.float32).ravel())
        n32 += v.size
        return n32 - v.size, 0

    first, rows, alpha, rank = [0], [], [], []
    for pairs in matrices:
        for j, at, bt, al, r in pairs:
            if id(at) not in held:
                rp = -(-r // 8) * 8
                pad = np.zeros((at.shape[0], rp), np.float32)
                pad[:, :r] = at
                held[id(at)] = (*put(pad), at)  # (keeps `at` alive: its id is not reused meanwhile)
            ao, ah = held[id(at)][:2]
            bo, bh = put(_tiles(bt))
            rows.append((j, r, -(-r // 8) * 8, ao, ah, bo, bh))
            alpha.append(al or 0.0)
            rank.append(r)
        first.append(len(rows))
    cat = lambda parts, dt: np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(8, dt)  # noqa: E731
    return LoraPart(1, np.array(first, np.int64), np.array(rows, np.int64).reshape(-1, 7),
                    np.array(alpha, np.float32), np.array(rank, np.float32), cat(w32, np.float32), cat(w16, np.uint16),
                    np.zeros(0, np.int64))


def _tiles(bt: np.ndarray) -> np.ndarray:
    """B transposed (R, N) in the order the kernel reads it: blocks of 32 output columns one after the other, each
    (R, 32) contiguous (B u streams through memory), the last block as wide as N rounded up to 8 (zeros past N)."""
    r, n = bt.shape
    n_pad = -(-n // 8) * 8
    padded = np.zeros((r, n_pad), np.float32)
    padded[:, :n] = bt
    return np.concatenate([padded[:, c:c + 32].ravel() for c in range(0, n_pad, 32)])


def off() -> LoraPart:
    """A stand-in for a model without adapters (on 0): the same types as a real one's."""
    z = np.zeros(1, np.int64)
    return LoraPart(0, z, np.zeros((0, 7), np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32),
                    np.zeros(8, np.float32), np.zeros(8, np.uint16), z)


NO_ROWS = np.zeros((0, 0), np.float32)  # a model without adapters: the rows' scales (never read)


@njit(nogil=True, cache=True)
def _down_w(x, w, t, j0, j1, ao, rp, part, at):
    # A x[t] over columns j0:j1 of x, A transposed at w[ao:] (float32, or float16 bits widened as read) -> part[at :
    # at + rp]: each lane's multiply-adds over the even columns and over the odd ones in order from 0 (two chains:
    # the latency of one would bound it), the two sums added
    rb = 0
    odd = (j1 - j0) % 2
    while rb < rp:
        two = rb + 16 <= rp  # two vectors of the rank at once (a rank of 16: all of it)
        a0 = a1 = b0 = b1 = simd.zerof()
        for j in range(j0, j1 - odd, 2):
            o = ao + j * rp + rb
            xa, xb = simd.splatf(x[t, j]), simd.splatf(x[t, j + 1])
            a0 = simd.fma8(simd.loadf8(w, o), xa, a0)
            b0 = simd.fma8(simd.loadf8(w, o + rp), xb, b0)
            if two:
                a1 = simd.fma8(simd.loadf8(w, o + 8), xa, a1)
                b1 = simd.fma8(simd.loadf8(w, o + rp + 8), xb, b1)
        if odd:
            o = ao + (j1 - 1) * rp + rb
            xa = simd.splatf(x[t, j1 - 1])
            a0 = simd.fma8(simd.loadf8(w, o), xa, a0)
            if two:
                a1 = simd.fma8(simd.loadf8(w, o + 8), xa, a1)
        simd.storef8(part, at + rb, simd.add8(a0, b0))
        if two:
            simd.storef8(part, at + rb + 8, simd.add8(a1, b1))
        rb += 16 if two else 8


@njit(nogil=True, cache=True)
def _down(x, lo, t, p, c, part, at):
    # pair p's A x[t] over the input's chunk c -> part[at : at + Rp]
    j0 = c * _KC
    j1 = min(x.shape[1], j0 + _KC)
    if lo.pairs[p, 4]:
        _down_w(x, lo.w16, t, j0, j1, lo.pairs[p, 3], lo.pairs[p, 2], part, at)
    else:
        _down_w(x, lo.w32, t, j0, j1, lo.pairs[p, 3], lo.pairs[p, 2], part, at)


@njit(nogil=True, cache=True)
def _up_w(w, bo, r_n, u, n0, n1, buf):
    # buf[: n1 - n0] (rounded up to 8) = B u over outputs n0:n1 (n0 a multiple of 32), B at w[bo:] in blocks of 32
    # outputs (`_tiles`): each output's multiply-adds in the order of the rank from 0, a block's 32 at a time (four
    # chains)
    end = n0 + (n1 - n0 + 7) // 8 * 8
    n = n0
    while n + 32 <= end:
        o = bo + n * r_n  # (the blocks before are whole: R x 32 each)
        c0 = c1 = c2 = c3 = simd.zerof()
        for r in range(r_n):
            ur = simd.splatf(u[r])
            c0 = simd.fma8(simd.loadf8(w, o), ur, c0)
            c1 = simd.fma8(simd.loadf8(w, o + 8), ur, c1)
            c2 = simd.fma8(simd.loadf8(w, o + 16), ur, c2)
            c3 = simd.fma8(simd.loadf8(w, o + 24), ur, c3)
            o += 32
        simd.storef8(buf, n - n0, c0)
        simd.storef8(buf, n - n0 + 8, c1)
        simd.storef8(buf, n - n0 + 16, c2)
        simd.storef8(buf, n - n0 + 24, c3)
        n += 32
    if n < end:  # the last block, narrower
        bw = end - n
        for k in range(0, bw, 8):
            c0 = simd.zerof()
            for r in range(r_n):
                c0 = simd.fma8(simd.loadf8(w, bo + n * r_n + r * bw + k), simd.splatf(u[r]), c0)
            simd.storef8(buf, n + k - n0, c0)


@njit(nogil=True, cache=True)
def _up(lo, scales, t, m, n0, n1, part, idx, base, n_c, rmax, out):
    # out[t, n0:n1] += each of matrix m's pairs' scale * B u, u = A x[t] (its partial sums in part, added in
    # order), pair after pair in adapter order
    buf = np.empty(_NC, np.float32)
    u = np.empty(rmax, np.float32)
    for p in range(lo.first[m], lo.first[m + 1]):
        s = scales[t, lo.pairs[p, 0]]
        if s == 0:
            continue
        if lo.alpha[p] != 0:
            s = s * lo.alpha[p] / lo.rank[p]
        r_n = lo.pairs[p, 1]
        i = idx[t, base + p - lo.first[m]]
        for r in range(r_n):
            v = part[(i * n_c) * rmax + r]
            for c in range(1, n_c):
                v += part[(i * n_c + c) * rmax + r]
            u[r] = v
        if lo.pairs[p, 6]:
            _up_w(lo.w16, lo.pairs[p, 5], r_n, u, n0, n1, buf)
        else:
            _up_w(lo.w32, lo.pairs[p, 5], r_n, u, n0, n1, buf)
        for n in range(n0, n1):
            out[t, n] += buf[n - n0] * s


@njit(parallel=True, nogil=True, cache=True)
def _downs_par(x, lo, tp, n_c, part, rmax):
    for i in prange(tp.shape[0] * n_c):
        k, c = i // n_c, i % n_c
        _down(x, lo, tp[k, 0], tp[k, 1], c, part, (k * n_c + c) * rmax)


@njit(parallel=True, nogil=True, cache=True)
def _ups_par(lo, scales, tasks, ms, part, idx, bases, n_c, rmax, o0, o1, o2):
    for i in prange(tasks.shape[0]):
        _up_task(lo, scales, tasks, np.int64(i), ms, part, idx, bases, n_c, rmax, o0, o1, o2)


@njit(inline="always", nogil=True, cache=True)
def _up_task(lo, scales, tasks, i, ms, part, idx, bases, n_c, rmax, o0, o1, o2):
    # task i of B u: (which of the call's matrices, row, output columns n0:n1)
    k, t, n0, n1 = tasks[i, 0], tasks[i, 1], tasks[i, 2], tasks[i, 3]
    if k == 0:
        _up(lo, scales, t, ms[0], n0, n1, part, idx, bases[0], n_c, rmax, o0)
    elif k == 1:
        _up(lo, scales, t, ms[1], n0, n1, part, idx, bases[1], n_c, rmax, o1)
    else:
        _up(lo, scales, t, ms[2], n0, n1, part, idx, bases[2], n_c, rmax, o2)


@njit(nogil=True, cache=True)
def apply(x, lo, m0, m1, m2, o0, o1, o2, scales):
    # x (T, K) float32, the input of up to three matrices (ids m0, m1, m2; -1: none) whose outputs are o0, o1, o2
    # (T, N_k) -> each o_k += its adapters' low-rank products at the rows' scales (T, n_adapters) (0: not that
    # row's adapter). The products of A (each row's once per distinct A: a fused matrix's splits share theirs)
    # run first, in chunks of the input, then those of B, in chunks of the output; in parallel for much work
    T, K = x.shape
    ms = np.array([m0, m1, m2], np.int64)
    bases = np.zeros(3, np.int64)  # where each matrix's pairs start among the call's
    n_p = 0
    rmax = 8
    for k in range(3):
        bases[k] = n_p
        if ms[k] >= 0:
            n_p += lo.first[ms[k] + 1] - lo.first[ms[k]]
            for p in range(lo.first[ms[k]], lo.first[ms[k] + 1]):
                rmax = max(rmax, lo.pairs[p, 2])
    if n_p == 0:
        return
    idx = np.full((T, n_p), -1, np.int64)  # (row, the call's pair) -> its row of tp
    tp = np.empty((T * n_p, 2), np.int64)  # (row, pair) of each A x to compute
    n_tp = 0
    for k in range(3):
        if ms[k] < 0:
            continue
        f = lo.first[ms[k]]
        for p in range(f, lo.first[ms[k] + 1]):
            for t in range(T):
                if scales[t, lo.pairs[p, 0]] == 0:
                    continue
                same = -1  # an earlier pair of the call with the same A (and adapter)
                for k2 in range(k):
                    if ms[k2] >= 0:
                        for p2 in range(lo.first[ms[k2]], lo.first[ms[k2] + 1]):
                            if lo.pairs[p2, 3] == lo.pairs[p, 3] and lo.pairs[p2, 4] == lo.pairs[p, 4]:
                                same = idx[t, bases[k2] + p2 - lo.first[ms[k2]]]
                if same >= 0:
                    idx[t, bases[k] + p - f] = same
                else:
                    tp[n_tp, 0], tp[n_tp, 1] = t, p
                    idx[t, bases[k] + p - f] = n_tp
                    n_tp += 1
    if n_tp == 0:
        return
    n_c = (K + _KC - 1) // _KC
    part = np.empty(n_tp * n_c * rmax, np.float32)
    if n_tp * K * rmax >= PAR_WORK:
        _downs_par(x, lo, tp[:n_tp], n_c, part, rmax)
    else:
        for k in range(n_tp):
            for c in range(n_c):
                _down(x, lo, tp[k, 0], tp[k, 1], c, part, (k * n_c + c) * rmax)
    # B u: a task per (matrix, row with a pair at work, chunk of the output)
    ns = np.array([o0.shape[1], o1.shape[1], o2.shape[1]], np.int64)
    n_tasks = 0
    for k in range(3):
        if ms[k] >= 0:
            n_tasks += T * ((ns[k] + _NC - 1) // _NC)
    tasks = np.empty((n_tasks, 4), np.int64)
    n_tasks = 0
    work = 0
    for k in range(3):
        if ms[k] < 0:
            continue
        n_pk = lo.first[ms[k] + 1] - lo.first[ms[k]]
        for t in range(T):
            busy = False
            for q in range(n_pk):
                if idx[t, bases[k] + q] >= 0:
                    busy = True
                    work += ns[k] * lo.pairs[lo.first[ms[k]] + q, 1]
            if busy:
                for n0 in range(0, ns[k], _NC):
                    tasks[n_tasks, 0], tasks[n_tasks, 1] = k, t
                    tasks[n_tasks, 2], tasks[n_tasks, 3] = n0, min(ns[k], n0 + _NC)
                    n_tasks += 1
    if work >= PAR_WORK:
        _ups_par(lo, scales, tasks[:n_tasks], ms, part, idx, bases, n_c, rmax, o0, o1, o2)
    else:
        for i in range(n_tasks):
            _up_task(lo, scales, tasks, i, ms, part, idx, bases, n_c, rmax, o0, o1, o2)


@njit(parallel=True, nogil=True, cache=True)
def lora_embed_add(ids, a, bt, scales, out):
    # token embeddings' adapter (A and B swapped, as llama.cpp's build_inp_embd): a (vocab, R), bt (R, dim)
    # -> out (T, dim) += scales[t] * B a[ids[t]]
    r_n, n_n = bt.shape
    for t in prange(ids.shape[0]):
        s = scales[t]
        if s == 0.0:
            continue
        acc = np.zeros(n_n, np.float32)
        for r in range(r_n):
            ur = a[ids[t], r]
            for n in range(n_n):
                acc[n] += bt[r, n] * ur
        for n in range(n_n):
            out[t, n] += acc[n] * s


@cache
def lora_sig() -> tuple:
    """apply's argument types (x, lo, m0, m1, m2, o0, o1, o2, scales), as the step calls it: a unit of its own
    (call_lora), compiled only for a model with adapters (the step of a model without stays as it was)."""
    f2 = types.Array(types.float32, 2, "C")
    return (f2, numba.typeof(off()), types.int64, types.int64, types.int64, f2, f2, f2, f2)


@intrinsic
def call_lora(typingctx, addr, x, lo, m0, m1, m2, o0, o1, o2, scales):
    """The LoRA unit at addr (Table slot LORA: `apply` compiled for lora_sig, the per-op forward's own
    function): apply(x, lo, m0, m1, m2, o0, o1, o2, scales) from the step."""
    argtys = (x, lo, m0, m1, m2, o0, o1, o2, scales)
    check("LoRA", argtys, argtys == lora_sig())
    return types.void(addr, *argtys), call_codegen(argtys)


def unit_address() -> int:
    """The address of the LoRA unit (compiled, or loaded from the cache, now)."""
    from .units import address

    return address(apply, lora_sig())


class Rows:
    """Which rows of the batch now computing use which adapter, and how strongly: `scales` (T, n_adapters)
    float32, or None: every row at `uniform` (n_adapters,). Set by the model at the start of each forward (and for
    the rows whose logits it computes)."""

    __slots__ = ("scales", "uniform")

    def __init__(self, uniform: np.ndarray):
        self.scales = None
        self.uniform = np.array(uniform, np.float32)

    def matrix(self, n: int) -> np.ndarray:
        """(n, n_adapters) float32: each of n rows' scales."""
        if self.scales is None:
            return np.ascontiguousarray(np.broadcast_to(self.uniform, (n, len(self.uniform))))
        if self.scales.shape[0] != n:
            raise ValueError(f"adapter scales for {self.scales.shape[0]} rows, a matmul of {n}")
        return self.scales

    def column(self, j: int, n: int, alpha: float = 0.0, rank: int = 1) -> np.ndarray:
        """Adapter j's scale for each of n rows, times alpha / rank where the adapter has an alpha (llama.cpp's
        get_scale: s * alpha / rank, rounded in float32 in that order)."""
        s = np.ascontiguousarray(self.matrix(n)[:, j])
        return s * np.float32(alpha) / np.float32(rank) if alpha else s


class Adapted:
    """A matrix with low-rank adapters beside it: matmul (backend.py) runs `base` and then `add`. mid: its id in
    the set's packed adapters (`owner.part`, a LoraPart), whose rows' scales are `owner.rows` (a Rows)."""

    __slots__ = ("base", "mid", "owner")

    def __init__(self, base, mid: int, owner):
        self.base, self.mid, self.owner = base, mid, owner

    @property
    def shape(self):
        return self.base.shape

    def __getattr__(self, name):  # kind, d and the rest: the base matrix's
        return getattr(self.base, name)

    def add(self, x: np.ndarray, out: np.ndarray) -> None:
        """out (T, N) += each adapter's low-rank product of x (T, K) at its rows' scales."""
        x = np.ascontiguousarray(x, np.float32)
        apply(x, self.owner.part, self.mid, -1, -1, out, out, out, self.owner.rows.matrix(x.shape[0]))


def warm_up() -> None:
    """Compile (or load) the kernels now, at load, rather than in a request's first step."""
    z = np.zeros((1, 1), np.float32)
    lora_embed_add(np.zeros(1, np.int64), z, z, np.zeros(1, np.float32), z)
    unit_address()

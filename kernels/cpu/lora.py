"""Low-rank adapters (LoRA) beside a matrix: W x + sum over adapters of s * B (A x), as llama.cpp's build_lora_mm.

The adapted matrix keeps its quantized weights as they are (never merged): its int8 matmul runs as always, and
each adapter adds its low-rank product after it, row by row with each row's own scale (0: the row's sequence
does not use that adapter), so one batch carries sequences with different adapters, or none (a gathered
low-rank product per sequence, as Punica's and S-LoRA's kernels). Every row's sums run in one fixed order
whatever else the batch holds: a request batched with others gets the bits it gets alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_CHUNK = 256  # output columns per task of the second product


@njit(parallel=True, nogil=True, cache=True)
def lora_add(x, at, bt, scales, out):
    # x (T, K) float32, at (K, R) = A transposed, bt (R, N) = B transposed float32, scales (T,) float32
    # -> out (T, N) += scales[t] * (B (A x[t])) for every row t whose scale is not 0
    t_n, k_n = x.shape
    r_n, n_n = bt.shape
    u = np.zeros((t_n, r_n), np.float32)
    for t in prange(t_n):  # A x: the rank's sums, each in the order of the input's columns
        if scales[t] != 0.0:
            for j in range(k_n):
                xj = x[t, j]
                for r in range(r_n):
                    u[t, r] += at[j, r] * xj
    chunks = (n_n + _CHUNK - 1) // _CHUNK
    for i in prange(t_n * chunks):  # B u, scaled, added: each output's sum in the order of the rank
        t, c = i // chunks, i % chunks
        s = scales[t]
        if s == 0.0:
            continue
        lo = c * _CHUNK
        hi = min(n_n, lo + _CHUNK)
        acc = np.zeros(hi - lo, np.float32)
        for r in range(r_n):
            ur = u[t, r]
            for n in range(lo, hi):
                acc[n - lo] += bt[r, n] * ur
        for n in range(lo, hi):
            out[t, n] += acc[n - lo] * s


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


class Rows:
    """Which rows of the batch now computing use which adapter, and how strongly: `scales` (T, n_adapters)
    float32, or None: every row at `uniform` (n_adapters,). Set by the model at the start of each forward (and for
    the rows whose logits it computes)."""

    __slots__ = ("scales", "uniform")

    def __init__(self, uniform: np.ndarray):
        self.scales = None
        self.uniform = np.array(uniform, np.float32)

    def column(self, j: int, n: int, alpha: float = 0.0, rank: int = 1) -> np.ndarray:
        """Adapter j's scale for each of n rows, times alpha / rank where the adapter has an alpha (llama.cpp's
        get_scale: s * alpha / rank, rounded in float32 in that order)."""
        if self.scales is None:
            s = np.full(n, self.uniform[j], np.float32)
        elif self.scales.shape[0] != n:
            raise ValueError(f"adapter scales for {self.scales.shape[0]} rows, a matmul of {n}")
        else:
            s = np.ascontiguousarray(self.scales[:, j])
        return s * np.float32(alpha) / np.float32(rank) if alpha else s


def warm_up() -> None:
    """Compile (or load) the kernels now, at load, rather than in a request's first step."""
    z = np.zeros((1, 1), np.float32)
    lora_add(z, z, z, np.zeros(1, np.float32), z)
    lora_embed_add(np.zeros(1, np.int64), z, z, np.zeros(1, np.float32), z)


class Adapted:
    """A matrix with low-rank adapters beside it: matmul (backend.py) runs `base` and then `add`. pairs: (adapter
    index, A transposed (K, R), B transposed (R, N), the adapter's alpha (0: none), rank); each row's scale s
    becomes s * alpha / rank (s alone without alpha), as llama.cpp's get_scale rounds it."""

    __slots__ = ("base", "pairs", "rows")

    def __init__(self, base, pairs: list, rows: Rows):
        self.base, self.pairs, self.rows = base, pairs, rows

    @property
    def shape(self):
        return self.base.shape

    def __getattr__(self, name):  # kind, d and the rest: the base matrix's
        return getattr(self.base, name)

    def add(self, x: np.ndarray, out: np.ndarray) -> None:
        """out (T, N) += each adapter's low-rank product of x (T, K) at its rows' scales."""
        for j, at, bt, alpha, rank in self.pairs:
            s = self.rows.column(j, x.shape[0], alpha, rank)
            if s.any():
                lora_add(x, at, bt, s, out)

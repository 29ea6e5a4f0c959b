"""The CPU backend: the kernel interface the models call (see kernels/__init__.py)."""

from __future__ import annotations

import numpy as np

from . import ops, quant
from .ops import gelu_tanh_mul, paged_attention, rmsnorm, rope, silu_mul, softcap, write_kv  # noqa: F401

NAME = "cpu"

def _fields(w):
    return w.kind, w.qs, w.qh, w.sc, w.d, w.m, quant.HALF_TO_F32


def matmul(w, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    # W (N, K) @ x (T, K) -> out (T, N). W: a repacked QTensor or a float32 ndarray.
    x = np.ascontiguousarray(x, dtype=np.float32)
    if isinstance(w, np.ndarray):
        return np.matmul(x, w.T, out=out)
    if out is None:
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
    # One fixed reduction order per output element, whatever the batch: a token's result does not
    # depend on what else is in the batch, so batched and solo generation agree bit for bit.
    quant.matmul_rows(*_fields(w), x, out)
    return out


def embed(w, ids: np.ndarray) -> np.ndarray:
    # rows of W (V, D) for ids (T,) -> (T, D) float32
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if isinstance(w, np.ndarray):
        return w[ids].astype(np.float32)
    out = np.empty((ids.shape[0], w.shape[1]), np.float32)
    quant.dequant_rows(*_fields(w), ids, out)
    return out


def dequantize(w) -> np.ndarray:
    # the whole W (N, K) as float32 (tests and the quantize tool; never on the inference path)
    if isinstance(w, np.ndarray):
        return w.astype(np.float32)
    out = np.empty(w.shape, np.float32)
    quant.dequant_range(*_fields(w), 0, out)
    return out


def zeros(shape, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


def set_threads(n: int) -> None:
    import numba

    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))

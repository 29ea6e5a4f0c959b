"""The CPU backend: the kernel interface the models call (see kernels/__init__.py)."""

from __future__ import annotations

import numpy as np

from . import quant
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
    # Each kernel reduces every output element in one fixed order, whatever the batch: batched and
    # solo generation agree bit for bit.
    k, luts = w.kind, quant.HALF_TO_F32
    if k <= 1:
        quant.matmul_half(k, w.d, luts, x, out)
    elif k == 2:
        quant.matmul_q8_0(w.qs, w.d, luts, x, out)
    elif k <= 4:
        quant.matmul_q4(k, w.qs, w.d, w.m, luts, x, out)
    elif k <= 6:
        quant.matmul_q5(k, w.qs, w.qh, w.d, w.m, luts, x, out)
    elif k <= 8:
        quant.matmul_k45(k, w.qs, w.qh, w.sc, w.d, w.m, luts, x, out)
    else:
        quant.matmul_q6_k(w.qs, w.sc, w.d, luts, x, out)
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
    quant.dequant_rows(*_fields(w), np.arange(w.shape[0], dtype=np.int64), out)
    return out


# -- sampling helpers -----------------------------------------------------------------------------


def argmax_rows(x) -> np.ndarray:
    # (R, V) -> (R,) int64
    return np.argmax(np.asarray(x), axis=1)


def log_softmax_rows(x) -> np.ndarray:
    # (R, V) -> (R, V) float32
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(np.float32)


# -- arrays: the CPU backend works on numpy arrays in place ---------------------------------------


def zeros(shape, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


def empty(shape, dtype=np.float32) -> np.ndarray:
    return np.empty(shape, dtype)


def upload(a):
    """A weight or constant, placed where the kernels read it: numpy arrays stay as they are."""
    return a


def prepare_batch(batch):
    """A Batch's index arrays, placed where the kernels read them."""
    return batch


def to_host(a) -> np.ndarray:
    return a


def add_(x, y) -> None:
    # x += y, (R, D)
    x += y


def scale_(x, s: float) -> None:
    # x *= s
    x *= np.float32(s)


def take_rows(x, idx):
    # x[idx] -> (len(idx), D)
    return x[idx]


def kv_store(x, dtype: str):
    """x (float32) in a KV cache's storage type: float16 bits for "f16"."""
    return x.astype(np.float16).view(np.uint16) if dtype == "f16" else x


def set_threads(n: int) -> None:
    import numba

    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))

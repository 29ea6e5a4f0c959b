"""Float matmuls, LayerNorm and bidirectional attention for encoder models (embeddings), many tokens at once.

Encoders compute whole texts, hundreds to thousands of tokens per call, from F16 weights: the arithmetic
is a dense GEMM. numpy's BLAS (OpenBLAS in numpy's wheels, with kernels for each x86 generation up to
AVX-512) runs it near the machine's peak, far past what a hand-tiled Numba loop reaches; each F16 matrix is
widened to float32 per call (a pass over the weights, small beside the GEMM for a batch of texts), so the
weights stay F16 in memory. The BLAS thread count follows set_threads (threadpoolctl).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .attention import paged_attention
from .halves import F16_TO_F32, f32_to_f16_bits


def dense(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    # W (N, K) float16 or float32 @ x (T, K) float32 -> (T, N) float32
    wf = w if w.dtype == np.float32 else widen(w.view(np.uint16), F16_TO_F32)
    return np.matmul(x, wf.T)


@njit(nogil=True, cache=True)
def widen(bits, table):
    # float16 bit patterns (N, K) -> float32 (N, K), through the 65,536-entry table (numpy's astype: 3 ns a value);
    # one thread: a parallel region's threads would still be spinning beside BLAS's when the GEMM starts
    out = np.empty(bits.shape, np.float32)
    for n in range(bits.shape[0]):
        for k in range(bits.shape[1]):
            out[n, k] = table[bits[n, k]]
    return out


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    # x (T, D): (x - mean) / sqrt(var + eps) * w + b per row (biased variance, as BERT and llama.cpp)
    mu = x.mean(axis=-1, keepdims=True, dtype=np.float32)
    xc = x - mu
    var = np.mean(xc * xc, axis=-1, keepdims=True, dtype=np.float32)
    xc *= 1.0 / np.sqrt(var + np.float32(eps))
    xc *= w
    xc += b
    return xc


def silu(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(x), in place
    s = np.exp(-x)
    s += 1.0
    np.divide(x, s, out=x)
    return x


def encoder_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, starts: np.ndarray, scale) -> np.ndarray:
    # q, k, v (T, H, D) of several sequences side by side, sequence i at rows starts[i]:starts[i+1];
    # every token attends to every token of its own sequence (no mask) -> (T, H, D) float32.
    # The decoders' attention kernel (tiles of keys, an online softmax) over each sequence's own K and V as the
    # one block of a cache, every query at the last position: faster than BLAS's score matrices and a softmax
    # pass, and no BLAS threads left spinning beside the kernel's
    q, k, v = (np.ascontiguousarray(a, np.float32) for a in (q, k, v))
    out = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.float32)
    table = np.zeros((1, 1), np.int32)
    for i in range(len(starts) - 1):
        s, e = int(starts[i]), int(starts[i + 1])
        n = e - s
        paged_attention(q[s:e], k[s:e], v[s:e], np.zeros(n, np.int64), np.full(n, n - 1, np.int64), table, n,
                        np.float32(scale), 0, np.float32(0.0), _NO_SINKS, out[s:e], numba.get_num_threads())
    return out


_NO_SINKS = np.zeros(0, np.float32)


def _gelu_table() -> np.ndarray:
    # ggml's CPU GELU (tanh form) of every half-float value, rounded to a half: its GGML_GELU_FP16 table
    with np.errstate(invalid="ignore", over="ignore"):
        h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
        c, a = np.float32(0.7978845608028654), np.float32(0.044715)
        g = np.float32(0.5) * h * (np.float32(1) + np.tanh(c * h * (np.float32(1) + a * h * h)))
    return g.astype(np.float16).astype(np.float32)


GELU_F16 = _gelu_table()


@njit(parallel=True, nogil=True, cache=True)
def gelu_(x, table):
    # GELU (tanh form) in place on x (T, F) as ggml's CPU computes it: the input rounded to a half, its value
    # looked up in `table` (GELU_F16); 0 at or below -10 and x itself at or above 10, outside the table's use
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            v = x[t, i]
            if v <= -10.0:
                x[t, i] = 0.0
            elif v < 10.0:
                x[t, i] = table[f32_to_f16_bits(v)]


def set_blas_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # without it BLAS uses every core, as numpy does by default
        return
    global _limits
    _limits = threadpool_limits(limits=n, user_api="blas")


_limits = None

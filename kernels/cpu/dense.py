"""Float matmuls, LayerNorm and bidirectional attention for encoder models (embeddings), many tokens at once.

Encoders compute whole texts, hundreds to thousands of tokens per call, from F16 weights: the arithmetic
is a dense GEMM. numpy's BLAS (OpenBLAS in numpy's wheels, with kernels for each x86 generation up to
AVX-512) runs it near the machine's peak, far past what a hand-tiled Numba loop reaches; each F16 matrix is
widened to float32 per call (a pass over the weights, small beside the GEMM for a batch of texts), so the
weights stay F16 in memory. The BLAS thread count follows set_threads (threadpoolctl).
"""

from __future__ import annotations

import numpy as np


def dense(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    # W (N, K) float16 or float32 @ x (T, K) float32 -> (T, N) float32
    wf = w if w.dtype == np.float32 else w.astype(np.float32)
    return np.matmul(x, wf.T)


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
    # every token attends to every token of its own sequence (no mask) -> (T, H, D) float32
    out = np.empty_like(q)
    for i in range(len(starts) - 1):
        s, e = int(starts[i]), int(starts[i + 1])
        qs = q[s:e].transpose(1, 0, 2)  # (H, n, D)
        ks = k[s:e].transpose(1, 2, 0)  # (H, D, n)
        vs = v[s:e].transpose(1, 0, 2)
        a = np.matmul(qs, ks)
        a *= scale
        a -= a.max(axis=-1, keepdims=True)
        np.exp(a, out=a)
        a /= a.sum(axis=-1, keepdims=True)
        out[s:e] = np.matmul(a, vs).transpose(1, 0, 2)
    return out


def set_blas_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # without it BLAS uses every core, as numpy does by default
        return
    global _limits
    _limits = threadpool_limits(limits=n, user_api="blas")


_limits = None

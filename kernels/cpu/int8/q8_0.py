"""Row-major Q8_0 (quant/repack.py; the portable path): one row and one token at a time."""

import numpy as np
from numba import njit

from .common import EXACT, i8

@njit(cache=True)
def _q8_portable(w, wo, x, xo):
    s = np.int32(0)
    for j in range(32):
        s += i8(w[wo + j]) * i8(x[xo + j])
    return s


@njit(cache=True, fastmath=EXACT)
def rows_q8_0(isa, qs, d, luts, xq, xd, out, n0, n1):
    T, K = xq.shape
    nb = K // 32
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            for g in range(nb):
                acc += luts[0, d[n, g]] * xd[t, g] * np.float32(_q8_portable(qs[n], g * 32, xq[t], g * 32))
            out[t, n] = acc

"""Row-major Q6_K (quant/repack.py; the portable path): one row and one token at a time."""

import numpy as np
from numba import njit

from .common import EXACT, i8

@njit(cache=True)
def _q6_portable(w, wo, x, xo, s0, s1):
    a = np.int32(0)
    b = np.int32(0)
    for j in range(16):
        a += i8(w[wo + j]) * i8(x[xo + j])
        b += i8(w[wo + 16 + j]) * i8(x[xo + 16 + j])
    return s0 * a + s1 * b


@njit(cache=True, fastmath=EXACT)
def rows_q6_k(isa, qs, sc, d, luts, xq, xd, out, n0, n1):
    T, K = xq.shape
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            for sb in range(K // 256):
                isum = np.int32(0)
                for g in range(8):
                    isum += _q6_portable(qs[n], sb * 256 + g * 32, xq[t], sb * 256 + g * 32,
                                         i8(sc[n, sb * 16 + 2 * g]), i8(sc[n, sb * 16 + 2 * g + 1]))
                acc += luts[0, d[n, sb]] * xd[t, sb] * np.float32(isum)
            out[t, n] = acc

"""Row-major Q4_K, Q5_K (quant/repack.py; the portable path): one row and one token at a time."""

import numpy as np
from numba import njit

from ... import kinds
from .common import EXACT, i8

has_qh = kinds.predicate("has_qh", within="k45")  # Q5_K

@njit(cache=True)
def _k_pair_portable(w, wo, qh, qho, five, i, x, xo, s_lo, s_hi):
    a = np.int32(0)
    b = np.int32(0)
    for j in range(32):
        q = np.int32(w[wo + j])
        lo = q & 15
        hi = q >> 4
        if five:
            hb = np.int32(qh[qho + j])
            lo |= ((hb >> i) & 1) << 4
            hi |= ((hb >> (i + 1)) & 1) << 4
        a += lo * i8(x[xo + j])
        b += hi * i8(x[xo + 32 + j])
    return s_lo * a + s_hi * b


@njit(cache=True, fastmath=EXACT)
def rows_k45(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, out, n0, n1):
    T, K = xq.shape
    five = has_qh(kind)
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            mo = np.float32(0.0)
            for sb in range(K // 256):
                isum = np.int32(0)
                for p in range(4):
                    isum += _k_pair_portable(qs[n], sb * 128 + p * 32, qh[n], sb * 32, five, 2 * p, xq[t],
                                             sb * 256 + p * 64, np.int32(sc[n, sb * 16 + 2 * p]),
                                             np.int32(sc[n, sb * 16 + 2 * p + 1]))
                msum = np.int32(0)
                for i in range(8):
                    msum += np.int32(sc[n, sb * 16 + 8 + i]) * xb[t, sb * 8 + i]
                acc += luts[0, d[n, sb]] * xd[t, sb] * np.float32(isum)
                mo -= luts[0, m[n, sb]] * xd[t, sb] * np.float32(msum)
            out[t, n] = acc + mo

"""Row-major Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL (quant/repack.py; the portable path): one row and one token at
a time. (Row-major MXFP4, IQ4_NL's nibbles on its own grid with E8M0 scales, runs in q8_0.py's loop.)"""

import numpy as np
from numba import njit

from ... import kinds
from .common import EXACT, i8
from .q8x8 import GRID

has_qh = kinds.predicate("has_qh", within="q45")    # Q5_0, Q5_1
has_min = kinds.predicate("has_min", within="q45")  # Q4_1, Q5_1
is_grid = kinds.predicate("ggml:IQ4_NL", within="q45")  # IQ4_NL: Q4_0's nibbles index the grid
_NIBBLES = np.arange(16, dtype=np.int32)  # Q4's nibbles as they are: the grid of the identity

@njit(cache=True)
def grid_portable(grid, w, wo, x, xo):
    # a block of nibbles into a 16-value grid (IQ4_NL's, MXFP4's) against the activation bytes
    s = np.int32(0)
    for j in range(16):
        q = np.int32(w[wo + j])
        s += grid[q & 15] * i8(x[xo + j]) + grid[q >> 4] * i8(x[xo + 16 + j])
    return s


@njit(cache=True)
def _q5_portable(w, wo, h, x, xo):
    s = np.int32(0)
    for j in range(16):
        q = np.int32(w[wo + j])
        lo = (q & 15) | np.int32(((h >> j) & 1) << 4)
        hi = (q >> 4) | np.int32(((h >> (j + 16)) & 1) << 4)
        s += lo * i8(x[xo + j]) + hi * i8(x[xo + 16 + j])
    return s


@njit(cache=True, fastmath=EXACT)
def rows_q45(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    T, K = xq.shape
    nb = K // 32
    five = has_qh(kind)
    nl = is_grid(kind)
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            mo = np.float32(0.0)
            for g in range(nb):
                dw = luts[0, d[n, g]]
                if has_min(kind):
                    off = luts[0, m[n, g]]
                elif nl:
                    off = np.float32(0.0)
                else:
                    off = np.float32(-16.0 if five else -8.0) * dw
                if five:
                    h = (np.uint32(qh[n, 4 * g]) | (np.uint32(qh[n, 4 * g + 1]) << 8)
                         | (np.uint32(qh[n, 4 * g + 2]) << 16) | (np.uint32(qh[n, 4 * g + 3]) << 24))
                    isum = _q5_portable(qs[n], g * 16, h, xq[t], g * 32)
                elif nl:
                    isum = grid_portable(GRID, qs[n], g * 16, xq[t], g * 32)
                else:
                    isum = grid_portable(_NIBBLES, qs[n], g * 16, xq[t], g * 32)
                acc += dw * xd[t, g] * np.float32(isum)
                mo += off * xs[t, g]
            out[t, n] = acc + mo

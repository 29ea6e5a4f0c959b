"""Row-major Q8_0 and MXFP4 (quant/repack.py; the portable path): one row and one token at a time, a float16
or an E8M0 scale per block of 32."""

import numpy as np
from numba import njit

from .common import EXACT, i8
from .q45 import grid_portable
from .q8x8 import MX_GRID, e8m0_at

@njit(cache=True)
def _q8_portable(w, wo, x, xo):
    s = np.int32(0)
    for j in range(32):
        s += i8(w[wo + j]) * i8(x[xo + j])
    return s


@njit(cache=True, fastmath=EXACT)
def rows_q8_0(isa, qs, d, luts, xq, xd, out, n0, n1):
    _rows_block_scaled(False, qs, d, luts, xq, xd, out, n0, n1)


@njit(cache=True, fastmath=EXACT)
def rows_mx4(isa, qs, d, luts, xq, xd, out, n0, n1):
    # row-major MXFP4 (family mx4): IQ4_NL's nibbles on MXFP4's grid; d holds the E8M0 bytes, two to a uint16
    _rows_block_scaled(True, qs, d, luts, xq, xd, out, n0, n1)


@njit(inline="always", cache=True)
def _rows_block_scaled(mx, qs, d, luts, xq, xd, out, n0, n1):
    # out[t, n] = the sum over 32-blocks g of scale * xd[t, g] * (the block's integer dot product), in order;
    # the scale a float16 (Q8_0) or an E8M0 byte (mx: MXFP4)
    T, K = xq.shape
    nb = K // 32
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            for g in range(nb):
                if mx:
                    s = e8m0_at(d, n, g)
                    isum = grid_portable(MX_GRID, qs[n], g * 16, xq[t], g * 32)
                else:
                    s = luts[0, d[n, g]]
                    isum = _q8_portable(qs[n], g * 32, xq[t], g * 32)
                acc += s * xd[t, g] * np.float32(isum)
            out[t, n] = acc

"""IQ4_NL and IQ4_XS: four-bit indices into a fixed 16-value grid (gguf's IQ4_NL.kvalues).

IQ4_NL: blocks of 32, Q4_0's packing (byte j: element j's index low, element j + 16's high) and a float16
scale d (value = d * grid[q]); repacked and interleaved as Q4_0 (kernels/formats/legacy.py), its kinds
IQ4_NL and IQ4_NL_X8 (the nlx8 family). IQ4_XS runs on IQ4_NL's kinds: the same nibbles, each 32-block's
scale d * (ls - 32) rounded to float16 (within 2^-11 of it; 4.5 bits per weight in memory rather than
4.25)."""

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import IQ4_NL as _IQ4_NL

from .. import kinds
from . import legacy
from .base import Type, flat, u16

_GRID = np.array(_IQ4_NL.kvalues, np.float32)  # the 16 values


def _repack_xs(blocks, n, k):
    # d | scales_h u16 | scales_l[4] | qs[128] -> IQ4_NL's qs and a float16 scale per 32
    d = u16(blocks, 0).view(np.float16).astype(np.float32)
    sh = u16(blocks, 2).astype(np.int32)
    sl = blocks[:, :, 4:8].astype(np.int32)
    ib = np.arange(8)
    ls = ((sl[:, :, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh[:, :, None] >> (2 * ib)) & 3) << 4)
    dl = (d[:, :, None] * (ls - 32).astype(np.float32)).astype(np.float16).view(np.uint16).reshape(n, -1)
    return {"qs": flat(blocks, 8, 136), "d": dl.copy()}


TYPES = (
    Type(T.IQ4_NL, kinds.IQ4_NL, {"d": (0, 2), "qs": (2, 18)}, direct=True),
    Type(T.IQ4_XS, kinds.IQ4_NL, {"d": (0, 2), "scales_h": (2, 4), "scales_l": (4, 8), "qs": (8, 136)},
         repack=_repack_xs),
)


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    lut = luts[0]
    if kind == kinds.IQ4_NL:  # Q4_0's nibbles, each an index into the grid
        db = lut[d[n, g]]
        for j in range(16):
            q = qs[n, g * 16 + j]
            y[j] = db * _GRID[q & 15]
            y[j + 16] = db * _GRID[q >> 4]
    else:  # eight rows interleaved, as Q4_0_X8
        G = n // 8
        r = n % 8
        db = lut[d[G, g * 8 + r]]
        for i in range(32):
            v = i // 4
            b = qs[G, g * 128 + (v % 4) * 32 + r * 4 + i % 4]
            q = np.int32(b & 15) if v < 4 else np.int32(b >> 4)
            y[i] = db * _GRID[q]


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W
    g = k // 32
    j = k % 32
    b = qs[n, g * 16 + j % 16]
    return luts[0, d[n, g]] * _GRID[(b & 15) if j < 16 else (b >> 4)]


transform = legacy.transform
regroup = legacy.regroup
BITS = {}

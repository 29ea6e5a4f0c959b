"""MXFP4 (OCP microscaling FP4, gpt-oss's experts): blocks of 32 E2M1 values, four bits each, and one shared
E8M0 scale byte e (value = grid[q] * 2^(e - 128), grid gguf's MXFP4.kvalues: the E2M1 values doubled, so that
they are integers, -12 .. 12).

Repacked as IQ4_NL (Q4_0's packing: byte j holds element j low, element j + 16 high) with the scale as the
bfloat16 bits of 2^(e - 128) (exact for every e, where float16 holds only e in 104 .. 143): its own kinds,
MXFP4 (family mx4, the portable path's) and MXFP4_X8 (family mxx8: IQ4_NL_X8's layout and kernels, their
grid and scale loads swapped), so that the IQ4_NL units are compiled without it."""

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import MXFP4 as _MXFP4

from .. import kinds
from . import legacy
from .base import Type, flat

GRID = np.array(_MXFP4.kvalues, np.float32)  # the 16 values (E2M1 doubled)


def scale_bits(e: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> the bfloat16 bits of 2^(e - 128) (gguf's e8m0_to_fp32_half, whose float32 has a zero
    low half for every e)."""
    return (_MXFP4.e8m0_to_fp32_half(np.ascontiguousarray(e, np.uint8)).view(np.uint32) >> 16).astype(np.uint16)


def _repack(blocks, n, k):
    # e | qs[16] -> IQ4_NL's qs and a bfloat16 scale per 32
    return {"qs": flat(blocks, 1, 17), "d": scale_bits(blocks[:, :, 0]).reshape(n, -1)}


TYPES = (Type(T.MXFP4, kinds.MXFP4, {"e": (0, 1), "qs": (1, 17)}, repack=_repack),)


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32; luts[1]: bfloat16 bits -> float32
    lut = luts[1]
    if kind == kinds.MXFP4:
        db = lut[d[n, g]]
        for j in range(16):
            q = qs[n, g * 16 + j]
            y[j] = db * GRID[q & 15]
            y[j + 16] = db * GRID[q >> 4]
    else:  # eight rows interleaved, as IQ4_NL_X8
        G = n // 8
        r = n % 8
        db = lut[d[G, g * 8 + r]]
        for i in range(32):
            v = i // 4
            b = qs[G, g * 128 + (v % 4) * 32 + r * 4 + i % 4]
            q = np.int32(b & 15) if v < 4 else np.int32(b >> 4)
            y[i] = db * GRID[q]


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W
    g = k // 32
    j = k % 32
    b = qs[n, g * 16 + j % 16]
    return luts[1, d[n, g]] * GRID[(b & 15) if j < 16 else (b >> 4)]


transform = legacy.transform
regroup = legacy.regroup
BITS = {}

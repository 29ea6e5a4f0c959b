"""F16 and BF16: 16-bit floats, one value per block; read by the float matmul (kernels/cpu/quant.matmul_half).

Repacked: d (N, K) uint16 holds the values themselves as bit patterns; the other arrays are empty. Decoded
through the backend's 65,536-entry tables (luts row 0: float16, row 1: bfloat16, the kind's own id)."""

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .. import kinds
from .base import Type


def _repack(blocks, n, k):
    return {"d": blocks.reshape(n, k * 2).copy().view(np.uint16)}


TYPES = (Type(T.F16, kinds.F16, {"d": (0, 2)}, repack=_repack),
         Type(T.BF16, kinds.BF16, {"d": (0, 2)}, repack=_repack))


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    tab = luts[kind]
    base = g * 32
    for j in range(32):
        y[j] = tab[d[n, base + j]]


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W
    return luts[kind, d[n, k]]


transform = None  # no interleaved twin: the float matmul reads rows
regroup = None
BITS = {}

"""Q8_0: blocks of 32 signed bytes and a float16 scale d (value = d * q).

Repacked: qs (N, K) the bytes, d (N, K / 32). Interleaved (Q8_0_X8, eight rows per group G): qs
(G, nb * 256), for block b and v < 8 a vector of the eight rows' signed bytes 4v .. 4v + 3; d (G, nb * 8)
the rows' block scales."""

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .. import kinds
from .base import Type, by_words, empty_groups, i8, regrouped, replace, scale_transform

TYPES = (Type(T.Q8_0, kinds.Q8_0, {"d": (0, 2), "qs": (2, 34)}, direct=True),)


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    lut = luts[0]
    if kind == kinds.Q8_0:  # 32 int8 per block
        db = lut[d[n, g]]
        base = g * 32
        for j in range(32):
            y[j] = db * i8(qs[n, base + j])
    else:  # eight rows interleaved
        G = n // 8
        r = n % 8
        db = lut[d[G, g * 8 + r]]
        for i in range(32):
            y[i] = db * i8(qs[G, (g * 8 + i // 4) * 32 + r * 4 + i % 4])


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W
    return luts[0, d[n, k // 32]] * np.float32(i8(qs[n, k]))


def transform(kind, field):
    return by_words(8) if field == "qs" else scale_transform(field)


def regroup(w, inplace):
    return replace(w, kind=kinds.interleaved(w.kind), qs=regrouped(w, transform, "qs", inplace),
                   d=regrouped(w, transform, "d", inplace), qh=empty_groups(w), sc=empty_groups(w),
                   m=empty_groups(w, np.uint16))


BITS = {}

"""Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 values, four bits each (a fifth bit for Q5_*), a float16 scale d
and, for Q4_1/Q5_1, a float16 min m (value = d * q + m; Q4_0: d * (q - 8); Q5_0: d * (q - 16)).

Repacked: qs (N, K / 2) the nibble bytes (byte j: element j low, element j + 16 high), qh (N, K / 8) the
fifth bits (bit j of a block's little-endian uint32: element j's), d and m (N, K / 32).

Interleaved (Q*_X8, the x8 family): rows regrouped eight at a time, so that one 32-byte vector holds the
same four elements of eight rows (a u8 x s8 dot product on it gives eight rows' sums at once, against four
activation bytes broadcast, and the scales of eight rows load as one vector). Rows are padded with zeros
to a multiple of 8. For row group G and block b (nb = K / 32 blocks per row):

    qs  (G, nb * 128)  four vectors per block: vector j holds, for each row r, bytes 4j .. 4j + 3
                       of the row's block (low nibbles: elements 4j + e; high: elements 16 + 4j + e)
    qh  (G, nb * 32)   Q5 only: one vector per block, byte 4 r + e lined up with the qs vectors'
                       byte 4 r + e: its bit v is the fifth bit of row r's element 4 v + e (in the
                       weight vector v: v < 4 the low nibbles of qs vector v, v >= 4 the high
                       nibbles of qs vector v - 4), so one shift and mask give a vector its bits
    d, m (G, nb * 8)   the eight rows' block scales (mins) as float16 bits
"""

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .. import kinds
from .base import Type, by_words, empty_groups, regrouped, replace, scale_transform

TYPES = (
    Type(T.Q4_0, kinds.Q4_0, {"d": (0, 2), "qs": (2, 18)}, direct=True),
    Type(T.Q4_1, kinds.Q4_1, {"d": (0, 2), "m": (2, 4), "qs": (4, 20)}, direct=True),
    Type(T.Q5_0, kinds.Q5_0, {"d": (0, 2), "qh": (2, 6), "qs": (6, 22)}, direct=True),
    Type(T.Q5_1, kinds.Q5_1, {"d": (0, 2), "m": (2, 4), "qh": (4, 8), "qs": (8, 24)}, direct=True),
)

_x8_has_qh = kinds.predicate("has_qh", within="x8")    # Q5_0_X8, Q5_1_X8
_x8_has_min = kinds.predicate("has_min", within="x8")  # Q4_1_X8, Q5_1_X8


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    lut = luts[0]
    if kind == kinds.Q4_0 or kind == kinds.Q4_1:  # byte j holds elements j (low nibble) and j + 16 (high)
        db = lut[d[n, g]]
        off = lut[m[n, g]] if kind == kinds.Q4_1 else np.float32(-8.0) * db
        for j in range(16):
            q = qs[n, g * 16 + j]
            y[j] = db * np.float32(q & 15) + off
            y[j + 16] = db * np.float32(q >> 4) + off
    elif kind == kinds.Q5_0 or kind == kinds.Q5_1:  # the fifth bit of element j is bit j of qh (u32 LE)
        db = lut[d[n, g]]
        off = lut[m[n, g]] if kind == kinds.Q5_1 else np.float32(-16.0) * db
        h = (np.uint32(qh[n, g * 4]) | (np.uint32(qh[n, g * 4 + 1]) << 8)
             | (np.uint32(qh[n, g * 4 + 2]) << 16) | (np.uint32(qh[n, g * 4 + 3]) << 24))
        for j in range(16):
            q = qs[n, g * 16 + j]
            lo = np.int32(q & 15) | np.int32(((h >> j) & 1) << 4)
            hi = np.int32(q >> 4) | np.int32(((h >> (j + 16)) & 1) << 4)
            y[j] = db * np.float32(lo) + off
            y[j + 16] = db * np.float32(hi) + off
    else:  # eight rows interleaved
        G = n // 8
        r = n % 8
        db = lut[d[G, g * 8 + r]]
        five = _x8_has_qh(kind)
        off = lut[m[G, g * 8 + r]] if _x8_has_min(kind) else np.float32(-16.0 if five else -8.0) * db
        for i in range(32):
            v = i // 4
            b = qs[G, g * 128 + (v % 4) * 32 + r * 4 + i % 4]
            q = np.int32(b & 15) if v < 4 else np.int32(b >> 4)
            if five:
                q |= np.int32((qh[G, g * 32 + r * 4 + i % 4] >> v) & 1) << 4
            y[i] = db * np.float32(q) + off


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W
    g = k // 32
    j = k % 32
    b = qs[n, g * 16 + j % 16]
    db = luts[0, d[n, g]]
    if kind == kinds.Q4_0 or kind == kinds.Q4_1:
        q = (b & 15) if j < 16 else (b >> 4)
        off = luts[0, m[n, g]] if kind == kinds.Q4_1 else np.float32(-8.0) * db
        return db * np.float32(q) + off
    q = np.int32((b & 15) if j < 16 else (b >> 4))
    q |= np.int32((qh[n, g * 4 + j // 8] >> (j % 8)) & 1) << 4
    off = luts[0, m[n, g]] if kind == kinds.Q5_1 else np.float32(-16.0) * db
    return db * np.float32(q) + off


def transform(kind, field):
    if field == "qs":
        return by_words(4)
    return None if field == "qh" else scale_transform(field)  # qh: a bit transpose (BITS)


def q5_bits(qh):
    """Q5_0/Q5_1 high bits (N, nb * 4), row-major (bit j of a block's uint32: element j's fifth bit) ->
    (ceil(N / 8), nb * 32) as the interleaved layout lays them out: a transpose of bits, not of bytes."""
    n = qh.shape[0]
    nb = qh.shape[1] // 4
    g = -(-n // 8)
    h = np.ascontiguousarray(np.pad(qh, ((0, g * 8 - n), (0, 0)))).view(np.uint32).reshape(g, 8, nb)
    out = np.zeros((g, nb, 8, 4), np.uint8)  # (group, block, row r, element e of the vector)
    for v in range(8):
        for e in range(4):
            bit = (h >> np.uint32(4 * v + e)) & np.uint32(1)  # (g, 8 rows, nb)
            out[:, :, :, e] |= (bit.transpose(0, 2, 1) << np.uint32(v)).astype(np.uint8)
    return out.reshape(g, nb * 32)


BITS = {"qh": q5_bits}


def regroup(w, inplace):
    """The matrix with eight rows interleaved (see the module docstring); kinds become their twins."""
    qh = q5_bits(w.qh) if kinds.has_qh(w.kind) else empty_groups(w)
    return replace(w, kind=kinds.interleaved(w.kind), qs=regrouped(w, transform, "qs", inplace), qh=qh,
                   sc=empty_groups(w), d=regrouped(w, transform, "d", inplace), m=regrouped(w, transform, "m", inplace))

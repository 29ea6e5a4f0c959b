"""Q4_K and Q5_K: super-blocks of 256 values in 8 sub-blocks of 32, four bits each (a fifth for Q5_K),
a 6-bit scale and min per sub-block (ggml's 12-byte packing) and float16 super-block scales d, dmin
(value = d * scale * q - dmin * min).

Repacked: qs (N, K / 2) in ggml's order (sub-blocks 2p, 2p + 1 share 32 bytes: low, high nibbles), qh
(N, K / 8) Q5_K's fifth bits (bit i of byte l: sub-block i's element l), sc (N, K / 16) per super-block 8
scales then 8 mins (decoded), d and m (N, K / 256).

Interleaved (Q4_K_X8, Q5_K_X8, the kx8 family), eight rows per group G, per super-block s (nsb per row):

    qs (G, nsb * 1024)  for pair p (sub-blocks 2p, 2p + 1) and v < 8: a vector of the eight rows' bytes
                        4v .. 4v + 3 of the pair's 32 bytes (low nibbles: sub-block 2p, high: 2p + 1;
                        elements 4v + e)
    qh (G, nsb * 256)   Q5_K: for v < 8, the eight rows' qh bytes 4v .. 4v + 3 (bit j: the fifth bit of
                        sub-block j's element 4v + e)
    sc (G, nsb * 128)   per super-block 16 entries (8 scales, 8 mins) x 8 rows
    d, m (G, nsb * 8)   the eight rows' super-block scale and min scale, float16 bits
"""

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .. import kinds
from .base import Type, by_words, regrouped, replace, scale_transform


def decode_k_scales(packed: np.ndarray) -> np.ndarray:
    """ggml's 12-byte packing of 8 six-bit scales and 8 six-bit mins -> (..., 16) uint8 [sc0..7, m0..7]."""
    q = packed.astype(np.uint8)
    sc = np.empty(q.shape[:-1] + (16,), np.uint8)
    sc[..., 0:4] = q[..., 0:4] & 63
    sc[..., 8:12] = q[..., 4:8] & 63
    sc[..., 4:8] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    sc[..., 12:16] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return sc


TYPES = (
    Type(T.Q4_K, kinds.Q4_K, {"d": (0, 2), "m": (2, 4), "sc": (4, 16), "qs": (16, 144)},
         scales=decode_k_scales, direct=True),
    Type(T.Q5_K, kinds.Q5_K, {"d": (0, 2), "m": (2, 4), "sc": (4, 16), "qh": (16, 48), "qs": (48, 176)},
         scales=decode_k_scales, direct=True),
)


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    lut = luts[0]
    if kind == kinds.Q4_K or kind == kinds.Q5_K:  # groups 2p, 2p+1 of a super-block share 32 bytes of qs
        sb = g // 8
        i = g % 8
        p = i // 2
        shift = 4 * (i % 2)
        scale = lut[d[n, sb]] * np.float32(sc[n, sb * 16 + i])
        mn = lut[m[n, sb]] * np.float32(sc[n, sb * 16 + 8 + i])
        for l in range(32):
            q = np.int32((qs[n, sb * 128 + p * 32 + l] >> shift) & 15)
            if kind == kinds.Q5_K:
                q |= np.int32((qh[n, sb * 32 + l] >> i) & 1) << 4
            y[l] = scale * np.float32(q) - mn
    else:  # eight rows interleaved
        G = n // 8
        r = n % 8
        sb = g // 8
        j = g % 8
        scale = lut[d[G, sb * 8 + r]] * np.float32(sc[G, (sb * 16 + j) * 8 + r])
        mn = lut[m[G, sb * 8 + r]] * np.float32(sc[G, (sb * 16 + 8 + j) * 8 + r])
        for l in range(32):
            o = ((sb * 4 + j // 2) * 8 + l // 4) * 32 + r * 4 + l % 4
            q = np.int32(qs[G, o] & 15) if j % 2 == 0 else np.int32(qs[G, o] >> 4)
            if kind == kinds.Q5_K_X8:
                q |= np.int32((qh[G, (sb * 8 + l // 4) * 32 + r * 4 + l % 4] >> j) & 1) << 4
            y[l] = scale * np.float32(q) - mn


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W
    g = k // 32
    j = k % 32
    sb = g // 8
    i = g % 8
    q = np.int32((qs[n, sb * 128 + (i // 2) * 32 + j] >> (4 * (i % 2))) & 15)
    if kind == kinds.Q5_K:
        q |= np.int32((qh[n, sb * 32 + j] >> i) & 1) << 4
    scale = luts[0, d[n, sb]] * np.float32(sc[n, sb * 16 + i])
    mn = luts[0, m[n, sb]] * np.float32(sc[n, sb * 16 + 8 + i])
    return scale * np.float32(q) - mn


def transform(kind, field):
    return by_words(8) if field in ("qs", "qh") else scale_transform(field)


def regroup(w, inplace):
    """The matrix with eight rows interleaved (see the module docstring)."""
    return replace(w, kind=kinds.interleaved(w.kind), qs=regrouped(w, transform, "qs", inplace),
                   qh=regrouped(w, transform, "qh", inplace), sc=regrouped(w, transform, "sc", inplace),
                   d=regrouped(w, transform, "d", inplace), m=regrouped(w, transform, "m", inplace))


BITS = {}

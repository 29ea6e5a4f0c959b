"""Q6_K: super-blocks of 256 six-bit values (ql: low four bits, qh: high two), an int8 scale per 16 and a
float16 super-block scale d (value = d * scale * (q - 32)).

Repacked: qs (N, K) every value unpacked to one signed byte q - 32 in element order (ggml's split layout
defeats vectorisation; 22% more bytes than the file, a small part of K-quant mixes), sc (N, K / 16) the
int8 scales, d (N, K / 256).

Interleaved (Q6_K_X8, the kx8 family), eight rows per group G, from the stored bits (the file's 6 bits a
weight, not a byte): per super-block and sub-block j of 16 (16 nsb per row) 96 bytes of qs (G, nsb * 1536),
three vectors of 32 bytes. Vector v < 4 of the sub-block holds the eight rows' elements 16 j + 4 v .. + 3
(byte 4 r + c: row r's element 16 j + 4 v + c) as unsigned q (0..63; the value is q - 32): its low nibble
is the low (v = 0, 2) or high (v = 1, 3) nibble of packed vector v // 2, its two high bits bits 2 v, 2 v + 1
of the third vector's byte. sc (G, nsb * 128) 16 int8 scales x 8 rows, d (G, nsb * 8)."""

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from numba.extending import overload

from .. import kinds
from .base import Type, by_words, flat, i8, regrouped, replace, scale_transform, u16


def unpack_q6_k(ql: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """(..., 128) low bits and (..., 64) high bits of Q6_K super-blocks -> (..., 256) int8 (q - 32) as uint8.

    Within each half of 128: element 32 r + l takes its low nibble from ql[l + 32 (r % 2)] (the high
    nibble when r >= 2) and its two high bits from qh[l] at shift 2 r."""
    out = np.empty(ql.shape[:-1] + (256,), np.int16)
    for half in range(2):
        lo = ql[..., half * 64:(half + 1) * 64].astype(np.int16)
        hi = qh[..., half * 32:(half + 1) * 32].astype(np.int16)
        for r in range(4):
            src = lo[..., 32 * (r % 2):32 * (r % 2) + 32]
            nib = (src >> 4) if r >= 2 else (src & 15)
            out[..., half * 128 + 32 * r:half * 128 + 32 * r + 32] = (nib | (((hi >> (2 * r)) & 3) << 4)) - 32
    return out.astype(np.int8).view(np.uint8)


_FIELDS = {"ql": (0, 128), "qh": (128, 192), "sc": (192, 208), "d": (208, 210)}


def _repack(blocks, n, k):
    (a, b), (c, e) = _FIELDS["ql"], _FIELDS["qh"]
    return {"qs": unpack_q6_k(blocks[:, :, a:b], blocks[:, :, c:e]).reshape(n, k),
            "sc": flat(blocks, *_FIELDS["sc"]), "d": u16(blocks, _FIELDS["d"][0])}


TYPES = (Type(T.Q6_K, kinds.Q6_K, _FIELDS, repack=_repack, direct=True, x8_block_bytes=192 + 16 + 2),)  # qs, sc, d


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    lut = luts[0]
    if kind == kinds.Q6_K:  # unpacked signed bytes; one int8 scale per 16 elements
        base = g * 32
        db = lut[d[n, g // 8]]
        for h in range(2):
            s = db * np.float32(i8(sc[n, g * 2 + h]))
            for l in range(16):
                y[h * 16 + l] = s * np.float32(i8(qs[n, base + h * 16 + l]))
    else:  # eight rows interleaved, unsigned q (value q - 32)
        G = n // 8
        r = n % 8
        sb = g // 8
        db = lut[d[G, sb * 8 + r]]
        for h in range(2):
            j = (g % 8) * 2 + h
            s = db * np.float32(i8(sc[G, (sb * 16 + j) * 8 + r]))
            for l in range(16):
                y[h * 16 + l] = s * np.float32(q6_x8(qs, G, sb * 16 + j, l, r) - 32)


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W: unpacked signed bytes, an int8 scale per 16
    return luts[0, d[n, k // 256]] * np.float32(i8(sc[n, k // 16])) * np.float32(i8(qs[n, k]))


def transform(kind, field):
    # qs: the permutation regroup applies before packing the values to six bits (so the loader never gathers
    # it: Q6_K's interleaved layout is built by regroup, a chunk at a time, quant/repack.repack_interleaved)
    return by_words(64) if field in ("qs", "qh") else scale_transform(field)


def q6_x8(qs, G, sub, i, r):
    # the unsigned q (0..63) of element i < 16 of sub-block `sub` (super-block * 16 + j) of row r of group G
    o = sub * 96 + r * 4 + i % 4
    v = i // 4
    nib = (np.int32(qs[G, o + (v // 2) * 32]) >> (4 * (v % 2))) & 15
    return nib | (((np.int32(qs[G, o + 64]) >> (2 * v)) & 3) << 4)


@overload(q6_x8, inline="always", target="generic")
def _q6_x8(qs, G, sub, i, r):
    return q6_x8  # compiled from the same source, in whichever target calls it


def pack_q6(u: np.ndarray) -> np.ndarray:
    """(G, nsb * 2048) unsigned q, four vectors of 32 bytes per sub-block of 16 -> (G, nsb * 1536), the
    module docstring's two nibble vectors and one of high bits per sub-block."""
    v = u.reshape(u.shape[0], -1, 4, 32)
    out = np.empty((u.shape[0], v.shape[1], 3, 32), np.uint8)
    out[:, :, 0] = (v[:, :, 0] & 15) | ((v[:, :, 1] & 15) << 4)
    out[:, :, 1] = (v[:, :, 2] & 15) | ((v[:, :, 3] & 15) << 4)
    out[:, :, 2] = (v[:, :, 0] >> 4) | ((v[:, :, 1] >> 4) << 2) | ((v[:, :, 2] >> 4) << 4) | ((v[:, :, 3] >> 4) << 6)
    return out.reshape(u.shape[0], -1)


def regroup(w, inplace):
    """The matrix with eight rows interleaved (see the module docstring)."""
    qs = regrouped(w, transform, "qs", inplace)
    qs += np.uint8(32)  # q - 32 as a byte, plus 32 (mod 256): q; padding rows' zeros become 32, times scale 0
    qs = pack_q6(qs)
    return replace(w, kind=kinds.interleaved(w.kind), qs=qs, qh=regrouped(w, transform, "qh", inplace),
                   sc=regrouped(w, transform, "sc", inplace), d=regrouped(w, transform, "d", inplace),
                   m=regrouped(w, transform, "m", inplace))


BITS = {}

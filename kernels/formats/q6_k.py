"""Q6_K: super-blocks of 256 six-bit values (ql: low four bits, qh: high two), an int8 scale per 16 and a
float16 super-block scale d (value = d * scale * (q - 32)).

Repacked: qs (N, K) every value unpacked to one signed byte q - 32 in element order (ggml's split layout
defeats vectorisation; 22% more bytes than the file, a small part of K-quant mixes), sc (N, K / 16) the
int8 scales, d (N, K / 256).

Interleaved (Q6_K_X8, the kx8 family), eight rows per group G, per super-block s (nsb per row): qs
(G, nsb * 2048) for v < 64 the eight rows' elements 4v .. 4v + 3 as unsigned q (0..63; the value is
q - 32), sc (G, nsb * 128) 16 int8 scales x 8 rows, d (G, nsb * 8)."""

import numpy as np
from gguf.constants import GGMLQuantizationType as T

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


TYPES = (Type(T.Q6_K, kinds.Q6_K, _FIELDS, repack=_repack),)


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
            s = db * np.float32(i8(sc[G, (sb * 16 + (g % 8) * 2 + h) * 8 + r]))
            for l in range(16):
                i = (g % 8) * 32 + h * 16 + l
                y[h * 16 + l] = s * np.float32(np.int32(qs[G, (sb * 64 + i // 4) * 32 + r * 4 + i % 4]) - 32)


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W: unpacked signed bytes, an int8 scale per 16
    return luts[0, d[n, k // 256]] * np.float32(i8(sc[n, k // 16])) * np.float32(i8(qs[n, k]))


def transform(kind, field):
    return by_words(64) if field in ("qs", "qh") else scale_transform(field)


def regroup(w, inplace):
    """The matrix with eight rows interleaved (see the module docstring)."""
    qs = regrouped(w, transform, "qs", inplace)
    qs += np.uint8(32)  # q - 32 as a byte, plus 32 (mod 256): q; padding rows' zeros become 32, times scale 0
    return replace(w, kind=kinds.interleaved(w.kind), qs=qs, qh=regrouped(w, transform, "qh", inplace),
                   sc=regrouped(w, transform, "sc", inplace), d=regrouped(w, transform, "d", inplace),
                   m=regrouped(w, transform, "m", inplace))


BITS = {}

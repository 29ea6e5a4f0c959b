"""Q3_K and Q2_K: super-blocks of 256 values in 16 sub-blocks of 16, two low bits each (Q3_K: a third from
its hmask, set meaning no -4), a float16 super-block scale d (Q2_K: and dmin). Q3_K: a 6-bit scale per 16
(ggml's 12-byte packing, minus 32), value = d * scale * (q - 4). Q2_K: a 4-bit scale and 4-bit min per 16,
value = d * scale * q - dmin * min.

Repacked: qs (N, K / 4) in ggml's order (element 32 i + l of a half of 128: bits 2 (i % 4) of byte
32 (i // 4) + l), qh (N, K / 8) Q3_K's hmask, sc (N, K / 16) Q3_K's decoded int8 scales, Q2_K the file's
bytes (scale low nibble, min high), d and m (N, K / 256).

Interleaved (Q3_K_X8, Q2_K_X8, the k23x8 family), eight rows per group G, per super-block s (nsb per row),
each of its 16 sub-blocks j of 16 elements as four weight vectors v (elements 4v .. 4v + 3 of the eight rows):

    qs (G, nsb * 512)  for s, j: 32 bytes, byte 4 r + e holding the two low bits of row r's element
                       4v + e of sub-block j at bits 2v, 2v + 1 (v < 4): one vector per sub-block
    qh (G, nsb * 256)  Q3_K: for s and pair p (sub-blocks 2p, 2p + 1): 32 bytes, byte 4 r + e holding
                       the third bit (hmask's) of element 4v + e of sub-block 2p + h at bit 4h + v
    sc (G, nsb * 128)  per super-block 16 entries x 8 rows: Q3_K's int8 scales, Q2_K's scale | min << 4
    d, m (G, nsb * 8)  the eight rows' super-block scale (Q2_K: and min scale), float16 bits

so a weight vector is (qs >> 2v) & 3, Q3_K's with ((qh >> 4h + v) & 1) << 2 (the value is that - 4).
"""

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .. import kinds
from .base import Type, i8, regrouped, replace, scale_transform


def q3_k_scales(packed: np.ndarray) -> np.ndarray:
    """(..., 12) Q3_K scale bytes -> (..., 16) int8 scales as uint8: scale j is six bits, a nibble of byte
    j % 8 (the high one for j >= 8) and two bits of byte 8 + j % 4 at shift 2 (j // 4), minus 32."""
    raw = packed.astype(np.int16)
    low = np.concatenate([raw[..., 0:8] & 0xF, raw[..., 0:8] >> 4], axis=-1)
    high = np.stack([(raw[..., 8:12] >> (2 * i)) & 3 for i in range(4)], axis=-2).reshape(raw.shape[:-1] + (16,))
    return ((low | (high << 4)) - 32).astype(np.int8).view(np.uint8)


TYPES = (
    Type(T.Q3_K, kinds.Q3_K, {"qh": (0, 32), "qs": (32, 96), "sc": (96, 108), "d": (108, 110)}, scales=q3_k_scales),
    Type(T.Q2_K, kinds.Q2_K, {"sc": (0, 16), "qs": (16, 80), "d": (80, 82), "m": (82, 84)}),
)


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    lut = luts[0]
    if kind == kinds.Q3_K or kind == kinds.Q2_K:  # element 32 i + l of a super-block, bits at 2 (i % 4)
        sb = g // 8
        i = g % 8
        db = lut[d[n, sb]]
        for l in range(32):
            q = np.int32((qs[n, sb * 64 + (i // 4) * 32 + l] >> (2 * (i % 4))) & 3)
            s = sc[n, sb * 16 + 2 * i + l // 16]
            if kind == kinds.Q3_K:
                q |= np.int32((qh[n, sb * 32 + l] >> i) & 1) << 2
                y[l] = (db * np.float32(i8(s))) * np.float32(q - 4)
            else:
                y[l] = (db * np.float32(s & 15)) * np.float32(q) - lut[m[n, sb]] * np.float32(s >> 4)
    else:  # eight rows interleaved: a plane of two-bit values per sub-block
        G = n // 8
        r = n % 8
        sb = g // 8
        db = lut[d[G, sb * 8 + r]]
        for l in range(32):
            j = (g % 8) * 2 + l // 16  # the sub-block of 16
            v = (l % 16) // 4
            e = l % 4
            q = np.int32((qs[G, ((sb * 16 + j) * 8 + r) * 4 + e] >> (2 * v)) & 3)
            s = sc[G, (sb * 16 + j) * 8 + r]
            if kind == kinds.Q3_K_X8:
                q |= np.int32((qh[G, ((sb * 8 + j // 2) * 8 + r) * 4 + e] >> (4 * (j % 2) + v)) & 1) << 2
                y[l] = (db * np.float32(i8(s))) * np.float32(q - 4)
            else:
                y[l] = (db * np.float32(s & 15)) * np.float32(q) - lut[m[G, sb * 8 + r]] * np.float32(s >> 4)


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W: two bits at 2 (i % 4) of qs byte 32 (i // 4) + j, i = g % 8
    g = k // 32
    j = k % 32
    sb = k // 256
    i = g % 8
    q = np.int32((qs[n, sb * 64 + (i // 4) * 32 + j] >> (2 * (i % 4))) & 3)
    s = sc[n, k // 16]
    db = luts[0, d[n, sb]]
    if kind == kinds.Q3_K:  # the hmask bit: set means no -4
        q |= np.int32((qh[n, sb * 32 + j] >> i) & 1) << 2
        return (db * np.float32(i8(s))) * np.float32(q - 4)
    return (db * np.float32(s & 15)) * np.float32(q) - luts[0, m[n, sb]] * np.float32(s >> 4)


def transform(kind, field):
    return scale_transform(field)  # qs, qh: bit planes (regroup), never a permutation of bytes


BITS = {}


def k23_values(qs, qh) -> np.ndarray:
    """Row-major Q3_K (qh: its hmask bytes) or Q2_K (qh None) fields as unsigned bytes u (N, K): Q3_K's two
    low bits and its hmask bit (u = low | h << 2, 0..7: the value is u - 4), Q2_K's two bits (0..3). In a
    super-block, element e takes its two bits from qs byte 32 (e // 128) + e % 32 at shift 2 ((e % 128) // 32),
    Q3_K's third from hmask byte e % 32, bit e // 32."""
    n = qs.shape[0]
    nsb = qs.shape[1] // 64
    q = qs.reshape(n, nsb, 2, 1, 32)
    u = ((q >> (2 * np.arange(4, dtype=np.uint8))[None, None, None, :, None]) & 3).reshape(n, nsb, 256)
    if qh is not None:
        h = qh.reshape(n, nsb, 1, 32)
        u |= (((h >> np.arange(8, dtype=np.uint8)[None, None, :, None]) & 1) << 2).reshape(n, nsb, 256)
    return u.reshape(n, nsb * 256)


def _planes(qs, qh, groups):
    """Row-major Q3_K/Q2_K qs (and Q3_K's qh, else None) of up to 8 * groups rows -> the (groups, nsb * 512)
    and (groups, nsb * 256) planes of the interleaved layout (rows past the input's as zeros)."""
    n, K = qs.shape[0], qs.shape[1] * 4
    nsb = K // 256
    u = np.zeros((groups * 8, K), np.uint8)
    u[:n] = k23_values(qs, qh)
    u = u.reshape(groups, 8, nsb, 16, 4, 4)  # group, row r, super-block, sub-block j, vector v, element e
    low = (u & 3).transpose(0, 2, 3, 1, 5, 4)  # (g, s, j, r, e, v)
    out = np.zeros(low.shape[:-1], np.uint8)
    for v in range(4):
        out |= low[..., v] << np.uint8(2 * v)
    if qh is None:
        return out.reshape(groups, nsb * 512), None
    hi = (u >> 2).reshape(groups, 8, nsb, 8, 2, 4, 4).transpose(0, 2, 3, 1, 6, 4, 5).reshape(groups, nsb, 8, 8, 4, 8)
    bits = np.zeros(hi.shape[:-1], np.uint8)
    for k in range(8):
        bits |= hi[..., k] << np.uint8(k)
    return out.reshape(groups, nsb * 512), bits.reshape(groups, nsb * 256)


K23_CHUNK_BYTES = 8 * 2**20  # regroup builds the planes from this many bytes of values (a byte each) at a time


def regroup(w, inplace):
    """The matrix with eight rows interleaved (see the module docstring). A group's planes take the bytes of
    its eight row-major rows, so in place (a row count that is a multiple of 8) they are built a few MB of
    rows at a time into the row-major arrays' memory (the temporaries: a few times K23_CHUNK_BYTES, whatever
    the matrix)."""
    n = w.shape[0]
    g = -(-n // 8)
    q3 = w.kind == kinds.Q3_K
    width = w.qs.shape[1]
    same = (inplace and n % 8 == 0 and w.qs.flags.c_contiguous and w.qs.flags.writeable
            and (not q3 or (w.qh.flags.c_contiguous and w.qh.flags.writeable)))
    qs = w.qs.reshape(g, 8 * width) if same else np.empty((g, 8 * width), np.uint8)
    qh = (w.qh.reshape(g, 8 * w.qh.shape[1]) if same else np.empty((g, 8 * w.qh.shape[1]), np.uint8)) if q3 \
        else np.zeros((g, 0), np.uint8)
    step = max(1, K23_CHUNK_BYTES // (8 * 4 * width))  # groups per chunk: its values as bytes, K23_CHUNK_BYTES
    for c in range(0, g, step):
        r0, r1 = 8 * c, min(n, 8 * (c + step))
        src_qs = w.qs[r0:r1].copy() if same else w.qs[r0:r1]  # in place: the rows before they are overwritten
        src_qh = (w.qh[r0:r1].copy() if same else w.qh[r0:r1]) if q3 else None
        pq, ph = _planes(src_qs, src_qh, -(-(r1 - r0) // 8))
        qs[c:c + pq.shape[0]] = pq
        if q3:
            qh[c:c + ph.shape[0]] = ph
    return replace(w, kind=kinds.interleaved(w.kind), qs=qs, qh=qh, sc=regrouped(w, transform, "sc", inplace),
                   d=regrouped(w, transform, "d", inplace), m=regrouped(w, transform, "m", inplace))

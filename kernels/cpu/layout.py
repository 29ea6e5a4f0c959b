"""The CPU SIMD kernels' own weight layout: quantized matrices with eight rows interleaved.

The CPU backend applies it at load (backend.upload) on the SIMD paths; the portable path and the CUDA
backend keep quant/repack.py's row-major layout. Kinds 10-13 name the interleaved forms of Q4_0, Q4_1,
Q5_0, Q5_1 (kinds 3-6), kinds 14-16 those of Q4_K, Q5_K, Q6_K (kinds 7-9), kind 17 that of Q8_0 (kind 2).
"""

import dataclasses

import numpy as np

INTERLEAVED = {3: 10, 4: 11, 5: 12, 6: 13, 7: 14, 8: 15, 9: 16, 2: 17}


def interleave8(w):
    """A repacked matrix of a kind in INTERLEAVED, eight rows interleaved (see _legacy8, _k8 and _q8_8)."""
    if w.kind == 2:
        return _q8_8(w)
    return _legacy8(w) if w.kind <= 6 else _k8(w)


def _q8_8(w):
    """Q8_0, eight rows per group G: qs (G, nb * 256), for block b and v < 8 a vector of the eight rows'
    signed bytes 4v .. 4v + 3; d (G, nb * 8) the rows' block scales as float16 bits."""
    n, k = w.shape
    nb = k // 32
    g = -(-n // 8)
    pad = ((0, g * 8 - n), (0, 0))
    qs = np.pad(w.qs, pad).reshape(g, 8, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(g, -1)
    return dataclasses.replace(w, kind=INTERLEAVED[w.kind], qs=np.ascontiguousarray(qs), d=_rows8(w.d, g, pad, 1),
                               qh=np.zeros((g, 0), np.uint8), sc=np.zeros((g, 0), np.uint8),
                               m=np.zeros((g, 0), np.uint16))


def _rows8(a, g, pad, per_row):
    # (N, nb * per_row) -> (G, nb * per_row * 8): entry i of row r of a group at (i // per_row, i % per_row, r)
    nb = a.shape[1] // per_row
    return np.ascontiguousarray(np.pad(a, pad).reshape(g, 8, nb, per_row).transpose(0, 2, 3, 1).reshape(g, -1))


def _k8(w):
    """Q4_K/Q5_K/Q6_K, eight rows per group G, per 256-element super-block s (nsb per row):

        Q4_K/Q5_K  qs (G, nsb * 1024)  for pair p (sub-blocks 2p, 2p + 1) and v < 8: a vector of the
                                       eight rows' bytes 4v .. 4v + 3 of the pair's 32 bytes (low nibbles:
                                       sub-block 2p, high: 2p + 1; elements 4v + e)
                   qh (G, nsb * 256)   Q5_K: for v < 8, the eight rows' qh bytes 4v .. 4v + 3 (bit j: the
                                       fifth bit of sub-block j's element 4v + e)
                   sc (G, nsb * 128)   per super-block 16 entries (8 scales, 8 mins) x 8 rows
        Q6_K       qs (G, nsb * 2048)  for v < 64: the eight rows' elements 4v .. 4v + 3 as unsigned q
                                       (0..63; the value is q - 32)
                   sc (G, nsb * 128)   16 int8 scales x 8 rows
        d, m       (G, nsb * 8)        the eight rows' super-block scale (and min scale), float16 bits
    """
    n, k = w.shape
    nsb = k // 256
    g = -(-n // 8)
    pad = ((0, g * 8 - n), (0, 0))
    d = _rows8(w.d, g, pad, 1)
    m = _rows8(w.m, g, pad, 1) if w.m.shape[1] else np.zeros((g, 0), np.uint16)
    sc = _rows8(w.sc, g, pad, 16)
    if w.kind == 9:
        q = (np.pad(w.qs, pad).view(np.int8).astype(np.int16) + 32).astype(np.uint8)
        qs = q.reshape(g, 8, nsb, 64, 4).transpose(0, 2, 3, 1, 4).reshape(g, -1)
        qh = np.zeros((g, 0), np.uint8)
    else:
        qs = np.pad(w.qs, pad).reshape(g, 8, nsb, 4, 8, 4).transpose(0, 2, 3, 4, 1, 5).reshape(g, -1)
        qh = np.zeros((g, 0), np.uint8)
        if w.kind == 8:
            qh = np.pad(w.qh, pad).reshape(g, 8, nsb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(g, -1)
    return dataclasses.replace(w, kind=INTERLEAVED[w.kind], qs=np.ascontiguousarray(qs), qh=np.ascontiguousarray(qh),
                               sc=sc, d=d, m=m)


def _legacy8(w):
    """A repacked Q4_0/Q4_1/Q5_0/Q5_1 matrix (quant/repack.py's QTensor) with its rows regrouped eight at a
    time, so that one 32-byte vector holds the same four elements of eight rows (a u8 x s8 dot product on
    it gives eight rows' sums at once, against four activation bytes broadcast, and the scales of eight
    rows load as one vector). Rows are padded with zeros to a multiple of 8; kinds become INTERLEAVED's. For row group G and
    block b (nb = K / 32 blocks per row):

        qs  (G, nb * 128)  four vectors per block: vector j holds, for each row r, bytes 4j .. 4j + 3
                           of the row's block (low nibbles: elements 4j + e; high: elements 16 + 4j + e)
        qh  (G, nb * 32)   Q5 only: eight uint32 per block, one per vector v (v < 4: low nibbles of
                           vector v; v >= 4: high nibbles of vector v - 4): bit 4 r + e is the fifth bit
                           of element 4 v + e of row r
        d, m (G, nb * 8)   the eight rows' block scales (mins) as float16 bits
    """
    n, k = w.shape
    nb = k // 32
    g = -(-n // 8)
    pad = ((0, g * 8 - n), (0, 0))
    qs = np.pad(w.qs, pad).reshape(g, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4).reshape(g, nb * 128)

    def rows8(a):
        return np.pad(a, pad).reshape(g, 8, nb).transpose(0, 2, 1).reshape(g, nb * 8).copy()

    d = rows8(w.d)
    m = rows8(w.m) if w.m.shape[1] else np.zeros((g, 0), np.uint16)
    qh = np.zeros((g, 0), np.uint8)
    if w.kind in (5, 6):
        h = np.ascontiguousarray(np.pad(w.qh, pad)).view(np.uint32).reshape(g, 8, nb)  # bit i: element i
        masks = np.zeros((g, nb, 8), np.uint32)
        for v in range(8):
            nib = (h >> np.uint32(4 * v)) & np.uint32(15)  # elements 4v .. 4v + 3 of each row
            for r in range(8):
                masks[:, :, v] |= nib[:, r, :] << np.uint32(4 * r)
        qh = masks.reshape(g, nb * 8).view(np.uint8)
    return dataclasses.replace(w, kind=INTERLEAVED[w.kind], qs=np.ascontiguousarray(qs), qh=qh,
                               sc=np.zeros((g, 0), np.uint8), d=d, m=m)

"""The CPU SIMD kernels' own weight layout: quantized matrices with eight rows interleaved.

The CPU backend applies it at load (backend.upload) on the SIMD paths; the portable path and the CUDA
backend keep quant/repack.py's row-major layout. Each row-major quantized kind has an interleaved twin
(kinds.py: Q4_0 -> Q4_0_X8, ..., Q8_0 -> Q8_0_X8), regrouped by its twin's family: x8 (Q4_0, Q4_1,
Q5_0, Q5_1: _legacy8), kx8 (Q4_K, Q5_K, Q6_K: _k8), q8x8 (Q8_0: _q8_8), nlx8 (IQ4_NL: _legacy8, Q4_0's
nibbles), k23x8 (Q3_K, Q2_K: _k23, two-bit planes).
"""

import dataclasses

import numpy as np
from numba import njit, prange

from .. import kinds
from . import simd

INTERLEAVED = kinds.INTERLEAVED  # row-major kind -> its interleaved twin


def interleave8(w, inplace: bool = False):
    """A repacked matrix of a kind in INTERLEAVED, eight rows interleaved (see _legacy8, _k8 and _q8_8).
    inplace: reuse w's arrays (a per-group permutation in place, when the row count is a multiple of 8),
    so loading holds no second copy of a matrix; w is then spent."""
    return _REGROUP[kinds.family(INTERLEAVED[w.kind])](w, inplace)


def _groups(a, transform, inplace):
    """(N, W) -> (G, 8 W): `transform` maps an (8 G, W) array to its (G, 8 W) interleaved form; in place
    (the same permutation applied to each group's 8 W contiguous entries, a few thousand groups at a
    time) where N is a multiple of 8, else on a zero-padded copy."""
    n, width = a.shape
    g = -(-n // 8)
    if width == 0:
        return np.zeros((g, 0), a.dtype)
    if inplace and n % 8 == 0 and a.flags.c_contiguous and a.flags.writeable:
        perm = transform(np.arange(8 * width).reshape(8, width)).reshape(-1)
        out = a.reshape(g, 8 * width)
        for c in range(0, g, 4096):
            out[c:c + 4096] = np.take(out[c:c + 4096], perm, axis=1)
        return out
    return np.ascontiguousarray(transform(np.pad(a, ((0, g * 8 - n), (0, 0)))))


def _by_rows(per_row):
    # entry i of row r of a group goes to (i // per_row, i % per_row, r): one vector of eight rows' values
    def transform(a):
        g = a.shape[0] // 8
        return a.reshape(g, 8, -1, per_row).transpose(0, 2, 3, 1).reshape(g, -1)
    return transform


def _by_words(words):
    # per block of `words` 4-byte words: word v of the eight rows side by side (a vector)
    def transform(a):
        g = a.shape[0] // 8
        return a.reshape(g, 8, -1, words, 4).transpose(0, 2, 3, 1, 4).reshape(g, -1)
    return transform


def _q8_8(w, inplace):
    """Q8_0, eight rows per group G: qs (G, nb * 256), for block b and v < 8 a vector of the eight rows'
    signed bytes 4v .. 4v + 3; d (G, nb * 8) the rows' block scales as float16 bits."""
    g = -(-w.shape[0] // 8)
    return dataclasses.replace(w, kind=INTERLEAVED[w.kind], qs=_field(w, "qs", inplace), d=_field(w, "d", inplace),
                               qh=np.zeros((g, 0), np.uint8), sc=np.zeros((g, 0), np.uint8),
                               m=np.zeros((g, 0), np.uint16))


def _k8(w, inplace):
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
    qs = _field(w, "qs", inplace)  # Q4_K/Q5_K: each pair's 32 bytes as eight words
    if w.kind == kinds.Q6_K:
        qs += np.uint8(32)  # q - 32 as a byte, plus 32 (mod 256): q; padding rows' zeros become 32, times scale 0
    return dataclasses.replace(w, kind=INTERLEAVED[w.kind], qs=qs, qh=_field(w, "qh", inplace),
                               sc=_field(w, "sc", inplace), d=_field(w, "d", inplace), m=_field(w, "m", inplace))


def _legacy8(w, inplace):
    """A repacked Q4_0/Q4_1/Q5_0/Q5_1 matrix (quant/repack.py's QTensor) with its rows regrouped eight at a
    time, so that one 32-byte vector holds the same four elements of eight rows (a u8 x s8 dot product on
    it gives eight rows' sums at once, against four activation bytes broadcast, and the scales of eight
    rows load as one vector). Rows are padded with zeros to a multiple of 8; kinds become INTERLEAVED's.
    For row group G and block b (nb = K / 32 blocks per row):

        qs  (G, nb * 128)  four vectors per block: vector j holds, for each row r, bytes 4j .. 4j + 3
                           of the row's block (low nibbles: elements 4j + e; high: elements 16 + 4j + e)
        qh  (G, nb * 32)   Q5 only: one vector per block, byte 4 r + e lined up with the qs vectors'
                           byte 4 r + e: its bit v is the fifth bit of row r's element 4 v + e (in the
                           weight vector v: v < 4 the low nibbles of qs vector v, v >= 4 the high
                           nibbles of qs vector v - 4), so one shift and mask give a vector its bits
        d, m (G, nb * 8)   the eight rows' block scales (mins) as float16 bits
    """
    g = -(-w.shape[0] // 8)
    qh = _q5_bits(w.qh) if kinds.has_qh(w.kind) else np.zeros((g, 0), np.uint8)
    return dataclasses.replace(w, kind=INTERLEAVED[w.kind], qs=_field(w, "qs", inplace), qh=qh,
                               sc=np.zeros((g, 0), np.uint8), d=_field(w, "d", inplace), m=_field(w, "m", inplace))


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


def _k23_planes(qs, qh, groups):
    """Row-major Q3_K/Q2_K qs (and Q3_K's qh, else None) of up to 8 * groups rows -> the (groups, nsb * 512)
    and (groups, nsb * 256) planes of _k23 (rows past the input's as zeros)."""
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


K23_CHUNK_BYTES = 8 * 2**20  # _k23 builds the planes from this many bytes of values (a byte each) at a time


def _k23(w, inplace):
    """Q3_K/Q2_K, eight rows per group G, per 256-element super-block s (nsb per row), each of its 16
    sub-blocks j of 16 elements as four weight vectors v (elements 4v .. 4v + 3 of the eight rows):

        qs (G, nsb * 512)  for s, j: 32 bytes, byte 4 r + e holding the two low bits of row r's element
                           4v + e of sub-block j at bits 2v, 2v + 1 (v < 4): one vector per sub-block
        qh (G, nsb * 256)  Q3_K: for s and pair p (sub-blocks 2p, 2p + 1): 32 bytes, byte 4 r + e holding
                           the third bit (hmask's) of element 4v + e of sub-block 2p + h at bit 4h + v
        sc (G, nsb * 128)  per super-block 16 entries x 8 rows: Q3_K's int8 scales, Q2_K's scale | min << 4
        d, m (G, nsb * 8)  the eight rows' super-block scale (Q2_K: and min scale), float16 bits

    so a weight vector is (qs >> 2v) & 3, Q3_K's with ((qh >> 4h + v) & 1) << 2 (the value is that - 4).
    A group's planes take the bytes of its eight row-major rows, so in place (a row count that is a multiple
    of 8) they are built a few MB of rows at a time into the row-major arrays' memory (the temporaries: a few
    times K23_CHUNK_BYTES, whatever the matrix)."""
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
        pq, ph = _k23_planes(src_qs, src_qh, -(-(r1 - r0) // 8))
        qs[c:c + pq.shape[0]] = pq
        if q3:
            qh[c:c + ph.shape[0]] = ph
    return dataclasses.replace(w, kind=INTERLEAVED[w.kind], qs=qs, qh=qh, sc=_field(w, "sc", inplace),
                               d=_field(w, "d", inplace), m=_field(w, "m", inplace))


# the regrouping of each interleaved family (interleave8)
_REGROUP = {"q8x8": _q8_8, "x8": _legacy8, "kx8": _k8, "nlx8": _legacy8,  # IQ4_NL: Q4_0's layout
            "k23x8": _k23}


def _q5_bits(qh):
    """Q5_0/Q5_1 high bits (N, nb * 4), row-major (bit j of a block's uint32: element j's fifth bit) ->
    (ceil(N / 8), nb * 32) as _legacy8 lays them out: a transpose of bits, not of bytes."""
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


# -- straight from the file's blocks: one gather per field, no row-major copy in between --------------
#
# Where a field's interleaved form is a permutation of the file's bytes (qs, d, m and Q5_K's qh: whole
# 4- or 2-byte units moved), the loader builds it in one pass with gather_groups, from the GGUF rows
# to the final array; quant/repack.py knows where each field sits in a block and asks gather_index for
# the permutation. The other fields (K-quant scales, Q5_0/Q5_1 high bits) are decoded first and
# regrouped with interleave_field; Q6_K goes through repack and interleave8.

def _field(w, field, inplace):
    # one field of a row-major matrix, regrouped (see _groups)
    return _groups(getattr(w, field), _transform(w.kind, field), inplace)


def _transform(kind, field):
    # the regrouping interleave8 applies to `field` of a row-major matrix of `kind` (see _q8_8, _legacy8, _k8)
    if field in ("d", "m"):
        return _by_rows(1)
    if field == "sc":
        return _by_rows(16)
    if kinds.family(kind) == "k23":
        return None  # qs, qh: bit planes (_k23)
    fam = kinds.family(kind)
    if fam == "q8_0":
        return _by_words(8)
    if fam == "q45":
        return _by_words(4) if field == "qs" else None  # Q5_0/Q5_1 qh: a bit transpose
    return _by_words(64) if fam == "q6_k" else _by_words(8)


def gather_index(kind, field, cols, row_bytes, unit):
    """For `field` (row-major: each row's bytes at columns `cols` of its file row, in field order; for a
    2-byte field, the first byte of each value) of a matrix of row-major `kind`: (rows, cols) int64
    arrays, one entry per `unit` bytes of a row group's interleaved field, naming where in the group's
    eight file rows those bytes start. None where the field is not a permutation of whole units."""
    t = _transform(kind, field)
    if t is None:
        return None
    cols = np.asarray(cols, np.int64)
    width = cols.shape[0]
    src = (np.arange(8, dtype=np.int64)[:, None] * row_bytes + cols[None, :])  # (8, width): file offsets
    order = t(np.arange(8 * width, dtype=np.int64).reshape(8, width)).reshape(-1)
    flat = src.reshape(-1)[order]
    if unit > 1 and field not in ("d", "m"):  # byte fields: moved in whole runs of `unit`?
        runs = flat.reshape(-1, unit)
        if not np.array_equal(runs - runs[:, :1], np.broadcast_to(np.arange(unit), runs.shape)):
            return None
        flat = runs[:, 0]
    return flat // row_bytes, flat % row_bytes


def interleave_field(kind, field, a):
    """A computed row-major field `a` (N, W) of a matrix of row-major `kind`, regrouped as interleave8
    regroups it: (ceil(N / 8), 8 W), rows past N as zeros (Q5_0/Q5_1 qh: the bit vectors of _legacy8)."""
    if kinds.is_q45(kind) and field == "qh":  # Q5_0/Q5_1
        return _q5_bits(a)
    return _groups(a, _transform(kind, field), False)


@njit(parallel=True, nogil=True, cache=True)
def gather_groups(src, rows, cols, unit, out):
    # src (R, row_bytes) uint8, file rows of whole row groups (the last may be short); rows/cols (M,) int64
    # from gather_index; out (ceil(R / 8), M * unit) uint8 <- for group g and entry j, the `unit` (2 or 4)
    # bytes at src[8 g + rows[j], cols[j]:], zeros for rows past R. One unaligned 2- or 4-byte move each.
    R, rb = src.shape
    M = rows.shape[0]
    width = out.shape[1]
    for g_ in prange(out.shape[0]):
        g = np.int64(g_)
        base = 8 * g * rb
        dst = g * width
        if 8 * g + 8 <= R:
            if unit == 4:
                for j in range(M):
                    simd.copy_bytes(out, dst + 4 * j, src, base + rows[j] * rb + cols[j], 4)
            else:
                for j in range(M):
                    simd.copy_bytes(out, dst + 2 * j, src, base + rows[j] * rb + cols[j], 2)
        else:
            for j in range(M):
                for e in range(unit):
                    out[g, j * unit + e] = src[8 * g + rows[j], cols[j] + e] if 8 * g + rows[j] < R else 0

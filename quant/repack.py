"""Repack GGUF block bytes, once at load, into the plain arrays the kernels index.

Every weight matrix W (N rows of K elements) becomes a :class:`QTensor` with the same five fields,
whatever its type, so one family of kernels serves every type (the kind is a small int: kernels/kinds.py):

    qs  uint8 (N, *)   the low quant bits of each block, in ggml's order within the block;
                       Q6_K: every weight unpacked to one signed byte (q - 32) in element order
    qh  uint8 (N, *)   high bits (Q5_0, Q5_1, Q5_K; Q3_K's hmask); empty (N, 0) otherwise
    sc  uint8 (N, *)   per-sub-block scales: Q4_K/Q5_K 8 scales then 8 mins (6-bit values, decoded
                       from ggml's 12-byte packing) per 256; Q6_K and Q3_K 16 int8 scales per 256 (Q3_K's
                       decoded from its 12-byte packing, minus 32); Q2_K the file's 16 bytes (scale in
                       the low nibble, min in the high one)
    d   uint16 (N, nb) block scale as float16 bits (for F16/BF16: the values themselves, (N, K))
    m   uint16 (N, nb) block min (Q4_1, Q5_1) or super-block min scale (Q4_K, Q5_K) as float16 bits

Scales stay as float16 bits (the kernels look them up in a 65,536-entry float32 table), so the
repacked weights take the same bytes as the file (Q6_K: 22% more, since its 6-bit values are
unpacked to bytes: its split layout defeats vectorisation, and it is a small part of K-quant mixes).
Only byte order inside a block is kept; kernels never see a GGUF block struct.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ..kernels import kinds
from ..pages import MADV_HUGEPAGE, MADV_POPULATE_READ, madvise

# The row-major kind of each GGML type the loader takes (kernels/kinds.py; their interleaved twins are the
# CPU SIMD kernels' own layout: kernels/cpu/layout.py). F32 weights are not a QTensor: they stay float32 arrays.
# IQ4_NL is read in its own packing (Q4_0's nibbles, each an index into the 16-value grid), Q3_K and Q2_K in
# theirs (two bits per value, Q3_K's hmask bit; the kernels' own kinds, 3.56 and 2.63 bits per weight). IQ4_XS
# runs on IQ4_NL's kernels (the same nibbles, each 32-block's scale d * (ls - 32) rounded to float16: within
# 2^-11 of it; 4.5 bits per weight rather than 4.25).
WIDENED = {T.IQ4_XS: kinds.IQ4_NL}
KIND = {**kinds.OF_GGML, **WIDENED}
# bytes per weight of a widened type once loaded: IQ4_NL's nibble per value and float16 d per 32
_WIDE_BYTES = {kinds.IQ4_NL: 0.5 + 2 / 32}
# bytes per 256 weights in memory where they differ from the file's: the K-quants' 12 bytes of 6-bit scales
# decoded to 16 (Q3_K 114 bytes rather than 110, Q4_K 148 rather than 144, Q5_K 180 rather than 176), Q6_K's
# values unpacked to a byte each (274 rather than 210)
_SUPER_BYTES = {T.Q3_K: 32 + 64 + 16 + 2, T.Q4_K: 4 + 16 + 128, T.Q5_K: 4 + 16 + 32 + 128, T.Q6_K: 256 + 16 + 2}


def loaded_bytes(ggml_type: T, n_elements: int, file_bytes: int) -> int:
    """The bytes a tensor's repacked arrays take in memory: the file's for the types the kernels read in
    their own packing (K-quants: their decoded scales; Q6_K: its values a byte each), the wider kind's bytes per value and scales for the
    widened ones (WIDENED)."""
    if ggml_type in WIDENED:
        return int(n_elements * _WIDE_BYTES[WIDENED[ggml_type]])
    if ggml_type in _SUPER_BYTES:
        return n_elements // 256 * _SUPER_BYTES[ggml_type]
    return file_bytes
SUPPORTED_TYPES = (T.F32,) + tuple(KIND)


ARRAYS = ("qs", "qh", "sc", "d", "m")  # a QTensor's arrays, by field name


@dataclass(frozen=True)
class QTensor:
    """A quantized weight matrix W (N, K) in kernel layout (see the module docstring)."""

    ggml_type: T
    kind: int
    n_rows: int
    n_cols: int
    qs: np.ndarray
    qh: np.ndarray
    sc: np.ndarray
    d: np.ndarray
    m: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_cols)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in ARRAYS)


def _u16(blocks: np.ndarray, start: int) -> np.ndarray:
    # (N, nb, type_size) uint8 -> (N, nb) uint16 from two little-endian bytes at `start`
    return np.ascontiguousarray(blocks[:, :, start:start + 2]).view(np.uint16)[:, :, 0].copy()


def _flat(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    n = blocks.shape[0]
    return np.ascontiguousarray(blocks[:, :, start:stop]).reshape(n, -1)


def decode_k_scales(packed: np.ndarray) -> np.ndarray:
    """ggml's 12-byte packing of 8 six-bit scales and 8 six-bit mins -> (..., 16) uint8 [sc0..7, m0..7]."""
    q = packed.astype(np.uint8)
    sc = np.empty(q.shape[:-1] + (16,), np.uint8)
    sc[..., 0:4] = q[..., 0:4] & 63
    sc[..., 8:12] = q[..., 4:8] & 63
    sc[..., 4:8] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    sc[..., 12:16] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return sc


def q3_k_scales(packed: np.ndarray) -> np.ndarray:
    """(..., 12) Q3_K scale bytes -> (..., 16) int8 scales as uint8: scale j is six bits, a nibble of byte
    j % 8 (the high one for j >= 8) and two bits of byte 8 + j % 4 at shift 2 (j // 4), minus 32."""
    raw = packed.astype(np.int16)
    low = np.concatenate([raw[..., 0:8] & 0xF, raw[..., 0:8] >> 4], axis=-1)
    high = np.stack([(raw[..., 8:12] >> (2 * i)) & 3 for i in range(4)], axis=-2).reshape(raw.shape[:-1] + (16,))
    return ((low | (high << 4)) - 32).astype(np.int8).view(np.uint8)


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


CHUNK_BYTES = 8 * 2**20  # repack_rows works through a matrix this many source bytes at a time


def repack_rows(raw: np.ndarray, ggml_type: T, shape: tuple[int, ...], release=None) -> QTensor:
    """repack() a 2-D matrix a few MB of rows at a time into arrays allocated once: the temporaries of
    one chunk at most, never a second copy of the matrix. release(r0, r1), when given, is called once
    rows r0 .. r1 have been copied (the loader drops those file pages from memory)."""
    k = int(shape[0])
    n = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    rows = np.asarray(raw, dtype=np.uint8).reshape(n, -1)
    step = max(8, CHUNK_BYTES // max(1, rows.shape[1]) // 8 * 8)
    if step >= n:
        out = repack(rows, ggml_type, shape)
        if release is not None:
            release(0, n)
        return out
    out = None
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        part = repack(rows[r0:r1], ggml_type, (k, r1 - r0))
        if out is None:
            fields = {f: np.empty((n,) + getattr(part, f).shape[1:], getattr(part, f).dtype)
                      for f in ARRAYS}
            out = QTensor(part.ggml_type, part.kind, n, k, **fields)
        for f in ARRAYS:
            getattr(out, f)[r0:r1] = getattr(part, f)
        if release is not None:
            release(r0, r1)
    return out


# Where each field sits in a block (byte ranges), for the types whose interleaved layout is built straight
# from the file (repack_interleaved). d and m are float16 values; sc is decoded (K-quants' 12-byte packing).
_BLOCK_FIELDS = {
    T.Q8_0: {"d": (0, 2), "qs": (2, 34)},
    T.Q4_0: {"d": (0, 2), "qs": (2, 18)},
    T.IQ4_NL: {"d": (0, 2), "qs": (2, 18)},
    T.Q4_1: {"d": (0, 2), "m": (2, 4), "qs": (4, 20)},
    T.Q5_0: {"d": (0, 2), "qh": (2, 6), "qs": (6, 22)},
    T.Q5_1: {"d": (0, 2), "m": (2, 4), "qh": (4, 8), "qs": (8, 24)},
    T.Q4_K: {"d": (0, 2), "m": (2, 4), "sc": (4, 16), "qs": (16, 144)},
    T.Q5_K: {"d": (0, 2), "m": (2, 4), "sc": (4, 16), "qh": (16, 48), "qs": (48, 176)},
}
DIRECT_TYPES = tuple(_BLOCK_FIELDS)


def _weights_array(shape, dtype) -> np.ndarray:
    # huge pages for the weights, where the kernel allows them: a 2 MB fault instead of 512 small ones
    # while loading, and fewer TLB misses while the matmuls stream them
    a = np.empty(shape, dtype)
    if a.nbytes >= 2 << 20:
        madvise(a, MADV_HUGEPAGE)
    return a


def repack_interleaved(raw: np.ndarray, ggml_type: T, shape: tuple[int, ...], release=None) -> QTensor:
    """A 2-D matrix of one of DIRECT_TYPES straight into the CPU SIMD kernels' interleaved layout
    (kernels/cpu/layout.py): the same arrays as interleave8(repack(...)), built a few MB of rows at a
    time with one gather per field from the file's bytes (no row-major copy in between, no second copy
    of the matrix). release(r0, r1) as for repack_rows."""
    from ..kernels.cpu import layout

    k = int(shape[0])
    n = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    nb = k // block
    rows = np.asarray(raw, dtype=np.uint8).reshape(n, nb * type_size)
    kind = KIND[ggml_type]
    g = -(-n // 8)
    fields = _BLOCK_FIELDS[ggml_type]
    starts = np.arange(nb, dtype=np.int64) * type_size
    out = {"qs": None, "qh": np.zeros((g, 0), np.uint8), "sc": np.zeros((g, 0), np.uint8),
           "d": None, "m": np.zeros((g, 0), np.uint16)}
    plans = {}  # field -> (rows, cols, unit) of a gather, or None: computed per chunk
    for f, (a, b) in fields.items():
        if f in ("d", "m"):
            out[f] = _weights_array((g, 8 * nb), np.uint16)
            plans[f] = layout.gather_index(kind, f, starts + a, nb * type_size, 2) + (2,)
        elif f == "sc":
            plans[f] = None
        else:
            cols = (starts[:, None] + np.arange(a, b)[None, :]).reshape(-1)
            idx = layout.gather_index(kind, f, cols, nb * type_size, 4)
            plans[f] = idx + (4,) if idx is not None else (None, cols)
            if idx is not None:
                out[f] = _weights_array((g, 8 * cols.shape[0]), np.uint8)
    step = max(8, CHUNK_BYTES // max(1, rows.shape[1]) // 8 * 8)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        g0, g1 = r0 // 8, -(-r1 // 8)
        src = rows[r0:r1]
        madvise(src, MADV_POPULATE_READ)
        for f, plan in plans.items():
            if plan is not None and plan[0] is not None:
                ridx, cidx, unit = plan
                layout.gather_groups(src, ridx, cidx, unit, out[f].view(np.uint8)[g0:g1])
                continue
            if f == "sc":
                a8 = decode_k_scales(src.reshape(r1 - r0, nb, type_size)[:, :, 4:16]).reshape(r1 - r0, -1)
            else:  # Q5_0/Q5_1 qh: the row-major bytes, then their bit transpose
                a8 = np.ascontiguousarray(src[:, plan[1]])
            part = layout.interleave_field(kind, f, a8)
            if out[f] is None or out[f].shape[1] == 0:
                out[f] = _weights_array((g, part.shape[1]), part.dtype)
            out[f][g0:g1] = part
        if release is not None:
            release(r0, r1)
    return QTensor(ggml_type, kinds.interleaved(kind), n, k, out["qs"], out["qh"], out["sc"], out["d"], out["m"])


def repack(raw: np.ndarray, ggml_type: T, shape: tuple[int, ...]) -> QTensor:
    """raw: the tensor's bytes (any shape ending in bytes per row); shape: ggml dims (K, N[, ...])."""
    if ggml_type not in KIND:
        raise ValueError(f"unsupported tensor type {ggml_type.name} (supported: "
                         f"{', '.join(t.name for t in SUPPORTED_TYPES)})")
    k = int(shape[0])
    n = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    nb = k // block
    b = np.asarray(raw, dtype=np.uint8).reshape(n, nb, type_size)
    empty = np.zeros((n, 0), np.uint8)
    none16 = np.zeros((n, 0), np.uint16)
    t = ggml_type
    if t in (T.F16, T.BF16):
        return QTensor(t, KIND[t], n, k, empty, empty, empty, b.reshape(n, k * 2).copy().view(np.uint16), none16)
    if t == T.Q8_0:  # d f16 | qs int8[32]
        return QTensor(t, KIND[t], n, k, _flat(b, 2, 34), empty, empty, _u16(b, 0), none16)
    if t == T.Q4_0:  # d | qs[16]
        return QTensor(t, KIND[t], n, k, _flat(b, 2, 18), empty, empty, _u16(b, 0), none16)
    if t == T.Q4_1:  # d | m | qs[16]
        return QTensor(t, KIND[t], n, k, _flat(b, 4, 20), empty, empty, _u16(b, 0), _u16(b, 2))
    if t == T.Q5_0:  # d | qh u32 | qs[16]
        return QTensor(t, KIND[t], n, k, _flat(b, 6, 22), _flat(b, 2, 6), empty, _u16(b, 0), none16)
    if t == T.Q5_1:  # d | m | qh u32 | qs[16]
        return QTensor(t, KIND[t], n, k, _flat(b, 8, 24), _flat(b, 4, 8), empty, _u16(b, 0), _u16(b, 2))
    if t == T.Q4_K:  # d | dmin | scales[12] | qs[128]
        sc = decode_k_scales(b[:, :, 4:16]).reshape(n, -1)
        return QTensor(t, KIND[t], n, k, _flat(b, 16, 144), empty, sc, _u16(b, 0), _u16(b, 2))
    if t == T.Q5_K:  # d | dmin | scales[12] | qh[32] | qs[128]
        sc = decode_k_scales(b[:, :, 4:16]).reshape(n, -1)
        return QTensor(t, KIND[t], n, k, _flat(b, 48, 176), _flat(b, 16, 48), sc, _u16(b, 0), _u16(b, 2))
    if t == T.Q6_K:  # ql[128] | qh[64] | scales int8[16] | d
        return QTensor(t, KIND[t], n, k, unpack_q6_k(b[:, :, 0:128], b[:, :, 128:192]).reshape(n, k), empty,
                       _flat(b, 192, 208), _u16(b, 208), none16)
    if t == T.Q3_K:  # hmask[32] | qs[64] | scales[12] | d
        sc = q3_k_scales(b[:, :, 96:108]).reshape(n, -1)
        return QTensor(t, KIND[t], n, k, _flat(b, 32, 96), _flat(b, 0, 32), sc, _u16(b, 108), none16)
    if t == T.IQ4_NL:  # d | qs[16]
        return QTensor(t, KIND[t], n, k, _flat(b, 2, 18), empty, empty, _u16(b, 0), none16)
    if t == T.IQ4_XS:  # d | scales_h u16 | scales_l[4] | qs[128]
        d = _u16(b, 0).view(np.float16).astype(np.float32)
        sh = _u16(b, 2).astype(np.int32)
        sl = b[:, :, 4:8].astype(np.int32)
        ib = np.arange(8)
        ls = ((sl[:, :, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh[:, :, None] >> (2 * ib)) & 3) << 4)
        dl = (d[:, :, None] * (ls - 32).astype(np.float32)).astype(np.float16).view(np.uint16).reshape(n, -1)
        return QTensor(t, KIND[t], n, k, _flat(b, 8, 136), empty, empty, dl.copy(), none16)
    if t == T.Q2_K:  # scales[16] | qs[64] | d | dmin
        return QTensor(t, KIND[t], n, k, _flat(b, 16, 80), empty, _flat(b, 0, 16), _u16(b, 80), _u16(b, 82))
    raise AssertionError(t)

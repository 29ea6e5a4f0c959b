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
repacked weights take the same bytes as the file (Q6_K row-major: 22% more, since its 6-bit values are
unpacked to bytes: its split layout defeats vectorisation; its interleaved form, which the SIMD paths read,
packs them back to six bits: kernels/formats/q6_k.py).
Only byte order inside a block is kept; kernels never see a GGUF block struct.

What each type's blocks hold and how they become these arrays is its weight format's (kernels/formats, one
module per family of types); this module drives them: whole matrices (`repack`), a few MB of rows at a time
(`repack_rows`), straight into the interleaved layout (`repack_interleaved`), and their size in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from ..kernels import formats, kinds
from ..pages import MADV_HUGEPAGE, MADV_POPULATE_READ, madvise

# The row-major kind each GGML type the loader takes is read as: its weight format's (kernels/formats; their
# interleaved twins are the CPU SIMD kernels' own layout: kernels/cpu/layout.py). F32 weights are not a
# QTensor: they stay float32 arrays. WIDENED: the types that run on a wider type's kind (IQ4_XS on IQ4_NL's:
# kernels/formats/iq4.py).
WIDENED = {t: f.kind for t, f in formats.TYPES.items() if kinds.OF_GGML.get(t) != f.kind}
KIND = {**{t: k for t, k in kinds.OF_GGML.items() if t in formats.TYPES}, **WIDENED}  # in kind order, then WIDENED
SUPPORTED_TYPES = (T.F32,) + tuple(KIND)
# the types whose interleaved layout is built straight from the file's blocks (repack_interleaved)
DIRECT_TYPES = tuple(t for t in KIND if formats.of(t).direct)


def loaded_bytes(ggml_type: T, n_elements: int, file_bytes: int, interleaved: bool = False) -> int:
    """The bytes a tensor's repacked arrays take in memory: its format's (the file's for the types the kernels
    read in their own packing; K-quants: their decoded scales; Q6_K: its values a byte each row-major, six bits
    interleaved; the widened ones: the wider kind's bytes per value and scales), the file's for the rest
    (F32). interleaved: in the SIMD kernels' layout (kernels/cpu/layout.py), not the portable path's."""
    f = formats.TYPES.get(ggml_type)
    return file_bytes if f is None else f.loaded_bytes(n_elements, file_bytes, interleaved)


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

    def rows(self, r0: int, r1: int) -> "QTensor":
        """Rows [r0, r1) as a matrix of their own, viewing these arrays (no copy): each output row of a
        matmul over it is the same row's over the whole matrix, bit for bit. An interleaved matrix's arrays
        hold a group of eight rows per entry, so there r0 and r1 must be multiples of 8 (or r1 the end)."""
        if not 0 <= r0 < r1 <= self.n_rows:
            raise ValueError(f"rows [{r0}, {r1}) are not within the matrix's {self.n_rows}")
        g = 8 if kinds.info(self.kind).interleaved else 1
        if r0 % g or (r1 % g and r1 != self.n_rows):
            raise ValueError(f"rows [{r0}, {r1}) of an interleaved matrix must start and end on a group of {g}")
        a, b = r0 // g, -(-r1 // g)
        return QTensor(self.ggml_type, self.kind, r1 - r0, self.n_cols,
                       *(getattr(self, f)[a:b] for f in ARRAYS))


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
    of the matrix; Q6_K, whose fields are computed together: each chunk repacked row-major, then
    regrouped). release(r0, r1) as for repack_rows."""
    from ..kernels.cpu import layout

    k = int(shape[0])
    n = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    fmt = formats.of(ggml_type)
    type_size = fmt.block_bytes
    nb = k // fmt.block
    rows = np.asarray(raw, dtype=np.uint8).reshape(n, nb * type_size)
    kind = fmt.kind
    g = -(-n // 8)
    if fmt.repack is not None:  # fields computed together (Q6_K): each chunk repacked, then regrouped
        return _regrouped_chunks(rows, ggml_type, k, n, release)
    fields = fmt.fields
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
            if f == "sc":  # the format's decoding of its packed scales
                a, b = fields["sc"]
                a8 = fmt.scales(src.reshape(r1 - r0, nb, type_size)[:, :, a:b]).reshape(r1 - r0, -1)
            else:  # Q5_0/Q5_1 qh: the row-major bytes, then their bit transpose
                a8 = np.ascontiguousarray(src[:, plan[1]])
            part = layout.interleave_field(kind, f, a8)
            if out[f] is None or out[f].shape[1] == 0:
                out[f] = _weights_array((g, part.shape[1]), part.dtype)
            out[f][g0:g1] = part
        if release is not None:
            release(r0, r1)
    return QTensor(ggml_type, kinds.interleaved(kind), n, k, out["qs"], out["qh"], out["sc"], out["d"], out["m"])


def _regrouped_chunks(rows: np.ndarray, ggml_type: T, k: int, n: int, release) -> QTensor:
    # repack_interleaved for a format whose fields are computed together: each chunk of whole row groups
    # repacked row-major, then interleaved (layout.interleave8) into arrays allocated once
    from ..kernels.cpu import layout

    g = -(-n // 8)
    step = max(8, CHUNK_BYTES // max(1, rows.shape[1]) // 8 * 8)
    out = None
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        madvise(rows[r0:r1], MADV_POPULATE_READ)
        part = layout.interleave8(repack(rows[r0:r1], ggml_type, (k, r1 - r0)), inplace=True)
        if out is None:
            out = {f: _weights_array((g,) + getattr(part, f).shape[1:], getattr(part, f).dtype) for f in ARRAYS}
        for f in ARRAYS:
            out[f][r0 // 8:-(-r1 // 8)] = getattr(part, f)
        if release is not None:
            release(r0, r1)
    return QTensor(ggml_type, part.kind, n, k, **out)


def repack(raw: np.ndarray, ggml_type: T, shape: tuple[int, ...]) -> QTensor:
    """raw: the tensor's bytes (any shape ending in bytes per row); shape: ggml dims (K, N[, ...])."""
    if ggml_type not in KIND:
        raise ValueError(f"unsupported tensor type {ggml_type.name} (supported: "
                         f"{', '.join(t.name for t in SUPPORTED_TYPES)})")
    fmt = formats.of(ggml_type)
    k = int(shape[0])
    n = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    b = np.asarray(raw, dtype=np.uint8).reshape(n, k // fmt.block, fmt.block_bytes)
    arrays = fmt.arrays(b, n, k)
    empty = np.zeros((n, 0), np.uint8)
    none16 = np.zeros((n, 0), np.uint16)
    return QTensor(ggml_type, fmt.kind, n, k, *(arrays.get(f, none16 if f in ("d", "m") else empty) for f in ARRAYS))

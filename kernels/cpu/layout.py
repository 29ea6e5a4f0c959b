"""The CPU SIMD kernels' own weight layout: quantized matrices with eight rows interleaved, and which
kernel paths read it.

The CPU backend applies it at load (backend.upload) on the SIMD paths; the portable path and the CUDA
backend keep quant/repack.py's row-major layout. Each row-major quantized kind has an interleaved twin
(kinds.py: Q4_0 -> Q4_0_X8, ..., Q8_0 -> Q8_0_X8); how a kind's fields are regrouped is its weight
format's (kernels/formats: `regroup`, `transform`, `BITS`). The layout does not depend on the SIMD path:
every one of them reads the same bytes (`layout_id`).
"""

import numpy as np
from numba import njit, prange

from .. import formats, kinds
from ..formats.base import groups
from . import simd

INTERLEAVED = kinds.INTERLEAVED  # row-major kind -> its interleaved twin

# The layouts the kernel paths read: the portable path row-major, every SIMD path the interleaved one (the
# same bytes on each: layout.py takes no path). Named so, a file of repacked weights (models/layout_cache.py)
# serves every path that reads its bytes.
ROW_MAJOR = "rows"
EIGHT_ROWS = "x8"


def layout_id(kernel_path: str) -> str:
    """The layout of the weights the kernels of `kernel_path` read (simd.PATHS): ROW_MAJOR or EIGHT_ROWS."""
    if kernel_path not in simd.PATHS:
        raise ValueError(f"unknown kernel path {kernel_path!r}")
    return ROW_MAJOR if kernel_path == "portable" else EIGHT_ROWS


def interleave8(w, inplace: bool = False):
    """A repacked matrix of a kind in INTERLEAVED, eight rows interleaved (its format's `regroup`).
    inplace: reuse w's arrays (a per-group permutation in place, when the row count is a multiple of 8),
    so loading holds no second copy of a matrix; w is then spent."""
    if w.kind not in INTERLEAVED:
        raise KeyError(w.kind)
    return formats.module_of_kind(w.kind).regroup(w, inplace)


# -- straight from the file's blocks: one gather per field, no row-major copy in between --------------
#
# Where a field's interleaved form is a permutation of the file's bytes (qs, d, m and Q5_K's qh: whole
# 4- or 2-byte units moved), the loader builds it in one pass with gather_groups, from the GGUF rows
# to the final array; quant/repack.py knows where each field sits in a block and asks gather_index for
# the permutation. The other fields (K-quant scales, Q5_0/Q5_1 high bits) are decoded first and
# regrouped with interleave_field; Q6_K goes through repack and interleave8.

def _transform(kind, field):
    # the regrouping interleave8 applies to `field` of a row-major matrix of `kind`; None: not a permutation
    return formats.module_of_kind(kind).transform(kind, field)


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
    regroups it: (ceil(N / 8), 8 W), rows past N as zeros (the fields in its format's BITS: as they compute it)."""
    bits = formats.module_of_kind(kind).BITS.get(field)
    if bits is not None:  # computed from the bytes, not a permutation of them
        return bits(a)
    return groups(a, _transform(kind, field), False)


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

"""What a weight format module declares (`Type`), and the pieces its repack, decode and regrouping share.

A format module (one per family of GGML types: kernels/formats/__init__.py) declares:

    TYPES      the `Type` of each GGML type it reads: the row-major kind it loads as, its block's field
               ranges, how those fields become a QTensor's arrays (quant/repack.py's QTensor)
    group      the CPU decode: elements [32 g, 32 g + 32) of row n -> y (32,) float32, for every kind of
               its types (row-major and interleaved); a plain function that kernels/cpu/quant.py compiles
               inline into its generated decode_group
    element    the CUDA decode: element k of row n of a row-major matrix; kernels/cuda/quant.py compiles it
               as a device function
    transform  (kind, field) -> the permutation that takes a field into the interleaved layout
               (kernels/cpu/layout.py), None where the field's interleaved form is computed (BITS, regroup)
    regroup    (w, inplace) -> the matrix with eight rows interleaved (kernels/cpu/layout.interleave8), or
               None where its kinds have no interleaved twin
    BITS       {field: function} the fields whose interleaved form is computed from the row-major bytes

This module imports nothing of ours, and no Numba code generator: `i8` is a generic
overload, compiled by whichever target calls it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba.extending import overload


# -- the declaration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Type:
    """One GGML type as the loader reads it.

    fields: the byte range [a, b) of each field of a block (its size: gguf's GGML_QUANT_SIZES); named as
    the QTensor array it becomes where `repack` is None (d, m: one float16 each; sc decoded by `scales`
    when given, else copied; qs, qh copied), as the file's struct names them otherwise.
    repack: (blocks (N, nb, block bytes) uint8, N, K) -> {array name: array} where the fields are not
    simply copied. direct: the interleaved layout is built straight from the file's bytes, one gather per
    field, or with `repack` a few MB of rows repacked and regrouped at a time (quant/repack.repack_interleaved)."""

    ggml: T
    kind: int  # the row-major kind (kernels/kinds.py) its matrices load as
    fields: dict
    scales: Callable | None = None
    repack: Callable | None = None
    direct: bool = False
    x8_block_bytes: int | None = None  # one block's bytes in the interleaved layout, where not the row-major's

    @property
    def block(self) -> int:
        return GGML_QUANT_SIZES[self.ggml][0]

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.ggml][1]

    def arrays(self, blocks: np.ndarray, n: int, k: int) -> dict:
        """blocks (N, nb, block bytes) uint8 -> the QTensor arrays this type fills."""
        if self.repack is not None:
            return self.repack(blocks, n, k)
        out = {}
        for f, (a, b) in self.fields.items():
            if f in ("d", "m"):
                out[f] = u16(blocks, a)
            elif f == "sc" and self.scales is not None:
                out[f] = self.scales(blocks[:, :, a:b]).reshape(n, -1)
            else:
                out[f] = flat(blocks, a, b)
        return out

    def loaded_bytes(self, n_elements: int, file_bytes: int, interleaved: bool = False) -> int:
        """The bytes a tensor of n_elements takes once repacked (interleaved: in the SIMD kernels' layout,
        kernels/cpu/layout.py): the file's where the arrays hold the block's bytes as they are, else what
        one block repacks to, per block."""
        per_block = self.x8_block_bytes if interleaved and self.x8_block_bytes else _loaded_per_block(self)
        if per_block == self.block_bytes:
            return file_bytes
        return n_elements // self.block * per_block


_per_block: dict = {}


def _loaded_per_block(t: Type) -> int:
    # what one row of one block repacks to: the repack itself says, so no size is written twice
    if t.ggml not in _per_block:
        a = t.arrays(np.zeros((1, 1, t.block_bytes), np.uint8), 1, t.block)
        _per_block[t.ggml] = sum(v.nbytes for v in a.values())
    return _per_block[t.ggml]


# -- repack helpers ---------------------------------------------------------------------------------


def u16(blocks: np.ndarray, start: int) -> np.ndarray:
    # (N, nb, type_size) uint8 -> (N, nb) uint16 from two little-endian bytes at `start`
    return np.ascontiguousarray(blocks[:, :, start:start + 2]).view(np.uint16)[:, :, 0].copy()


def flat(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    n = blocks.shape[0]
    return np.ascontiguousarray(blocks[:, :, start:stop]).reshape(n, -1)


# -- decode helpers ---------------------------------------------------------------------------------


def i8(v):
    """A uint8 bit pattern's signed value, branch-free (so loops over bytes vectorise)."""
    return (np.int32(v) ^ 128) - 128


@overload(i8, inline="always", target="generic")
def _i8(v):
    def impl(v):
        return (np.int32(v) ^ 128) - 128
    return impl


# -- regrouping helpers (kernels/cpu/layout.py's interleaved layout) ---------------------------------


def groups(a, transform, inplace):
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


def by_rows(per_row):
    # entry i of row r of a group goes to (i // per_row, i % per_row, r): one vector of eight rows' values
    def transform(a):
        g = a.shape[0] // 8
        return a.reshape(g, 8, -1, per_row).transpose(0, 2, 3, 1).reshape(g, -1)
    return transform


def by_words(words):
    # per block of `words` 4-byte words: word v of the eight rows side by side (a vector)
    def transform(a):
        g = a.shape[0] // 8
        return a.reshape(g, 8, -1, words, 4).transpose(0, 2, 3, 1, 4).reshape(g, -1)
    return transform


def scale_transform(field):
    """The regrouping every format gives its scales: d and m a vector of eight rows' values per block,
    sc 16 entries x 8 rows per super-block; None for the other fields."""
    if field in ("d", "m"):
        return by_rows(1)
    if field == "sc":
        return by_rows(16)
    return None


def regrouped(w, transform, field, inplace):
    # one field of a row-major matrix, regrouped (see groups)
    return groups(getattr(w, field), transform(w.kind, field), inplace)


def empty_groups(w, dtype=np.uint8):
    # an empty field of the interleaved matrix of w: (ceil(N / 8), 0)
    return np.zeros((-(-w.shape[0] // 8), 0), dtype)


def replace(w, **arrays):
    return dataclasses.replace(w, **arrays)

"""MXFP4 (OCP microscaling FP4, gpt-oss's experts): blocks of 32 E2M1 values, four bits each, and one shared
E8M0 scale byte e (value = grid[q] * 2^(e - 128), grid gguf's MXFP4.kvalues: the E2M1 values doubled, so that
they are integers, -12 .. 12).

Repacked as IQ4_NL's nibbles (Q4_0's packing: byte j holds element j low, element j + 16 high) with the scale
bytes kept as they are, two to a uint16 of `d` (byte i of a row's d is block i's e), so a matrix takes the
file's 4.25 bits a weight: its own kinds, MXFP4 (family mx4, the portable path's) and MXFP4_X8 (family mxx8:
IQ4_NL_X8's layout and kernels, their grid and scale loads swapped: simd.mxgrid16, simd.loade8m0), so that the
IQ4_NL units are compiled without it. Interleaved, a block's eight rows' scale bytes lie side by side (d
(G, nb * 4) uint16: eight bytes a block). 2^(e - 128) is exact in float32 for every e (E8M0, below)."""

import dataclasses

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import MXFP4 as _MXFP4

from .. import kinds
from . import legacy
from .base import Type, flat, replace

GRID = np.array(_MXFP4.kvalues, np.float32)  # the 16 values (E2M1 doubled)
E8M0 = _MXFP4.e8m0_to_fp32_half(np.arange(256, dtype=np.uint8)).astype(np.float32)  # e -> 2^(e - 128)


def pack_bytes(e: np.ndarray) -> np.ndarray:
    """(N, nb) uint8 -> (N, ceil(nb / 2)) uint16, byte i of a row's the i-th (little-endian; a zero pad byte)."""
    n, nb = e.shape
    out = np.zeros((n, 2 * (-(-nb // 2))), np.uint8)
    out[:, :nb] = e
    return out.view(np.uint16)


def _repack(blocks, n, k):
    # e | qs[16] -> IQ4_NL's qs, and the scale bytes two to a uint16
    return {"qs": flat(blocks, 1, 17), "d": pack_bytes(np.ascontiguousarray(blocks[:, :, 0]))}


@dataclasses.dataclass(frozen=True)
class _Bytes(Type):
    def loaded_bytes(self, n_elements: int, file_bytes: int, interleaved: bool = False) -> int:
        return file_bytes  # the file's bytes (a row of an odd number of blocks holds a pad byte more, not counted)


TYPES = (_Bytes(T.MXFP4, kinds.MXFP4, {"e": (0, 1), "qs": (1, 17)}, repack=_repack),)


def group(kind, qs, qh, sc, d, m, luts, n, g, y):
    # elements [32 g, 32 g + 32) of row n of W -> y (32,) float32
    if kind == kinds.MXFP4:
        db = E8M0[(d[n, g >> 1] >> ((g & 1) << 3)) & 255]
        for j in range(16):
            q = qs[n, g * 16 + j]
            y[j] = db * GRID[q & 15]
            y[j + 16] = db * GRID[q >> 4]
    else:  # eight rows interleaved, as IQ4_NL_X8; byte g * 8 + r of the group's scales is row r's
        G = n // 8
        r = n % 8
        i = g * 8 + r
        db = E8M0[(d[G, i >> 1] >> ((i & 1) << 3)) & 255]
        for i in range(32):
            v = i // 4
            b = qs[G, g * 128 + (v % 4) * 32 + r * 4 + i % 4]
            q = np.int32(b & 15) if v < 4 else np.int32(b >> 4)
            y[i] = db * GRID[q]


def element(kind, qs, qh, sc, d, m, luts, n, k):
    # element k of row n of W
    g = k // 32
    j = k % 32
    b = qs[n, g * 16 + j % 16]
    return E8M0[(d[n, g >> 1] >> ((g & 1) << 3)) & 255] * GRID[(b & 15) if j < 16 else (b >> 4)]


transform = legacy.transform
BITS = {}


def regroup(w, inplace):
    """IQ4_NL_X8's layout (legacy.regroup) of the nibbles, and each block's eight rows' scale bytes side by side."""
    n, nb = w.shape[0], w.shape[1] // 32
    e = np.ascontiguousarray(w.d.view(np.uint8)[:, :nb])
    x = legacy.regroup(replace(w, d=e), inplace)
    return replace(x, d=np.ascontiguousarray(x.d).view(np.uint16))

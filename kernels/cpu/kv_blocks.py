"""The KV cache's bf16 and 4- and 5-bit rows (q5_1, q5_0, q4_1, q4_0, iq4_nl; kernels/kv_format.py): written as
llama.cpp's CPU writes them, read as its dequantizers read them.

A row of D values is D/32 of ggml's blocks of its type, byte for byte (so `gguf`'s dequantize reads a row as
it reads a tensor's), in an array whose element type is a record of one field named after the format: the
kernels reach a byte as `cache[slot, g, i][name]`, and the format is part of the array's type, so each
compiled kernel holds one format's code and no branch on it.

Writing a row is ggml's reference quantizer of the type (ggml-quants.c's quantize_row_*_ref: what ggml's CPU
from_float runs for these types when llama.cpp stores K and V; iq4_nl's with no importance weights and no
scale search, as its CPU from_float calls it); bf16 rounds to nearest even. Reading is ggml's to_float:
float(q) * d (+ m for the _1 types), iq4_nl's grid value times d, a block at a time (`row_reader`: into the
attention tiles, and for kv_load's one value).

`row_reader(name)`, `loader(name)` and `writer(name)` give a format's compiled functions; ops.py's KV overloads
(kv_load, kv_keys_to_tile, kv_value_to_tile, kv_put_head) dispatch to them by the array's record name.
"""

import math
from functools import cache

import numpy as np
from gguf.quants import IQ4_NL
from numba import njit

from .halves import F16_TO_F32, bf16_to_f32, f32_to_bf16_bits, f32_to_f16_bits

BLOCK = 32
IQ4_VALUES = np.array(IQ4_NL.kvalues, np.float32)  # iq4_nl's 16 grid values
# per format: bytes per block, where its 4-bit quants start in the block, whether a min (m) follows the scale,
# whether a word of fifth bits does, and the offset its quants are stored from (q - offset: 8 or 16; 0 with a min)
LAYOUT = {"q4_0": (18, 2, False, False, 8), "q4_1": (20, 4, True, False, 0), "q5_0": (22, 6, False, True, 16),
          "q5_1": (24, 8, True, True, 0), "iq4_nl": (18, 2, False, False, 0)}


def record_name(dtype) -> str | None:
    """The format a KV array's Numba element type names (a record's one field), or None: not one of these."""
    fields = getattr(dtype, "fields", None)
    return next(iter(fields)) if fields and len(fields) == 1 else None


@cache
def row_reader(name: str):
    """read_row(c, slot, g, n, out, o, b0=0): out[o : o + n] = the n values of row c[slot, g] from its block b0
    on (bf16: from value b0 on), a block at a time in loops the compiler vectorizes."""
    if name == "bf16":
        @njit(inline="always", nogil=True, cache=True)
        def read_bf16(c, slot, g, n, out, o, b0=0):
            for i in range(n):
                out[o + i] = bf16_to_f32(c[slot, g, b0 + i][name])
        return read_bf16
    size, qs, has_min, has_high, offset = LAYOUT[name]
    grid = name == "iq4_nl"

    @njit(inline="always", nogil=True, cache=True)
    def read_row(c, slot, g, n, out, o, b0=0):
        for b in range(n // BLOCK):
            base, at = (b0 + b) * size, o + b * BLOCK
            scale = F16_TO_F32[np.int64(c[slot, g, base][name]) | (np.int64(c[slot, g, base + 1][name]) << 8)]
            lo = np.float32(0.0)
            if has_min:
                lo = F16_TO_F32[np.int64(c[slot, g, base + 2][name]) | (np.int64(c[slot, g, base + 3][name]) << 8)]
            high = np.int64(0)
            if has_high:
                for k in range(4):
                    high |= np.int64(c[slot, g, base + qs - 4 + k][name]) << (8 * k)
            for j in range(16):
                byte = np.int64(c[slot, g, base + qs + j][name])
                q0, q1 = byte & 0xF, byte >> 4
                if has_high:
                    q0 |= ((high >> j) & 1) << 4
                    q1 |= ((high >> (j + 16)) & 1) << 4
                if grid:
                    out[at + j] = scale * IQ4_VALUES[q0]
                    out[at + j + 16] = scale * IQ4_VALUES[q1]
                elif has_min:
                    out[at + j] = np.float32(q0) * scale + lo
                    out[at + j + 16] = np.float32(q1) * scale + lo
                else:
                    out[at + j] = np.float32(q0 - offset) * scale
                    out[at + j + 16] = np.float32(q1 - offset) * scale
    return read_row


@cache
def values_per_row(name: str):
    """per_row(n): the values in a row of n elements of this format."""
    size = LAYOUT[name][0] if name in LAYOUT else 0

    @njit(inline="always", nogil=True, cache=True)
    def per_row(n):
        return n // size * BLOCK if size else n
    return per_row


@cache
def loader(name: str):
    """load(c, slot, g, i): value i of row c[slot, g] as float32, one at a time (the same value read_row gives)."""
    if name == "bf16":
        @njit(nogil=True, cache=True)
        def load_bf16(c, slot, g, i):
            return bf16_to_f32(c[slot, g, i][name])
        return load_bf16
    read_row = row_reader(name)

    @njit(nogil=True, cache=True)
    def load(c, slot, g, i):
        tmp = np.empty(BLOCK, np.float32)
        read_row(c, slot, g, BLOCK, tmp, 0, i // BLOCK)
        return tmp[i % BLOCK]
    return load


@njit(inline="always", nogil=True, cache=True)
def _trunc_u8(v):
    # C's (int8_t) / (uint8_t) of a float in [0, 128): toward zero
    return np.int64(math.floor(v)) if v >= 0 else np.int64(math.ceil(v))


@cache
def writer(name: str):
    """put(c, slot, g, row): row c[slot, g] = row (float32 (D,)) in this format."""
    if name == "bf16":
        @njit(inline="always", nogil=True, cache=True)
        def put_bf16(c, slot, g, row):
            for i in range(row.shape[0]):
                c[slot, g, i][name] = f32_to_bf16_bits(row[i])
        return put_bf16
    size, qs, has_min, has_high, offset = LAYOUT[name]
    grid = name == "iq4_nl"
    top = 31 if has_high else 15

    @njit(inline="always", nogil=True, cache=True)
    def put_bytes(c, slot, g, at, bits, n):  # n little-endian bytes of bits at byte `at` of the row
        for k in range(n):
            c[slot, g, at + k][name] = np.uint8((bits >> (8 * k)) & 0xFF)

    @njit(inline="always", nogil=True, cache=True)
    def put(c, slot, g, row):
        for b in range(row.shape[0] // BLOCK):
            base, x0 = b * size, b * BLOCK
            if has_min:  # q4_1, q5_1: d = (max - min) / (2^bits - 1), m = min
                mn, mx = np.float32(np.inf), np.float32(-np.inf)
                for j in range(BLOCK):
                    v = row[x0 + j]
                    if v < mn:
                        mn = v
                    if v > mx:
                        mx = v
                d = (mx - mn) / np.float32(top)
                put_bytes(c, slot, g, base + 2, np.int64(f32_to_f16_bits(mn)), 2)
            else:  # the value of largest magnitude, signed (the first of equals)
                amax, mx = np.float32(0.0), np.float32(0.0)
                for j in range(BLOCK):
                    v = row[x0 + j]
                    if amax < abs(v):
                        amax, mx = abs(v), v
                mn = np.float32(0.0)
                d = mx / (IQ4_VALUES[0] if grid else np.float32(-offset))  # iq4_nl: max / -127
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            high = np.int64(0)
            codes = np.empty(BLOCK, np.int64)
            if grid:  # iq4_nl: the nearest grid value to x / d, then d refit by least squares weighted by x^2
                sqx = sq = np.float32(0.0)
                for j in range(BLOCK):
                    v = row[x0 + j]
                    codes[j] = _nearest(inv * v)
                    gq = IQ4_VALUES[codes[j]]
                    w = v * v
                    sqx += w * gq * v
                    sq += w * gq * gq
                d = sqx / sq if sq > 0 else np.float32(0.0)
                if amax < np.float32(1e-15):
                    d = np.float32(0.0)
                    for j in range(BLOCK):
                        codes[j] = 0
            else:
                for j in range(BLOCK):
                    v = (row[x0 + j] - mn) * inv if has_min else row[x0 + j] * inv
                    codes[j] = min(top, _trunc_u8(v + np.float32(0.5 if has_min else offset + 0.5)))
            put_bytes(c, slot, g, base, np.int64(f32_to_f16_bits(d)), 2)
            for j in range(16):
                lo_q, hi_q = codes[j], codes[j + 16]
                c[slot, g, base + qs + j][name] = np.uint8((lo_q & 0xF) | ((hi_q & 0xF) << 4))
                high |= ((lo_q >> 4) & 1) << j
                high |= ((hi_q >> 4) & 1) << (j + 16)
            if has_high:
                put_bytes(c, slot, g, base + qs - 4, high, 4)
    return put


@njit(inline="always", nogil=True, cache=True)
def _nearest(x):
    # ggml's best_index_int8 over iq4_nl's grid: the index of the grid value nearest x (the lower of a tie)
    if x <= IQ4_VALUES[0]:
        return np.int64(0)
    if x >= IQ4_VALUES[15]:
        return np.int64(15)
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x < IQ4_VALUES[mid]:
            hi = mid
        else:
            lo = mid
    return np.int64(hi - 1) if x - IQ4_VALUES[hi - 1] < IQ4_VALUES[hi] - x else np.int64(hi)

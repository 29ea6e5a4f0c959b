"""Half-precision bit patterns: float16 and bfloat16 to and from float32, as numpy and ggml convert them
(round to nearest even). A leaf: the KV row formats (ops, kv_blocks) and attention share these."""

import numpy as np
from numba import njit

from .simd import f32_bits

# float16 bit pattern -> float32, for KV caches stored as float16 bits (uint16)
with np.errstate(invalid="ignore"):  # signalling NaNs set the invalid flag on aarch64 (numpy warns); kept as NaNs
    F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True)
def f32_to_f16_bits(v):
    # float32 -> float16 bit pattern (uint16), rounding to nearest even as numpy's astype(float16) does
    u = f32_bits(np.float32(v))
    sign = np.uint32((u >> 16) & 0x8000)
    exp = np.int32((u >> 23) & 0xFF)
    mant = np.uint32(u & 0x7FFFFF)
    if exp == 0xFF:  # inf, nan
        return np.uint16(sign | 0x7C00 | (np.uint32(0x200) if mant != 0 else np.uint32(0)))
    e = exp - 127 + 15
    if e >= 31:  # too large: inf
        return np.uint16(sign | 0x7C00)
    if e <= 0:  # subnormal half, or zero
        if e < -10:
            return np.uint16(sign)
        mant |= np.uint32(0x800000)
        shift = np.uint32(14 - e)
        r = mant >> shift
        rem = mant & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rem > half or (rem == half and (r & 1) != 0):
            r += np.uint32(1)
        return np.uint16(sign | r)
    r = sign | (np.uint32(e) << 10) | (mant >> 13)
    rem = mant & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (r & 1) != 0):
        r += np.uint32(1)  # a carry into the exponent is the right rounding too
    return np.uint16(r)


@njit(inline="always", cache=True)
def f32_to_bf16_bits(v):
    # float32 -> bfloat16 bit pattern (uint16) as ggml's ggml_compute_fp32_to_bf16: round to nearest even; a NaN
    # kept a (quiet) NaN
    u = f32_bits(np.float32(v))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((u >> 16) | np.uint32(64))
    return np.uint16((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16)


@njit(inline="always", cache=True)
def bf16_to_f32(bits):
    # a bfloat16 bit pattern as float32 (exact: the upper half of its bits)
    return np.uint32(np.uint32(bits) << 16).view(np.float32)

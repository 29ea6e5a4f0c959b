"""K-quant quantizers (Q4_K, Q5_K, Q6_K), vectorised over all blocks at once in numpy.

They search scales as llama.cpp's reference quantizers do (quantize_row_q4_K_ref, q5_K_ref, q6_K_ref, through
search.py's make_qkx and make_qx, which follow the C code step for step), so their blocks are llama.cpp's:
- Q4_K/Q5_K: for each 32-element sub-block, a weighted least-squares fit of (scale, min) over a
  sweep of candidate inverse scales (weights |x| + rms of the sub-block), then the 8 scales and
  8 mins are themselves quantized to 6 bits against the super-block's largest;
- Q6_K: for each 16-element sub-block, the scale maximising the x^2-weighted fit over 19 candidates,
  then the 16 scales quantized to int8.
With an importance matrix row they run llama.cpp's `_impl` searches instead (k45_weighted,
q6_k_scales, below).
Block byte layouts are ggml's (the output is an ordinary GGUF tensor); gguf.quants.dequantize reads
them back. Arithmetic is float32, as in llama.cpp; rounding is to nearest even (its nearest_int).
"""

from __future__ import annotations

import numpy as np

from ..kernels.formats.k45 import decode_k_scales
from . import search

QK_K = 256
F32 = np.float32


def _f16(x: np.ndarray) -> np.ndarray:
    """Round to float16 and back: the value a stored float16 scale will have."""
    return x.astype(np.float16).astype(F32)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(x.shape + (2,))


def _rint(x):
    return np.rint(x).astype(np.int32)


def _pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """(nb, 8) six-bit scales and mins -> ggml's (nb, 12) packing."""
    out = np.zeros(ls.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = ls[..., 0:4] | ((ls[..., 4:8] >> 4) << 6)
    out[..., 4:8] = lm[..., 0:4] | ((lm[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (ls[..., 4:8] & 0xF) | ((lm[..., 4:8] & 0xF) << 4)
    return out


def _quantize_k45(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """Shared Q4_K/Q5_K path (quantize_row_q4_K_ref / q5_K_ref): x (nb, 256) -> d, dmin (nb,), packed scales
    (nb, 12), levels (nb, 256). Per 32-element sub-block make_qkx2_quants with weights rms + |x|, then the 8
    scales and 8 mins on 6 bits against the super-block's largest, the values requantized against them."""
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32)
    av = np.sqrt(search._ssum(sub * sub) / F32(32)).astype(F32)
    w = (av[:, None] + np.abs(sub)).astype(F32)
    scales, mins, fit = search.make_qkx(sub, w, nmax, rmin, 0.1, nstep, False)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    inv_scale = np.where(max_scale > 0, F32(63) / np.where(max_scale > 0, max_scale, 1), F32(0)).astype(F32)
    inv_min = np.where(max_min > 0, F32(63) / np.where(max_min > 0, max_min, 1), F32(0)).astype(F32)
    # uint8_t ls = nearest_int(...) (a negative level wraps), then MIN(63, ls), as the C code
    ls = np.minimum(63, _rint(inv_scale[:, None] * scales) & 0xFF).astype(np.uint8)
    lm = np.minimum(63, _rint(inv_min[:, None] * mins) & 0xFF).astype(np.uint8)
    d = _f16((max_scale / F32(63)).astype(F32))
    dmin = _f16((max_min / F32(63)).astype(F32))
    # requantize every value against the scales as they will be stored; a zero scale keeps the fit's levels
    sd = (d[:, None] * ls.astype(F32)).astype(F32)
    sm = (dmin[:, None] * lm.astype(F32)).astype(F32)
    xs = x.reshape(nb, 8, 32)
    safe = np.where(sd == 0, F32(1), sd)
    L = np.clip(_rint((xs + sm[:, :, None]) / safe[:, :, None]), 0, nmax)
    L = np.where((sd == 0)[:, :, None], fit.reshape(nb, 8, 32), L).reshape(nb, 256).astype(np.uint8)
    return d, dmin, _pack_k_scales(ls, lm), L


def _nibbles(L: np.ndarray) -> np.ndarray:
    """(nb, 256) levels (low 4 bits used) -> (nb, 128) qs: groups of 64 as 32 bytes low | high << 4."""
    g = L.reshape(-1, 4, 2, 32) & 0xF
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def _k45_blocks(x: np.ndarray, weights, nmax: int, rmin: float, nstep: int):
    """Q4_K's or Q5_K's (nmax 15 or 31) scales and levels for x (rows, k): (rows, d, dmin, packed scales,
    levels), from llama.cpp's weighted search with an imatrix row, else from the reference one (rmin, nstep)."""
    rows, _, xb = search._blocks(x, QK_K)
    if weights is not None:
        return (rows,) + k45_weighted(xb, weights, rows, nmax)
    return (rows,) + _quantize_k45(xb, nmax, rmin, nstep)


def quantize_q4_k(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 144) uint8 Q4_K blocks. weights: an
    imatrix row (k,), llama.cpp's weighted search (k45_weighted)."""
    rows, d, dmin, sc, L = _k45_blocks(x, weights, 15, -1.0, 20)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), sc, _nibbles(L)], axis=1)
    return out.reshape(rows, -1)


def quantize_q5_k(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32 -> (rows, k / 256 * 176) uint8 Q5_K blocks (weights: as quantize_q4_k)."""
    rows, d, dmin, sc, L = _k45_blocks(x, weights, 31, -0.5, 15)
    hi = (L >> 4).reshape(-1, 8, 32)  # group i's fifth bit goes to bit i of qh[l]
    qh = np.zeros((L.shape[0], 32), np.uint8)
    for i in range(8):
        qh |= (hi[:, i, :] << i).astype(np.uint8)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), sc, qh, _nibbles(L)], axis=1)
    return out.reshape(rows, -1)


def quantize_q6_k(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32 -> (rows, k / 256 * 210) uint8 Q6_K blocks (weights: an imatrix row (k,))."""
    rows, _, xb = search._blocks(x, QK_K)
    nb = xb.shape[0]
    if weights is not None:
        scales, fit_levels = q6_k_scales(xb.reshape(nb * 16, 16), weights, rows)
        scales = scales.reshape(nb, 16)
    else:
        sub = xb.reshape(nb * 16, 16)
        scales, fit_levels = search.make_qx(sub, 32, sub * sub)
        scales = scales.reshape(nb, 16)
    pick = np.abs(scales).argmax(axis=1)
    max_scale = scales[np.arange(nb), pick]
    zero = np.abs(max_scale) < F32(1e-15)
    iscale = np.where(zero, F32(0), F32(-128) / np.where(zero, F32(1), max_scale)).astype(F32)
    d = _f16(np.where(zero, F32(0), F32(1) / np.where(zero, F32(1), iscale)).astype(F32))
    sc = np.minimum(127, _rint(iscale[:, None] * scales)).astype(np.int8)
    dd = (d[:, None] * sc.astype(F32)).astype(F32)
    safe = np.where(dd == 0, F32(1), dd)
    L = np.clip(_rint(xb.reshape(nb, 16, 16) / safe[:, :, None]), -32, 31) + 32
    # as llama.cpp: a zero scale keeps the fit's levels, a zero super-block is all zero bytes
    L = np.where((dd == 0)[:, :, None], fit_levels.reshape(nb, 16, 16), L)
    L = np.where(zero[:, None, None], 0, L).reshape(nb, 256).astype(np.uint8)
    # pack: per half of 128, element 32 r + l -> low nibble in ql[l + 32 (r % 2)] (high nibble
    # for r >= 2), high 2 bits at shift 2 r of qh[l]
    h = L.reshape(nb, 2, 4, 32)
    ql = np.empty((nb, 2, 64), np.uint8)
    ql[:, :, :32] = (h[:, :, 0] & 0xF) | ((h[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:] = (h[:, :, 1] & 0xF) | ((h[:, :, 3] & 0xF) << 4)
    qh = ((h[:, :, 0] >> 4) | ((h[:, :, 1] >> 4) << 2) | ((h[:, :, 2] >> 4) << 4) | ((h[:, :, 3] >> 4) << 6))
    out = np.concatenate([ql.reshape(nb, 128), qh.astype(np.uint8).reshape(nb, 64), sc.view(np.uint8),
                          _f16_bytes(np.where(zero, F32(0), d))], axis=1)
    return out.reshape(rows, -1)


# -- the K-quants of 4 to 6 bits with an importance matrix (quantize_row_q4_K/q5_K/q6_K_impl) --------


def k45_weighted(x: np.ndarray, weights: np.ndarray, rows: int, nmax: int):
    """Q4_K (nmax 15) or Q5_K (31) super-blocks x (nb, 256) weighted by an imatrix row: per 32-element
    sub-block a make_qkx3 fit with weights qw * sqrt(sigma2 + x^2), the eight scales and mins on six bits by
    make_qp against the sub-blocks' total weights, the values requantized against them as stored.
    -> (d, dmin (nb,), packed scales (nb, 12), levels (nb, 256)), as _quantize_k45."""
    nb = x.shape[0]
    k = nb // rows * QK_K
    qw = search._importance(weights, rows, k, 32)
    sub = x.reshape(nb * 8, 32)
    sigma2 = (F32(2) * search._ssum(x * x) / F32(QK_K)).astype(F32)
    w = (qw * np.sqrt(np.repeat(sigma2, 8)[:, None] + sub * sub)).astype(F32)
    scales, mins, fit = search.make_qkx(sub, w, nmax, -0.9, 0.05, 36, False)
    sw = search._ssum(w).reshape(nb, 8)
    dblock, ls = search.make_qp(scales.reshape(nb, 8), 63, sw)
    mblock, lm = search.make_qp(mins.reshape(nb, 8), 63, sw)
    # as the C code: the levels as uint8 (a negative one wraps), Q5_K's capped at 63, Q4_K's not; packed,
    # then read back from the 12 bytes (get_scale_min_k4) for the requantization
    ls, lm = (ls & 0xFF).astype(np.uint8), (lm & 0xFF).astype(np.uint8)
    if nmax == 31:
        ls, lm = np.minimum(63, ls), np.minimum(63, lm)
    packed = _pack_k_scales(ls, lm)
    dec = decode_k_scales(packed).astype(F32)
    d, dmin = search._f16(dblock), search._f16(mblock)
    sd = (d[:, None] * dec[:, :8]).astype(F32)
    sm = (dmin[:, None] * dec[:, 8:]).astype(F32)
    nz = sd != 0
    req = np.clip(search._rint((x.reshape(nb, 8, 32) + sm[:, :, None]) / search._safe(sd, ~nz)[:, :, None]), 0, nmax)
    L = np.where(nz[:, :, None], req, fit.reshape(nb, 8, 32)).reshape(nb, QK_K).astype(np.uint8)
    return d, dmin, packed, L


def q6_k_scales(sub: np.ndarray, weights: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K's 16-element sub-block scales (nb * 16,) by make_qx with the imatrix as the weights (llama.cpp's
    quantize_row_q6_K_impl passes them straight, unlike the other types), and the fit's levels (nb * 16, 16),
    which a sub-block whose scale rounds to zero keeps."""
    k = sub.shape[0] * 16 // rows
    return search.make_qx(sub, 32, search._importance(weights, rows, k, 16))

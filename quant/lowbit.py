"""Quantizers for the types below 4.5 bits: Q2_K, Q3_K, IQ4_NL and IQ4_XS, with or without an importance
matrix, vectorised over all blocks at once in numpy.

Written from llama.cpp's reference quantizers (ggml-quants.c: quantize_row_q2_K_ref and _impl,
quantize_row_q3_K_ref and _impl, quantize_row_iq4_nl_impl with make_qkx2/qkx3/qx/q3/qp_quants): the same
scale searches (quant/search.py), the same candidates, the same requantization against the scales as
stored, so the result is llama.cpp's block for block (tests/test_lowbit.py holds every type to blocks
llama.cpp made). Also the imatrix-weighted searches of the 32-element types (Q4_0 .. Q5_1); those of
Q4_K, Q5_K and Q6_K are kquants.py's.

`weights`, when given, is the importance of each column (an imatrix row: the mean squared activation the
matrix's input had in that column, (k,) float32); llama.cpp's `_impl` quantizers then weight each
element's error by it. Without it they weight as llama.cpp's reference quantizers do (|x| for Q2_K,
x^2 for Q3_K and the IQ4 types).

Block byte layouts are ggml's; gguf.quants.dequantize reads them back.
"""

from __future__ import annotations

import numpy as np

from .search import (EPS, F32, KVALUES, QK_K, _KV, _amax_signed, _f16, _f16_bytes, _importance, _rint,  # noqa: F401
                     _blocks, _rows, _safe, _ssum, best_index, make_q3, make_qkx, make_qp, make_qx)


# -- the block packings ----------------------------------------------------------------------------


def _pack2(L: np.ndarray) -> np.ndarray:
    """(nb, 256) levels 0..3 -> (nb, 64) qs: per 128 elements, byte l holds elements l, l+32, l+64, l+96."""
    g = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (g[:, :, 0] | (g[:, :, 1] << 2) | (g[:, :, 2] << 4) | (g[:, :, 3] << 6)).reshape(-1, 64)


def quantize_q2_k(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 84) uint8 Q2_K blocks."""
    rows, k, xb = _blocks(x, QK_K)
    nb = xb.shape[0]
    sub = xb.reshape(nb * 16, 16)
    if weights is None:
        scales, mins, L = make_qkx(sub, np.abs(sub), 3, -0.5, 0.1, 15, True)
        scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
        max_scale, max_min = scales.max(axis=1), mins.max(axis=1)
        zs, zm = ~(max_scale > 0), ~(max_min > 0)
        ls = np.where(zs[:, None], 0, _rint((F32(15) / _safe(max_scale, zs))[:, None] * scales))
        lm = np.where(zm[:, None], 0, _rint((F32(15) / _safe(max_min, zm))[:, None] * mins))
        d = np.where(zs, F32(0), _f16(max_scale / F32(15)))
        dmin = np.where(zm, F32(0), _f16(max_min / F32(15)))
    else:
        qw = _importance(weights, rows, k, 16)
        sigma2 = (_ssum(xb * xb) / F32(QK_K)).astype(F32)
        w = (qw * np.sqrt(np.repeat(sigma2, 16)[:, None] + sub * sub)).astype(F32)
        scales, mins, L = make_qkx(sub, w, 3, -0.9, 0.05, 36, False)
        sw = _ssum(w).reshape(nb, 16)
        dm, ls = make_qp(scales.reshape(nb, 16), 15, sw)
        mm, lm = make_qp(mins.reshape(nb, 16), 15, sw)
        d, dmin = _f16(dm), _f16(mm)
    packed = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)  # as C stores them: uint8 of Ls | Lm << 4
    dl = (d[:, None] * (packed & 0xF).astype(F32)).astype(F32)
    ml = (dmin[:, None] * (packed >> 4).astype(F32)).astype(F32)
    nz = dl != 0
    req = np.clip(_rint((xb.reshape(nb, 16, 16) + ml[:, :, None]) / _safe(dl, ~nz)[:, :, None]), 0, 3)
    L = np.where(nz[:, :, None], req, L.reshape(nb, 16, 16)).reshape(nb, QK_K)
    out = np.concatenate([packed, _pack2(L), _f16_bytes(d).reshape(nb, 2), _f16_bytes(dmin).reshape(nb, 2)], axis=1)
    return out.reshape(rows, -1)


def _pack_q3_scales(l: np.ndarray) -> np.ndarray:
    """(nb, 16) six-bit scales (value + 32) -> ggml's 12-byte packing (gguf.quants.Q3_K's diagram)."""
    l = l.astype(np.uint8)
    out = np.zeros((l.shape[0], 12), np.uint8)
    out[:, 0:8] = (l[:, 0:8] & 0xF) | ((l[:, 8:16] & 0xF) << 4)
    hi = l >> 4
    out[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    return out


def quantize_q3_k(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 110) uint8 Q3_K blocks."""
    rows, k, xb = _blocks(x, QK_K)
    nb = xb.shape[0]
    sub = xb.reshape(nb * 16, 16)
    if weights is None:
        scales, L = make_q3(sub, 4)
        scales = scales.reshape(nb, 16)
        amax, max_scale = _amax_signed(scales)
        z = max_scale == 0
        iscale = (F32(-32) / _safe(max_scale, z)).astype(F32)
        ls = np.clip(_rint(iscale[:, None] * scales), -32, 31) + 32
        ls = np.where(z[:, None], 0, ls)  # the C code leaves the scales bytes zero: every scale -32, times d = 0
        d = np.where(z, F32(0), _f16(F32(1) / iscale))
    else:
        qw = _importance(weights, rows, k, 16)
        sigma2 = (F32(2) * _ssum(xb * xb) / F32(QK_K)).astype(F32)
        w = (qw * np.sqrt(np.repeat(sigma2, 16)[:, None] + sub * sub)).astype(F32)
        scales, L = make_qx(sub, 4, w)
        sw = _ssum(w).reshape(nb, 16)
        dblock, ls = make_qx(scales.reshape(nb, 16), 32, sw)
        d = _f16(dblock)
    packed = _pack_q3_scales(ls)
    sc = (ls.astype(np.int32) & 63) - 32  # as stored: six bits
    dl = (d[:, None] * sc.astype(F32)).astype(F32)
    nz = dl != 0
    req = np.clip(_rint(xb.reshape(nb, 16, 16) / _safe(dl, ~nz)[:, :, None]), -4, 3) + 4
    L = np.where(nz[:, :, None], req, L.reshape(nb, 16, 16)).reshape(nb, QK_K)
    high = L > 3
    hmask = np.zeros((nb, 32), np.uint8)
    hb = high.reshape(nb, 8, 32)
    for b in range(8):
        hmask |= (hb[:, b, :].astype(np.uint8) << b)
    L = np.where(high, L - 4, L)
    out = np.concatenate([hmask, _pack2(L), packed, _f16_bytes(d).reshape(nb, 2)], axis=1)
    return out.reshape(rows, -1)


def _iq4_blocks(xb: np.ndarray, qw: np.ndarray | None, super_size: int, ntry: int = 7):
    """quantize_row_iq4_nl_impl's per-32 search: xb (B, 32) blocks of super-blocks of super_size elements
    -> (scale (B,), weights (B, 32)). qw: the blocks' importance (B, 32) or None."""
    nsub = super_size // 32
    B = xb.shape[0]
    sup = xb.reshape(B // nsub, super_size)
    sigma2 = (_ssum(sup * sup) * (F32(2) / F32(super_size))).astype(F32)  # C: the sum, then *= 2 / size
    if qw is not None:
        w = (qw * np.sqrt(np.repeat(sigma2, nsub)[:, None] + xb * xb)).astype(F32)
    else:
        w = (xb * xb).astype(F32)
    amax, mx = _amax_signed(xb)
    zero = amax < EPS
    mx = _safe(mx, zero)
    v0 = F32(KVALUES[0])
    d = (-mx / v0).astype(F32)
    idd = (F32(1) / d).astype(F32)

    def sums(i):
        q = _KV[best_index(_KV, (i[:, None] * xb).astype(F32))]
        wq = (w * q).astype(F32)
        return _ssum(wq * xb), _ssum(wq * q)

    sumqx, sumq2 = sums(idd)
    d = np.where(sumq2 > 0, sumqx / _safe(sumq2, sumq2 <= 0), F32(0)).astype(F32)
    best = (d * sumqx).astype(F32)
    for t in range(-ntry, ntry + 1):
        sx, s2 = sums(((F32(t) + v0) / mx).astype(F32))
        better = (s2 > 0) & (sx * sx > best * s2)
        nd = (sx / _safe(s2, s2 <= 0)).astype(F32)
        d = np.where(better, nd, d)
        best = np.where(better, (nd * sx).astype(F32), best)
    return np.where(zero, F32(0), d).astype(F32), w


def _nibbles(L: np.ndarray) -> np.ndarray:
    """(B, 32) indices -> (B, 16) bytes: element j in the low nibble of byte j, element 16 + j in the high."""
    L = L.astype(np.uint8)
    return L[:, :16] | (L[:, 16:] << 4)


def quantize_iq4_nl(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32, k a multiple of 32 -> (rows, k / 32 * 18) uint8 IQ4_NL blocks."""
    rows, k, xb = _blocks(x, 32)
    qw = None if weights is None else _importance(weights, rows, k, 32)
    d, _ = _iq4_blocks(xb, qw, 32)
    idd = np.where(d != 0, F32(1) / _safe(d, d == 0), F32(0)).astype(F32)
    L = best_index(_KV, (idd[:, None] * xb).astype(F32))
    out = np.concatenate([_f16_bytes(d), _nibbles(L)], axis=1)
    return out.reshape(rows, -1)


def quantize_iq4_xs(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 136) uint8 IQ4_XS blocks."""
    rows, k, xb = _blocks(x, QK_K, 32)
    nb = xb.shape[0] // 8
    qw = None if weights is None else _importance(weights, rows, k, 32)
    scales, _ = _iq4_blocks(xb, qw, QK_K)
    scales = scales.reshape(nb, 8)
    _, max_scale = _amax_signed(scales)
    d = (-max_scale / F32(32)).astype(F32)
    idd = np.where(d != 0, F32(1) / _safe(d, d == 0), F32(0)).astype(F32)
    l = np.clip(_rint(idd[:, None] * scales), -32, 31)
    dl = (d[:, None] * l.astype(F32)).astype(F32)
    idl = np.where(dl != 0, F32(1) / _safe(dl, dl == 0), F32(0)).astype(F32)
    L = best_index(_KV, (idl.reshape(-1, 1) * xb).astype(F32))
    u = (l + 32).astype(np.uint16)
    scales_l = ((u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    scales_h = np.zeros(nb, np.uint16)
    for ib in range(8):
        scales_h |= ((u[:, ib] >> 4) << (2 * ib)).astype(np.uint16)
    out = np.concatenate([_f16_bytes(d).reshape(nb, 2), scales_h.view(np.uint8).reshape(nb, 2), scales_l,
                          _nibbles(L).reshape(nb, 128)], axis=1)
    return out.reshape(rows, -1)


QUANTIZERS = {"Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k, "IQ4_NL": quantize_iq4_nl, "IQ4_XS": quantize_iq4_xs}


# -- the 32-element types with an importance matrix (quantize_row_q4_0/q4_1/q5_0/q5_1_impl) -------------


def quantize_legacy_weighted(x: np.ndarray, type_name: str, weights: np.ndarray) -> np.ndarray:
    """Q4_0, Q4_1, Q5_0 or Q5_1 blocks of x (rows, k) weighted by an imatrix row, llama.cpp's `_impl` searches:
    weights qw * sqrt(sigma2 + x^2) with sigma2 the row's mean square; make_qx for the symmetric types (the
    fit's levels kept as they are), make_qkx3 for the ones with a min. Without weights llama.cpp (and gguf)
    use the plain reference quantizers instead."""
    rows, k = _rows(x, 32)
    x = np.ascontiguousarray(x, F32)
    xb = x.reshape(-1, 32)
    sigma2 = (_ssum(x * x) / F32(k)).astype(F32)
    qw = _importance(weights, rows, k, 32)
    w = (qw * np.sqrt(np.repeat(sigma2, k // 32)[:, None] + xb * xb)).astype(F32)
    five = type_name in ("Q5_0", "Q5_1")
    if type_name in ("Q4_0", "Q5_0"):
        d, L = make_qx(xb, 16 if five else 8, w)
        head = [_f16_bytes(d)]
    else:
        d, the_min, L = make_qkx(xb, w, 31 if five else 15, -0.9, 0.05, 36, False)
        head = [_f16_bytes(d), _f16_bytes(-the_min)]
    L = L.astype(np.uint32)
    qs = ((L[:, :16] & 0xF) | ((L[:, 16:] & 0xF) << 4)).astype(np.uint8)
    if five:
        hb = (L >> 4) & 1
        qh = np.zeros(L.shape[0], np.uint32)
        for j in range(32):
            qh |= hb[:, j] << j
        head.append(qh.view(np.uint8).reshape(-1, 4))
    return np.concatenate(head + [qs], axis=1).reshape(rows, -1)

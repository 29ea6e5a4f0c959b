"""The test models' K-quant quantizers (Q4_K, Q5_K, Q6_K): quant/kquants.py as it was when the zoo and tiny
models were first written (commit 212063d), frozen here so that those files, whose sha256 and llama.cpp's
outputs on them are golden data (tests/golden/arch_zoo.json, imatrix_llamacpp.json), stay byte for byte the
same when the product's quantizers change (they have since been made llama.cpp's blocks exactly). Not product
code: nothing outside tests/ imports it.

They search scales the way llama.cpp's reference quantizers do, rather than taking a naive min/max:
- Q4_K/Q5_K: for each 32-element sub-block, a weighted least-squares fit of (scale, min) over a
  sweep of candidate inverse scales (weights |x| + rms of the sub-block), then the 8 scales and
  8 mins are themselves quantized to 6 bits against the super-block's largest;
- Q6_K: for each 16-element sub-block, the scale maximising the x^2-weighted fit over 19 candidates,
  then the 16 scales quantized to int8.
Block byte layouts are ggml's (the output is an ordinary GGUF tensor); gguf.quants.dequantize reads
them back. Arithmetic is float32, as in llama.cpp; rounding is to nearest even (its nearest_int).
"""

from __future__ import annotations

import numpy as np

QK_K = 256
F32 = np.float32


def _f16(x: np.ndarray) -> np.ndarray:
    """Round to float16 and back: the value a stored float16 scale will have."""
    return x.astype(np.float16).astype(F32)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(x.shape + (2,))


def _rint(x):
    return np.rint(x).astype(np.int32)


def _fit_scale_min(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Per row of x (R, n): levels L in [0, nmax], scale and min so that x ~ scale * L - min.

    Returns (scale (R,), min (R,) >= 0, L (R, n)). llama.cpp's make_qkx2_quants, vectorised."""
    xmin = np.minimum(x.min(axis=1), 0).astype(F32)
    xmax = x.max(axis=1).astype(F32)
    sum_w = w.sum(axis=1, dtype=F32)
    sum_x = (w * x).sum(axis=1, dtype=F32)
    flat = xmax == xmin
    span = np.where(flat, F32(1), xmax - xmin)
    iscale = (F32(nmax) / span).astype(F32)
    scale = (F32(1) / iscale).astype(F32)
    L = np.clip(_rint(iscale[:, None] * (x - xmin[:, None])), 0, nmax)
    best = (w * (scale[:, None] * L + xmin[:, None] - x) ** 2).sum(axis=1, dtype=F32)
    mn = xmin.copy()
    for step in range(nstep):
        isc = ((F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / span).astype(F32)
        la = np.clip(_rint(isc[:, None] * (x - xmin[:, None])), 0, nmax)
        lf = la.astype(F32)
        sum_l = (w * lf).sum(axis=1, dtype=F32)
        sum_l2 = (w * lf * lf).sum(axis=1, dtype=F32)
        sum_xl = (w * lf * x).sum(axis=1, dtype=F32)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Dz = np.where(ok, D, F32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / Dz
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Dz
        pos = this_min > 0
        this_scale = np.where(pos, sum_xl / np.where(sum_l2 > 0, sum_l2, F32(1)), this_scale).astype(F32)
        this_min = np.where(pos, F32(0), this_min).astype(F32)
        err = (w * (this_scale[:, None] * lf + this_min[:, None] - x) ** 2).sum(axis=1, dtype=F32)
        better = ok & (err < best)
        L = np.where(better[:, None], la, L)
        best = np.where(better, err, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    scale = np.where(flat, F32(0), scale)
    L = np.where(flat[:, None], 0, L)
    return scale.astype(F32), (-mn).astype(F32), L


def _pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """(nb, 8) six-bit scales and mins -> ggml's (nb, 12) packing."""
    out = np.zeros(ls.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = ls[..., 0:4] | ((ls[..., 4:8] >> 4) << 6)
    out[..., 4:8] = lm[..., 0:4] | ((lm[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (ls[..., 4:8] & 0xF) | ((lm[..., 4:8] & 0xF) << 4)
    return out


def _quantize_k45(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """Shared Q4_K/Q5_K path: x (nb, 256) -> d, dmin (nb,), packed scales (nb, 12), levels (nb, 256)."""
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32)
    av = np.sqrt((sub * sub).sum(axis=1, dtype=F32) / F32(32)).astype(F32)
    w = (av[:, None] + np.abs(sub)).astype(F32)
    scales, mins, _ = _fit_scale_min(sub, w, nmax, rmin, 0.1, nstep)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)
    max_scale = scales.max(axis=1)
    max_min = mins.max(axis=1)
    inv_scale = np.where(max_scale > 0, F32(63) / np.where(max_scale > 0, max_scale, 1), F32(0)).astype(F32)
    inv_min = np.where(max_min > 0, F32(63) / np.where(max_min > 0, max_min, 1), F32(0)).astype(F32)
    ls = np.minimum(63, _rint(inv_scale[:, None] * scales)).astype(np.uint8)
    lm = np.minimum(63, _rint(inv_min[:, None] * mins)).astype(np.uint8)
    d = _f16((max_scale / F32(63)).astype(F32))
    dmin = _f16((max_min / F32(63)).astype(F32))
    # requantize every value against the scales as they will be stored
    sd = (d[:, None] * ls.astype(F32)).astype(F32)
    sm = (dmin[:, None] * lm.astype(F32)).astype(F32)
    xs = x.reshape(nb, 8, 32)
    safe = np.where(sd == 0, F32(1), sd)
    L = np.clip(_rint((xs + sm[:, :, None]) / safe[:, :, None]), 0, nmax)
    L = np.where((sd == 0)[:, :, None], 0, L).reshape(nb, 256).astype(np.uint8)
    return d, dmin, _pack_k_scales(ls, lm), L


def _nibbles(L: np.ndarray) -> np.ndarray:
    """(nb, 256) levels (low 4 bits used) -> (nb, 128) qs: groups of 64 as 32 bytes low | high << 4."""
    g = L.reshape(-1, 4, 2, 32) & 0xF
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """x (rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 144) uint8 Q4_K blocks."""
    rows = x.shape[0]
    xb = np.ascontiguousarray(x, dtype=F32).reshape(-1, QK_K)
    d, dmin, sc, L = _quantize_k45(xb, 15, -1.0, 20)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), sc, _nibbles(L)], axis=1)
    return out.reshape(rows, -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """x (rows, k) float32 -> (rows, k / 256 * 176) uint8 Q5_K blocks."""
    rows = x.shape[0]
    xb = np.ascontiguousarray(x, dtype=F32).reshape(-1, QK_K)
    d, dmin, sc, L = _quantize_k45(xb, 31, -0.5, 15)
    hi = (L >> 4).reshape(-1, 8, 32)  # group i's fifth bit goes to bit i of qh[l]
    qh = np.zeros((L.shape[0], 32), np.uint8)
    for i in range(8):
        qh |= (hi[:, i, :] << i).astype(np.uint8)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), sc, qh, _nibbles(L)], axis=1)
    return out.reshape(rows, -1)


def _fit_symmetric(x: np.ndarray, nmax: int):
    """Per row of x (R, n): scale for levels in [-nmax, nmax - 1] maximising the x^2-weighted fit
    over 19 candidate inverse scales (llama.cpp's make_qx_quants with rmse_type 1)."""
    ax = np.abs(x)
    idx = ax.argmax(axis=1)
    amax = ax[np.arange(x.shape[0]), idx]
    xmax = x[np.arange(x.shape[0]), idx]
    zero = amax < F32(1e-15)
    safe = np.where(zero, F32(1), xmax)
    w = x * x

    def fit(isc):
        l = np.clip(_rint(isc[:, None] * x), -nmax, nmax - 1).astype(F32)
        return (w * x * l).sum(axis=1, dtype=F32), (w * l * l).sum(axis=1, dtype=F32)

    sumlx, suml2 = fit((F32(-nmax) / safe).astype(F32))
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, 1), F32(0)).astype(F32)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        sx, s2 = fit((-(F32(nmax) + F32(0.1) * F32(step)) / safe).astype(F32))
        better = (s2 > 0) & (sx * sx > best * s2)
        new_scale = np.where(s2 > 0, sx / np.where(s2 > 0, s2, 1), F32(0)).astype(F32)
        scale = np.where(better, new_scale, scale)
        best = np.where(better, new_scale * sx, best)
    return np.where(zero, F32(0), scale).astype(F32)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """x (rows, k) float32 -> (rows, k / 256 * 210) uint8 Q6_K blocks."""
    rows = x.shape[0]
    xb = np.ascontiguousarray(x, dtype=F32).reshape(-1, QK_K)
    nb = xb.shape[0]
    scales = _fit_symmetric(xb.reshape(nb * 16, 16), 32).reshape(nb, 16)
    pick = np.abs(scales).argmax(axis=1)
    max_scale = scales[np.arange(nb), pick]
    zero = np.abs(max_scale) < F32(1e-15)
    iscale = np.where(zero, F32(0), F32(-128) / np.where(zero, F32(1), max_scale)).astype(F32)
    d = _f16(np.where(zero, F32(0), F32(1) / np.where(zero, F32(1), iscale)).astype(F32))
    sc = np.minimum(127, _rint(iscale[:, None] * scales)).astype(np.int8)
    dd = (d[:, None] * sc.astype(F32)).astype(F32)
    safe = np.where(dd == 0, F32(1), dd)
    L = np.clip(_rint(xb.reshape(nb, 16, 16) / safe[:, :, None]), -32, 31) + 32
    L = np.where((dd == 0)[:, :, None], 32, L).reshape(nb, 256).astype(np.uint8)
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

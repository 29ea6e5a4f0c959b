"""llama.cpp's scale searches (ggml-quants.c: make_qkx2/qkx3_quants, make_qx_quants, make_q3_quants,
make_qp_quants, best_index_int8), vectorised over rows of blocks: the primitives quant/lowbit.py and
quant/kquants.py build their block quantizers from.

Each per-element loop of the C code is one numpy operation over every row, and sums run over a row's elements
in the C code's order (`_ssum`), so the choices are llama.cpp's. Where the C code keeps levels in uint8_t (and
so wraps a negative one) or finds the first least value, these do the same.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
F32 = np.float32
EPS = F32(1e-15)  # llama.cpp's GROUP_MAX_EPS: a group whose largest |x| is below it is all zero
# IQ4_NL's and IQ4_XS's 16 values (ggml-common.h kvalues_iq4nl; gguf.quants.IQ4_NL.kvalues)
from gguf.quants import IQ4_NL as _IQ4  # noqa: E402

KVALUES = np.array(_IQ4.kvalues, np.int8)
_KV = KVALUES.astype(F32)


def _f16(x) -> np.ndarray:
    return np.asarray(x, F32).astype(np.float16).astype(F32)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, F32).astype(np.float16).view(np.uint8).reshape(np.shape(x) + (2,))


def _rint(x) -> np.ndarray:
    return np.rint(x).astype(np.int32)  # nearest, ties to even: llama.cpp's nearest_int


def _ssum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in element order (as a C loop accumulates), float32."""
    s = a[..., 0].astype(F32)
    for j in range(1, a.shape[-1]):
        s = (s + a[..., j]).astype(F32)
    return s


def _safe(x, zero):
    return np.where(zero, F32(1), x).astype(F32)


def _amax_signed(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The largest |x| of each row and the signed value where it first occurs."""
    ax = np.abs(x)
    i = ax.argmax(axis=-1)
    amax = np.take_along_axis(ax, i[..., None], -1)[..., 0]
    return amax, np.take_along_axis(x, i[..., None], -1)[..., 0]


# -- llama.cpp's scale searches, each over rows of n elements -------------------------------------


def make_qkx(x, w, nmax: int, rmin: float, rdelta: float, nstep: int, mad: bool):
    """make_qkx2_quants / make_qkx3_quants: levels L in [0, nmax], scale and min (>= 0) so that
    x ~ scale * L - min, the w-weighted |error| (mad) or error^2 least over nstep + 1 candidate
    inverse scales and their least-squares refits. -> (scale (R,), min (R,), L (R, n) int32)."""
    x = x.astype(F32)
    w = w.astype(F32)
    # the first least and greatest values, as the C loops find them (a -0.0 before a 0.0 is kept)
    xmin = np.take_along_axis(x, x.argmin(axis=-1)[:, None], -1)[:, 0]
    xmin = np.where(xmin > 0, F32(0), xmin).astype(F32)
    xmax = np.take_along_axis(x, x.argmax(axis=-1)[:, None], -1)[:, 0]
    sum_w = _ssum(w)
    sum_x = _ssum(w * x)
    flat = xmax <= xmin
    span = _safe(xmax - xmin, flat)
    iscale = (F32(nmax) / span).astype(F32)
    scale = (F32(1) / iscale).astype(F32)

    def err(s, m, lv):
        diff = (s[:, None] * lv + m[:, None] - x).astype(F32)
        return _ssum(w * (np.abs(diff) if mad else diff * diff))

    L = np.clip(_rint(iscale[:, None] * (x - xmin[:, None])), 0, nmax)
    best = err(scale, xmin, L.astype(F32))
    mn = xmin.copy()
    for step in range(nstep + 1):
        # as in the C loop, a better fit's min becomes the origin of the later candidates
        span = _safe(xmax - mn, flat | (xmax - mn == 0))
        isc = ((F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / span).astype(F32)
        la = np.clip(_rint(isc[:, None] * (x - mn[:, None])), 0, nmax)
        lf = la.astype(F32)
        wl = (w * lf).astype(F32)
        sum_l, sum_l2, sum_xl = _ssum(wl), _ssum(wl * lf), _ssum(wl * x)
        D = (sum_w * sum_l2 - sum_l * sum_l).astype(F32)
        ok = D > 0
        Dz = _safe(D, ~ok)
        ts = ((sum_w * sum_xl - sum_x * sum_l) / Dz).astype(F32)
        tm = ((sum_l2 * sum_x - sum_l * sum_xl) / Dz).astype(F32)
        pos = tm > 0
        ts = np.where(pos, sum_xl / _safe(sum_l2, sum_l2 == 0), ts).astype(F32)
        tm = np.where(pos, F32(0), tm).astype(F32)
        cur = err(ts, tm, lf)
        better = ok & (cur < best) & ~flat
        L = np.where(better[:, None], la, L)
        best = np.where(better, cur, best)
        scale = np.where(better, ts, scale)
        mn = np.where(better, tm, mn)
    scale = np.where(flat, F32(0), scale).astype(F32)
    L = np.where(flat[:, None], 0, L)
    return scale, (-mn).astype(F32), L


def make_qx(x, nmax: int, w):
    """make_qx_quants with rmse_type 1: symmetric levels l in [-nmax, nmax - 1] (returned as l + nmax)
    and the scale maximising the w-weighted fit over 19 candidates. -> (scale (R,), L (R, n))."""
    x = x.astype(F32)
    w = w.astype(F32)
    amax, mx = _amax_signed(x)
    zero = amax < EPS
    mx = _safe(mx, zero)

    def fit(isc):
        l = np.clip(_rint(isc[:, None] * x), -nmax, nmax - 1)
        lf = l.astype(F32)
        return l, _ssum(w * x * lf), _ssum(w * lf * lf)

    L, sumlx, suml2 = fit((F32(-nmax) / mx).astype(F32))
    scale = np.where(suml2 > 0, sumlx / _safe(suml2, suml2 == 0), F32(0)).astype(F32)
    best = (scale * sumlx).astype(F32)
    for step in range(-9, 10):
        if step == 0:
            continue
        l, sx, s2 = fit((-(F32(nmax) + F32(0.1) * F32(step)) / mx).astype(F32))
        better = (s2 > 0) & (sx * sx > best * s2)
        new = (sx / _safe(s2, s2 == 0)).astype(F32)
        L = np.where(better[:, None], l, L)
        scale = np.where(better, new, scale)
        best = np.where(better, (new * sx).astype(F32), best)
    L = np.where(zero[:, None], 0, L + nmax)
    return np.where(zero, F32(0), scale).astype(F32), L


def _descend(x, w, L, sumlx, suml2, lo: int, hi: int, *, as_bytes: bool = False):
    """The five rounds of per-element coordinate descent of make_q3_quants and make_qp_quants: each element in
    turn takes the level that the others' fit asks for, if that improves sumlx^2 / suml2; rows stop once a
    round changes nothing (as the C loops break). make_q3 keeps signed levels and asks sl2 > 0 of the new fit;
    make_qp (as_bytes) keeps its levels as uint8_t, so the sums read the wrapped byte, and asks sl2 > 0 of the
    old one instead."""
    active = np.ones(x.shape[0], bool)
    for _ in range(5):
        changed = np.zeros(x.shape[0], bool)
        for i in range(x.shape[1]):
            xi, wi, li = x[:, i], w[:, i], L[:, i].astype(F32)
            slx = (sumlx - wi * xi * li).astype(F32)
            sl2 = (suml2 - wi * li * li).astype(F32)
            ok = active & (slx > 0) & ((sl2 > 0) if as_bytes else True)
            new = np.clip(_rint(xi * sl2 / _safe(slx, ~ok)), lo, hi)
            nf = new.astype(F32)
            slx2 = (slx + wi * xi * nf).astype(F32)
            sl22 = (sl2 + wi * nf * nf).astype(F32)
            better = slx2 * slx2 * suml2 > sumlx * sumlx * sl22
            take = ok & (new != L[:, i]) & (better if as_bytes else (sl22 > 0) & better)
            L[:, i] = np.where(take, (new & 0xFF) if as_bytes else new, L[:, i])
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
            changed |= take
        active &= changed
        if not active.any():
            break
    return L, sumlx, suml2


def make_q3(x, nmax: int):
    """make_q3_quants with do_rmse: levels in [-nmax, nmax - 1] (returned + nmax), x^2-weighted, refined
    by coordinate descent. -> (scale (R,), L (R, n))."""
    x = x.astype(F32)
    amax, mx = _amax_signed(x)
    zero = amax < EPS
    iscale = (F32(-nmax) / _safe(mx, zero)).astype(F32)
    L = np.clip(_rint(iscale[:, None] * x), -nmax, nmax - 1)
    w = (x * x).astype(F32)
    lf = L.astype(F32)
    sumlx, suml2 = _ssum(w * x * lf), _ssum(w * lf * lf)
    L, sumlx, suml2 = _descend(x, w, L, sumlx, suml2, -nmax, nmax - 1)
    scale = np.where(suml2 > 0, sumlx / _safe(suml2, suml2 <= 0), F32(0)).astype(F32)
    return np.where(zero, F32(0), scale), np.where(zero[:, None], 0, L + nmax)


def make_qp(x, nmax: int, w):
    """make_qp_quants: the scales of the scales (Q2_K, Q4_K, Q5_K with an imatrix): x (R, n) on levels up to
    nmax with weights w. The C code keeps its levels in uint8_t, so a negative level (a negative scale among
    x) wraps, and the later sums read the wrapped byte: so here. -> (scale (R,), L (R, n) as the uint8 values)."""
    x = x.astype(F32)
    w = w.astype(F32)
    mx = np.maximum(x.max(axis=-1), F32(0))
    zero = mx < EPS
    mxs = _safe(mx, zero)
    iscale = (F32(nmax) / mxs).astype(F32)
    L0 = (_rint(iscale[:, None] * x) & 0xFF).astype(F32)
    sc0 = (F32(1) / iscale).astype(F32)
    d = (x - sc0[:, None] * L0).astype(F32)
    best = _ssum(w * d * d)
    for step in range(-4, 5):
        if step == 0:
            continue
        isi = ((F32(0.1) * F32(step) + F32(nmax)) / mxs).astype(F32)
        si = (F32(1) / isi).astype(F32)
        l = np.minimum(nmax, _rint(isi[:, None] * x))
        d = (x - si[:, None] * l.astype(F32)).astype(F32)
        mse = _ssum(w * d * d)
        better = mse < best
        best = np.where(better, mse, best)
        iscale = np.where(better, isi, iscale)
    l = np.minimum(nmax, _rint(iscale[:, None] * x))
    lf = l.astype(F32)
    sumlx, suml2 = _ssum(w * x * lf), _ssum(w * lf * lf)
    L, sumlx, suml2 = _descend(x, w, l & 0xFF, sumlx, suml2, -(2 ** 30), nmax, as_bytes=True)  # the stored bytes
    scale = np.where(suml2 > 0, sumlx / _safe(suml2, suml2 <= 0), F32(0)).astype(F32)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, L)


def best_index(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """best_index_int8: the index of the nearest of the sorted values (the upper one on a tie), for the
    IQ4 grid (KVALUES, as float32) by a table: every midpoint between neighbours is a multiple of 1/2, so the
    index is the count of midpoints m <= x, which floor(2 x) tells exactly; other grids by binary search."""
    if values is _KV:
        c = np.clip(np.floor(x * F32(2)), -_MID_SPAN, _MID_SPAN).astype(np.int32)
        return _MID_TABLE[c + _MID_SPAN]
    mu = np.clip(np.searchsorted(values, x, side="right"), 1, len(values) - 1)
    lo = values[mu - 1]
    hi = values[mu]
    i = np.where(x - lo < hi - x, mu - 1, mu)
    return np.where(x <= values[0], 0, np.where(x >= values[-1], len(values) - 1, i))


_MID_SPAN = 512  # |2 x| beyond 2 * 127: the ends of the grid either way
_MIDS2 = (KVALUES[:-1].astype(np.int32) + KVALUES[1:].astype(np.int32))  # twice each midpoint, integers
_MID_TABLE = np.searchsorted(_MIDS2, np.arange(-_MID_SPAN, _MID_SPAN + 1), side="right").astype(np.intp)


def _rows(x: np.ndarray, block: int) -> tuple[int, int]:
    """(rows, k) of a matrix whose rows are whole blocks: a ValueError otherwise (blocks never cross rows)."""
    if x.ndim != 2 or x.shape[1] % block:
        raise ValueError(f"rows of {x.shape[-1]} values are not a whole number of {block}-value blocks")
    return x.shape


def _blocks(x: np.ndarray, block: int, width: int | None = None):
    """(rows, k, xb): x's shape, checked by _rows, and its values as float32 rows of `width` (default
    `block`) values each: where every quantizer starts."""
    rows, k = _rows(x, block)
    return rows, k, np.ascontiguousarray(x, F32).reshape(-1, width or block)


def _importance(weights, rows: int, k: int, block: int) -> np.ndarray:
    """An imatrix row (k,) as per-block weights (rows * k / block, block), float32."""
    qw = np.asarray(weights, F32).reshape(-1)
    if qw.size != k:
        raise ValueError(f"importance has {qw.size} columns, the matrix {k}")
    return np.broadcast_to(qw.reshape(1, k // block, block), (rows, k // block, block)).reshape(-1, block)

"""Interleaved Q4_0, Q4_1, Q5_0, Q5_1 (layout.interleave8): eight rows per vector."""

import numpy as np
from numba import njit
from numba.extending import overload

from ... import kinds
from .. import simd
from .common import EXACT, PREFETCH, X8_TOKENS, by_path, dot8, i8, mmla_pair, row_tiles8

has_qh = kinds.predicate("has_qh", within="x8")    # Q5_0, Q5_1
has_min = kinds.predicate("has_min", within="x8")  # Q4_1, Q5_1


def rows_x8(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q4_0/Q4_1/Q5_0/Q5_1, every token."""


@njit(inline="always", cache=True)
def _x8_lane(kind, qs, qh, d, m, luts, xq, xd, xs, grp, r, t, nb):
    # row r of row group grp times token t, the SIMD path's arithmetic lane by lane (the same bits)
    five = has_qh(kind)
    acc = np.float32(0.0)
    mo = np.float32(0.0)
    for b in range(nb):
        isum = np.int32(0)
        for i in range(32):
            v = i // 4
            q = np.int32(qs[grp, b * 128 + (v % 4) * 32 + r * 4 + i % 4])
            q = q & 15 if v < 4 else q >> 4
            if five:
                q |= np.int32((qh[grp, b * 32 + r * 4 + i % 4] >> v) & 1) << 4
            isum += q * i8(xq[t, b * 32 + i])
        dw = luts[0, d[grp, b * 8 + r]]
        off = luts[0, m[grp, b * 8 + r]] if has_min(kind) else dw * np.float32(-16.0 if five else -8.0)
        acc = simd.fma1(np.float32(isum), dw * xd[t, b], acc)
        mo = simd.fma1(off, xs[t, b], mo)
    return acc + mo


@njit(cache=True, fastmath=EXACT)
def _x8_portable(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    # one row and one token at a time
    for n in range(n0, n1):
        for t in range(xq.shape[0]):
            out[t, n] = _x8_lane(kind, qs, qh, d, m, luts, xq, xd, xs, n // 8, n % 8, t, xq.shape[1] // 32)


@njit(inline="always", cache=True)
def _x8_high(five, w, h, v):
    # a vector of nibbles, with the fifth bits of a Q5 type: bit v of each byte of the block's qh vector h
    if five:
        return simd.or_(w, simd.bit_to_16(h, v))
    return w


@njit(inline="always", cache=True)
def _x8_weights(five, v0, v1, v2, v3, h):
    # a block's eight weight vectors (elements 4v .. 4v + 3 of eight rows) from its four packed vectors: low
    # nibbles are elements 0-15, high ones 16-31, with a Q5 type's fifth bits from h
    return (_x8_high(five, simd.low4(v0), h, 0), _x8_high(five, simd.low4(v1), h, 1),
            _x8_high(five, simd.low4(v2), h, 2), _x8_high(five, simd.low4(v3), h, 3),
            _x8_high(five, simd.shr4(v0), h, 4), _x8_high(five, simd.shr4(v1), h, 5),
            _x8_high(five, simd.shr4(v2), h, 6), _x8_high(five, simd.shr4(v3), h, 7))


@njit(inline="always", cache=True)
def _x8_block(five, has_m, offk, qs, qh, d, m, o):
    # block o's eight weight vectors (_x8_weights), its eight rows' scales and their offsets (Q4_1/Q5_1's
    # mins, or -8 / -16 times the scale)
    v0 = simd.load32(qs, o * 128)
    v1 = simd.load32(qs, o * 128 + 32)
    v2 = simd.load32(qs, o * 128 + 64)
    v3 = simd.load32(qs, o * 128 + 96)
    w0, w1, w2, w3, w4, w5, w6, w7 = _x8_weights(five, v0, v1, v2, v3, simd.load32(qh, o * 32) if five else v3)
    dw = simd.loadf8(d, o * 8)
    return w0, w1, w2, w3, w4, w5, w6, w7, dw, simd.loadf8(m, o * 8) if has_m else simd.mul8(dw, offk)


@njit(inline="always", cache=True)
def _x8_tile(k, K, grp, grp2, t0, t1, acc, mos):
    # row group grp's blocks for tokens [t0, t1) (common.row_tiles8): each block's eight weight vectors decoded
    # once for the tile's tokens
    isa, kind, qs, qh, d, m, xq, xd, xs = k
    nb = K // 32
    five = has_qh(kind)
    has_m = has_min(kind)
    offk = simd.splatf(np.float32(-16.0 if five else -8.0))
    for b in range(nb):
        w0, w1, w2, w3, w4, w5, w6, w7, dw, off = _x8_block(five, has_m, offk, qs, qh, d, m, grp * nb + b)
        for t in range(t0, t1):
            xo = t * K + b * 32
            isum = dot8(isa, w0, w1, w2, w3, w4, w5, w6, w7,
                        simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4), simd.bcast4(xq, xo + 8),
                        simd.bcast4(xq, xo + 12), simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20),
                        simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28))
            j = (t - t0) * 8
            simd.storef8(acc, j, simd.fma8(simd.cvt8(isum), simd.mul8(dw, simd.splatf(simd.ld(xd, t * nb + b))),
                                           simd.loadf8(acc, j)))
            simd.storef8(mos, j, simd.fma8(off, simd.splatf(simd.ld(xs, t * nb + b)), simd.loadf8(mos, j)))


@njit(cache=True, fastmath=EXACT)
def _x8_simd(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    T, K = xq.shape
    N = out.shape[1]
    nb = K // 32
    five = has_qh(kind)
    has_m = has_min(kind)
    offk = simd.splatf(np.float32(-16.0 if five else -8.0))
    if T == 1:
        for grp in range(n0 // 8, (n1 + 7) // 8):
            acc = simd.zerof()
            mo = simd.zerof()
            for b in range(nb):
                o = grp * nb + b
                simd.prefetch(qs, o * 128 + PREFETCH)
                simd.prefetch(qs, o * 128 + 64 + PREFETCH)
                v0 = simd.load32(qs, o * 128)
                v1 = simd.load32(qs, o * 128 + 32)
                v2 = simd.load32(qs, o * 128 + 64)
                v3 = simd.load32(qs, o * 128 + 96)
                h = simd.load32(qh, o * 32) if five else v3
                isum = dot8(isa, _x8_high(five, simd.low4(v0), h, 0),
                            _x8_high(five, simd.low4(v1), h, 1),
                            _x8_high(five, simd.low4(v2), h, 2),
                            _x8_high(five, simd.low4(v3), h, 3),
                            _x8_high(five, simd.shr4(v0), h, 4),
                            _x8_high(five, simd.shr4(v1), h, 5),
                            _x8_high(five, simd.shr4(v2), h, 6),
                            _x8_high(five, simd.shr4(v3), h, 7),
                            simd.bcast4(xq, b * 32), simd.bcast4(xq, b * 32 + 4), simd.bcast4(xq, b * 32 + 8),
                            simd.bcast4(xq, b * 32 + 12), simd.bcast4(xq, b * 32 + 16), simd.bcast4(xq, b * 32 + 20),
                            simd.bcast4(xq, b * 32 + 24), simd.bcast4(xq, b * 32 + 28))
                dw = simd.loadf8(d, o * 8)
                off = simd.loadf8(m, o * 8) if has_m else simd.mul8(dw, offk)
                acc = simd.fma8(simd.cvt8(isum), simd.mul8(dw, simd.splatf(simd.ld(xd, b))), acc)
                mo = simd.fma8(off, simd.splatf(simd.ld(xs, b)), mo)
            simd.storef8_first(out, grp * 8, simd.add8(acc, mo), N - grp * 8)
        return
    _x8_batch(isa, kind, qs, qh, d, m, xq, xd, xs, out, n0, n1)


@njit(cache=True, fastmath=EXACT)
def _x8_batch(isa, kind, qs, qh, d, m, xq, xd, xs, out, n0, n1):
    # a batch: tiles of up to X8_TOKENS tokens (a function of its own, so the decode loop's registers are
    # those of _x8_simd alone)
    acc = np.empty(X8_TOKENS * 8, np.float32)
    mos = np.empty(X8_TOKENS * 8, np.float32)
    row_tiles8(_x8_tile, (isa, kind, qs, qh, d, m, xq, xd, xs), 1, xq, out, n0, n1, acc, mos)


@njit(inline="always", cache=True)
def _x8_pairs_tile(k, K, grp, grp2, t0, t1, acc, mos):
    # _x8_tile for the i8mm path: the tile's tokens two at a time in smmla
    qs, qh, d, m, xq, xd, xs, five, has_m, offk = k
    nb = K // 32
    for b in range(nb):
        w0, w1, w2, w3, w4, w5, w6, w7, dw, off = _x8_block(five, has_m, offk, qs, qh, d, m, grp * nb + b)
        for t in range(t0, t1, 2):
            u = min(t + 1, t1 - 1)  # the pair's second token (t itself when t is the tile's last)
            j = (t - t0) * 8
            mmla_pair(w0, w1, w2, w3, w4, w5, w6, w7, xq, xd, dw, acc, K, nb, b, t, u, j)
            simd.storef8(mos, j, simd.fma8(off, simd.splatf(simd.ld(xs, t * nb + b)), simd.loadf8(mos, j)))
            if u > t:
                simd.storef8(mos, j + 8, simd.fma8(off, simd.splatf(simd.ld(xs, u * nb + b)), simd.loadf8(mos, j + 8)))


@njit(cache=True, fastmath=EXACT)
def _x8_mmla(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    # the i8mm path: one token as _x8_simd (sdot); a batch two tokens at a time, each block's eight weight
    # vectors against both tokens' activations in 16 smmla (simd.mmla8; the weights' zips, which do not
    # depend on the token, are left to the compiler to hoist). The same integer sums as sdot, so the same
    # bits: a token's result does not depend on its partner.
    T = xq.shape[0]
    if T == 1:
        _x8_simd(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1)
        return
    five = has_qh(kind)
    has_m = has_min(kind)
    offk = simd.splatf(np.float32(-16.0 if five else -8.0))
    acc = np.empty(X8_TOKENS * 8, np.float32)
    mos = np.empty(X8_TOKENS * 8, np.float32)
    row_tiles8(_x8_pairs_tile, (qs, qh, d, m, xq, xd, xs, five, has_m, offk), 1, xq, out, n0, n1, acc, mos)


overload(rows_x8)(by_path(_x8_portable, _x8_simd, i8mm=_x8_mmla))

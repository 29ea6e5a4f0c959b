"""The Q4_K/Q5_K/Q6_K kernel of the avx2 path (kx8.py): a sub-block's weights unpacked once into registers
for a tile of tokens, the sub-block scales on the vpmaddwd (see _kx8_avx2)."""

import numpy as np
from numba import njit

from .. import simd
from .common import EXACT, PREFETCH, X8_TOKENS, row_tiles8
from .kx8_simd import Q6_SUB, _q45w, has_qh, is_q6_k, q6w


@njit(inline="always", cache=True)
def _dot45(five, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7, s16):
    # a 32-element sub-block of eight rows times one token, times the rows' sub-block scales (s16)
    a = simd.add16(simd.add16(simd.maddubs(w0, x0), simd.maddubs(w1, x1)),
                   simd.add16(simd.maddubs(w2, x2), simd.maddubs(w3, x3)))
    b = simd.add16(simd.add16(simd.maddubs(w4, x4), simd.maddubs(w5, x5)),
                   simd.add16(simd.maddubs(w6, x6), simd.maddubs(w7, x7)))
    if five:
        return simd.add32(simd.madd(a, s16), simd.madd(b, s16))
    return simd.madd(simd.add16(a, b), s16)


@njit(inline="always", cache=True)
def _q45_tile(k, K, grp, grp2, t0, t1, acc, mos):
    # row group grp's super-blocks for tokens [t0, t1) (common.row_tiles8): each sub-block's weight vectors
    # unpacked once for the tile's tokens
    five, qs, qh, sc, d, m, xq, xd, xb, isums = k
    nsb = K // 256
    for sb in range(nsb):
        g = grp * nsb + sb
        isums[: (t1 - t0) * 8] = 0
        for p in range(4):
            o = (g * 4 + p) * 256
            ho = g * 256 if five else o
            if t0 == 0:
                simd.prefetch256(qs, o + PREFETCH)
            hq = qh if five else qs
            for half in range(2):
                j = 2 * p + half
                w0 = _q45w(five, half, simd.load32(qs, o), simd.load32(hq, ho), j)
                w1 = _q45w(five, half, simd.load32(qs, o + 32), simd.load32(hq, ho + 32), j)
                w2 = _q45w(five, half, simd.load32(qs, o + 64), simd.load32(hq, ho + 64), j)
                w3 = _q45w(five, half, simd.load32(qs, o + 96), simd.load32(hq, ho + 96), j)
                w4 = _q45w(five, half, simd.load32(qs, o + 128), simd.load32(hq, ho + 128), j)
                w5 = _q45w(five, half, simd.load32(qs, o + 160), simd.load32(hq, ho + 160), j)
                w6 = _q45w(five, half, simd.load32(qs, o + 192), simd.load32(hq, ho + 192), j)
                w7 = _q45w(five, half, simd.load32(qs, o + 224), simd.load32(hq, ho + 224), j)
                s16 = simd.scales16(sc, g * 128 + j * 8)
                for t in range(t0, t1):
                    xo = t * K + sb * 256 + j * 32
                    v = _dot45(five, w0, w1, w2, w3, w4, w5, w6, w7,
                               simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4), simd.bcast4(xq, xo + 8),
                               simd.bcast4(xq, xo + 12), simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20),
                               simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28), s16)
                    i = (t - t0) * 8
                    simd.store8i(isums, i, simd.add32(simd.load8i(isums, i), v))
        mins = g * 128 + 64
        mv = simd.loadf8(m, g * 8)
        dv = simd.loadf8(d, g * 8)
        for t in range(t0, t1):
            o8 = t * nsb * 8 + sb * 8
            msum = simd.add32(
                simd.add32(simd.madd(simd.pairs16(sc, mins), simd.splat_pair16(simd.ld(xb, o8), simd.ld(xb, o8 + 1))),
                           simd.madd(simd.pairs16(sc, mins + 16), simd.splat_pair16(simd.ld(xb, o8 + 2), simd.ld(xb, o8 + 3)))),
                simd.add32(simd.madd(simd.pairs16(sc, mins + 32), simd.splat_pair16(simd.ld(xb, o8 + 4), simd.ld(xb, o8 + 5))),
                           simd.madd(simd.pairs16(sc, mins + 48), simd.splat_pair16(simd.ld(xb, o8 + 6), simd.ld(xb, o8 + 7)))))
            i = (t - t0) * 8
            dx = simd.splatf(simd.ld(xd, t * nsb + sb))
            simd.storef8(mos, i, simd.fma8(simd.cvt8(msum), simd.mul8(mv, dx), simd.loadf8(mos, i)))
            simd.storef8(acc, i, simd.fma8(simd.cvt8(simd.load8i(isums, i)), simd.mul8(dv, dx), simd.loadf8(acc, i)))


@njit(inline="always", cache=True)
def _q45_avx2(five, qs, qh, sc, d, m, xq, xd, xb, out, n0, n1, acc, mos, isums):
    # Q4_K (five False) or Q5_K (True), as _kx8_avx2 describes; `five` is a constant where this is inlined
    T, K = xq.shape
    N = out.shape[1]
    nsb = K // 256
    if T == 1:  # decode: the same sums with the accumulators in registers
        for grp in range(n0 // 8, (n1 + 7) // 8):
            av = simd.zerof()
            mo = simd.zerof()
            for sb in range(nsb):
                g = grp * nsb + sb
                isum = simd.zero32()
                for p in range(4):
                    o = (g * 4 + p) * 256
                    ho = g * 256 if five else o
                    simd.prefetch256(qs, o + PREFETCH)
                    hq = qh if five else qs
                    for half in range(2):
                        j = 2 * p + half
                        xo = sb * 256 + j * 32
                        isum = simd.add32(isum, _dot45(
                            five,
                            _q45w(five, half, simd.load32(qs, o), simd.load32(hq, ho), j),
                            _q45w(five, half, simd.load32(qs, o + 32), simd.load32(hq, ho + 32), j),
                            _q45w(five, half, simd.load32(qs, o + 64), simd.load32(hq, ho + 64), j),
                            _q45w(five, half, simd.load32(qs, o + 96), simd.load32(hq, ho + 96), j),
                            _q45w(five, half, simd.load32(qs, o + 128), simd.load32(hq, ho + 128), j),
                            _q45w(five, half, simd.load32(qs, o + 160), simd.load32(hq, ho + 160), j),
                            _q45w(five, half, simd.load32(qs, o + 192), simd.load32(hq, ho + 192), j),
                            _q45w(five, half, simd.load32(qs, o + 224), simd.load32(hq, ho + 224), j),
                            simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4), simd.bcast4(xq, xo + 8),
                            simd.bcast4(xq, xo + 12), simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20),
                            simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28), simd.scales16(sc, g * 128 + j * 8)))
                mins = g * 128 + 64
                o8 = sb * 8
                msum = simd.add32(
                    simd.add32(simd.madd(simd.pairs16(sc, mins), simd.splat_pair16(simd.ld(xb, o8), simd.ld(xb, o8 + 1))),
                               simd.madd(simd.pairs16(sc, mins + 16), simd.splat_pair16(simd.ld(xb, o8 + 2), simd.ld(xb, o8 + 3)))),
                    simd.add32(simd.madd(simd.pairs16(sc, mins + 32), simd.splat_pair16(simd.ld(xb, o8 + 4), simd.ld(xb, o8 + 5))),
                               simd.madd(simd.pairs16(sc, mins + 48), simd.splat_pair16(simd.ld(xb, o8 + 6), simd.ld(xb, o8 + 7)))))
                dx = simd.splatf(simd.ld(xd, sb))
                mo = simd.fma8(simd.cvt8(msum), simd.mul8(simd.loadf8(m, g * 8), dx), mo)
                av = simd.fma8(simd.cvt8(isum), simd.mul8(simd.loadf8(d, g * 8), dx), av)
            simd.storef8_first(out, grp * 8, simd.sub8(av, mo), N - grp * 8)
        return
    row_tiles8(_q45_tile, (five, qs, qh, sc, d, m, xq, xd, xb, isums), -1, xq, out, n0, n1, acc, mos)


@njit(inline="always", cache=True)
def _q6_tile(k, K, grp, grp2, t0, t1, acc, mos):
    # _q45_tile for Q6_K
    qs, sc, d, xq, xd, xb16, isums = k
    nsb = K // 256
    for sb in range(nsb):
        g = grp * nsb + sb
        isums[: (t1 - t0) * 8] = 0
        for j in range(16):
            o = (g * 16 + j) * Q6_SUB
            if t0 == 0:
                simd.prefetch(qs, o + PREFETCH)
                simd.prefetch(qs, o + 64 + PREFETCH)
            w0, w1, w2, w3 = q6w(simd.load32(qs, o), simd.load32(qs, o + 32), simd.load32(qs, o + 64))
            s16 = simd.scales16s(sc, g * 128 + j * 8)
            for t in range(t0, t1):
                xo = t * K + sb * 256 + j * 16
                a = simd.add16(simd.maddubs(w0, simd.bcast4(xq, xo)), simd.maddubs(w1, simd.bcast4(xq, xo + 4)))
                b = simd.add16(simd.maddubs(w2, simd.bcast4(xq, xo + 8)), simd.maddubs(w3, simd.bcast4(xq, xo + 12)))
                i = (t - t0) * 8
                simd.store8i(isums, i, simd.add32(simd.load8i(isums, i), simd.add32(simd.madd(a, s16), simd.madd(b, s16))))
        dv = simd.loadf8(d, g * 8)
        for t in range(t0, t1):
            # - 32 sum_j sc_j xb16_j: the weights are q, the value + 32
            o16 = t * nsb * 16 + sb * 16
            off = simd.zero32()
            for jp in range(8):
                off = simd.add32(off, simd.madd(simd.pairs16s(sc, g * 128 + jp * 16),
                                                simd.splat_pair16(simd.ld(xb16, o16 + 2 * jp),
                                                                  simd.ld(xb16, o16 + 2 * jp + 1))))
            i = (t - t0) * 8
            isum = simd.sub32(simd.load8i(isums, i), simd.mul32(off, simd.splat32(32)))
            simd.storef8(acc, i, simd.fma8(simd.cvt8(isum), simd.mul8(dv, simd.splatf(simd.ld(xd, t * nsb + sb))),
                                           simd.loadf8(acc, i)))


@njit(inline="always", cache=True)
def _q6_avx2(qs, sc, d, xq, xd, xb16, out, n0, n1, acc, isums):
    # Q6_K (weights unsigned q, 0..63, unpacked from six bits: q6w), as _kx8_avx2 describes
    T, K = xq.shape
    N = out.shape[1]
    nsb = K // 256
    if T == 1:  # decode: the same sums with the accumulators in registers
        for grp in range(n0 // 8, (n1 + 7) // 8):
            av = simd.zerof()
            for sb in range(nsb):
                g = grp * nsb + sb
                isum = simd.zero32()
                for j in range(16):
                    o = (g * 16 + j) * Q6_SUB
                    simd.prefetch(qs, o + PREFETCH)
                    simd.prefetch(qs, o + 64 + PREFETCH)
                    xo = sb * 256 + j * 16
                    w0, w1, w2, w3 = q6w(simd.load32(qs, o), simd.load32(qs, o + 32), simd.load32(qs, o + 64))
                    a = simd.add16(simd.maddubs(w0, simd.bcast4(xq, xo)), simd.maddubs(w1, simd.bcast4(xq, xo + 4)))
                    b = simd.add16(simd.maddubs(w2, simd.bcast4(xq, xo + 8)), simd.maddubs(w3, simd.bcast4(xq, xo + 12)))
                    s16 = simd.scales16s(sc, g * 128 + j * 8)
                    isum = simd.add32(isum, simd.add32(simd.madd(a, s16), simd.madd(b, s16)))
                off = simd.zero32()
                for jp in range(8):
                    off = simd.add32(off, simd.madd(simd.pairs16s(sc, g * 128 + jp * 16),
                                                    simd.splat_pair16(simd.ld(xb16, sb * 16 + 2 * jp),
                                                                      simd.ld(xb16, sb * 16 + 2 * jp + 1))))
                isum = simd.sub32(isum, simd.mul32(off, simd.splat32(32)))
                av = simd.fma8(simd.cvt8(isum), simd.mul8(simd.loadf8(d, g * 8), simd.splatf(simd.ld(xd, sb))), av)
            simd.storef8_first(out, grp * 8, av, N - grp * 8)
        return
    row_tiles8(_q6_tile, (qs, sc, d, xq, xd, xb16, isums), 0, xq, out, n0, n1, acc, acc)


@njit(cache=True, fastmath=EXACT)
def _kx8_avx2(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    # Weight reuse across tokens: a sub-block's weight vectors (32 elements of eight rows, eight vectors;
    # Q6_K: 16 elements, four) are unpacked once into registers and multiplied against every token of a
    # tile of up to X8_TOKENS, the tokens' integer sums kept in a small scratch (`isums`, L1). AVX2 has 16
    # ymm registers: the eight weights, the scales, a token's broadcasts and partial sums fit, so the token
    # loop runs without spills (more tokens per weight load would need more accumulators than registers).
    # The sub-block scales ride on the vpmaddwd that widens the 16-bit partials (scales16: row r's scale in
    # both halves of lane r), so no vpmulld; the mins (and Q6_K's -32 offset) come from the activation's
    # block sums, one vpmaddwd per two sub-blocks (pairs16 x splat_pair16).
    # Every integer sum is exact, so each (row, token, super-block) gets the same integer as _kx8_simd and
    # _kx8_portable, and each output the same FMAs in the same order: the same bits for every batch.
    # Ranges (vpmaddubsw adds two u8 x s8 products into 16 bits; vpaddw wraps):
    #   Q4_K  8 pairs per 16-bit partial  8 x 2 x 15 x 128 = 30720 < 2**15
    #   Q5_K  4 pairs                     4 x 2 x 31 x 128 = 31744
    #   Q6_K  2 pairs                     2 x 2 x 63 x 128 = 32256
    tile = min(xq.shape[0], X8_TOKENS)
    acc = np.empty(tile * 8, np.float32)
    mos = np.empty(tile * 8, np.float32)
    isums = np.empty(tile * 8, np.int32)
    if is_q6_k(kind):
        _q6_avx2(qs, sc, d, xq, xd, xb16, out, n0, n1, acc, isums)
    elif has_qh(kind):
        _q45_avx2(True, qs, qh, sc, d, m, xq, xd, xb, out, n0, n1, acc, mos, isums)
    else:
        _q45_avx2(False, qs, qh, sc, d, m, xq, xd, xb, out, n0, n1, acc, mos, isums)

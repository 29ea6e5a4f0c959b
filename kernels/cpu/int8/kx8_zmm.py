"""The Q4_K/Q5_K/Q6_K kernel of the avx512 path (kx8.py): the avx2 kernel's tile with two row groups (16
rows) per zmm vector (simd/vec.py), see _kx8_zmm."""

import numpy as np
from numba import njit

from .. import simd
from .common import EXACT, PREFETCH, X8_TOKENS, dot8w, pack_pairs, row_tiles16
from .kx8_simd import Q6_SUB, has_min, has_qh, is_q6_k, q6w


@njit(inline="always", cache=True)
def _w45(five, half, qs, qh, o, p, ho, hp, j):
    # one wide vector of sub-block j's weights: groups g (offset o, qh ho) and g + 1 (p, hp)
    b = simd.load32(qs, o, p)
    q = simd.shr4(b) if half else simd.low4(b)
    return simd.or_(q, simd.bit_to_16(simd.load32(qh, ho, hp), j)) if five else q


@njit(inline="always", cache=True)
def _tile(k, K, grp, grp2, t0, t1, acc, mos):
    # row groups grp and grp2's super-blocks for tokens [t0, t1) (common.row_tiles16), as _kx8_zmm describes
    q6, five, mins, qs, qh, sc, d, m, xq, xd, xp, isums = k
    nsb = K // 256
    npair = nsb * 8 if q6 else nsb * 4  # pairs per token
    for sb in range(nsb):
        g = grp * nsb + sb
        h = grp2 * nsb + sb
        isums[: (t1 - t0) * 16] = 0
        if q6:
            for j in range(16):
                o = (g * 16 + j) * Q6_SUB
                p = (h * 16 + j) * Q6_SUB
                if t0 == 0:
                    simd.prefetch(qs, o + PREFETCH)
                    simd.prefetch(qs, o + 64 + PREFETCH)
                    simd.prefetch(qs, p + PREFETCH)
                    simd.prefetch(qs, p + 64 + PREFETCH)
                w0, w1, w2, w3 = q6w(simd.load32(qs, o, p), simd.load32(qs, o + 32, p + 32), simd.load32(qs, o + 64, p + 64))
                s = simd.widen8s(sc, g * 128 + j * 8, h * 128 + j * 8)
                for t in range(t0, t1):
                    xo = t * K + sb * 256 + j * 16
                    dot = simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(
                        simd.zero32w(), w0, simd.bcast4w(xq, xo)), w1, simd.bcast4w(xq, xo + 4)),
                        w2, simd.bcast4w(xq, xo + 8)), w3, simd.bcast4w(xq, xo + 12))
                    i = (t - t0) * 16
                    simd.store8i(isums, i, simd.add32(simd.load16i(isums, i), simd.mul32(dot, s)))
        else:
            for pp in range(4):
                o = (g * 4 + pp) * 256
                p = (h * 4 + pp) * 256
                ho = g * 256 if five else o
                hp = h * 256 if five else p
                hq = qh if five else qs
                if t0 == 0:
                    simd.prefetch256(qs, o + PREFETCH)
                    simd.prefetch256(qs, p + PREFETCH)
                for half in range(2):
                    j = 2 * pp + half
                    w0 = _w45(five, half, qs, hq, o, p, ho, hp, j)
                    w1 = _w45(five, half, qs, hq, o + 32, p + 32, ho + 32, hp + 32, j)
                    w2 = _w45(five, half, qs, hq, o + 64, p + 64, ho + 64, hp + 64, j)
                    w3 = _w45(five, half, qs, hq, o + 96, p + 96, ho + 96, hp + 96, j)
                    w4 = _w45(five, half, qs, hq, o + 128, p + 128, ho + 128, hp + 128, j)
                    w5 = _w45(five, half, qs, hq, o + 160, p + 160, ho + 160, hp + 160, j)
                    w6 = _w45(five, half, qs, hq, o + 192, p + 192, ho + 192, hp + 192, j)
                    w7 = _w45(five, half, qs, hq, o + 224, p + 224, ho + 224, hp + 224, j)
                    s = simd.widen8(sc, g * 128 + j * 8, h * 128 + j * 8)
                    for t in range(t0, t1):
                        i = (t - t0) * 16
                        dot = dot8w(simd.zero32w(), w0, w1, w2, w3, w4, w5, w6, w7, xq, t * K + sb * 256 + j * 32)
                        simd.store8i(isums, i, simd.add32(simd.load16i(isums, i), simd.mul32(dot, s)))
        # the super-block's float step per token: Q6_K's offset or Q4_K/Q5_K's mins from the block sums
        base = g * 128 if q6 else g * 128 + 64
        hbase = h * 128 if q6 else h * 128 + 64
        c0, c1 = simd.pairs16s(sc, base, hbase) if q6 else simd.pairs16(sc, base, hbase), \
            simd.pairs16s(sc, base + 16, hbase + 16) if q6 else simd.pairs16(sc, base + 16, hbase + 16)
        c2, c3 = simd.pairs16s(sc, base + 32, hbase + 32) if q6 else simd.pairs16(sc, base + 32, hbase + 32), \
            simd.pairs16s(sc, base + 48, hbase + 48) if q6 else simd.pairs16(sc, base + 48, hbase + 48)
        dv = simd.loadf8(d, g * 8, h * 8)
        mv = simd.loadf8(m, g * 8, h * 8) if mins else dv
        for t in range(t0, t1):
            i = (t - t0) * 16
            x0 = t * npair + sb * (8 if q6 else 4)
            c = simd.dpwssd(simd.dpwssd(simd.dpwssd(simd.dpwssd(
                simd.zero32w(), c0, simd.splat32w(simd.ld(xp, x0))), c1, simd.splat32w(simd.ld(xp, x0 + 1))),
                c2, simd.splat32w(simd.ld(xp, x0 + 2))), c3, simd.splat32w(simd.ld(xp, x0 + 3)))
            dx = simd.splatf16(simd.ld(xd, t * nsb + sb))
            isum = simd.load16i(isums, i)
            if q6:
                c = simd.dpwssd(simd.dpwssd(simd.dpwssd(simd.dpwssd(
                    c, simd.pairs16s(sc, base + 64, hbase + 64), simd.splat32w(simd.ld(xp, x0 + 4))),
                    simd.pairs16s(sc, base + 80, hbase + 80), simd.splat32w(simd.ld(xp, x0 + 5))),
                    simd.pairs16s(sc, base + 96, hbase + 96), simd.splat32w(simd.ld(xp, x0 + 6))),
                    simd.pairs16s(sc, base + 112, hbase + 112), simd.splat32w(simd.ld(xp, x0 + 7)))
                isum = simd.sub32(isum, simd.shl32(c, 5))  # the weights are q, the value + 32
            else:
                simd.storef8(mos, i, simd.fma8(simd.cvt8(c), simd.mul8(mv, dx), simd.loadf16(mos, i)))
            simd.storef8(acc, i, simd.fma8(simd.cvt8(isum), simd.mul8(dv, dx), simd.loadf16(acc, i)))


@njit(cache=True, fastmath=EXACT)
def _kx8_zmm(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    # The avx512 path: two row groups (16 rows) per zmm vector (simd/vec.py) and _kx8_avx2's tile: a
    # sub-block's weight vectors unpacked once into registers for up to X8_TOKENS tokens, each token's
    # vpdpbusd sums times the sub-block scales (vpmulld) added into a scratch of integer sums (`isums`).
    # The mins (Q6_K: the -32 offset) come once per super-block and token from one vpdpwssd per two
    # sub-blocks: the rows' scales as 16-bit pairs against the activations' block sums packed in pairs
    # (pack_pairs). The integers are _kx8_simd's and the FMAs the same in the same order: the same bits.
    T = xq.shape[0]
    q6 = is_q6_k(kind)
    tile = min(T, X8_TOKENS)
    acc = np.empty(tile * 16, np.float32)
    mos = np.empty(tile * 16, np.float32)
    isums = np.empty(tile * 16, np.int32)
    xp = pack_pairs(xb16 if q6 else xb)
    k = (q6, has_qh(kind), has_min(kind), qs, qh, sc, d, m, xq, xd, xp, isums)
    row_tiles16(_tile, k, -1 if has_min(kind) else 0, xq, out, n0, n1, acc, mos)

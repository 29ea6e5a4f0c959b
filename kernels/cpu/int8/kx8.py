"""Interleaved Q4_K, Q5_K, Q6_K (layout._k8): eight rows per vector."""

import numpy as np
from numba import njit
from numba.extending import overload

from ... import kinds
from .. import simd
from ..simd import path_of
from .common import EXACT, PREFETCH, by_path, i8, store8, dot8

has_qh = kinds.predicate("has_qh", within="kx8")    # Q5_K
has_min = kinds.predicate("has_min", within="kx8")  # Q4_K, Q5_K: packed nibbles and a min; Q6_K: neither
is_q6_k = kinds.predicate("ggml:Q6_K", within="kx8")  # Q6_K: unsigned bytes, no min

# -- interleaved Q4_K/Q5_K/Q6_K (layout._k8): eight rows per vector ----------------------------------
#
# As for the legacy types, each vector holds four elements of eight rows; the sub-block scales are
# applied in the integer domain to eight rows at once (vpmulld with the rows' scales widened to 32 bits),
# the mins from the activation's sums per 32, and one float FMA per 256 elements per eight rows:
#   Q4_K/Q5_K  acc = fma(float(sum_j sc_j dot_j), d d_x, acc), mo = fma(float(sum_j min_j xsum_j), dmin d_x, mo)
#   Q6_K       acc = fma(float(sum_j sc_j (dot_j - 32 xsum16_j)), d d_x, acc)   (q stored unsigned, 0..63)
# Q4_K/Q5_K weights are unpacked once per row group into a scratch of bytes (8 K of them), which every
# token then reads; Q6_K's are stored unpacked. One code path for every batch size: the same bits.


def rows_kx8(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q4_K/Q5_K/Q6_K, every token."""


def dot4(isa, w0, w1, w2, w3, x0, x1, x2, x3):
    """sum_v u8x32 w_v . s8x32 x_v -> s32x8 (exact) for weights up to 63: vpdpbusd chain on vnni; on avx2
    vpmaddubsw pairs summed in 16 bits (at most 2 x 2 x 63 x 127 < 2**15), then vpmaddwd."""


@overload(dot4, inline="always")
def _dot4(isa, w0, w1, w2, w3, x0, x1, x2, x3):
    if path_of(isa) == "vnni":
        def impl(isa, w0, w1, w2, w3, x0, x1, x2, x3):
            return simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.zero32(), w0, x0), w1, x1), w2, x2), w3, x3)
        return impl

    def impl(isa, w0, w1, w2, w3, x0, x1, x2, x3):
        a = simd.add16(simd.maddubs(w0, x0), simd.maddubs(w1, x1))
        b = simd.add16(simd.maddubs(w2, x2), simd.maddubs(w3, x3))
        return simd.add32(simd.madd(a, simd.ones16()), simd.madd(b, simd.ones16()))
    return impl


@njit(cache=True, fastmath=EXACT)
def _kx8_portable(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    # one row and one token at a time, the SIMD path's arithmetic lane by lane (the same bits)
    T, K = xq.shape
    nsb = K // 256
    for n in range(n0, n1):
        grp = n // 8
        r = n % 8
        for t in range(T):
            acc = np.float32(0.0)
            mo = np.float32(0.0)
            for sb in range(nsb):
                isum = np.int32(0)
                msum = np.int32(0)
                if is_q6_k(kind):
                    for j in range(16):
                        dot = np.int32(0)
                        for i in range(16):
                            e = j * 16 + i
                            dot += np.int32(qs[grp, ((sb * 64 + e // 4) * 8 + r) * 4 + e % 4]) * i8(xq[t, sb * 256 + e])
                        isum += i8(sc[grp, (sb * 16 + j) * 8 + r]) * (dot - 32 * xb16[t, sb * 16 + j])
                else:
                    for j in range(8):
                        dot = np.int32(0)
                        for l in range(32):
                            b = qs[grp, (((sb * 4 + j // 2) * 8 + l // 4) * 8 + r) * 4 + l % 4]
                            q = np.int32(b & 15) if j % 2 == 0 else np.int32(b >> 4)
                            if has_qh(kind):
                                q |= np.int32((qh[grp, ((sb * 8 + l // 4) * 8 + r) * 4 + l % 4] >> j) & 1) << 4
                            dot += q * i8(xq[t, sb * 256 + j * 32 + l])
                        isum += np.int32(sc[grp, (sb * 16 + j) * 8 + r]) * dot
                        msum += np.int32(sc[grp, (sb * 16 + 8 + j) * 8 + r]) * xb[t, sb * 8 + j]
                dx = xd[t, sb]
                acc = simd.fma1(np.float32(isum), luts[0, d[grp, sb * 8 + r]] * dx, acc)
                if has_min(kind):
                    mo = simd.fma1(np.float32(msum), luts[0, m[grp, sb * 8 + r]] * dx, mo)
            out[t, n] = acc - mo if has_min(kind) else acc


@njit(cache=True, fastmath=EXACT)
def _kx8_simd(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    T, K = xq.shape
    N = out.shape[1]
    nsb = K // 256
    res = np.empty(8, np.float32)
    ws = np.empty(8 * K if has_min(kind) else 0, np.uint8)  # a row group's Q4_K/Q5_K weights as bytes
    for grp in range(n0 // 8, (n1 + 7) // 8):
        if has_min(kind):  # Q4_K/Q5_K: unpack: sub-block j, vector v at ((sb * 8 + j) * 8 + v) * 32
            for sb in range(nsb):
                for p in range(4):
                    for v in range(8):
                        o = (((grp * nsb + sb) * 4 + p) * 8 + v) * 32
                        simd.prefetch(qs, o + PREFETCH)
                        b = simd.load32(qs, o)
                        lo = simd.low4(b)
                        hi = simd.shr4(b)
                        if has_qh(kind):
                            hv = simd.load32(qh, ((grp * nsb + sb) * 8 + v) * 32)
                            lo = simd.or_(lo, simd.bit_to_16(hv, 2 * p))
                            hi = simd.or_(hi, simd.bit_to_16(hv, 2 * p + 1))
                        simd.store32(ws, ((sb * 8 + 2 * p) * 8 + v) * 32, lo)
                        simd.store32(ws, ((sb * 8 + 2 * p + 1) * 8 + v) * 32, hi)
        for t in range(T):
            acc = simd.zerof()
            mo = simd.zerof()
            for sb in range(nsb):
                so = (grp * nsb + sb) * 128
                isum = simd.zero32()
                if is_q6_k(kind):
                    for j in range(16):
                        o = ((grp * nsb + sb) * 64 + j * 4) * 32
                        if T == 1:
                            simd.prefetch(qs, o + PREFETCH)
                            simd.prefetch(qs, o + 64 + PREFETCH)
                        xo = t * K + sb * 256 + j * 16
                        dot = dot4(isa, simd.load32(qs, o), simd.load32(qs, o + 32), simd.load32(qs, o + 64),
                                   simd.load32(qs, o + 96), simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4),
                                   simd.bcast4(xq, xo + 8), simd.bcast4(xq, xo + 12))
                        dot = simd.sub32(dot, simd.splat32(32 * simd.ld(xb16, t * nsb * 16 + sb * 16 + j)))
                        isum = simd.add32(isum, simd.mul32(dot, simd.widen8s(sc, so + j * 8)))
                else:
                    msum = simd.zero32()
                    for j in range(8):
                        o = (sb * 8 + j) * 256
                        xo = t * K + sb * 256 + j * 32
                        dot = dot8(isa, simd.load32(ws, o), simd.load32(ws, o + 32), simd.load32(ws, o + 64),
                                   simd.load32(ws, o + 96), simd.load32(ws, o + 128), simd.load32(ws, o + 160),
                                   simd.load32(ws, o + 192), simd.load32(ws, o + 224),
                                   simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4), simd.bcast4(xq, xo + 8),
                                   simd.bcast4(xq, xo + 12), simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20),
                                   simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28))
                        isum = simd.add32(isum, simd.mul32(dot, simd.widen8(sc, so + j * 8)))
                        msum = simd.add32(msum, simd.mul32(simd.widen8(sc, so + 64 + j * 8),
                                                           simd.splat32(simd.ld(xb, t * nsb * 8 + sb * 8 + j))))
                    mo = simd.fma8(simd.cvt8(msum), simd.mul8(simd.loadf8(m, (grp * nsb + sb) * 8),
                                                              simd.splatf(simd.ld(xd, t * nsb + sb))), mo)
                acc = simd.fma8(simd.cvt8(isum), simd.mul8(simd.loadf8(d, (grp * nsb + sb) * 8),
                                                           simd.splatf(simd.ld(xd, t * nsb + sb))), acc)
            store8(out, t, grp * 8, N, simd.sub8(acc, mo) if has_min(kind) else acc, res)


overload(rows_kx8)(by_path(_kx8_portable, _kx8_simd))

"""Interleaved Q4_K, Q5_K, Q6_K (layout._k8): eight rows per vector.

One file over 450 lines: the family's implementations (portable, avx2, vnni, aarch64) compute the same
integers in the same order and change together; the next split moves the avx2 kernel (_q45_avx2, _q6_avx2,
_kx8_avx2) into a module of its own."""

import numpy as np
from numba import njit
from numba.extending import overload

from ... import kinds
from .. import simd
from ..simd import VNNI_PATHS, path_of
from .common import EXACT, PREFETCH, SDOT_PATHS, X8_TOKENS, by_path, i8, dot8

has_qh = kinds.predicate("has_qh", within="kx8")    # Q5_K
has_min = kinds.predicate("has_min", within="kx8")  # Q4_K, Q5_K: packed nibbles and a min; Q6_K: neither
is_q6_k = kinds.predicate("ggml:Q6_K", within="kx8")  # Q6_K: unsigned bytes, no min

# -- interleaved Q4_K/Q5_K/Q6_K (layout._k8): eight rows per vector ----------------------------------
#
# As for the legacy types, each vector holds four elements of eight rows; the sub-block scales are
# applied in the integer domain to eight rows at once, the mins from the activation's sums per 32, and one
# float FMA per 256 elements per eight rows:
#   Q4_K/Q5_K  acc = fma(float(sum_j sc_j dot_j), d d_x, acc), mo = fma(float(sum_j min_j xsum_j), dmin d_x, mo)
#   Q6_K       acc = fma(float(sum_j sc_j (dot_j - 32 xsum16_j)), d d_x, acc)   (q stored unsigned, 0..63)
# Four implementations compute the same integers and the same FMAs, so the same bits for every batch:
# _kx8_portable lane by lane; _kx8_avx2 (weights unpacked once into registers for a tile of tokens, scales
# on the vpmaddwd: see there); _kx8_simd on the vnni and aarch64 paths (vpdpbusd or sdot sums times the
# scales by vpmulld/mul, Q4_K and Q5_K weights unpacked once per row group into a byte scratch that every
# token reads; on aarch64 a decode step reads the packed weights directly, _kx8_arm); _kx8_mmla on i8mm
# (_kx8_simd with two tokens per smmla); _kx8_zmm on avx512 (_kx8_avx2's tile, two row groups per zmm vector,
# vpdpbusd sums times the scales by vpmulld, the mins by vpdpwssd).


def rows_kx8(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q4_K/Q5_K/Q6_K, every token."""


def dot4(isa, w0, w1, w2, w3, x0, x1, x2, x3):
    """sum_v u8x32 w_v . s8x32 x_v -> s32x8 (exact) for weights up to 63: vpdpbusd chain on vnni; on avx2
    vpmaddubsw pairs summed in 16 bits (at most 2 x 2 x 63 x 127 < 2**15), then vpmaddwd; sdot chain on
    dotprod and i8mm; 16-bit products summed over the four vectors, then widened, on neon."""


@overload(dot4, inline="always")
def _dot4(isa, w0, w1, w2, w3, x0, x1, x2, x3):
    if path_of(isa) in SDOT_PATHS:
        def impl(isa, w0, w1, w2, w3, x0, x1, x2, x3):
            return simd.sdot(simd.sdot(simd.sdot(simd.sdot(simd.zero32(), w0, x0), w1, x1), w2, x2), w3, x3)
        return impl
    if path_of(isa) == "neon":  # four products per 16-bit lane: at most 4 x 63 x 127 = 32004 < 2**15
        def impl(isa, w0, w1, w2, w3, x0, x1, x2, x3):
            return simd.sum4x16(simd.zero32(), simd.add16x32(simd.add16x32(simd.mull16(w0, x0), simd.mull16(w1, x1)),
                                                             simd.add16x32(simd.mull16(w2, x2), simd.mull16(w3, x3))))
        return impl
    if path_of(isa) in VNNI_PATHS:
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


@njit(inline="always", cache=True)
def _unpack45(five, qs, qh, ws, grp, nsb):
    # row group grp's Q4_K/Q5_K weights as bytes into ws: sub-block j's vector v at ((sb * 8 + j) * 8 + v) * 32
    for sb in range(nsb):
        for p in range(4):
            for v in range(8):
                o = (((grp * nsb + sb) * 4 + p) * 8 + v) * 32
                simd.prefetch(qs, o + PREFETCH)
                b = simd.load32(qs, o)
                lo = simd.low4(b)
                hi = simd.shr4(b)
                if five:
                    hv = simd.load32(qh, ((grp * nsb + sb) * 8 + v) * 32)
                    lo = simd.or_(lo, simd.bit_to_16(hv, 2 * p))
                    hi = simd.or_(hi, simd.bit_to_16(hv, 2 * p + 1))
                simd.store32(ws, ((sb * 8 + 2 * p) * 8 + v) * 32, lo)
                simd.store32(ws, ((sb * 8 + 2 * p + 1) * 8 + v) * 32, hi)


@njit(cache=True, fastmath=EXACT)
def _kx8_simd(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    T, K = xq.shape
    N = out.shape[1]
    nsb = K // 256
    ws = np.empty(8 * K if has_min(kind) else 0, np.uint8)  # a row group's Q4_K/Q5_K weights as bytes
    for grp in range(n0 // 8, (n1 + 7) // 8):
        if has_min(kind):
            _unpack45(has_qh(kind), qs, qh, ws, grp, nsb)
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
            simd.storef8_first(out, t * N + grp * 8, simd.sub8(acc, mo) if has_min(kind) else acc, N - grp * 8)


@njit(inline="always", cache=True)
def _q45w(five, half, b, h, j):
    # sub-block j's weights from its pair's vector b: the low (half 0) or high (half 1) nibbles, with Q5_K's
    # fifth bit (bit j of the qh vector h). Helpers in the loops take vectors, never arrays (int8/__init__).
    q = simd.shr4(b) if half else simd.low4(b)
    return simd.or_(q, simd.bit_to_16(h, j)) if five else q


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
    for grp in range(n0 // 8, (n1 + 7) // 8):
        for t0 in range(0, T, X8_TOKENS):
            t1 = min(T, t0 + X8_TOKENS)
            acc[:] = 0
            mos[:] = 0
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
            for t in range(t0, t1):
                i = (t - t0) * 8
                simd.storef8_first(out, t * N + grp * 8, simd.sub8(simd.loadf8(acc, i), simd.loadf8(mos, i)), N - grp * 8)


@njit(inline="always", cache=True)
def _q6_avx2(qs, sc, d, xq, xd, xb16, out, n0, n1, acc, isums):
    # Q6_K (weights stored as unsigned q + 32, 0..63), as _kx8_avx2 describes
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
                    o = (g * 64 + j * 4) * 32
                    simd.prefetch(qs, o + PREFETCH)
                    simd.prefetch(qs, o + 64 + PREFETCH)
                    xo = sb * 256 + j * 16
                    a = simd.add16(simd.maddubs(simd.load32(qs, o), simd.bcast4(xq, xo)),
                                   simd.maddubs(simd.load32(qs, o + 32), simd.bcast4(xq, xo + 4)))
                    b = simd.add16(simd.maddubs(simd.load32(qs, o + 64), simd.bcast4(xq, xo + 8)),
                                   simd.maddubs(simd.load32(qs, o + 96), simd.bcast4(xq, xo + 12)))
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
    for grp in range(n0 // 8, (n1 + 7) // 8):
        for t0 in range(0, T, X8_TOKENS):
            t1 = min(T, t0 + X8_TOKENS)
            acc[:] = 0
            for sb in range(nsb):
                g = grp * nsb + sb
                isums[: (t1 - t0) * 8] = 0
                for j in range(16):
                    o = (g * 64 + j * 4) * 32
                    if t0 == 0:
                        simd.prefetch(qs, o + PREFETCH)
                        simd.prefetch(qs, o + 64 + PREFETCH)
                    w0 = simd.load32(qs, o)
                    w1 = simd.load32(qs, o + 32)
                    w2 = simd.load32(qs, o + 64)
                    w3 = simd.load32(qs, o + 96)
                    s16 = simd.scales16s(sc, g * 128 + j * 8)
                    for t in range(t0, t1):
                        xo = t * K + sb * 256 + j * 16
                        a = simd.add16(simd.maddubs(w0, simd.bcast4(xq, xo)), simd.maddubs(w1, simd.bcast4(xq, xo + 4)))
                        b = simd.add16(simd.maddubs(w2, simd.bcast4(xq, xo + 8)), simd.maddubs(w3, simd.bcast4(xq, xo + 12)))
                        i = (t - t0) * 8
                        simd.store8i(isums, i, simd.add32(simd.load8i(isums, i), simd.add32(simd.madd(a, s16), simd.madd(b, s16))))
                dv = simd.loadf8(d, g * 8)
                for t in range(t0, t1):
                    # - 32 sum_j sc_j xb16_j: the weights are stored as q + 32
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
            for t in range(t0, t1):
                simd.storef8_first(out, t * N + grp * 8, simd.loadf8(acc, (t - t0) * 8), N - grp * 8)


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


@njit(inline="always", cache=True)
def _q45_decode(isa, five, qs, qh, sc, d, m, xq, xd, xb, out, n0, n1):
    # one token of Q4_K (five False) or Q5_K (True) straight from the packed nibbles, with _kx8_simd's
    # integers and FMAs (the same bits): each pair's eight vectors are unpacked in registers into the two
    # sub-blocks' weights, where _kx8_simd writes them to its byte scratch first for a batch to reuse
    K = xq.shape[1]
    N = out.shape[1]
    nsb = K // 256
    for grp in range(n0 // 8, (n1 + 7) // 8):
        acc = simd.zerof()
        mo = simd.zerof()
        for sb in range(nsb):
            g = grp * nsb + sb
            isum = simd.zero32()
            msum = simd.zero32()
            for p in range(4):
                o = (g * 4 + p) * 256
                ho = g * 256 if five else o
                hq = qh if five else qs
                simd.prefetch256(qs, o + PREFETCH)
                for half in range(2):
                    j = 2 * p + half
                    xo = sb * 256 + j * 32
                    dot = dot8(isa, _q45w(five, half, simd.load32(qs, o), simd.load32(hq, ho), j),
                               _q45w(five, half, simd.load32(qs, o + 32), simd.load32(hq, ho + 32), j),
                               _q45w(five, half, simd.load32(qs, o + 64), simd.load32(hq, ho + 64), j),
                               _q45w(five, half, simd.load32(qs, o + 96), simd.load32(hq, ho + 96), j),
                               _q45w(five, half, simd.load32(qs, o + 128), simd.load32(hq, ho + 128), j),
                               _q45w(five, half, simd.load32(qs, o + 160), simd.load32(hq, ho + 160), j),
                               _q45w(five, half, simd.load32(qs, o + 192), simd.load32(hq, ho + 192), j),
                               _q45w(five, half, simd.load32(qs, o + 224), simd.load32(hq, ho + 224), j),
                               simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4), simd.bcast4(xq, xo + 8),
                               simd.bcast4(xq, xo + 12), simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20),
                               simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28))
                    isum = simd.add32(isum, simd.mul32(dot, simd.widen8(sc, g * 128 + j * 8)))
                    msum = simd.add32(msum, simd.mul32(simd.widen8(sc, g * 128 + 64 + j * 8),
                                                       simd.splat32(simd.ld(xb, sb * 8 + j))))
            dx = simd.splatf(simd.ld(xd, sb))
            mo = simd.fma8(simd.cvt8(msum), simd.mul8(simd.loadf8(m, g * 8), dx), mo)
            acc = simd.fma8(simd.cvt8(isum), simd.mul8(simd.loadf8(d, g * 8), dx), acc)
        simd.storef8_first(out, grp * 8, simd.sub8(acc, mo), N - grp * 8)


@njit(cache=True, fastmath=EXACT)
def _kx8_arm(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    # the aarch64 paths: _kx8_simd (sdot chains on dotprod, widening products on neon), but a Q4_K/Q5_K
    # decode step reads the packed weights directly (_q45_decode)
    if xq.shape[0] == 1 and has_min(kind):
        if has_qh(kind):
            _q45_decode(isa, True, qs, qh, sc, d, m, xq, xd, xb, out, n0, n1)
        else:
            _q45_decode(isa, False, qs, qh, sc, d, m, xq, xd, xb, out, n0, n1)
        return
    _kx8_simd(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1)


@njit(cache=True, fastmath=EXACT)
def _kx8_mmla(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    # the i8mm path: one token as _kx8_arm (sdot); a batch two tokens at a time, each sub-block's weight
    # vectors (Q4_K/Q5_K: from the byte scratch) against both tokens in smmla (simd.mmla8, Q6_K's 16-element
    # groups simd.mmla4), then _kx8_simd's integer scales and float FMAs for each token: the same bits
    T, K = xq.shape
    if T == 1:
        _kx8_arm(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1)
        return
    N = out.shape[1]
    nsb = K // 256
    ws = np.empty(8 * K if has_min(kind) else 0, np.uint8)
    for grp in range(n0 // 8, (n1 + 7) // 8):
        if has_min(kind):
            _unpack45(has_qh(kind), qs, qh, ws, grp, nsb)
        for t in range(0, T, 2):
            u = min(t + 1, T - 1)  # the pair's second token (t itself when t is the last)
            acc_a = simd.zerof()
            acc_b = simd.zerof()
            mo_a = simd.zerof()
            mo_b = simd.zerof()
            for sb in range(nsb):
                so = (grp * nsb + sb) * 128
                ia = simd.zero32()
                ib = simd.zero32()
                if is_q6_k(kind):
                    for j in range(16):
                        o = ((grp * nsb + sb) * 64 + j * 4) * 32
                        s2 = simd.mmla4(simd.load32(qs, o), simd.load32(qs, o + 32), simd.load32(qs, o + 64),
                                        simd.load32(qs, o + 96), xq, t * K + sb * 256 + j * 16, u * K + sb * 256 + j * 16)
                        scale = simd.widen8s(sc, so + j * 8)
                        da = simd.sub32(simd.token_a(s2), simd.splat32(32 * simd.ld(xb16, t * nsb * 16 + sb * 16 + j)))
                        db = simd.sub32(simd.token_b(s2), simd.splat32(32 * simd.ld(xb16, u * nsb * 16 + sb * 16 + j)))
                        ia = simd.add32(ia, simd.mul32(da, scale))
                        ib = simd.add32(ib, simd.mul32(db, scale))
                else:
                    ma = simd.zero32()
                    mb = simd.zero32()
                    for j in range(8):
                        o = (sb * 8 + j) * 256
                        s2 = simd.mmla8(simd.load32(ws, o), simd.load32(ws, o + 32), simd.load32(ws, o + 64),
                                        simd.load32(ws, o + 96), simd.load32(ws, o + 128), simd.load32(ws, o + 160),
                                        simd.load32(ws, o + 192), simd.load32(ws, o + 224),
                                        xq, t * K + sb * 256 + j * 32, u * K + sb * 256 + j * 32)
                        scale = simd.widen8(sc, so + j * 8)
                        ia = simd.add32(ia, simd.mul32(simd.token_a(s2), scale))
                        ib = simd.add32(ib, simd.mul32(simd.token_b(s2), scale))
                        mins = simd.widen8(sc, so + 64 + j * 8)
                        ma = simd.add32(ma, simd.mul32(mins, simd.splat32(simd.ld(xb, t * nsb * 8 + sb * 8 + j))))
                        mb = simd.add32(mb, simd.mul32(mins, simd.splat32(simd.ld(xb, u * nsb * 8 + sb * 8 + j))))
                    dm = simd.loadf8(m, (grp * nsb + sb) * 8)
                    mo_a = simd.fma8(simd.cvt8(ma), simd.mul8(dm, simd.splatf(simd.ld(xd, t * nsb + sb))), mo_a)
                    mo_b = simd.fma8(simd.cvt8(mb), simd.mul8(dm, simd.splatf(simd.ld(xd, u * nsb + sb))), mo_b)
                dd = simd.loadf8(d, (grp * nsb + sb) * 8)
                acc_a = simd.fma8(simd.cvt8(ia), simd.mul8(dd, simd.splatf(simd.ld(xd, t * nsb + sb))), acc_a)
                acc_b = simd.fma8(simd.cvt8(ib), simd.mul8(dd, simd.splatf(simd.ld(xd, u * nsb + sb))), acc_b)
            simd.storef8_first(out, t * N + grp * 8, simd.sub8(acc_a, mo_a) if has_min(kind) else acc_a, N - grp * 8)
            if u > t:
                simd.storef8_first(out, u * N + grp * 8, simd.sub8(acc_b, mo_b) if has_min(kind) else acc_b, N - grp * 8)


@njit(inline="always", cache=True)
def _pack_pairs(xs):
    # (T, M) int32 sums (each within 16 bits) -> (T * M / 2) int32: sums 2i and 2i + 1 as the low and high
    # 16 bits of word i, the activation-side operand of simd.dpwssdw
    T, M = xs.shape
    out = np.empty(T * (M // 2), np.int32)
    for t in range(T):
        for i in range(M // 2):
            out[t * (M // 2) + i] = (xs[t, 2 * i] & 0xFFFF) | (xs[t, 2 * i + 1] << 16)
    return out


@njit(inline="always", cache=True)
def _w45(five, half, qs, qh, o, p, ho, hp, j):
    # one wide vector of sub-block j's weights: groups g (offset o, qh ho) and g + 1 (p, hp)
    b = simd.load32x2(qs, o, p)
    q = simd.shr4w(b) if half else simd.low4w(b)
    return simd.or_w(q, simd.bit_to_16w(simd.load32x2(qh, ho, hp), j)) if five else q


@njit(inline="always", cache=True)
def _dot8w(w0, w1, w2, w3, w4, w5, w6, w7, xq, xo):
    # sixteen rows' sums of a 32-element sub-block against the activation bytes xq[xo:xo + 32]: one vpdpbusd chain
    a = simd.dpbusdw(simd.dpbusdw(simd.dpbusdw(simd.dpbusdw(
        simd.zero32w(), w0, simd.bcast4w(xq, xo)), w1, simd.bcast4w(xq, xo + 4)),
        w2, simd.bcast4w(xq, xo + 8)), w3, simd.bcast4w(xq, xo + 12))
    return simd.dpbusdw(simd.dpbusdw(simd.dpbusdw(simd.dpbusdw(
        a, w4, simd.bcast4w(xq, xo + 16)), w5, simd.bcast4w(xq, xo + 20)),
        w6, simd.bcast4w(xq, xo + 24)), w7, simd.bcast4w(xq, xo + 28))


@njit(cache=True, fastmath=EXACT)
def _kx8_zmm(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    # The avx512 path: two row groups (16 rows) per zmm vector (simd/wide.py) and _kx8_avx2's tile: a
    # sub-block's weight vectors unpacked once into registers for up to X8_TOKENS tokens, each token's
    # vpdpbusd sums times the sub-block scales (vpmulld) added into a scratch of integer sums (`isums`).
    # The mins (Q6_K: the -32 offset) come once per super-block and token from one vpdpwssd per two
    # sub-blocks: the rows' scales as 16-bit pairs against the activations' block sums packed in pairs
    # (_pack_pairs). The integers are _kx8_simd's and the FMAs the same in the same order: the same bits.
    T, K = xq.shape
    N = out.shape[1]
    nsb = K // 256
    q6 = is_q6_k(kind)
    five = has_qh(kind)
    tile = min(T, X8_TOKENS)
    acc = np.empty(tile * 16, np.float32)
    mos = np.empty(tile * 16, np.float32)
    isums = np.empty(tile * 16, np.int32)
    xp = _pack_pairs(xb16 if q6 else xb)
    npair = nsb * 8 if q6 else nsb * 4  # pairs per token
    g1 = (n1 + 7) // 8
    for grp in range(n0 // 8, g1, 2):
        grp2 = min(grp + 1, g1 - 1)  # a task's odd last group fills both halves (the upper one not stored)
        rows = min(N - grp * 8, 16 if grp2 > grp else 8)
        for t0 in range(0, T, X8_TOKENS):
            t1 = min(T, t0 + X8_TOKENS)
            acc[: (t1 - t0) * 16] = 0
            mos[: (t1 - t0) * 16] = 0
            for sb in range(nsb):
                g = grp * nsb + sb
                h = grp2 * nsb + sb
                isums[: (t1 - t0) * 16] = 0
                if q6:
                    for j in range(16):
                        o = (g * 64 + j * 4) * 32
                        p = (h * 64 + j * 4) * 32
                        if t0 == 0:
                            simd.prefetch(qs, o + PREFETCH)
                            simd.prefetch(qs, o + 64 + PREFETCH)
                            simd.prefetch(qs, p + PREFETCH)
                            simd.prefetch(qs, p + 64 + PREFETCH)
                        w0, w1 = simd.load32x2(qs, o, p), simd.load32x2(qs, o + 32, p + 32)
                        w2, w3 = simd.load32x2(qs, o + 64, p + 64), simd.load32x2(qs, o + 96, p + 96)
                        s = simd.widen8x2s(sc, g * 128 + j * 8, h * 128 + j * 8)
                        for t in range(t0, t1):
                            xo = t * K + sb * 256 + j * 16
                            dot = simd.dpbusdw(simd.dpbusdw(simd.dpbusdw(simd.dpbusdw(
                                simd.zero32w(), w0, simd.bcast4w(xq, xo)), w1, simd.bcast4w(xq, xo + 4)),
                                w2, simd.bcast4w(xq, xo + 8)), w3, simd.bcast4w(xq, xo + 12))
                            i = (t - t0) * 16
                            simd.store16i(isums, i, simd.add32w(simd.load16i(isums, i), simd.mul32w(dot, s)))
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
                            s = simd.widen8x2(sc, g * 128 + j * 8, h * 128 + j * 8)
                            for t in range(t0, t1):
                                i = (t - t0) * 16
                                dot = _dot8w(w0, w1, w2, w3, w4, w5, w6, w7, xq, t * K + sb * 256 + j * 32)
                                simd.store16i(isums, i, simd.add32w(simd.load16i(isums, i), simd.mul32w(dot, s)))
                # the super-block's float step per token: Q6_K's offset or Q4_K/Q5_K's mins from the block sums
                base = g * 128 if q6 else g * 128 + 64
                hbase = h * 128 if q6 else h * 128 + 64
                c0, c1 = simd.pairs16x2s(sc, base, hbase) if q6 else simd.pairs16x2(sc, base, hbase), \
                    simd.pairs16x2s(sc, base + 16, hbase + 16) if q6 else simd.pairs16x2(sc, base + 16, hbase + 16)
                c2, c3 = simd.pairs16x2s(sc, base + 32, hbase + 32) if q6 else simd.pairs16x2(sc, base + 32, hbase + 32), \
                    simd.pairs16x2s(sc, base + 48, hbase + 48) if q6 else simd.pairs16x2(sc, base + 48, hbase + 48)
                dv = simd.loadf8x2(d, g * 8, h * 8)
                mv = simd.loadf8x2(m, g * 8, h * 8) if has_min(kind) else dv
                for t in range(t0, t1):
                    i = (t - t0) * 16
                    x0 = t * npair + sb * (8 if q6 else 4)
                    c = simd.dpwssdw(simd.dpwssdw(simd.dpwssdw(simd.dpwssdw(
                        simd.zero32w(), c0, simd.splat32w(simd.ld(xp, x0))), c1, simd.splat32w(simd.ld(xp, x0 + 1))),
                        c2, simd.splat32w(simd.ld(xp, x0 + 2))), c3, simd.splat32w(simd.ld(xp, x0 + 3)))
                    dx = simd.splatf16(simd.ld(xd, t * nsb + sb))
                    isum = simd.load16i(isums, i)
                    if q6:
                        c = simd.dpwssdw(simd.dpwssdw(simd.dpwssdw(simd.dpwssdw(
                            c, simd.pairs16x2s(sc, base + 64, hbase + 64), simd.splat32w(simd.ld(xp, x0 + 4))),
                            simd.pairs16x2s(sc, base + 80, hbase + 80), simd.splat32w(simd.ld(xp, x0 + 5))),
                            simd.pairs16x2s(sc, base + 96, hbase + 96), simd.splat32w(simd.ld(xp, x0 + 6))),
                            simd.pairs16x2s(sc, base + 112, hbase + 112), simd.splat32w(simd.ld(xp, x0 + 7)))
                        isum = simd.sub32w(isum, simd.shl32w(c, 5))  # the weights are stored as q + 32
                    else:
                        simd.storef16(mos, i, simd.fma16(simd.cvt16(c), simd.mul16(mv, dx), simd.loadf16(mos, i)))
                    simd.storef16(acc, i, simd.fma16(simd.cvt16(isum), simd.mul16(dv, dx), simd.loadf16(acc, i)))
            for t in range(t0, t1):
                i = (t - t0) * 16
                v = simd.sub16(simd.loadf16(acc, i), simd.loadf16(mos, i)) if has_min(kind) else simd.loadf16(acc, i)
                simd.storef16_first(out, t * N + grp * 8, v, rows)


# vnni keeps _kx8_simd's vpdpbusd chains: the avx2 kernel runs there too, but which is faster on an
# AVX-512 VNNI host has not been measured. The aarch64 paths run _kx8_arm (sdot, or neon's widening
# products), i8mm its two-token twin for batches.
overload(rows_kx8)(by_path(_kx8_portable, _kx8_simd, avx2=_kx8_avx2, avx512=_kx8_zmm, neon=_kx8_arm, dotprod=_kx8_arm,
                           i8mm=_kx8_mmla))

"""The Q4_K/Q5_K/Q6_K kernels of the vnni and aarch64 paths (kx8.py): _kx8_simd (vpdpbusd or sdot sums
times the scales, Q4_K/Q5_K weights unpacked once per row group into a byte scratch), _kx8_arm (a decode
step straight from the packed nibbles), _kx8_mmla (two tokens per smmla on i8mm); and what the other
kx8 modules share: the kind predicates, dot4 and the nibble unpacking _q45w."""

import numpy as np
from numba import njit
from numba.extending import overload

from ... import kinds
from .. import simd
from ..simd import VNNI_PATHS, path_of
from .common import EXACT, PREFETCH, SDOT_PATHS, dot8

has_qh = kinds.predicate("has_qh", within="kx8")    # Q5_K
has_min = kinds.predicate("has_min", within="kx8")  # Q4_K, Q5_K: packed nibbles and a min; Q6_K: neither
is_q6_k = kinds.predicate("ggml:Q6_K", within="kx8")  # Q6_K: six bits a weight (q6w), no min


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


Q6_SUB = 96  # bytes of one Q6_K sub-block of 16 of a row group: two nibble vectors, one of high bits


@njit(inline="always", cache=True)
def q6w(n0, n1, h):
    # a Q6_K sub-block's four weight vectors (unsigned q, 0..63) from its three packed ones (formats/q6_k.py):
    # the low and high nibbles of n0 and of n1, each with its two high bits from h
    return (simd.or_(simd.low4(n0), simd.bits2_to_48(h, 0)), simd.or_(simd.shr4(n0), simd.bits2_to_48(h, 2)),
            simd.or_(simd.low4(n1), simd.bits2_to_48(h, 4)), simd.or_(simd.shr4(n1), simd.bits2_to_48(h, 6)))


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
                        o = ((grp * nsb + sb) * 16 + j) * Q6_SUB
                        if T == 1:
                            simd.prefetch(qs, o + PREFETCH)
                            simd.prefetch(qs, o + 64 + PREFETCH)
                        xo = t * K + sb * 256 + j * 16
                        w0, w1, w2, w3 = q6w(simd.load32(qs, o), simd.load32(qs, o + 32), simd.load32(qs, o + 64))
                        dot = dot4(isa, w0, w1, w2, w3, simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4),
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
                        o = ((grp * nsb + sb) * 16 + j) * Q6_SUB
                        w0, w1, w2, w3 = q6w(simd.load32(qs, o), simd.load32(qs, o + 32), simd.load32(qs, o + 64))
                        s2 = simd.mmla4(w0, w1, w2, w3, xq, t * K + sb * 256 + j * 16, u * K + sb * 256 + j * 16)
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

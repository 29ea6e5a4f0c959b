"""Q3_K and Q2_K in their own packing: two bits per value (Q3_K a third, its hmask bit), 16-element
sub-blocks, against the Q8_K activation.

Per 256-element super-block and row, the integers and float steps every implementation computes:

    Q3_K  isum = sum_j sc_j (dot_j - 4 xsum16_j)        acc = fma(float(isum), d d_x, acc)
    Q2_K  isum = sum_j (sc_j & 15) dot_j                acc = fma(float(isum), d d_x, acc)
          msum = sum_j (sc_j >> 4) xsum16_j             mo  = fma(float(msum), dmin d_x, mo);  out = acc - mo

with dot_j the sub-block's sum of u x over its 16 elements (u: Q3_K's low | hmask << 2, 0..7, the value
u - 4; Q2_K's 0..3) and xsum16_j the activation's sum over the same 16 (Q8_K's bsums). The integers are
exact, so every path and every batch gives each output the same bits.

- rows_k23: the row-major kinds (quant/repack.py: the file's qs and hmask bytes; the portable path), one
  row and one token at a time.
- rows_k23x8: the interleaved kinds (layout._k23: a 32-byte plane of two-bit values per sub-block of
  eight rows, Q3_K's hmask bits a plane per two sub-blocks). _k23x8_portable lane by lane; _k23x8_simd on
  every SIMD path but avx512: for a tile of up to X8_TOKENS tokens each pair of sub-blocks is unpacked once into
  eight weight vectors in registers ((plane >> 2v) & 3, Q3_K's bit or-ed in at bit 2) and multiplied
  against every token of the tile, the tokens' integer sums in a small scratch. The dot products are the
  path's (dot4: vpdpbusd on vnni, sdot on dotprod/i8mm, widening products on neon); on avx2 the
  four vpmaddubsw of a sub-block add in 16 bits (at most 8 x 7 x 128 = 7168) and the scales ride on the
  vpmaddwd that widens them (scales16), as kx8's avx2 kernel does. The offset (Q3_K) and mins (Q2_K) come
  once per super-block and token from the block sums. _k23x8_zmm on avx512: the same tile with two row
  groups per zmm vector (simd/vec.py), the offset and mins by one vpdpwssd per two sub-blocks.
"""

import numpy as np
from numba import njit
from numba.extending import overload

from ... import kinds
from .. import simd
from ..simd import path_of
from .common import EXACT, PREFETCH, X8_TOKENS, by_path, i8, pack_pairs, row_tiles8, row_tiles16
from .kx8_simd import dot4

is_q3 = kinds.predicate("ggml:Q3_K", within="k23")
is_q3x8 = kinds.predicate("ggml:Q3_K", within="k23x8")


@njit(inline="always", cache=True)
def _value(x8, q3, qs, qh, n, sb, j, l):
    # the unsigned value u of element 16 j + l of super-block sb of row n: interleaved (x8, layout._k23) or
    # row-major (element 32 i + c of a super-block takes its bits from qs byte 32 (i // 4) + c at shift
    # 2 (i % 4), Q3_K's third from hmask byte c, bit i)
    if x8:
        grp, r, v, e = n // 8, n % 8, l // 4, l % 4
        u = np.int32((qs[grp, ((sb * 16 + j) * 8 + r) * 4 + e] >> (2 * v)) & 3)
        if q3:
            u |= np.int32((qh[grp, ((sb * 8 + j // 2) * 8 + r) * 4 + e] >> (4 * (j % 2) + v)) & 1) << 2
        return u
    i, c = j // 2, 16 * (j % 2) + l
    u = np.int32((qs[n, sb * 64 + (i // 4) * 32 + c] >> (2 * (i % 4))) & 3)
    if q3:
        u |= np.int32((qh[n, sb * 32 + c] >> i) & 1) << 2
    return u


@njit(inline="always", cache=True)
def _rows_portable(x8, q3, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1):
    # one row and one token at a time, the arithmetic of the module docstring (the SIMD path's lane by lane)
    T, K = xq.shape
    for n in range(n0, n1):
        row, r = (n // 8, n % 8) if x8 else (n, 0)
        for t in range(T):
            acc = np.float32(0.0)
            mo = np.float32(0.0)
            for sb in range(K // 256):
                isum = np.int32(0)
                msum = np.int32(0)
                for j in range(16):
                    dot = np.int32(0)
                    for l in range(16):
                        dot += _value(x8, q3, qs, qh, n, sb, j, l) * i8(xq[t, sb * 256 + 16 * j + l])
                    s = np.int32(sc[row, (sb * 16 + j) * 8 + r if x8 else sb * 16 + j])
                    if q3:
                        isum += ((s ^ 128) - 128) * (dot - 4 * xb16[t, sb * 16 + j])
                    else:
                        isum += (s & 15) * dot
                        msum += (s >> 4) * xb16[t, sb * 16 + j]
                dx = xd[t, sb]
                col = sb * 8 + r if x8 else sb
                acc = simd.fma1(np.float32(isum), luts[0, d[row, col]] * dx, acc)
                if not q3:
                    mo = simd.fma1(np.float32(msum), luts[0, m[row, col]] * dx, mo)
            out[t, n] = acc if q3 else acc - mo


@njit(cache=True, fastmath=EXACT)
def rows_k23(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1):
    if is_q3(kind):
        _rows_portable(False, True, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1)
    else:
        _rows_portable(False, False, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1)


def rows_k23x8(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q3_K/Q2_K, every token."""


@njit(cache=True, fastmath=EXACT)
def _k23x8_portable(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1):
    if is_q3x8(kind):
        _rows_portable(True, True, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1)
    else:
        _rows_portable(True, False, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1)


# -- the path's pieces: the scale operand, a scaled sub-block dot product, the block-sum term -------------


def wscale(isa, q3, sc, o):
    """The eight rows' sub-block scales at sc[o:o + 8] as the operand of sdot16: avx2 s16x16 (each in both
    halves of its lane, for vpmaddwd), the other paths s32x8; Q2_K's the low nibbles."""


@njit(inline="always", cache=True)
def _scale16(q3, sc, o):
    return simd.scales16s(sc, o) if q3 else simd.low4_16(simd.scales16(sc, o))


@njit(inline="always", cache=True)
def _scale32(q3, sc, o):
    return simd.widen8s(sc, o) if q3 else simd.low4_32(simd.widen8(sc, o))


@njit(inline="always", cache=True)
def _bsum16(q3, sc, o, xb16, xo):
    c = simd.zero32()
    for jp in range(8):
        w = simd.pairs16s(sc, o + jp * 16) if q3 else simd.high4_16(simd.pairs16(sc, o + jp * 16))
        c = simd.add32(c, simd.madd(w, simd.splat_pair16(simd.ld(xb16, xo + 2 * jp), simd.ld(xb16, xo + 2 * jp + 1))))
    return c


@njit(inline="always", cache=True)
def _bsum32(q3, sc, o, xb16, xo):
    c = simd.zero32()
    for j in range(16):
        w = simd.widen8s(sc, o + j * 8) if q3 else simd.high4_32(simd.widen8(sc, o + j * 8))
        c = simd.add32(c, simd.mul32(w, simd.splat32(simd.ld(xb16, xo + j))))
    return c


@overload(wscale)
def _wscale(isa, q3, sc, o):
    if path_of(isa) == "avx2":
        return lambda isa, q3, sc, o: _scale16(q3, sc, o)
    return lambda isa, q3, sc, o: _scale32(q3, sc, o)


def sdot16(isa, w0, w1, w2, w3, x0, x1, x2, x3, s):
    """sum_v w_v . x_v times the rows' scales s (wscale) -> s32x8, for weights up to 7: on avx2 four
    vpmaddubsw summed in 16 bits, then one vpmaddwd with the scales; elsewhere dot4 times s (vpmulld)."""


@overload(sdot16, inline="always")
def _sdot16(isa, w0, w1, w2, w3, x0, x1, x2, x3, s):
    if path_of(isa) == "avx2":
        def impl(isa, w0, w1, w2, w3, x0, x1, x2, x3, s):
            return simd.madd(simd.add16(simd.add16(simd.maddubs(w0, x0), simd.maddubs(w1, x1)),
                                        simd.add16(simd.maddubs(w2, x2), simd.maddubs(w3, x3))), s)
        return impl

    def impl(isa, w0, w1, w2, w3, x0, x1, x2, x3, s):
        return simd.mul32(dot4(isa, w0, w1, w2, w3, x0, x1, x2, x3), s)
    return impl


def bsum_term(isa, q3, sc, o, xb16, xo):
    """sum_j c_j xb16[xo + j] over a super-block's 16 sub-blocks for the eight rows (s32x8): c_j Q3_K's
    scale (sc[o + 8 j:], signed), Q2_K's min (the high nibble)."""


@overload(bsum_term)
def _bsum_term(isa, q3, sc, o, xb16, xo):
    if path_of(isa) == "avx2":  # one vpmaddwd per two sub-blocks
        return lambda isa, q3, sc, o, xb16, xo: _bsum16(q3, sc, o, xb16, xo)
    return lambda isa, q3, sc, o, xb16, xo: _bsum32(q3, sc, o, xb16, xo)


@njit(inline="always", cache=True)
def _w(q3, plane, hv, v, bit):
    # weight vector v of a sub-block: two bits of its plane, Q3_K's third from bit `bit` of the hmask plane
    lo = simd.bits2(plane, 2 * v)
    return simd.or_(lo, simd.bit_to_4(hv, bit)) if q3 else lo


@njit(inline="always", cache=True)
def _k23_tile(k, K, grp, grp2, t0, t1, acc, mos):
    # row group grp's super-blocks for tokens [t0, t1) (common.row_tiles8): each pair of sub-blocks unpacked
    # once for the tile's tokens; Q3_K (q3 True) or Q2_K, a constant where this is inlined
    isa, q3, qs, qh, sc, d, m, xq, xd, xb16, isums = k
    nsb = K // 256
    for sb in range(nsb):
        g = grp * nsb + sb
        isums[: (t1 - t0) * 8] = 0
        for p in range(8):
            o = (g * 16 + 2 * p) * 32  # the planes of sub-blocks 2p and 2p + 1
            ho = (g * 8 + p) * 32
            if t0 == 0:
                simd.prefetch(qs, o + PREFETCH)
                if q3 and p % 2 == 0:
                    simd.prefetch(qh, ho + PREFETCH // 2)
            la = simd.load32(qs, o)
            lb = simd.load32(qs, o + 32)
            hv = simd.load32(qh, ho) if q3 else la
            a0, a1, a2, a3 = _w(q3, la, hv, 0, 0), _w(q3, la, hv, 1, 1), _w(q3, la, hv, 2, 2), _w(q3, la, hv, 3, 3)
            b0, b1, b2, b3 = _w(q3, lb, hv, 0, 4), _w(q3, lb, hv, 1, 5), _w(q3, lb, hv, 2, 6), _w(q3, lb, hv, 3, 7)
            sa = wscale(isa, q3, sc, (g * 16 + 2 * p) * 8)
            sb2 = wscale(isa, q3, sc, (g * 16 + 2 * p + 1) * 8)
            for t in range(t0, t1):
                xo = t * K + sb * 256 + p * 32
                v = simd.add32(
                    sdot16(isa, a0, a1, a2, a3, simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4),
                           simd.bcast4(xq, xo + 8), simd.bcast4(xq, xo + 12), sa),
                    sdot16(isa, b0, b1, b2, b3, simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20),
                           simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28), sb2))
                i = (t - t0) * 8
                simd.store8i(isums, i, simd.add32(simd.load8i(isums, i), v))
        dv = simd.loadf8(d, g * 8)
        mv = dv if q3 else simd.loadf8(m, g * 8)
        for t in range(t0, t1):
            i = (t - t0) * 8
            c = bsum_term(isa, q3, sc, g * 128, xb16, t * nsb * 16 + sb * 16)
            dx = simd.splatf(simd.ld(xd, t * nsb + sb))
            isum = simd.load8i(isums, i)
            if q3:
                isum = simd.sub32(isum, simd.mul32(c, simd.splat32(4)))
            else:
                simd.storef8(mos, i, simd.fma8(simd.cvt8(c), simd.mul8(mv, dx), simd.loadf8(mos, i)))
            simd.storef8(acc, i, simd.fma8(simd.cvt8(isum), simd.mul8(dv, dx), simd.loadf8(acc, i)))


@njit(cache=True, fastmath=EXACT)
def _k23x8_simd(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1):
    T = xq.shape[0]
    tile = min(T, X8_TOKENS)
    acc = np.empty(tile * 8, np.float32)
    mos = np.empty(tile * 8, np.float32)
    isums = np.empty(tile * 8, np.int32)
    if is_q3x8(kind):
        row_tiles8(_k23_tile, (isa, True, qs, qh, sc, d, m, xq, xd, xb16, isums), 0, xq, out, n0, n1, acc, mos)
    else:
        row_tiles8(_k23_tile, (isa, False, qs, qh, sc, d, m, xq, xd, xb16, isums), -1, xq, out, n0, n1, acc, mos)


@njit(inline="always", cache=True)
def _ww(q3, plane, hv, v, bit):
    # _w on zmm: weight vector v of a sub-block of two row groups
    lo = simd.bits2(plane, 2 * v)
    return simd.or_(lo, simd.bit_to_4(hv, bit)) if q3 else lo


@njit(inline="always", cache=True)
def _dot4w(w0, w1, w2, w3, xq, xo):
    # sixteen rows' sums of a sub-block's four weight vectors against the activation bytes xq[xo:xo + 16]
    return simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(
        simd.zero32w(), w0, simd.bcast4w(xq, xo)), w1, simd.bcast4w(xq, xo + 4)),
        w2, simd.bcast4w(xq, xo + 8)), w3, simd.bcast4w(xq, xo + 12))


@njit(inline="always", cache=True)
def _k23_tile_w(k, K, grp, grp2, t0, t1, acc, mos):
    # _k23_tile with two row groups per zmm vector (simd/vec.py): group grp in the low half, grp2 in the high
    # (common.row_tiles16)
    q3, qs, qh, sc, d, m, xq, xd, xp, isums = k
    nsb = K // 256
    for sb in range(nsb):
        g = grp * nsb + sb
        h = grp2 * nsb + sb
        isums[: (t1 - t0) * 16] = 0
        for p in range(8):
            o, op = (g * 16 + 2 * p) * 32, (h * 16 + 2 * p) * 32
            ho, hp = (g * 8 + p) * 32, (h * 8 + p) * 32
            if t0 == 0:
                simd.prefetch(qs, o + PREFETCH)
                simd.prefetch(qs, op + PREFETCH)
                if q3 and p % 2 == 0:
                    simd.prefetch(qh, ho + PREFETCH // 2)
                    simd.prefetch(qh, hp + PREFETCH // 2)
            la = simd.load32(qs, o, op)
            lb = simd.load32(qs, o + 32, op + 32)
            hv = simd.load32(qh, ho, hp) if q3 else la
            a0, a1, a2, a3 = _ww(q3, la, hv, 0, 0), _ww(q3, la, hv, 1, 1), _ww(q3, la, hv, 2, 2), _ww(q3, la, hv, 3, 3)
            b0, b1, b2, b3 = _ww(q3, lb, hv, 0, 4), _ww(q3, lb, hv, 1, 5), _ww(q3, lb, hv, 2, 6), _ww(q3, lb, hv, 3, 7)
            so, sp = (g * 16 + 2 * p) * 8, (h * 16 + 2 * p) * 8
            if q3:
                sa, sb2 = simd.widen8s(sc, so, sp), simd.widen8s(sc, so + 8, sp + 8)
            else:
                sa, sb2 = simd.low4_16(simd.widen8(sc, so, sp)), simd.low4_16(simd.widen8(sc, so + 8, sp + 8))
            for t in range(t0, t1):
                xo = t * K + sb * 256 + p * 32
                v = simd.add32(simd.mul32(_dot4w(a0, a1, a2, a3, xq, xo), sa),
                                simd.mul32(_dot4w(b0, b1, b2, b3, xq, xo + 16), sb2))
                i = (t - t0) * 16
                simd.store8i(isums, i, simd.add32(simd.load16i(isums, i), v))
        # the super-block's float step per token, the offset (Q3_K) or the mins (Q2_K) from the block
        # sums: one vpdpwssd per two sub-blocks, the rows' scales or mins as 16-bit pairs
        dv = simd.loadf8(d, g * 8, h * 8)
        mv = dv if q3 else simd.loadf8(m, g * 8, h * 8)
        for t in range(t0, t1):
            i = (t - t0) * 16
            x0 = (t * nsb + sb) * 8
            c = simd.zero32w()
            for jp in range(8):
                if q3:
                    w = simd.pairs16s(sc, g * 128 + jp * 16, h * 128 + jp * 16)
                else:
                    w = simd.high4_16(simd.pairs16(sc, g * 128 + jp * 16, h * 128 + jp * 16))
                c = simd.dpwssd(c, w, simd.splat32w(simd.ld(xp, x0 + jp)))
            dx = simd.splatf16(simd.ld(xd, t * nsb + sb))
            isum = simd.load16i(isums, i)
            if q3:
                isum = simd.sub32(isum, simd.shl32(c, 2))
            else:
                simd.storef8(mos, i, simd.fma8(simd.cvt8(c), simd.mul8(mv, dx), simd.loadf16(mos, i)))
            simd.storef8(acc, i, simd.fma8(simd.cvt8(isum), simd.mul8(dv, dx), simd.loadf16(acc, i)))


@njit(cache=True, fastmath=EXACT)
def _k23x8_zmm(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb16, out, n0, n1):
    # the avx512 path: _k23x8_simd's integers and float steps, sixteen rows per vector, so the same bits
    T = xq.shape[0]
    tile = min(T, X8_TOKENS)
    acc = np.empty(tile * 16, np.float32)
    mos = np.empty(tile * 16, np.float32)
    isums = np.empty(tile * 16, np.int32)
    xp = pack_pairs(xb16)  # the block sums per 16 in pairs: the activation side of vpdpwssd
    if is_q3x8(kind):
        row_tiles16(_k23_tile_w, (True, qs, qh, sc, d, m, xq, xd, xp, isums), 0, xq, out, n0, n1, acc, mos)
    else:
        row_tiles16(_k23_tile_w, (False, qs, qh, sc, d, m, xq, xd, xp, isums), -1, xq, out, n0, n1, acc, mos)


overload(rows_k23x8)(by_path(_k23x8_portable, _k23x8_simd, avx512=_k23x8_zmm))

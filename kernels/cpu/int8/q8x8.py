"""Interleaved Q8_0 (layout._q8_8) and IQ4_NL (layout._legacy8, as Q4_0): eight rows per vector, signed
weights by the sign trick (IQ4_NL on vnni: its grid offset to unsigned bytes instead, unsigned_grid).

Both are a signed byte per weight and a float16 scale per 32-block, so one set of kernels runs them: Q8_0's
eight weight vectors of a block are loaded as they are, IQ4_NL's are looked up in its 16-value grid from
the four vectors of nibbles (simd.grid16: a byte shuffle), then the same dot products and scales. The two
are separate units (families q8x8 and nlx8): a unit's kinds, named in the type of `isa`, decide at compile
time which loads it holds. On the avx512 path (_q8x8_zmm) a zmm vector holds two row groups, and every weight
goes in unsigned (IQ4_NL's grid + 128, Q8_0's bytes + 128: AVX-512 has no vpsignb).

MXFP4 (family mxx8, kernels/formats/mxfp4.py) runs here too: IQ4_NL's layout with its own 16-value grid (the
E2M1 values doubled, simd.mxgrid16) and its scales E8M0 bytes, eight rows' side by side (simd.loade8m0): `is_grid`
says which of the three a unit's weights are, a constant in every unit (each family is one)."""

import numpy as np
from numba import njit
from numba.extending import overload

from ... import kinds
from ...formats.mxfp4 import E8M0
from .. import simd
from ..simd import VNNI_PATHS, kinds_of, path_of
from .common import EXACT, PREFETCH, SDOT_PATHS, X8_TOKENS, by_path, dot8, dot8w, i8, mmla_pair, row_tiles8, row_tiles16

GRID = np.array(simd.IQ4_GRID, np.int32)
MX_GRID = np.array(simd.MX_GRID, np.int32)
BYTES, NL, MX = 0, 1, 2  # is_grid: Q8_0's bytes, IQ4_NL's grid, MXFP4's grid
_CODE = {kinds.Q8_0_X8: BYTES, kinds.IQ4_NL_X8: NL, kinds.MXFP4_X8: MX}


def rows_q8x8(isa, kind, qs, d, luts, xq, xd, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q8_0 or IQ4_NL, every token."""


def is_grid(isa, kind):
    """What the weights are: BYTES (Q8_0's), NL (IQ4_NL's nibbles into its grid) or MX (MXFP4's nibbles
    into its grid, E8M0 scale bytes); nonzero for a grid. A constant where the unit's kinds (isa) hold one
    of the three, else the kind's test."""


@overload(is_grid, inline="always")
def _is_grid(isa, kind):
    ks = kinds_of(isa) & set(_CODE)
    if len(ks) == 1:
        code = _CODE[next(iter(ks))]
        return lambda isa, kind: code
    return lambda isa, kind: NL if kind == kinds.IQ4_NL_X8 else (MX if kind == kinds.MXFP4_X8 else BYTES)


def unsigned_grid(isa):
    """Whether IQ4_NL's weights go into the dot products as grid + 128, unsigned: on vnni, where vpdpbusd
    takes them without the sign trick (three instructions a vector less) and sums in 32 bits without
    saturation, so subtracting 128 times the activations' block sum gives the same integers."""


@overload(unsigned_grid, inline="always")
def _unsigned_grid(isa):
    vnni = path_of(isa) in VNNI_PATHS
    return lambda isa: vnni


@njit(inline="always", cache=True)
def _grid(isa, nl, v):
    # the grid values of a vector of nibbles, as the path's dot products take them (unsigned_grid)
    if unsigned_grid(isa):
        return simd.mxgrid16u(isa, v) if nl == MX else simd.grid16u(isa, v)
    return simd.mxgrid16(isa, v) if nl == MX else simd.grid16(isa, v)


@njit(inline="always", cache=True)
def _scales(nl, d, o):
    # the eight rows' block scales of the block whose float16 scales are d[o:o + 8] (o = 8 x the block's index);
    # MXFP4's are its eight E8M0 bytes, at d[o / 2:o / 2 + 4]
    return simd.loade8m0(d, o >> 1) if nl == MX else simd.loadf8(d, o)


@njit(inline="always", cache=True)
def _scales_w(nl, d, o, p):
    # _scales of two row groups as one f32x16
    return simd.loade8m0(d, o >> 1, p >> 1) if nl == MX else simd.loadf8(d, o, p)


@njit(inline="always", cache=True)
def e8m0_at(d, n, i):
    """2^(e - 128) for the E8M0 byte i of row n of d (uint16, two bytes each, little-endian)."""
    return E8M0[(np.int64(d[n, i >> 1]) >> ((i & 1) << 3)) & 255]


@njit(inline="always", cache=True)
def _weights(isa, nl, qs, blk):
    # block blk's eight weight vectors (signed bytes; vector v: elements 4v .. 4v + 3 of the eight rows):
    # Q8_0's 256 bytes as they are, or the grid values of IQ4_NL's four vectors of nibbles (128 bytes; low
    # nibbles elements 0-15, high ones 16-31)
    if nl:
        o = blk * 128
        v0 = simd.load32(qs, o)
        v1 = simd.load32(qs, o + 32)
        v2 = simd.load32(qs, o + 64)
        v3 = simd.load32(qs, o + 96)
        return (_grid(isa, nl, simd.low4(v0)), _grid(isa, nl, simd.low4(v1)), _grid(isa, nl, simd.low4(v2)),
                _grid(isa, nl, simd.low4(v3)), _grid(isa, nl, simd.shr4(v0)), _grid(isa, nl, simd.shr4(v1)),
                _grid(isa, nl, simd.shr4(v2)), _grid(isa, nl, simd.shr4(v3)))
    o = blk * 256
    return (simd.load32(qs, o), simd.load32(qs, o + 32), simd.load32(qs, o + 64), simd.load32(qs, o + 96),
            simd.load32(qs, o + 128), simd.load32(qs, o + 160), simd.load32(qs, o + 192), simd.load32(qs, o + 224))


@njit(inline="always", cache=True)
def _dot(isa, nl, sums, w0, w1, w2, w3, w4, w5, w6, w7, xq, xo, s):
    # the block's exact integer sums for eight rows against the activation bytes xq[xo:xo + 32]; s: the index
    # of their block sum in `sums` (unsigned_grid)
    x0, x1, x2, x3 = simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4), simd.bcast4(xq, xo + 8), simd.bcast4(xq, xo + 12)
    x4, x5, x6, x7 = simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20), simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28)
    if nl and unsigned_grid(isa):
        return simd.add32(dot8(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7),
                          simd.splat32(simd.ld(sums, s)))
    return dot8s(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7)


@njit(inline="always", cache=True)
def _sums128(xq):
    # -128 times each activation block's sum of bytes (T * nb int32), which takes back what unsigned weights
    # (w + 128: vnni's IQ4_NL grid, every avx512 weight) add to a block's integer sums
    T, K = xq.shape
    nb = K // 32
    sums = np.empty(T * nb, np.int32)
    for t in range(T):
        for b in range(nb):
            s = np.int32(0)
            for i in range(32):
                s += i8(xq[t, b * 32 + i])
            sums[t * nb + b] = s * np.int32(-128)
    return sums


@njit(inline="always", cache=True)
def _block_sums(isa, nl, xq):
    # -128 times each activation block's sum of bytes (_sums128) where the unsigned grid needs them, else none
    if nl and unsigned_grid(isa):
        return _sums128(xq)
    return np.zeros(0, np.int32)


@njit(inline="always", cache=True)
def _prefetch(nl, qs, blk):
    # the weights a few KiB past block blk's, a 64-byte line at a time
    o = blk * (128 if nl else 256) + PREFETCH
    simd.prefetch(qs, o)
    simd.prefetch(qs, o + 64)
    if not nl:
        simd.prefetch(qs, o + 128)
        simd.prefetch(qs, o + 192)


def dot8s(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    """sum_v s8x32 w_v . s8x32 x_v -> s32x8 (exact), as |w| . (x with the sign of w): vpdpbusd chains on
    vnni; on avx2 each vpmaddubsw widened by vpmaddwd at once (two of them can pass 2**15). On aarch64 as
    it is: sdot chains on dotprod and i8mm, 16-bit products widened every two vectors on neon."""


@overload(dot8s, inline="always")
def _dot8s(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    if path_of(isa) in SDOT_PATHS:  # sdot is signed x signed: dot8 as it is (any weights there)
        def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
            return dot8(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7)
        return impl
    if path_of(isa) == "neon":  # two products per 16-bit lane: at most 2 x 128 x 127 = 32512 < 2**15
        def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
            a = simd.sum4x16(simd.sum4x16(simd.zero32(), simd.add16x32(simd.mull16(w0, x0), simd.mull16(w1, x1))),
                             simd.add16x32(simd.mull16(w2, x2), simd.mull16(w3, x3)))
            b = simd.sum4x16(simd.sum4x16(simd.zero32(), simd.add16x32(simd.mull16(w4, x4), simd.mull16(w5, x5))),
                             simd.add16x32(simd.mull16(w6, x6), simd.mull16(w7, x7)))
            return simd.add32(a, b)
        return impl
    if path_of(isa) in VNNI_PATHS:
        def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
            a = simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(
                simd.zero32(), simd.abs8(w0), simd.sign8(x0, w0)), simd.abs8(w1), simd.sign8(x1, w1)),
                simd.abs8(w2), simd.sign8(x2, w2)), simd.abs8(w3), simd.sign8(x3, w3))
            b = simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(
                simd.zero32(), simd.abs8(w4), simd.sign8(x4, w4)), simd.abs8(w5), simd.sign8(x5, w5)),
                simd.abs8(w6), simd.sign8(x6, w6)), simd.abs8(w7), simd.sign8(x7, w7))
            return simd.add32(a, b)
        return impl

    def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
        one = simd.ones16()
        a = simd.add32(simd.add32(simd.madd(simd.maddubs(simd.abs8(w0), simd.sign8(x0, w0)), one),
                                  simd.madd(simd.maddubs(simd.abs8(w1), simd.sign8(x1, w1)), one)),
                       simd.add32(simd.madd(simd.maddubs(simd.abs8(w2), simd.sign8(x2, w2)), one),
                                  simd.madd(simd.maddubs(simd.abs8(w3), simd.sign8(x3, w3)), one)))
        b = simd.add32(simd.add32(simd.madd(simd.maddubs(simd.abs8(w4), simd.sign8(x4, w4)), one),
                                  simd.madd(simd.maddubs(simd.abs8(w5), simd.sign8(x5, w5)), one)),
                       simd.add32(simd.madd(simd.maddubs(simd.abs8(w6), simd.sign8(x6, w6)), one),
                                  simd.madd(simd.maddubs(simd.abs8(w7), simd.sign8(x7, w7)), one)))
        return simd.add32(a, b)
    return impl


@njit(cache=True, fastmath=EXACT)
def _q8x8_portable(isa, kind, qs, d, luts, xq, xd, out, n0, n1):
    # one row and one token at a time, the SIMD path's arithmetic lane by lane (the same bits)
    T, K = xq.shape
    nb = K // 32
    nl = is_grid(isa, kind)
    for n in range(n0, n1):
        grp = n // 8
        r = n % 8
        for t in range(T):
            acc = np.float32(0.0)
            for b in range(nb):
                isum = np.int32(0)
                for i in range(32):
                    if nl:
                        v = i // 4
                        q = np.int32(qs[grp, b * 128 + (v % 4) * 32 + r * 4 + i % 4])
                        w = (MX_GRID if nl == MX else GRID)[q & 15 if v < 4 else q >> 4]
                    else:
                        w = i8(qs[grp, ((b * 8 + i // 4) * 8 + r) * 4 + i % 4])
                    isum += w * i8(xq[t, b * 32 + i])
                dw = e8m0_at(d, grp, b * 8 + r) if nl == MX else luts[0, d[grp, b * 8 + r]]
                acc = simd.fma1(np.float32(isum), dw * xd[t, b], acc)
            out[t, n] = acc


@njit(inline="always", cache=True)
def _tile(k, K, grp, grp2, t0, t1, acc, mos):
    # row group grp's blocks for tokens [t0, t1) (common.row_tiles8): each block's eight weight vectors loaded
    # once for the tile's tokens
    isa, qs, d, xq, xd, sums, nl = k
    nb = K // 32
    for b in range(nb):
        _prefetch(nl, qs, grp * nb + b)
        w0, w1, w2, w3, w4, w5, w6, w7 = _weights(isa, nl, qs, grp * nb + b)
        dw = _scales(nl, d, (grp * nb + b) * 8)
        for t in range(t0, t1):
            isum = _dot(isa, nl, sums, w0, w1, w2, w3, w4, w5, w6, w7, xq, t * K + b * 32, t * nb + b)
            j = (t - t0) * 8
            simd.storef8(acc, j, simd.fma8(simd.cvt8(isum), simd.mul8(dw, simd.splatf(simd.ld(xd, t * nb + b))),
                                           simd.loadf8(acc, j)))


@njit(cache=True, fastmath=EXACT)
def _q8x8_simd(isa, kind, qs, d, luts, xq, xd, out, n0, n1):
    nl = is_grid(isa, kind)
    acc = np.empty(X8_TOKENS * 8, np.float32)
    row_tiles8(_tile, (isa, qs, d, xq, xd, _block_sums(isa, nl, xq), nl), 0, xq, out, n0, n1, acc, acc)


@njit(inline="always", cache=True)
def _gridw(nl, v):
    # the grid values + 128 of a wide vector of nibbles (_grid's, on zmm)
    return simd.mxgrid16u(v) if nl == MX else simd.grid16u(v)


@njit(inline="always", cache=True)
def _weights_w(nl, qs, blk, blk2):
    # blocks blk (rows of group g) and blk2 (group g + 1) as eight wide vectors of unsigned weights (w + 128):
    # IQ4_NL's or MXFP4's grid + 128, Q8_0's bytes flipped
    if nl:
        o, p = blk * 128, blk2 * 128
        v0, v1 = simd.load32(qs, o, p), simd.load32(qs, o + 32, p + 32)
        v2, v3 = simd.load32(qs, o + 64, p + 64), simd.load32(qs, o + 96, p + 96)
        return (_gridw(nl, simd.low4(v0)), _gridw(nl, simd.low4(v1)), _gridw(nl, simd.low4(v2)),
                _gridw(nl, simd.low4(v3)), _gridw(nl, simd.shr4(v0)), _gridw(nl, simd.shr4(v1)),
                _gridw(nl, simd.shr4(v2)), _gridw(nl, simd.shr4(v3)))
    o, p = blk * 256, blk2 * 256
    return (simd.flip8(simd.load32(qs, o, p)), simd.flip8(simd.load32(qs, o + 32, p + 32)),
            simd.flip8(simd.load32(qs, o + 64, p + 64)), simd.flip8(simd.load32(qs, o + 96, p + 96)),
            simd.flip8(simd.load32(qs, o + 128, p + 128)), simd.flip8(simd.load32(qs, o + 160, p + 160)),
            simd.flip8(simd.load32(qs, o + 192, p + 192)), simd.flip8(simd.load32(qs, o + 224, p + 224)))


@njit(inline="always", cache=True)
def _tile_w(k, K, grp, grp2, t0, t1, acc, mos):
    # _tile on zmm: the blocks of row groups grp and grp2 (common.row_tiles16)
    qs, d, xq, xd, sums, nl = k
    nb = K // 32
    for b in range(nb):
        _prefetch(nl, qs, grp * nb + b)
        _prefetch(nl, qs, grp2 * nb + b)
        w0, w1, w2, w3, w4, w5, w6, w7 = _weights_w(nl, qs, grp * nb + b, grp2 * nb + b)
        dw = _scales_w(nl, d, (grp * nb + b) * 8, (grp2 * nb + b) * 8)
        for t in range(t0, t1):
            # the weights + 128 in one chain that starts from -128 times the activations' sum (a broadcast load: no
            # vector operation goes to taking it back; the tokens' chains overlap in the out-of-order core)
            isum = dot8w(simd.splat32w(simd.ld(sums, t * nb + b)), w0, w1, w2, w3, w4, w5, w6, w7, xq, t * K + b * 32)
            j = (t - t0) * 16
            simd.storef8(acc, j, simd.fma8(simd.cvt8(isum), simd.mul8(dw, simd.splatf16(simd.ld(xd, t * nb + b))),
                                           simd.loadf16(acc, j)))


@njit(cache=True, fastmath=EXACT)
def _q8x8_zmm(isa, kind, qs, d, luts, xq, xd, out, n0, n1):
    # the avx512 path: two groups of eight rows per zmm vector (simd/vec.py), otherwise _q8x8_simd's tile;
    # the sums are the same integers and each lane's float operations the same, so the same bits
    acc = np.empty(X8_TOKENS * 16, np.float32)
    row_tiles16(_tile_w, (qs, d, xq, xd, _sums128(xq), is_grid(isa, kind)), 0, xq, out, n0, n1, acc, acc)


@njit(inline="always", cache=True)
def _tile_pairs(k, K, grp, grp2, t0, t1, acc, mos):
    # _tile for the i8mm path: the tile's tokens two at a time in smmla
    isa, qs, d, xq, xd, nl = k
    nb = K // 32
    for b in range(nb):
        w0, w1, w2, w3, w4, w5, w6, w7 = _weights(isa, nl, qs, grp * nb + b)
        dw = _scales(nl, d, (grp * nb + b) * 8)
        for t in range(t0, t1, 2):
            u = min(t + 1, t1 - 1)  # the pair's second token (t itself when t is the tile's last)
            mmla_pair(w0, w1, w2, w3, w4, w5, w6, w7, xq, xd, dw, acc, K, nb, b, t, u, (t - t0) * 8)


@njit(cache=True, fastmath=EXACT)
def _q8x8_mmla(isa, kind, qs, d, luts, xq, xd, out, n0, n1):
    # the i8mm path: one token as _q8x8_simd (sdot); a batch two tokens at a time in smmla, as x8._x8_mmla
    T = xq.shape[0]
    if T == 1:
        _q8x8_simd(isa, kind, qs, d, luts, xq, xd, out, n0, n1)
        return
    acc = np.empty(X8_TOKENS * 8, np.float32)
    row_tiles8(_tile_pairs, (isa, qs, d, xq, xd, is_grid(isa, kind)), 0, xq, out, n0, n1, acc, acc)


overload(rows_q8x8)(by_path(_q8x8_portable, _q8x8_simd, i8mm=_q8x8_mmla, avx512=_q8x8_zmm))

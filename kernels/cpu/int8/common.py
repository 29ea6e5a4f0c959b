"""What the int8 kernel families share: the exactness flags, the signed-byte helper, the choice of
implementation by ISA path, the interleaved families' tile (X8_TOKENS) and dot product, and the block sums
packed in pairs for the avx512 kernels' vpdpwssd (pack_pairs)."""

import numpy as np
from numba import njit
from numba.extending import overload

from .. import simd
from ..simd import VNNI_PATHS, path_of

# Bytes ahead that the loops ask for the weights (prefetcht0). The hardware prefetcher alone reached 15 GB/s
# on a 178 MB matrix (2 threads); 4 KiB ahead reached 25 GB/s, the machine's streaming read rate.
PREFETCH = 4096
EXACT = {"nnan", "ninf", "nsz"}  # no reassociation or contraction: the same bits in every calling context


@njit(inline="always", cache=True)
def i8(v):
    return (np.int32(v) ^ 128) - 128


def by_path(portable, simd_impl, **paths):
    # an @overload body: the portable or the SIMD implementation, by the type of `isa`; a path named in
    # `paths` (avx2=..., i8mm=...) takes its own implementation instead of simd_impl
    def pick(isa, *args):
        path = path_of(isa)
        impl = portable if path == "portable" else paths.get(path, simd_impl)
        return lambda isa, *args: impl(isa, *args)
    return pick


# -- the interleaved layouts (layout.py): eight rows per vector ---------------------------------------
#
# (Written for Q4_0/Q4_1/Q5_0/Q5_1, x8.py; Q8_0, q8x8.py, and the K-quants, kx8.py, share the tile.) One 32-byte vector holds the same four elements of eight rows, so a u8 x s8 dot product against four
# activation bytes broadcast to every lane gives eight rows' partial sums at once: eight of them make the
# block's exact integer sums for eight rows (no horizontal sum), and the float work per block is one
# vector for eight rows: acc = fma(float(isum), d_w * d_x, acc), mo = fma(offset_w, s_x, mo), with the
# eight rows' scales loaded as one vector. Every output element is this chain over blocks in order,
# whatever the batch: decode takes one token in registers, batches take up to X8_TOKENS tokens per pass
# over a group's blocks (each block decoded once for all of them, accumulators in a small scratch).
# Tile shape: 8 rows (the eight 32-bit lanes of a ymm register) x up to 32 tokens. The loop over tokens
# holds only the block's eight weight vectors and a few temporaries in registers (the accumulators live
# in the scratch, an L1 load and store per token and block), so the same shape fits AVX2's 16 vector
# registers and AVX-512's 32 without spills, on both paths and for every weight type (on the vnni path
# Q4_K/Q5_K read their weights from a byte scratch instead, kx8_simd._kx8_simd). 32 tokens keep the
# scratch (1 KiB) in L1 and the tokens' activation rows (32 K bytes) in L1 or L2 while a group's blocks
# stream past.
X8_TOKENS = 32


def _row_tiles(lanes):
    # the driver for vectors of `lanes` rows: 8 (ymm, one group of eight rows) or 16 (zmm, two groups); `load`
    # and `per` are constants of the code Numba inlines
    load = simd.loadf8 if lanes == 8 else simd.loadf16
    per = lanes // 8  # row groups per vector

    def row_tiles(tile, k, combine, xq, out, n0, n1, acc, mos):
        """The interleaved kernels' loop over a task's rows [n0, n1) and the tokens of xq (T, K): for each vector's
        row groups (grp, and grp2 the second of a zmm vector's, grp on ymm) and each tile of up to X8_TOKENS
        tokens [t0, t1), the tile's accumulators zeroed (acc and, unless combine is 0, mos: a vector's
        floats per token), tile(k, K, grp, grp2, t0, t1, acc, mos) adds the groups' blocks into them (k: the
        kernel's arrays and constants), then each token's rows are stored: acc, acc + mos (combine > 0) or
        acc - mos (combine < 0). The kernel passes its tile body as an argument; both are inline="always",
        so Numba inlines this loop and the body into the kernel's own IR before typing (no call per tile,
        and the body never compiled apart)."""
        T, K = xq.shape
        N = out.shape[1]
        g1 = (n1 + 7) // 8
        for grp in range(n0 // 8, g1, per):
            grp2 = grp if per == 1 else min(grp + 1, g1 - 1)  # an odd last group fills both halves (the upper one not stored)
            rows = N - grp * 8 if per == 1 else min(N - grp * 8, 16 if grp2 > grp else 8)
            for t0 in range(0, T, X8_TOKENS):
                t1 = min(T, t0 + X8_TOKENS)
                acc[: (t1 - t0) * lanes] = 0
                if combine != 0:
                    mos[: (t1 - t0) * lanes] = 0
                tile(k, K, grp, grp2, t0, t1, acc, mos)
                for t in range(t0, t1):
                    i = (t - t0) * lanes
                    v = load(acc, i)
                    if combine > 0:
                        v = simd.add8(v, load(mos, i))
                    elif combine < 0:
                        v = simd.sub8(v, load(mos, i))
                    simd.storef8_first(out, t * N + grp * 8, v, rows)

    return njit(inline="always")(row_tiles)


row_tiles8 = _row_tiles(8)    # ymm: eight rows per vector
row_tiles16 = _row_tiles(16)  # zmm: two groups, sixteen rows per vector (the avx512 kernels)
# the aarch64 paths with sdot (simd/neon.py): i8mm cores have dotprod too
SDOT_PATHS = ("dotprod", "i8mm")


def dot8(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    """sum_v u8x32 w_v . s8x32 x_v -> s32x8 (exact) for weights up to 31: vpdpbusd chains on vnni; vpmaddubsw
    pairs summed in 16 bits (at most 4 x 2 x 31 x 127 < 2**15) then vpmaddwd on avx2; sdot chains on
    dotprod and i8mm; 16-bit products summed over the eight vectors, then widened, on neon."""


@overload(dot8, inline="always")
def _dot8(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    if path_of(isa) in SDOT_PATHS or path_of(isa) in VNNI_PATHS:
        # two chains of the accumulating dot instruction, summed: sdot on aarch64, vpdpbusd on vnni
        dot = simd.sdot if path_of(isa) in SDOT_PATHS else simd.dpbusd

        def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
            a = dot(dot(dot(dot(simd.zero32(), w0, x0), w1, x1), w2, x2), w3, x3)
            b = dot(dot(dot(dot(simd.zero32(), w4, x4), w5, x5), w6, x6), w7, x7)
            return simd.add32(a, b)
        return impl
    if path_of(isa) == "neon":  # eight products per 16-bit lane: at most 8 x 31 x 127 = 31496 < 2**15
        def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
            a = simd.add16x32(simd.add16x32(simd.mull16(w0, x0), simd.mull16(w1, x1)),
                              simd.add16x32(simd.mull16(w2, x2), simd.mull16(w3, x3)))
            b = simd.add16x32(simd.add16x32(simd.mull16(w4, x4), simd.mull16(w5, x5)),
                              simd.add16x32(simd.mull16(w6, x6), simd.mull16(w7, x7)))
            return simd.sum4x16(simd.zero32(), simd.add16x32(a, b))
        return impl

    def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
        a = simd.add16(simd.add16(simd.maddubs(w0, x0), simd.maddubs(w1, x1)),
                       simd.add16(simd.maddubs(w2, x2), simd.maddubs(w3, x3)))
        b = simd.add16(simd.add16(simd.maddubs(w4, x4), simd.maddubs(w5, x5)),
                       simd.add16(simd.maddubs(w6, x6), simd.maddubs(w7, x7)))
        return simd.add32(simd.madd(a, simd.ones16()), simd.madd(b, simd.ones16()))
    return impl


@njit(inline="always", cache=True)
def pack_pairs(xs):
    # (T, M) int32 sums (each within 16 bits) -> (T * M / 2) int32: sums 2i and 2i + 1 as the low and high
    # 16 bits of word i, the activation-side operand of simd.dpwssd
    T, M = xs.shape
    out = np.empty(T * (M // 2), np.int32)
    for t in range(T):
        for i in range(M // 2):
            out[t * (M // 2) + i] = (xs[t, 2 * i] & 0xFFFF) | (xs[t, 2 * i + 1] << 16)
    return out


@njit(inline="always", cache=True)
def dot8w(acc, w0, w1, w2, w3, w4, w5, w6, w7, xq, xo):
    # acc plus sixteen rows' sums (two row groups' zmm weights, u8) of 32 elements against the activation bytes
    # xq[xo:xo + 32]: one chain of vpdpbusd (the avx512 kernels)
    a = simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(
        acc, w0, simd.bcast4w(xq, xo)), w1, simd.bcast4w(xq, xo + 4)),
        w2, simd.bcast4w(xq, xo + 8)), w3, simd.bcast4w(xq, xo + 12))
    return simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(
        a, w4, simd.bcast4w(xq, xo + 16)), w5, simd.bcast4w(xq, xo + 20)),
        w6, simd.bcast4w(xq, xo + 24)), w7, simd.bcast4w(xq, xo + 28))


@njit(inline="always", cache=True)
def mmla_pair(w0, w1, w2, w3, w4, w5, w6, w7, xq, xd, dw, acc, K, nb, b, t, u, j):
    # the i8mm paths' step: block b's eight weight vectors against tokens t and u (u == t: t alone) in smmla
    # (simd.mmla8); each token's integer sums times dw and its activation scale added to acc[j:j + 8] (t) and
    # acc[j + 8:j + 16] (u)
    s2 = simd.mmla8(w0, w1, w2, w3, w4, w5, w6, w7, xq, t * K + b * 32, u * K + b * 32)
    simd.storef8(acc, j, simd.fma8(simd.cvt8(simd.token_a(s2)), simd.mul8(dw, simd.splatf(simd.ld(xd, t * nb + b))),
                                   simd.loadf8(acc, j)))
    if u > t:
        simd.storef8(acc, j + 8, simd.fma8(simd.cvt8(simd.token_b(s2)), simd.mul8(dw, simd.splatf(simd.ld(xd, u * nb + b))),
                                           simd.loadf8(acc, j + 8)))

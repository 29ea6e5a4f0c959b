"""Interleaved Q4_K, Q5_K, Q6_K (layout._k8): eight rows per vector.

As for the legacy types, each vector holds four elements of eight rows; the sub-block scales are applied in
the integer domain to eight rows at once, the mins from the activation's sums per 32, and one float FMA per
256 elements per eight rows:

    Q4_K/Q5_K  acc = fma(float(sum_j sc_j dot_j), d d_x, acc), mo = fma(float(sum_j min_j xsum_j), dmin d_x, mo)
    Q6_K       acc = fma(float(sum_j sc_j (dot_j - 32 xsum16_j)), d d_x, acc)   (q unsigned, 0..63, six bits)

Every implementation computes the same integers and the same FMAs, so the same bits for every batch, one
module each: _kx8_portable here, lane by lane; kx8_simd.py on the vnni and aarch64 paths (vpdpbusd or sdot
sums times the scales by vpmulld/mul, Q4_K and Q5_K weights unpacked once per row group into a byte scratch
that every token reads; on aarch64 a decode step reads the packed weights directly, _kx8_arm; on i8mm two
tokens per smmla, _kx8_mmla); kx8_avx2.py (weights unpacked once into registers for a tile of tokens,
scales on the vpmaddwd); kx8_zmm.py on avx512 (the avx2 kernel's tile, two row groups per zmm vector,
vpdpbusd sums times the scales by vpmulld, the mins by vpdpwssd).
"""

import numpy as np
from numba import njit
from numba.extending import overload

from ...formats.q6_k import q6_x8
from .. import simd
from .common import EXACT, by_path, i8
from .kx8_avx2 import _kx8_avx2
from .kx8_simd import _kx8_arm, _kx8_mmla, _kx8_simd, has_min, has_qh, is_q6_k
from .kx8_zmm import _kx8_zmm


def rows_kx8(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q4_K/Q5_K/Q6_K, every token."""


@njit(inline="always", cache=True)
def _kx8_lane(kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, grp, r, t, nsb):
    # row r of row group grp times token t, the SIMD path's arithmetic lane by lane (the same bits)
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
                    dot += q6_x8(qs, grp, sb * 16 + j, i, r) * i8(xq[t, sb * 256 + e])
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
    return acc - mo if has_min(kind) else acc


@njit(cache=True, fastmath=EXACT)
def _kx8_portable(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    # one row and one token at a time
    for n in range(n0, n1):
        for t in range(xq.shape[0]):
            out[t, n] = _kx8_lane(kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, n // 8, n % 8, t, xq.shape[1] // 256)


# vnni keeps _kx8_simd's vpdpbusd chains: the avx2 kernel runs there too, but which is faster on an
# AVX-512 VNNI host has not been measured. The aarch64 paths run _kx8_arm (sdot, or neon's widening
# products), i8mm its two-token twin for batches.
overload(rows_kx8)(by_path(_kx8_portable, _kx8_simd, avx2=_kx8_avx2, avx512=_kx8_zmm, neon=_kx8_arm, dotprod=_kx8_arm,
                           i8mm=_kx8_mmla))

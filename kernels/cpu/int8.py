"""Integer dot-product matmuls over repacked weights, as llama.cpp computes them.

Activations are quantized once per matmul input, per token row (``quantize_q8`` / ``quantize_q8k``):

- Q8 (for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 weights): 32-element blocks, int8 values, a float scale and
  the scaled block sum (the min/offset term of the weight type is folded through it);
- Q8_K (for Q4_K, Q5_K, Q6_K): 256-element blocks, int8 values, a float scale, int sums per 32 and 16.

A weight block times an activation block is an exact integer dot product, scaled once per block
(legacy types) or once per 256-element super-block (K-quants, whose sub-block scales are applied in the
integer domain). Every output element is computed by the same sequence of operations whatever the
number of tokens, so batched and single-token results are bit-identical.

`matmuls` is the one entry point (up to three matrices reading the same input, in one parallel
region). Two layouts, two families of kernels:

- row-major (quant/repack.py's QTensor, kinds 2-9): plain integer loops, one row and one token at a
  time; the portable path's layout;
- eight rows interleaved (layout.py, kinds 10-17): the SIMD paths' layout. A vector's eight lanes are
  eight output rows (u8 x s8 with the idioms of simd.py; vpdpbusd on vnni, vpmaddubsw + vpmaddwd on
  avx2, chosen by the type of the `isa` argument); each has a portable twin that computes the lanes one
  by one, to the same bits.

Helpers inside the loops take vectors and scalars, never arrays: an array argument costs reference
counting on every call (measured 10x slower).
"""

import numpy as np
from numba import njit, prange
from numba.extending import overload

from . import simd, units
from .simd import kinds_of, path_of

# Bytes ahead that the loops ask for the weights (prefetcht0). The hardware prefetcher alone reached 15 GB/s
# on a 178 MB matrix (2 threads); 4 KiB ahead reached 25 GB/s, the machine's streaming read rate.
PREFETCH = 4096
EXACT = {"nnan", "ninf", "nsz"}  # no reassociation or contraction: the same bits in every calling context


@njit(inline="always", cache=True)
def _i8(v):
    return (np.int32(v) ^ 128) - 128


# -- the portable path's block functions: plain integer loops that LLVM vectorizes where it can


@njit(cache=True)
def _q4_portable(w, wo, x, xo):
    s = np.int32(0)
    for j in range(16):
        q = np.int32(w[wo + j])
        s += (q & 15) * _i8(x[xo + j]) + (q >> 4) * _i8(x[xo + 16 + j])
    return s


@njit(cache=True)
def _q5_portable(w, wo, h, x, xo):
    s = np.int32(0)
    for j in range(16):
        q = np.int32(w[wo + j])
        lo = (q & 15) | np.int32(((h >> j) & 1) << 4)
        hi = (q >> 4) | np.int32(((h >> (j + 16)) & 1) << 4)
        s += lo * _i8(x[xo + j]) + hi * _i8(x[xo + 16 + j])
    return s


@njit(cache=True)
def _q8_portable(w, wo, x, xo):
    s = np.int32(0)
    for j in range(32):
        s += _i8(w[wo + j]) * _i8(x[xo + j])
    return s


@njit(cache=True)
def _k_pair_portable(w, wo, qh, qho, five, i, x, xo, s_lo, s_hi):
    a = np.int32(0)
    b = np.int32(0)
    for j in range(32):
        q = np.int32(w[wo + j])
        lo = q & 15
        hi = q >> 4
        if five:
            hb = np.int32(qh[qho + j])
            lo |= ((hb >> i) & 1) << 4
            hi |= ((hb >> (i + 1)) & 1) << 4
        a += lo * _i8(x[xo + j])
        b += hi * _i8(x[xo + 32 + j])
    return s_lo * a + s_hi * b


@njit(cache=True)
def _q6_portable(w, wo, x, xo, s0, s1):
    a = np.int32(0)
    b = np.int32(0)
    for j in range(16):
        a += _i8(w[wo + j]) * _i8(x[xo + j])
        b += _i8(w[wo + 16 + j]) * _i8(x[xo + 16 + j])
    return s0 * a + s1 * b


# -- activation quantization --------------------------------------------------------------------


@njit(parallel=True, nogil=True, cache=True)
def quantize_q8(x, xq, xd, xs):
    # x (T, K) float32 -> xq (T, K) int8 as uint8, xd (T, K/32) float32 scale, xs (T, K/32) float32 d * sum(q).
    # llama.cpp's quantize_row_q8_1: d = max|x| / 127, q = round(x / d), s = d * sum(q) (for the offset terms).
    # d and s stay float32: rounding them to fp16 as llama.cpp's blocks store them was measured to move
    # the golden top logits further from llama.cpp's (0.42 -> 0.65 at worst), not closer.
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        quantize_q8_row(x, xq, xd, xs, t)


@njit(parallel=True, nogil=True, cache=True)
def quantize_q8k(x, xq, xd, xb, xb16):
    # x (T, K) float32 -> xq (T, K) int8 as uint8, xd (T, K/256) float32, xb (T, K/32) int32 sums per 32
    # (the K-quants' min terms need them per 32-element sub-block), xb16 (T, K/16) sums per 16 (as
    # llama.cpp's bsums: the interleaved Q6_K kernel's offset of 32 per 16-element group).
    # llama.cpp's quantize_row_q8_K: the value of largest magnitude maps to -127 (its sign flips the scale).
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        quantize_q8k_row(x, xq, xd, xb, xb16, t)


@njit(nogil=True, cache=True)
def quantize_q8_row(x, xq, xd, xs, t):
    # token t of quantize_q8
    quantize_q8_blocks(x, xq, xd, xs, t, np.int64(0), x.shape[1] // 32)


@njit(nogil=True, cache=True)
def quantize_q8_blocks(x, xq, xd, xs, t, g0, g1):
    # 32-blocks [g0, g1) of token t (see quantize_q8)
    for g in range(g0, g1):
        amax = np.float32(0.0)
        for j in range(32):
            amax = max(amax, abs(x[t, g * 32 + j]))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
        s = np.int32(0)
        for j in range(32):
            q = np.int32(np.rint(x[t, g * 32 + j] * inv))
            s += q
            xq[t, g * 32 + j] = np.uint8(q & 255)
        xd[t, g] = d
        xs[t, g] = d * np.float32(s)


@njit(nogil=True, cache=True)
def quantize_q8k_row(x, xq, xd, xb, xb16, t):
    # token t of quantize_q8k
    quantize_q8k_blocks(x, xq, xd, xb, xb16, t, np.int64(0), x.shape[1] // 256)


@njit(nogil=True, cache=True)
def quantize_q8k_blocks(x, xq, xd, xb, xb16, t, sb0, sb1):
    # 256-blocks [sb0, sb1) of token t (see quantize_q8k)
    for sb in range(sb0, sb1):
        amax = np.float32(0.0)
        vmax = np.float32(0.0)
        for j in range(256):
            v = x[t, sb * 256 + j]
            if abs(v) > amax:
                amax = abs(v)
                vmax = v
        if amax == 0:
            xd[t, sb] = 0
            for j in range(256):
                xq[t, sb * 256 + j] = 0
            for j in range(8):
                xb[t, sb * 8 + j] = 0
                xb16[t, sb * 16 + 2 * j] = 0
                xb16[t, sb * 16 + 2 * j + 1] = 0
            continue
        iscale = np.float32(-127.0) / vmax
        for j in range(8):
            s = np.int32(0)
            s16 = np.int32(0)
            for l in range(32):
                q = min(np.int32(127), np.int32(np.rint(iscale * x[t, sb * 256 + j * 32 + l])))
                s += q
                s16 += q
                if l == 15:
                    xb16[t, sb * 16 + 2 * j] = s16
                    s16 = np.int32(0)
                xq[t, sb * 256 + j * 32 + l] = np.uint8(q & 255)
            xb[t, sb * 8 + j] = s
            xb16[t, sb * 16 + 2 * j + 1] = s16
        xd[t, sb] = np.float32(1.0) / iscale


# -- matmuls: W (N, K) @ x (T, K) -> out (T, N) --------------------------------------------------
#
# `matmuls` hands two tasks of rows per thread (`threads`: numba's thread count) to the threads;
# `rows_any` computes a task's rows for every token with the kernel of the matrix's kind. Every output
# element is reduced by one chain of operations whatever the batch, so a token's result never depends
# on the rest of the batch.


@njit(inline="always", cache=True)
def rows_per_task(n, threads):
    # two tasks per thread, a multiple of 8 rows each (interleaved weights come in groups of eight): a
    # task is one call with a dozen array arguments, whose reference counting is not free
    per = -(-n // (2 * threads))
    return max(8, -(-per // 8) * 8)


def uses_q8k(kind: int) -> bool:
    """Whether a matrix of this kind reads the activation as Q8_K (K-quants) rather than Q8."""
    return 7 <= kind <= 9 or 14 <= kind <= 16


def as_tuple(w) -> tuple:
    """A repacked matrix (quant/repack.py's QTensor) as the (kind, qs, qh, sc, d, m) tuple `matmuls` takes."""
    return (np.int64(w.kind), w.qs, w.qh, w.sc, w.d, w.m)


def rows_any(w, q8, q8k, luts, out, n0, n1, isa):
    """Rows [n0, n1) of W @ x -> out (T, N) for every token. w: a quantized matrix as (kind, qs, qh, sc,
    d, m) (quant/repack.py, kinds 2-9; layout.py, kinds 10-17); q8, q8k: x quantized (quantize_q8,
    quantize_q8k). Only the kinds the type of `isa` names are compiled in (simd.isa_tag); a matrix of
    another kind leaves out untouched."""


@overload(rows_any)
def _rows_any(w, q8, q8k, luts, out, n0, n1, isa):
    ks = kinds_of(isa)
    # branches on these closure constants are pruned before typing: the kernels of absent kinds are
    # never compiled
    h_q8_0 = 2 in ks
    h_q45 = bool(ks & {3, 4, 5, 6})
    h_k45 = bool(ks & {7, 8})
    h_q6_k = 9 in ks
    h_x8 = bool(ks & {10, 11, 12, 13})
    h_kx8 = bool(ks & {14, 15, 16})
    h_q8x8 = 17 in ks

    def impl(w, q8, q8k, luts, out, n0, n1, isa):
        kind, qs, qh, sc, d, m = w
        if h_x8:
            if 10 <= kind <= 13:
                rows_x8(isa, kind, qs, qh, d, m, luts, q8[0], q8[1], q8[2], out, n0, n1)
        if h_kx8:
            if 14 <= kind <= 16:
                rows_kx8(isa, kind, qs, qh, sc, d, m, luts, q8k[0], q8k[1], q8k[2], q8k[3], out, n0, n1)
        if h_q8x8:
            if kind == 17:
                rows_q8x8(isa, qs, d, luts, q8[0], q8[1], out, n0, n1)
        if h_q8_0:
            if kind == 2:
                rows_q8_0(isa, qs, d, luts, q8[0], q8[1], out, n0, n1)
        if h_q45:
            if 3 <= kind <= 6:
                rows_q45(isa, kind, qs, qh if kind >= 5 else qs, d, m, luts, q8[0], q8[1], q8[2], out, n0, n1)
        if h_k45:
            if 7 <= kind <= 8:
                rows_k45(isa, kind, qs, qh, sc, d, m, luts, q8k[0], q8k[1], q8k[2], out, n0, n1)
        if h_q6_k:
            if kind == 9:
                rows_q6_k(isa, qs, sc, d, luts, q8k[0], q8k[1], out, n0, n1)
    return impl


@njit(parallel=True, nogil=True, cache=True)
def matmuls(w0, w1, w2, n_mats, q8, q8k, luts, o0, o1, o2, threads, table):
    # W_j (N_j, K) @ x (T, K) -> o_j (T, N_j) for the first n_mats of (w0, w1, w2), all reading the same x
    # (q/k/v, gate/up), in one parallel region: each matrix's rows are cut into tasks, and all run together.
    # table: units.Table's addresses; a task runs rows_any of its matrix's kind through the unit of that
    # kind's family (compiled apart, called by address)
    per0 = rows_per_task(o0.shape[1], threads)
    per1 = rows_per_task(o1.shape[1], threads)
    per2 = rows_per_task(o2.shape[1], threads)
    t0 = -(-o0.shape[1] // per0)
    t1 = -(-o1.shape[1] // per1) if n_mats > 1 else 0
    t2 = -(-o2.shape[1] // per2) if n_mats > 2 else 0
    for task in prange(t0 + t1 + t2):
        if task < t0:
            units.call_rows(table[w0[0]], w0, q8, q8k, luts, o0, np.int64(task * per0),
                            np.int64(min(o0.shape[1], (task + 1) * per0)))
        elif task < t0 + t1:
            i = task - t0
            units.call_rows(table[w1[0]], w1, q8, q8k, luts, o1, np.int64(i * per1),
                            np.int64(min(o1.shape[1], (i + 1) * per1)))
        else:
            i = task - t0 - t1
            units.call_rows(table[w2[0]], w2, q8, q8k, luts, o2, np.int64(i * per2),
                            np.int64(min(o2.shape[1], (i + 1) * per2)))


def rows_x8(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q4_0/Q4_1/Q5_0/Q5_1, every token."""


def rows_kx8(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q4_K/Q5_K/Q6_K, every token."""


def rows_q8x8(isa, qs, d, luts, xq, xd, out, n0, n1):
    """Rows [n0, n1) (n0 a multiple of 8) of a matmul of interleaved Q8_0, every token."""


def _by_path(portable, simd_impl):
    # an @overload body: the portable or the SIMD implementation, by the type of `isa`
    def pick(isa, *args):
        impl = portable if path_of(isa) == "portable" else simd_impl
        return lambda isa, *args: impl(isa, *args)
    return pick


# -- the row-major layout (the portable path): one row, one token at a time, plain integer loops -----


@njit(cache=True, fastmath=EXACT)
def _q8_0_portable(isa, qs, d, luts, xq, xd, out, n0, n1):
    T, K = xq.shape
    nb = K // 32
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            for g in range(nb):
                acc += luts[0, d[n, g]] * xd[t, g] * np.float32(_q8_portable(qs[n], g * 32, xq[t], g * 32))
            out[t, n] = acc


@njit(cache=True, fastmath=EXACT)
def _q45_portable(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    T, K = xq.shape
    nb = K // 32
    five = kind >= 5
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            mo = np.float32(0.0)
            for g in range(nb):
                dw = luts[0, d[n, g]]
                if kind == 4 or kind == 6:
                    off = luts[0, m[n, g]]
                else:
                    off = np.float32(-16.0 if five else -8.0) * dw
                if five:
                    h = (np.uint32(qh[n, 4 * g]) | (np.uint32(qh[n, 4 * g + 1]) << 8)
                         | (np.uint32(qh[n, 4 * g + 2]) << 16) | (np.uint32(qh[n, 4 * g + 3]) << 24))
                    isum = _q5_portable(qs[n], g * 16, h, xq[t], g * 32)
                else:
                    isum = _q4_portable(qs[n], g * 16, xq[t], g * 32)
                acc += dw * xd[t, g] * np.float32(isum)
                mo += off * xs[t, g]
            out[t, n] = acc + mo


@njit(cache=True, fastmath=EXACT)
def _k45_portable(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, out, n0, n1):
    T, K = xq.shape
    five = kind == 8
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            mo = np.float32(0.0)
            for sb in range(K // 256):
                isum = np.int32(0)
                for p in range(4):
                    isum += _k_pair_portable(qs[n], sb * 128 + p * 32, qh[n], sb * 32, five, 2 * p, xq[t],
                                             sb * 256 + p * 64, np.int32(sc[n, sb * 16 + 2 * p]),
                                             np.int32(sc[n, sb * 16 + 2 * p + 1]))
                msum = np.int32(0)
                for i in range(8):
                    msum += np.int32(sc[n, sb * 16 + 8 + i]) * xb[t, sb * 8 + i]
                acc += luts[0, d[n, sb]] * xd[t, sb] * np.float32(isum)
                mo -= luts[0, m[n, sb]] * xd[t, sb] * np.float32(msum)
            out[t, n] = acc + mo


@njit(cache=True, fastmath=EXACT)
def _q6_k_portable(isa, qs, sc, d, luts, xq, xd, out, n0, n1):
    T, K = xq.shape
    for n in range(n0, n1):
        for t in range(T):
            acc = np.float32(0.0)
            for sb in range(K // 256):
                isum = np.int32(0)
                for g in range(8):
                    isum += _q6_portable(qs[n], sb * 256 + g * 32, xq[t], sb * 256 + g * 32,
                                         _i8(sc[n, sb * 16 + 2 * g]), _i8(sc[n, sb * 16 + 2 * g + 1]))
                acc += luts[0, d[n, sb]] * xd[t, sb] * np.float32(isum)
            out[t, n] = acc


@njit(cache=True, fastmath=EXACT)
def _x8_portable(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    # one row and one token at a time, the SIMD path's arithmetic lane by lane (the same bits)
    T, K = xq.shape
    N = out.shape[1]
    nb = K // 32
    five = kind >= 12
    has_m = kind == 11 or kind == 13
    for n in range(n0, n1):
        grp = n // 8
        r = n % 8
        for t in range(T):
            acc = np.float32(0.0)
            mo = np.float32(0.0)
            for b in range(nb):
                isum = np.int32(0)
                for i in range(32):
                    v = i // 4
                    q = np.int32(qs[grp, b * 128 + (v % 4) * 32 + r * 4 + i % 4])
                    q = q & 15 if v < 4 else q >> 4
                    if five:
                        o = (b * 8 + v) * 4
                        mask = (np.uint32(qh[grp, o]) | (np.uint32(qh[grp, o + 1]) << 8)
                                | (np.uint32(qh[grp, o + 2]) << 16) | (np.uint32(qh[grp, o + 3]) << 24))
                        q |= np.int32((mask >> (r * 4 + i % 4)) & 1) << 4
                    isum += q * _i8(xq[t, b * 32 + i])
                dw = luts[0, d[grp, b * 8 + r]]
                off = luts[0, m[grp, b * 8 + r]] if has_m else dw * np.float32(-16.0 if five else -8.0)
                acc = simd.fma1(np.float32(isum), dw * xd[t, b], acc)
                mo = simd.fma1(off, xs[t, b], mo)
            out[t, n] = acc + mo


# The row-major kinds run only here: on the SIMD paths the backend regroups every quantized matrix
# (layout.interleave8) and the interleaved kernels below take them.
rows_q8_0 = _q8_0_portable
rows_q45 = _q45_portable
rows_k45 = _k45_portable
rows_q6_k = _q6_k_portable


# -- interleaved Q4_0/Q4_1/Q5_0/Q5_1 (layout.interleave8): eight rows per vector ------------
#
# One 32-byte vector holds the same four elements of eight rows, so a u8 x s8 dot product against four
# activation bytes broadcast to every lane gives eight rows' partial sums at once: eight of them make the
# block's exact integer sums for eight rows (no horizontal sum), and the float work per block is one
# vector for eight rows: acc = fma(float(isum), d_w * d_x, acc), mo = fma(offset_w, s_x, mo), with the
# eight rows' scales loaded as one vector. Every output element is this chain over blocks in order,
# whatever the batch: decode takes one token in registers, batches take up to X8_TOKENS tokens per pass
# over a group's blocks (each block decoded once for all of them, accumulators in a small scratch).
# Tile shape: 8 rows (the eight 32-bit lanes of a ymm register) x up to 32 tokens. The loop over tokens
# holds only the block's eight weight vectors and a few temporaries in registers (the accumulators live
# in the scratch, an L1 load and store per token and block), so the same shape fits AVX2's 16 vector
# registers and AVX-512's 32 without spills, on both paths and for every weight type (Q4_K/Q5_K read
# their weights from a byte scratch instead, Q6_K straight from its unpacked layout). 32 tokens keep the
# scratch (1 KiB) in L1 and the tokens' activation rows (32 K bytes) in L1 or L2 while a group's blocks
# stream past.
X8_TOKENS = 32


def dot8(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    """sum_v u8x32 w_v . s8x32 x_v -> s32x8 (exact): vpdpbusd chains on vnni; vpmaddubsw pairs summed in
    16 bits (at most 4 x 2 x 31 x 127 < 2**15) then vpmaddwd on avx2."""


@overload(dot8, inline="always")
def _dot8(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    if path_of(isa) == "vnni":
        def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
            a = simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.zero32(), w0, x0), w1, x1), w2, x2), w3, x3)
            b = simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.dpbusd(simd.zero32(), w4, x4), w5, x5), w6, x6), w7, x7)
            return simd.add32(a, b)
        return impl

    def impl(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
        a = simd.add16(simd.add16(simd.maddubs(w0, x0), simd.maddubs(w1, x1)),
                       simd.add16(simd.maddubs(w2, x2), simd.maddubs(w3, x3)))
        b = simd.add16(simd.add16(simd.maddubs(w4, x4), simd.maddubs(w5, x5)),
                       simd.add16(simd.maddubs(w6, x6), simd.maddubs(w7, x7)))
        return simd.add32(simd.madd(a, simd.ones16()), simd.madd(b, simd.ones16()))
    return impl


@njit(inline="always", cache=True)
def _x8_high(five, w, mask):
    # a vector of low nibbles, with the fifth bits of a Q5 type from its 32-bit mask
    if five:
        return simd.or_(w, simd.bits_to_bytes(mask, np.uint8(16)))
    return w


@njit(inline="always", cache=True)
def _x8_store(out, t, n, N, v, res):
    # out[t, n : n + 8] = v, lanes past the last row N dropped
    if n + 8 <= N:
        simd.storef8(out, t * N + n, v)
    else:
        simd.storef8(res, 0, v)
        for i in range(N - n):
            out[t, n + i] = res[i]


@njit(cache=True, fastmath=EXACT)
def _x8_simd(isa, kind, qs, qh, d, m, luts, xq, xd, xs, out, n0, n1):
    T, K = xq.shape
    N = out.shape[1]
    nb = K // 32
    five = kind >= 12
    has_m = kind == 11 or kind == 13
    offk = simd.splatf(np.float32(-16.0 if five else -8.0))
    qh32 = qh.reshape(qh.size).view(np.uint32)
    res = np.empty(8, np.float32)
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
                isum = dot8(isa, _x8_high(five, simd.low4(v0), simd.ld(qh32, o * 8)),
                            _x8_high(five, simd.low4(v1), simd.ld(qh32, o * 8 + 1)),
                            _x8_high(five, simd.low4(v2), simd.ld(qh32, o * 8 + 2)),
                            _x8_high(five, simd.low4(v3), simd.ld(qh32, o * 8 + 3)),
                            _x8_high(five, simd.shr4(v0), simd.ld(qh32, o * 8 + 4)),
                            _x8_high(five, simd.shr4(v1), simd.ld(qh32, o * 8 + 5)),
                            _x8_high(five, simd.shr4(v2), simd.ld(qh32, o * 8 + 6)),
                            _x8_high(five, simd.shr4(v3), simd.ld(qh32, o * 8 + 7)),
                            simd.bcast4(xq, b * 32), simd.bcast4(xq, b * 32 + 4), simd.bcast4(xq, b * 32 + 8),
                            simd.bcast4(xq, b * 32 + 12), simd.bcast4(xq, b * 32 + 16), simd.bcast4(xq, b * 32 + 20),
                            simd.bcast4(xq, b * 32 + 24), simd.bcast4(xq, b * 32 + 28))
                dw = simd.loadf8(d, o * 8)
                off = simd.loadf8(m, o * 8) if has_m else simd.mul8(dw, offk)
                acc = simd.fma8(simd.cvt8(isum), simd.mul8(dw, simd.splatf(simd.ld(xd, b))), acc)
                mo = simd.fma8(off, simd.splatf(simd.ld(xs, b)), mo)
            _x8_store(out, 0, grp * 8, N, simd.add8(acc, mo), res)
        return
    acc = np.empty(X8_TOKENS * 8, np.float32)
    mos = np.empty(X8_TOKENS * 8, np.float32)
    for grp in range(n0 // 8, (n1 + 7) // 8):
        for t0 in range(0, T, X8_TOKENS):
            t1 = min(T, t0 + X8_TOKENS)
            acc[:] = 0
            mos[:] = 0
            for b in range(nb):
                o = grp * nb + b
                v0 = simd.load32(qs, o * 128)
                v1 = simd.load32(qs, o * 128 + 32)
                v2 = simd.load32(qs, o * 128 + 64)
                v3 = simd.load32(qs, o * 128 + 96)
                w0 = _x8_high(five, simd.low4(v0), simd.ld(qh32, o * 8))
                w1 = _x8_high(five, simd.low4(v1), simd.ld(qh32, o * 8 + 1))
                w2 = _x8_high(five, simd.low4(v2), simd.ld(qh32, o * 8 + 2))
                w3 = _x8_high(five, simd.low4(v3), simd.ld(qh32, o * 8 + 3))
                w4 = _x8_high(five, simd.shr4(v0), simd.ld(qh32, o * 8 + 4))
                w5 = _x8_high(five, simd.shr4(v1), simd.ld(qh32, o * 8 + 5))
                w6 = _x8_high(five, simd.shr4(v2), simd.ld(qh32, o * 8 + 6))
                w7 = _x8_high(five, simd.shr4(v3), simd.ld(qh32, o * 8 + 7))
                dw = simd.loadf8(d, o * 8)
                off = simd.loadf8(m, o * 8) if has_m else simd.mul8(dw, offk)
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
            for t in range(t0, t1):
                j = (t - t0) * 8
                _x8_store(out, t, grp * 8, N, simd.add8(simd.loadf8(acc, j), simd.loadf8(mos, j)), res)


overload(rows_x8)(_by_path(_x8_portable, _x8_simd))


# -- interleaved Q4_K/Q5_K/Q6_K (layout._k8): eight rows per vector ----------------------------------
#
# As for the legacy types, each vector holds four elements of eight rows; the sub-block scales are
# applied in the integer domain to eight rows at once (vpmulld with the rows' scales widened to 32 bits),
# the mins from the activation's sums per 32, and one float FMA per 256 elements per eight rows:
#   Q4_K/Q5_K  acc = fma(float(sum_j sc_j dot_j), d d_x, acc), mo = fma(float(sum_j min_j xsum_j), dmin d_x, mo)
#   Q6_K       acc = fma(float(sum_j sc_j (dot_j - 32 xsum16_j)), d d_x, acc)   (q stored unsigned, 0..63)
# Q4_K/Q5_K weights are unpacked once per row group into a scratch of bytes (8 K of them), which every
# token then reads; Q6_K's are stored unpacked. One code path for every batch size: the same bits.


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
                if kind == 16:
                    for j in range(16):
                        dot = np.int32(0)
                        for i in range(16):
                            e = j * 16 + i
                            dot += np.int32(qs[grp, ((sb * 64 + e // 4) * 8 + r) * 4 + e % 4]) * _i8(xq[t, sb * 256 + e])
                        isum += _i8(sc[grp, (sb * 16 + j) * 8 + r]) * (dot - 32 * xb16[t, sb * 16 + j])
                else:
                    for j in range(8):
                        dot = np.int32(0)
                        for l in range(32):
                            b = qs[grp, (((sb * 4 + j // 2) * 8 + l // 4) * 8 + r) * 4 + l % 4]
                            q = np.int32(b & 15) if j % 2 == 0 else np.int32(b >> 4)
                            if kind == 15:
                                q |= np.int32((qh[grp, ((sb * 8 + l // 4) * 8 + r) * 4 + l % 4] >> j) & 1) << 4
                            dot += q * _i8(xq[t, sb * 256 + j * 32 + l])
                        isum += np.int32(sc[grp, (sb * 16 + j) * 8 + r]) * dot
                        msum += np.int32(sc[grp, (sb * 16 + 8 + j) * 8 + r]) * xb[t, sb * 8 + j]
                dx = xd[t, sb]
                acc = simd.fma1(np.float32(isum), luts[0, d[grp, sb * 8 + r]] * dx, acc)
                if kind != 16:
                    mo = simd.fma1(np.float32(msum), luts[0, m[grp, sb * 8 + r]] * dx, mo)
            out[t, n] = acc - mo if kind != 16 else acc


@njit(cache=True, fastmath=EXACT)
def _kx8_simd(isa, kind, qs, qh, sc, d, m, luts, xq, xd, xb, xb16, out, n0, n1):
    T, K = xq.shape
    N = out.shape[1]
    nsb = K // 256
    res = np.empty(8, np.float32)
    ws = np.empty(8 * K if kind != 16 else 0, np.uint8)  # a row group's Q4_K/Q5_K weights as bytes
    for grp in range(n0 // 8, (n1 + 7) // 8):
        if kind != 16:  # unpack: sub-block j, vector v at ((sb * 8 + j) * 8 + v) * 32
            for sb in range(nsb):
                for p in range(4):
                    for v in range(8):
                        o = (((grp * nsb + sb) * 4 + p) * 8 + v) * 32
                        simd.prefetch(qs, o + PREFETCH)
                        b = simd.load32(qs, o)
                        lo = simd.low4(b)
                        hi = simd.shr4(b)
                        if kind == 15:
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
                if kind == 16:
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
            _x8_store(out, t, grp * 8, N, simd.sub8(acc, mo) if kind != 16 else acc, res)


overload(rows_kx8)(_by_path(_kx8_portable, _kx8_simd))


# -- interleaved Q8_0 (layout._q8_8): eight rows per vector, signed weights by the sign trick ---------


def dot8s(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    """sum_v s8x32 w_v . s8x32 x_v -> s32x8 (exact), as |w| . (x with the sign of w): vpdpbusd chains on
    vnni; on avx2 each vpmaddubsw widened by vpmaddwd at once (two of them can pass 2**15)."""


@overload(dot8s, inline="always")
def _dot8s(isa, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    if path_of(isa) == "vnni":
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
def _q8x8_portable(isa, qs, d, luts, xq, xd, out, n0, n1):
    # one row and one token at a time, the SIMD path's arithmetic lane by lane (the same bits)
    T, K = xq.shape
    nb = K // 32
    for n in range(n0, n1):
        grp = n // 8
        r = n % 8
        for t in range(T):
            acc = np.float32(0.0)
            for b in range(nb):
                isum = np.int32(0)
                for i in range(32):
                    isum += _i8(qs[grp, ((b * 8 + i // 4) * 8 + r) * 4 + i % 4]) * _i8(xq[t, b * 32 + i])
                acc = simd.fma1(np.float32(isum), luts[0, d[grp, b * 8 + r]] * xd[t, b], acc)
            out[t, n] = acc


@njit(cache=True, fastmath=EXACT)
def _q8x8_simd(isa, qs, d, luts, xq, xd, out, n0, n1):
    T, K = xq.shape
    N = out.shape[1]
    nb = K // 32
    res = np.empty(8, np.float32)
    acc = np.empty(X8_TOKENS * 8, np.float32)
    for grp in range(n0 // 8, (n1 + 7) // 8):
        for t0 in range(0, T, X8_TOKENS):
            t1 = min(T, t0 + X8_TOKENS)
            acc[: (t1 - t0) * 8] = 0
            for b in range(nb):
                o = (grp * nb + b) * 256
                simd.prefetch(qs, o + PREFETCH)
                simd.prefetch(qs, o + 64 + PREFETCH)
                simd.prefetch(qs, o + 128 + PREFETCH)
                simd.prefetch(qs, o + 192 + PREFETCH)
                w0 = simd.load32(qs, o)
                w1 = simd.load32(qs, o + 32)
                w2 = simd.load32(qs, o + 64)
                w3 = simd.load32(qs, o + 96)
                w4 = simd.load32(qs, o + 128)
                w5 = simd.load32(qs, o + 160)
                w6 = simd.load32(qs, o + 192)
                w7 = simd.load32(qs, o + 224)
                dw = simd.loadf8(d, (grp * nb + b) * 8)
                for t in range(t0, t1):
                    xo = t * K + b * 32
                    isum = dot8s(isa, w0, w1, w2, w3, w4, w5, w6, w7,
                                 simd.bcast4(xq, xo), simd.bcast4(xq, xo + 4), simd.bcast4(xq, xo + 8),
                                 simd.bcast4(xq, xo + 12), simd.bcast4(xq, xo + 16), simd.bcast4(xq, xo + 20),
                                 simd.bcast4(xq, xo + 24), simd.bcast4(xq, xo + 28))
                    j = (t - t0) * 8
                    simd.storef8(acc, j, simd.fma8(simd.cvt8(isum), simd.mul8(dw, simd.splatf(simd.ld(xd, t * nb + b))),
                                                   simd.loadf8(acc, j)))
            for t in range(t0, t1):
                _x8_store(out, t, grp * 8, N, simd.loadf8(acc, (t - t0) * 8), res)


overload(rows_q8x8)(_by_path(_q8x8_portable, _q8x8_simd))

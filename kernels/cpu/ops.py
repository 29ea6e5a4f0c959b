"""Numba kernels for everything but the weight matmuls and attention: norms, RoPE, KV writes, activations."""

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from . import simd
from . import kv_blocks, kv_rotation
from .halves import F16_TO_F32, f32_to_f16_bits  # noqa: F401  (the kernels' half-float conversions)

# KV cache storage, per layer (n_slots, KVH, row), one of:
#   float32 values; float16 bit patterns (uint16); or q8_0 (int8): a row of D values is D int8 quants
#   (blocks of 32) followed by the D/32 blocks' float16 scales as little-endian byte pairs, D + D/16
#   bytes in all, 1.0625 bytes per value (llama.cpp's q8_0 block: 34 bytes per 32 values); or bf16 or a 4- or
#   5-bit type, each in a record type of its own (kv_blocks.py).
Q8_KV_BLOCK = 32


def kv_load(cache, slot, g, i):
    """cache[slot, g, i] as float32, whatever the cache's storage (float32, float16 bits, q8_0, kv_blocks')."""


@njit(inline="always", cache=True)
def _q8_scale(cache, row, b):
    # the float16 scale of block b of the q8_0 row starting at flat index `row`, as float32
    at = row + cache.shape[2] * 16 // 17 + 2 * b
    return F16_TO_F32[(np.int64(cache.flat[at]) & 0xFF) | ((np.int64(cache.flat[at + 1]) & 0xFF) << 8)]


@overload(kv_load, inline="always")
def _kv_load(cache, slot, g, i):
    if name := kv_blocks.record_name(cache.dtype):
        load = kv_blocks.loader(name)

        def impl(cache, slot, g, i):
            return load(cache, slot, g, i)
    elif cache.dtype == types.uint16:
        def impl(cache, slot, g, i):
            return F16_TO_F32[cache[slot, g, i]]
    elif cache.dtype == types.int8:
        def impl(cache, slot, g, i):
            row = (slot * cache.shape[1] + g) * cache.shape[2]
            return np.float32(cache[slot, g, i]) * _q8_scale(cache, row, i // Q8_KV_BLOCK)
    else:
        def impl(cache, slot, g, i):
            return cache[slot, g, i]
    return impl


def kv_tiled(cache):
    """Whether attention reads a KV cache's value rows from a float32 tile they are converted into (q8_0,
    kv_blocks' formats) rather than in place (a constant where it is compiled)."""


@overload(kv_tiled, inline="always")
def _kv_tiled(cache):
    tiled = cache.dtype == types.int8 or kv_blocks.record_name(cache.dtype) is not None
    return lambda cache: tiled


def kv_quantized(cache):
    """Whether a KV cache holds quantized rows (q8_0, the 4- and 5-bit types), which llama.cpp rotates
    (kv_rotation.py; a constant where it is compiled)."""


def quantized_rows(dtype) -> bool:
    """kv_quantized's answer for a cache of this Numba element type (at typing time)."""
    return dtype == types.int8 or kv_blocks.record_name(dtype) not in (None, "bf16")


@overload(kv_quantized, inline="always")
def _kv_quantized(cache):
    quantized = quantized_rows(cache.dtype)
    return lambda cache: quantized


def kv_value_to_tile(vt, o, cache, slot, g):
    """For a tiled cache (kv_tiled): vt[o : o + Dv] = the value row cache[slot, g] dequantized (float32), once
    per key tile for every query row that reads it. Nothing for float caches, read in place (kv_value8)."""


@overload(kv_value_to_tile, inline="always")
def _kv_value_to_tile(vt, o, cache, slot, g):
    if name := kv_blocks.record_name(cache.dtype):
        read_row, per_row = kv_blocks.row_reader(name), kv_blocks.values_per_row(name)

        def impl(vt, o, cache, slot, g):
            read_row(cache, slot, g, per_row(cache.shape[2]), vt, o)
    elif cache.dtype == types.int8:
        def impl(vt, o, cache, slot, g):
            D = cache.shape[2] * 16 // 17
            row = (slot * cache.shape[1] + g) * cache.shape[2]
            for i in range(0, D, 8):
                simd.storef8(vt, o + i, kv_key8(cache, row, i))
    else:
        def impl(vt, o, cache, slot, g):
            pass
    return impl


def kv_value8(vt, o, cache, row, c):
    """Values c .. c+7 of a key's value row as f32x8: from the dequantized tile (vt at o) for a tiled cache,
    else from the cache row starting at flat index `row`."""


@overload(kv_value8, inline="always")
def _kv_value8(vt, o, cache, row, c):
    if cache.dtype == types.int8 or kv_blocks.record_name(cache.dtype):
        def impl(vt, o, cache, row, c):
            return simd.loadf8(vt, o + c)
    else:
        def impl(vt, o, cache, row, c):
            return simd.loadf8(cache, row + c)  # float32, or float16 bits widened as they load
    return impl


def kv_key8(cache, row, d):
    """Keys d .. d+7 (d a multiple of 8) of the KV row starting at flat index `row`, as f32x8: float32,
    float16 bits widened (vcvtph2ps), or q8_0 quants times their block's scale. Exact conversions: the
    same values kv_load gives one at a time."""


@overload(kv_key8, inline="always")
def _kv_key8(cache, row, d):
    if cache.dtype == types.int8:
        def impl(cache, row, d):
            s = _q8_scale(cache, row, d // Q8_KV_BLOCK)
            return simd.mul8(simd.cvt8(simd.widen8s(cache, row + d)), simd.splatf(s))
    else:
        def impl(cache, row, d):
            return simd.loadf8(cache, row + d)
    return impl


def kv_keys_to_tile(kt, tmp, cache, slots, g, D, j0, j1, stride):
    """kt[d * stride + j] = key d of cache[slots[j], g] as float32 for the keys j in [j0, j1) of a tile, d < D
    (a multiple of 8; stride, the tile's width, a multiple of 8 as well: the groups of eight fill whole rows). Float and q8_0 rows: eight keys at a time, each 8 x 8 block of values transposed in
    registers (simd.transpose8), a key of the eight outside [j0, j1) standing in for by the nearest inside
    (columns the caller masks); kv_blocks' formats: a key's row at a time, read whole into tmp (D values at
    least), then spread to its strided places."""


@overload(kv_keys_to_tile, inline="always")
def _kv_keys_to_tile(kt, tmp, cache, slots, g, D, j0, j1, stride):
    if name := kv_blocks.record_name(cache.dtype):
        read_row = kv_blocks.row_reader(name)

        def impl(kt, tmp, cache, slots, g, D, j0, j1, stride):
            for j in range(j0, j1):
                read_row(cache, slots[j], g, D, tmp, 0)
                for d in range(D):
                    kt[d * stride + j] = tmp[d]
        return impl

    def impl(kt, tmp, cache, slots, g, D, j0, j1, stride):
        n = cache.shape[1] * cache.shape[2]  # flat elements per slot
        o = g * cache.shape[2]
        for jg in range(j0 // 8 * 8, j1, 8):
            r0, r1 = _key_row(slots, jg, j0, j1, n, o), _key_row(slots, jg + 1, j0, j1, n, o)
            r2, r3 = _key_row(slots, jg + 2, j0, j1, n, o), _key_row(slots, jg + 3, j0, j1, n, o)
            r4, r5 = _key_row(slots, jg + 4, j0, j1, n, o), _key_row(slots, jg + 5, j0, j1, n, o)
            r6, r7 = _key_row(slots, jg + 6, j0, j1, n, o), _key_row(slots, jg + 7, j0, j1, n, o)
            for d in range(0, D, 8):
                c0, c1, c2, c3, c4, c5, c6, c7 = simd.transpose8(
                    kv_key8(cache, r0, d), kv_key8(cache, r1, d), kv_key8(cache, r2, d), kv_key8(cache, r3, d),
                    kv_key8(cache, r4, d), kv_key8(cache, r5, d), kv_key8(cache, r6, d), kv_key8(cache, r7, d))
                at = d * stride + jg
                simd.storef8(kt, at, c0)
                simd.storef8(kt, at + stride, c1)
                simd.storef8(kt, at + 2 * stride, c2)
                simd.storef8(kt, at + 3 * stride, c3)
                simd.storef8(kt, at + 4 * stride, c4)
                simd.storef8(kt, at + 5 * stride, c5)
                simd.storef8(kt, at + 6 * stride, c6)
                simd.storef8(kt, at + 7 * stride, c7)
    return impl


@njit(inline="always", cache=True)
def _key_row(slots, j, j0, j1, n, o):
    # the flat index of key j's row (a key outside [j0, j1): the nearest inside)
    return slots[min(max(j, j0), j1 - 1)] * n + o


def kv_put_head(cache, slot, g, x, t, n):
    """cache[slot, g] = x[t, g] (x float32 (T, KVH, D), or already in the cache's storage type):
    converted to float16 bits for a float16 cache (rounded as numpy's astype(float16) rounds), quantized
    to q8_0 blocks for an int8 cache (as llama.cpp's reference quantize_row_q8_0: d = amax / 127 stored
    as float16, q = round-half-away(x / d) with the float32 d); kv_blocks' formats as its writer writes them.
    n: a quantized row is first rotated in chunks of n values (kv_rotation; 0: not)."""


@overload(kv_put_head)
def _kv_put_head(cache, slot, g, x, t, n):
    name = kv_blocks.record_name(cache.dtype)
    if name or cache.dtype == types.int8:
        put = kv_blocks.writer(name) if name else _put_q8_0

        def impl(cache, slot, g, x, t, n):
            row = np.empty(x.shape[2], np.float32)
            if n:
                kv_rotation.fwht(x[t, g], row, n)
            else:
                row[:] = x[t, g]
            put(cache, slot, g, row)
    elif cache.dtype == types.uint16 and isinstance(x.dtype, types.Float):
        def impl(cache, slot, g, x, t, n):
            for i in range(x.shape[2]):
                cache[slot, g, i] = f32_to_f16_bits(x[t, g, i])
    else:
        def impl(cache, slot, g, x, t, n):
            for i in range(x.shape[2]):
                cache[slot, g, i] = x[t, g, i]
    return impl


@njit(inline="always", nogil=True, cache=True)
def _put_q8_0(cache, slot, g, row):
    # the row (D,) as q8_0 quants then the blocks' float16 scales (see kv_put_head)
    D = row.shape[0]
    for b in range(D // Q8_KV_BLOCK):
        amax = np.float32(0.0)
        for i in range(b * Q8_KV_BLOCK, (b + 1) * Q8_KV_BLOCK):
            amax = max(amax, abs(row[i]))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        bits = f32_to_f16_bits(d)
        cache[slot, g, D + 2 * b] = np.int8(np.int64(bits & 0xFF) - (256 if bits & 0x80 else 0))
        hi = np.int64(bits >> 8)
        cache[slot, g, D + 2 * b + 1] = np.int8(hi - (256 if hi & 0x80 else 0))
        for i in range(b * Q8_KV_BLOCK, (b + 1) * Q8_KV_BLOCK):
            v = row[i] * inv
            q = math.floor(abs(v) + 0.5)  # roundf: halves away from zero
            cache[slot, g, i] = np.int8(q if v >= 0 else -q)


# Strict IEEE arithmetic (no fast-math) in the row functions: then a row function computes the same
# bits whether LLVM inlines it into a parallel region or the compiled step calls it in a serial loop,
# so the per-op reference and the compiled step agree exactly (with contraction or reassociation
# allowed, the two contexts were measured to differ by an ulp, which int8 rounding then amplifies).

# Row-wise ops come as a row function (`*_row`, one row r or token t) and a parallel kernel over all
# rows that calls it: the compiled step (step.py) runs the row functions in a plain loop when a batch
# has so few rows that a parallel region's launch would cost more than the work.


@njit(nogil=True, cache=True)
def rmsnorm_row(x, w, eps, out, r):
    # row r: x[r] (D,) * w (D,) / rms(x[r]) -> out[r]; out may alias x
    D = x.shape[1]
    lanes = np.zeros(8, np.float32)  # eight interleaved partial sums: vectorizable in a fixed order
    for i in range(D // 8 * 8):
        lanes[i % 8] += x[r, i] * x[r, i]
    for i in range(D // 8 * 8, D):
        lanes[i % 8] += x[r, i] * x[r, i]
    ss = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    inv = np.float32(1.0) / np.sqrt(ss / D + eps)
    for i in range(D):
        out[r, i] = x[r, i] * inv * w[i]


@njit(parallel=True, nogil=True, cache=True)
def rmsnorm(x, w, eps, out):
    # x (R, D) * w (D,) / rms(x) -> out (R, D); out may alias x
    for r_ in prange(x.shape[0]):
        r = np.int64(r_)  # prange counts in uint64: one row function for both loops
        rmsnorm_row(x, w, eps, out, r)


@njit(parallel=True, nogil=True, cache=True)
def rope(x, positions, inv_freq, neox, mscale=1.0):
    # x (T, H, D) rotated in place; positions (T,) int; inv_freq (n_rot/2,): angle = pos * inv_freq[i].
    # neox: pairs (i, i + n_rot/2) (GPT-NeoX, Gemma); else adjacent pairs (2i, 2i+1) (llama.cpp's llama).
    # mscale: cos and sin multiplied by it (llama.cpp's rope attn_factor: LongRoPE files set it)
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        rope_row(x, positions, inv_freq, neox, t, mscale)


@njit(nogil=True, cache=True)
def rope_row(x, positions, inv_freq, neox, t, mscale=1.0):
    # token t of x (T, H, D), rotated in place (see rope)
    H = x.shape[1]
    half = inv_freq.shape[0]
    p = np.float64(positions[t])
    ms = np.float32(mscale)
    for i in range(half):
        ang = p * inv_freq[i]
        c = np.float32(math.cos(ang)) * ms
        s = np.float32(math.sin(ang)) * ms
        for h in range(H):
            if neox:
                _rotate_pair(x, t, h, i, i + half, c, s)
            else:
                _rotate_pair(x, t, h, 2 * i, 2 * i + 1, c, s)


def rotate_pair(x, t, h, i, j, c, s):
    """Elements i and j of x[t, h] rotated by the angle whose cosine and sine are c and s. Plain Python:
    compiled here for rope_row and by numba.cuda for the CUDA backend's rope, so both rotate alike."""
    a = x[t, h, i]
    b = x[t, h, j]
    x[t, h, i] = a * c - b * s
    x[t, h, j] = a * s + b * c


_rotate_pair = njit(inline="always", nogil=True, cache=True)(rotate_pair)


@njit(parallel=True, nogil=True, cache=True)
def write_kv(k, v, slot_mapping, k_cache, v_cache):
    # k (T, KVH, D), v (T, KVH, Dv) -> k_cache/v_cache (n_slots, KVH, row) at slot_mapping (T,), in the
    # cache's storage (see kv_put_head)
    for t_ in prange(k.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        write_kv_row(k, v, slot_mapping, k_cache, v_cache, t)


@njit(nogil=True, cache=True)
def write_kv_row(k, v, slot_mapping, k_cache, v_cache, t):
    # token t's k and v into their slot (see write_kv)
    s = slot_mapping[t]
    nk = kv_rotation.k_chunk(k.shape[2]) if kv_quantized(k_cache) else 0  # (llama.cpp's rotations: kv_rotation)
    nv = kv_rotation.v_chunk(v.shape[2]) if kv_quantized(v_cache) else 0
    for g in range(k.shape[1]):
        kv_put_head(k_cache, s, g, k, t, nk)
        kv_put_head(v_cache, s, g, v, t, nv)


@njit(nogil=True, cache=True)
def gated_act_row(g, u, out, gelu, t):
    # row t: act(g) * u -> out, act gelu (tanh approximation) when `gelu`, else silu
    gated_act_range(g, u, out, gelu, t, 0, g.shape[1])


@njit(nogil=True, cache=True)
def gated_act_range(g, u, out, gelu, t, i0, i1):
    # elements [i0, i1) of row t (see gated_act_row); g, u, out C-contiguous (T, F). Eight lanes at a
    # time in f32x8 (exp8 for the exponential, tanh as 1 - 2 / (e**2y + 1)); a tail shorter than eight
    # goes through the same vector code from a buffer, so every element gets the same bits wherever its
    # range starts or ends
    F = g.shape[1]
    i = i0
    while i + 8 <= i1:
        simd.storef8(out, t * F + i, _act8(simd.loadf8(g, t * F + i), simd.loadf8(u, t * F + i), gelu))
        i += 8
    if i < i1:
        buf = np.zeros(16, np.float32)
        for j in range(i1 - i):
            buf[j] = g[t, i + j]
            buf[8 + j] = u[t, i + j]
        simd.storef8(buf, 0, _act8(simd.loadf8(buf, 0), simd.loadf8(buf, 8), gelu))
        for j in range(i1 - i):
            out[t, i + j] = buf[j]


@njit(inline="always", cache=True)
def _act8(x, u, gelu):
    # act(x) * u on eight lanes: gelu (tanh approximation) for gelu 1, silu for 0; for gelu 2 gpt-oss's clamped
    # SwiGLU (ggml's swiglu_oai with llama.cpp's alpha 1.702 and limit 7): min(x, 7) sigmoid(1.702 min(x, 7)),
    # times u clamped to [-7, 7] plus 1
    one = simd.splatf(np.float32(1.0))
    if gelu == 2:
        lim = simd.splatf(SWIGLU_LIMIT)
        xc = simd.min8(x, lim)
        uc = simd.max8(simd.min8(u, lim), simd.splatf(-SWIGLU_LIMIT))
        e = simd.exp8(simd.mul8(simd.splatf(-SWIGLU_ALPHA), xc))
        return simd.mul8(simd.div8(xc, simd.add8(one, e)), simd.add8(uc, one))
    if gelu == 1:
        y = simd.mul8(simd.splatf(np.float32(math.sqrt(2.0 / math.pi))),
                      simd.add8(x, simd.mul8(simd.splatf(np.float32(0.044715)), simd.mul8(simd.mul8(x, x), x))))
        e = simd.exp8(simd.add8(y, y))
        th = simd.sub8(one, simd.div8(simd.splatf(np.float32(2.0)), simd.add8(e, one)))
        return simd.mul8(simd.mul8(simd.mul8(simd.splatf(np.float32(0.5)), x), simd.add8(one, th)), u)
    e = simd.exp8(simd.sub8(simd.splatf(np.float32(0.0)), x))
    return simd.mul8(simd.div8(x, simd.add8(one, e)), u)


@njit(parallel=True, nogil=True, cache=True)
def gated_act(g, u, out, gelu):
    # act(g) * u, (T, F) -> out (T, F); out may alias g
    for t_ in prange(g.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        gated_act_row(g, u, out, gelu, t)


def silu_mul(g, u, out):
    # silu(g) * u, (T, F) -> out (T, F)
    gated_act(g, u, out, False)


def gelu_tanh_mul(g, u, out):
    # gelu(g, tanh approximation) * u, (T, F) -> out (T, F)
    gated_act(g, u, out, True)


SWIGLU_ALPHA, SWIGLU_LIMIT = np.float32(1.702), np.float32(7.0)  # llama.cpp's, for LLM_FFN_SWIGLU_OAI_MOE


def swiglu_oai(g, u, out):
    # gpt-oss's clamped SwiGLU of g and u, (T, F) -> out (T, F) (_act8's gelu 2)
    gated_act(g, u, out, np.int64(2))


@njit(nogil=True, cache=True, fastmath=True)
def softcap(x, cap):
    # cap * tanh(x / cap), in place on x (R, V)
    R, V = x.shape
    for r in range(R):
        for i in range(V):
            x[r, i] = cap * np.tanh(x[r, i] / cap)


@njit(parallel=True, nogil=True, cache=True)
def _touch(x):
    for i in prange(x.shape[0]):
        x[i] = i


def warm_threads() -> None:
    """Start numba's thread pool (its threading layer is chosen on the first parallel call)."""
    _touch(np.empty(2, np.int64))


@njit(nogil=True, cache=True)
def add_row(x, y, r):
    # x[r] += y[r]
    for i in range(x.shape[1]):
        x[r, i] += y[r, i]


@njit(parallel=True, nogil=True, cache=True)
def sigmoid_mul_(x, g):
    """x (T, F) *= sigmoid(g) (T, F) in place, 1 / (1 + expf(-g)) one element at a time (ggml_sigmoid's
    scalar form: the same bits wherever an element sits in a batch): the gated attention's output gate."""
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] = x[t, i] * (np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-g[t, i]))))


@njit(nogil=True, cache=True)
def attn_temperature(q, positions, scale, floor):
    # q (T, H, D): each token's queries times log(floor(pos / floor) + 1) * scale + 1, in float64 then float32
    # (Llama 4's and Mistral 3's attention temperature: 1 before `floor`, the original context)
    for t in range(q.shape[0]):
        s = np.float32(np.log(np.floor(positions[t] / floor) + 1.0) * np.float64(scale) + 1.0)
        if s != np.float32(1.0):
            q[t] *= s

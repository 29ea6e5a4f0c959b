"""Paged attention, tiled over queries and keys (flash-attention style), for prefill and decode alike.

A task is a tile of queries: up to Q_TOKENS consecutive tokens of one sequence times the query heads
of one KV head (GQA: the heads sharing a K/V head share every K/V load; where there are fewer tasks than
threads, a part of them, see paged_attention). It walks the keys in tiles of
KEYS positions aligned to multiples of KEYS, read through the block table (any cache block size). Each
key tile is transposed once into a scratch (head_dim, KEYS) array (eight keys' rows at a time, as 8 x 8
blocks transposed in registers, for float and q8_0 caches), then every query row of the task
takes its scores against it (two f32x8 accumulators per row, one FMA per dimension), a running maximum
and sum (online softmax), and its P . V contribution.

Each query row's arithmetic is fixed by the row alone (its position, its window, the aligned key
tiles that intersect its range) and done in strict IEEE order with no fast-math: a token's output is
the same bits whether it comes in a 512-token prefill, a chunk of 7, or a decode step next to other
sequences, so chunked prefill and batching never change a result.

Tiles are handed to the threads alternately from the light and the heavy end (causal tiles late in a
prompt see more keys), so two halves of the task list carry about the same work.
"""

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from . import kv_blocks, kv_rotation, simd
from .halves import bf16_to_f32, f32_to_bf16_bits
from .ops import (F16_TO_F32, f32_to_f16_bits, kv_keys_to_tile, kv_load, kv_quantized, kv_tiled, kv_value8,
                  kv_value_to_tile, quantized_rows)

KEYS = 16  # key positions per tile: two f32x8 score vectors per query row
Q_TOKENS = 16  # query tokens per task: a tile of Q_TOKENS * group rows reuses each transposed key tile


@njit(nogil=True, cache=True)
def _run_end(token_seq, t):
    # the end of the run of tokens of token_seq[t]'s sequence that starts at t, at most Q_TOKENS long
    e = t + 1
    while e < token_seq.shape[0] and e - t < Q_TOKENS and token_seq[e] == token_seq[t]:
        e += 1
    return e


@njit(nogil=True, cache=True)
def _tasks(token_seq, n_kv):
    # (n, 3) int64 rows (t0, t1, g): runs of consecutive tokens of one sequence, cut into Q_TOKENS, times
    # the KV heads
    n = 0
    t = np.int64(0)  # not a literal 0: that would compile a second _run_end
    while t < token_seq.shape[0]:
        t = _run_end(token_seq, t)
        n += 1
    out = np.empty((n * n_kv, 3), np.int64)
    i = 0
    t = np.int64(0)
    while t < token_seq.shape[0]:
        e = _run_end(token_seq, t)
        for g in range(n_kv):
            out[i, 0] = t
            out[i, 1] = e
            out[i, 2] = g
            i += 1
        t = e
    return out


@njit(parallel=True, nogil=True, cache=True)
def paged_attention(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window,
                    softcap, sinks, out, threads):
    # q (T, H, D); k_cache (n_slots, KVH, D); v_cache (n_slots, KVH, Dv), float32, float16 bits
    # (uint16), q8_0 rows (int8; see ops.kv_put_head) or kv_blocks' formats; token_seq (T,) row of block_tables (S, max_blocks) for each token; positions (T,)
    # -> out (T, H, Dv). Causal: the token at position p sees its sequence's keys at positions
    # max(0, p - window + 1) .. p (window <= 0: all), read through the block table (no contiguous copy).
    # sinks (H,) float32, or empty: none; each head's attention sink (gpt-oss), a logit with no value that
    # joins the softmax's sum: the output times sum / (sum + exp(sink - max)), as llama.cpp's soft_max_ext.
    # threads: the threads the parallel loop runs on (where there are fewer tasks, a KV head's query heads are
    # split between tasks)
    T, H, D = q.shape
    KVH = k_cache.shape[1]
    Dv = out.shape[2]
    q = queries_for(q, k_cache)
    tasks = _tasks(token_seq, KVH)
    tiled = D % 8 == 0 and Dv % 8 == 0
    # fewer tasks than threads (a decode step of a model with one KV head, or two on four threads): each KV
    # head's query heads in `split` equal parts, a task each (every part reads all the keys)
    split = _split(tasks.shape[0], H // KVH, threads) if tiled else 1
    n = tasks.shape[0] * split
    for i in prange(n):
        j = i // 2 if i % 2 == 0 else n - 1 - i // 2  # light and heavy tiles alternate
        tj = j // split
        if tiled:
            _tile(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window, softcap, sinks,
                  out, tasks[tj, 0], tasks[tj, 1], tasks[tj, 2], j % split, split)
        else:
            _rows_scalar(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window, softcap,
                         sinks, out, tasks[tj, 0], tasks[tj, 1], tasks[tj, 2])


@njit(nogil=True, cache=True)
def _split(n_tasks, group, threads):
    # the largest divisor of group at most threads // n_tasks (1: none)
    best = 1
    for s in range(2, min(group, threads // max(n_tasks, 1)) + 1):
        if group % s == 0:
            best = s
    return best


def queries_for(q, k_cache):
    """The queries as llama.cpp's flash attention takes them into its dot products with keys of k_cache's type
    (the keys' vec_dot type): for a quantized K (q8_0, the 4- and 5-bit types), rotated as the keys are
    (kv_rotation), then as q8_0 values (q4_1's and q5_1's q8_1 holds the same values; llama.cpp's q8_1 sum
    term, its min times a float16 sum of the block, rounds a little differently from the exact sum here);
    bfloat16 values for bf16 keys. Float keys take q as it is (llama.cpp's decode path rounds q to float16
    for f16 keys; its prompt path does not)."""


@overload(queries_for)
def _queries_for(q, k_cache):
    if kv_blocks.record_name(k_cache.dtype) == "bf16":
        return lambda q, k_cache: bf16_values(q)
    if quantized_rows(k_cache.dtype):
        def impl(q, k_cache):
            n = kv_rotation.k_chunk(q.shape[2])
            return q8_values(kv_rotation.rotated(q, n) if n else q)
        return impl
    return lambda q, k_cache: q


@njit(nogil=True, cache=True)
def bf16_values(q):
    # q (T, H, D) rounded to bfloat16 values (as ggml's CPU from_float for BF16)
    out = np.empty_like(q)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                out[t, h, i] = bf16_to_f32(f32_to_bf16_bits(q[t, h, i]))
    return out


@njit(nogil=True, cache=True)
def q8_values(q):
    # q (T, H, D) as the values its q8_0 blocks hold: each head's row in blocks of 32, d = amax / 127 kept as a
    # float16, quants round-half-even(x * 127 / amax) (ggml's quantize_row_q8_0 on x86 and ARM, which llama.cpp's
    # flash attention runs on the queries before its q8_0 dot products), times that float16 d
    T, H, D = q.shape
    out = np.empty_like(q)
    for t in range(T):
        for h in range(H):
            for b in range(0, D, 32):
                amax = np.float32(0.0)
                for i in range(b, min(b + 32, D)):
                    amax = max(amax, abs(q[t, h, i]))
                d = F16_TO_F32[f32_to_f16_bits(amax / np.float32(127.0))]
                inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
                for i in range(b, min(b + 32, D)):
                    out[t, h, i] = np.float32(np.round(q[t, h, i] * inv)) * d
    return out


@njit(inline="always", cache=True)
def _first_key(pos, window):
    return max(0, pos - window + 1) if window > 0 else 0


@njit(nogil=True, cache=True)
def _tile(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window, softcap, sinks, out, t0,
          t1, g, part, split):
    # tokens [t0, t1) of one sequence times part `part` of `split` equal parts of KV head g's query heads, heads
    # [gq * group, (gq + 1) * group); a row's arithmetic is its own, the same bits however the heads are split
    _, H, D = q.shape
    KVH = k_cache.shape[1]
    Dv = out.shape[2]
    row_len = v_cache.shape[2]  # Dv, or a quantized row's length (its scales with its quants)
    group = H // KVH // split
    gq = g * split + part
    R = (t1 - t0) * group
    row = token_seq[t0]
    lo_all = _first_key(positions[t0], window)
    hi_all = positions[t0]
    for t in range(t0, t1):
        lo_all = min(lo_all, _first_key(positions[t], window))
        hi_all = max(hi_all, positions[t])
    kt = np.zeros(D * KEYS, np.float32)  # the key tile, transposed: kt[d * KEYS + j]
    tmp8 = np.zeros(max(D, 8), np.float32)  # a key row's values on their way into the tile (kv_blocks' formats)
    vt = np.zeros(KEYS * Dv if kv_tiled(v_cache) else 0, np.float32)  # the tile's values, dequantized (kv_tiled)
    vbase = np.zeros(KEYS, np.int64)  # flat index of the start of each key's V row in v_cache
    kslot = np.zeros(KEYS, np.int64)  # each key's cache slot
    p = np.empty(KEYS, np.float32)
    m = np.full(R, -np.inf, np.float32)
    l = np.zeros(R, np.float32)
    acc = np.zeros(R * Dv, np.float32)
    sc = np.empty(R * KEYS, np.float32)  # every row's scores against the current key tile
    fill = np.float32(-np.inf)
    for kb in range(lo_all // KEYS * KEYS, hi_all + 1, KEYS):
        j0 = max(lo_all, kb) - kb
        j1 = min(hi_all + 1, kb + KEYS) - kb
        for j in range(j0, j1):
            pos = kb + j
            slot = block_tables[row, pos // block_size] * block_size + pos % block_size
            vbase[j] = (slot * KVH + g) * row_len
            kslot[j] = slot
            kv_value_to_tile(vt, j * Dv, v_cache, slot, g)
        kv_keys_to_tile(kt, tmp8, k_cache, kslot, g, D, j0, j1, KEYS)
        _scores(q, kt, sc, t0, gq, group, R, D, scale)
        for r in range(R):
            t = t0 + r // group
            pos = positions[t]
            lo = _first_key(pos, window)
            if kb > pos or kb + KEYS <= lo:
                continue
            a = max(lo, kb) - kb  # this row's keys in the tile: [a, e)
            e = min(pos + 1, kb + KEYS) - kb
            s0 = simd.loadf8(sc, r * KEYS)
            s1 = simd.loadf8(sc, r * KEYS + 8)
            if softcap > 0:
                s0, s1 = _softcap16(s0, s1, p, softcap)
            s0 = simd.keep8(s0, 0, a, e, fill)
            s1 = simd.keep8(s1, 8, a, e, fill)
            m_old = m[r]
            m_new = max(m_old, simd.hmax8(simd.max8(s0, s1)))
            corr = simd.lane8(simd.exp8(simd.splatf(m_old - m_new)), 0)
            mv = simd.splatf(m_new)
            p0 = simd.exp8(simd.sub8(s0, mv))
            p1 = simd.exp8(simd.sub8(s1, mv))
            l[r] = l[r] * corr + simd.hsum_f(simd.add8(p0, p1))
            m[r] = m_new
            simd.storef8(p, 0, p0)
            simd.storef8(p, 8, p1)
            # acc_r = corr * acc_r + sum over keys j in [a, e) of p[j] * V_j: 64 values at a time (eight
            # independent FMA chains), then 8 at a time; each 8-value chunk is the same chain either way.
            # (Written out here, not called: an array argument costs reference counting per call.)
            cv = simd.splatf(corr)
            base = r * Dv
            c = 0
            while c + 64 <= Dv:
                o = base + c
                x0 = simd.mul8(simd.loadf8(acc, o), cv)
                x1 = simd.mul8(simd.loadf8(acc, o + 8), cv)
                x2 = simd.mul8(simd.loadf8(acc, o + 16), cv)
                x3 = simd.mul8(simd.loadf8(acc, o + 24), cv)
                x4 = simd.mul8(simd.loadf8(acc, o + 32), cv)
                x5 = simd.mul8(simd.loadf8(acc, o + 40), cv)
                x6 = simd.mul8(simd.loadf8(acc, o + 48), cv)
                x7 = simd.mul8(simd.loadf8(acc, o + 56), cv)
                for j in range(a, e):
                    pj = simd.splatf(p[j])
                    vb = vbase[j]
                    jt = j * Dv
                    x0 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c), x0)
                    x1 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c + 8), x1)
                    x2 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c + 16), x2)
                    x3 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c + 24), x3)
                    x4 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c + 32), x4)
                    x5 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c + 40), x5)
                    x6 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c + 48), x6)
                    x7 = simd.fma8(pj, kv_value8(vt, jt, v_cache, vb, c + 56), x7)
                simd.storef8(acc, o, x0)
                simd.storef8(acc, o + 8, x1)
                simd.storef8(acc, o + 16, x2)
                simd.storef8(acc, o + 24, x3)
                simd.storef8(acc, o + 32, x4)
                simd.storef8(acc, o + 40, x5)
                simd.storef8(acc, o + 48, x6)
                simd.storef8(acc, o + 56, x7)
                c += 64
            while c < Dv:
                x0 = simd.mul8(simd.loadf8(acc, base + c), cv)
                for j in range(a, e):
                    x0 = simd.fma8(simd.splatf(p[j]), kv_value8(vt, j * Dv, v_cache, vbase[j], c), x0)
                simd.storef8(acc, base + c, x0)
                c += 8
    nv = kv_rotation.v_chunk(Dv) if kv_quantized(v_cache) else 0  # rotated values: the output rotated back
    for t in range(t0, t1):
        for hh in range(group):
            r = (t - t0) * group + hh
            den = l[r]
            if sinks.shape[0] > 0:
                den += _sink_term(sinks[gq * group + hh], m[r])
            inv = np.float32(1.0) / den
            for c in range(Dv):
                out[t, gq * group + hh, c] = acc[r * Dv + c] * inv
            if nv:
                kv_rotation.fwht(out[t, gq * group + hh], out[t, gq * group + hh], nv)


@njit(inline="always", cache=True)
def _sink_term(sink, mx):
    # exp(sink - max): the sink's share of the softmax's sum, in the scale of the keys' running max
    return np.float32(math.exp(sink - mx))


@njit(inline="always", cache=True)
def _qk(q, t, h, d, k0, k1, a0, a1):
    # one query row's chains a0, a1 one step on: q[t, h, d] times the key tile's two vectors at d
    x = simd.splatf(q[t, h, d])
    return simd.fma8(x, k0, a0), simd.fma8(x, k1, a1)


@njit(inline="always", cache=True)
def _store_scores(sc, o, a0, a1, sv):
    # one query row's sixteen scores, times the scale, at sc[o:o + 16]
    simd.storef8(sc, o, simd.mul8(a0, sv))
    simd.storef8(sc, o + 8, simd.mul8(a1, sv))


@njit(nogil=True, cache=True)
def _scores(q, kt, sc, t0, g, group, R, D, scale):
    # sc[r * KEYS + j] = scale * q_r . k_j for every row r of the task: four rows at a time share each
    # load of the key tile and keep eight independent FMA chains in flight (the rest: two rows, four chains,
    # then one); each row's chain runs over d in order, the same whichever rows it is grouped with
    sv = simd.splatf(scale)
    r = 0
    while r + 4 <= R:
        ta, ha = t0 + r // group, g * group + r % group
        tb, hb = t0 + (r + 1) // group, g * group + (r + 1) % group
        tc, hc = t0 + (r + 2) // group, g * group + (r + 2) % group
        td, hd = t0 + (r + 3) // group, g * group + (r + 3) % group
        a0 = a1 = b0 = b1 = c0 = c1 = d0 = d1 = simd.splatf(np.float32(0.0))
        for d in range(D):
            k0 = simd.loadf8(kt, d * KEYS)
            k1 = simd.loadf8(kt, d * KEYS + 8)
            a0, a1 = _qk(q, ta, ha, d, k0, k1, a0, a1)
            b0, b1 = _qk(q, tb, hb, d, k0, k1, b0, b1)
            c0, c1 = _qk(q, tc, hc, d, k0, k1, c0, c1)
            d0, d1 = _qk(q, td, hd, d, k0, k1, d0, d1)
        _store_scores(sc, r * KEYS, a0, a1, sv)
        _store_scores(sc, r * KEYS + 16, b0, b1, sv)
        _store_scores(sc, r * KEYS + 32, c0, c1, sv)
        _store_scores(sc, r * KEYS + 48, d0, d1, sv)
        r += 4
    if r + 2 <= R:  # two rows: four chains
        ta, ha = t0 + r // group, g * group + r % group
        tb, hb = t0 + (r + 1) // group, g * group + (r + 1) % group
        a0 = a1 = b0 = b1 = simd.splatf(np.float32(0.0))
        for d in range(D):
            k0 = simd.loadf8(kt, d * KEYS)
            k1 = simd.loadf8(kt, d * KEYS + 8)
            a0, a1 = _qk(q, ta, ha, d, k0, k1, a0, a1)
            b0, b1 = _qk(q, tb, hb, d, k0, k1, b0, b1)
        _store_scores(sc, r * KEYS, a0, a1, sv)
        _store_scores(sc, r * KEYS + 16, b0, b1, sv)
        r += 2
    for r in range(r, R):
        t, h = t0 + r // group, g * group + r % group
        a0 = a1 = simd.splatf(np.float32(0.0))
        for d in range(D):
            a0, a1 = _qk(q, t, h, d, simd.loadf8(kt, d * KEYS), simd.loadf8(kt, d * KEYS + 8), a0, a1)
        _store_scores(sc, r * KEYS, a0, a1, sv)


@njit(nogil=True, cache=True)
def _softcap16(s0, s1, p, cap):
    # cap * tanh(s / cap) on 16 scores, lane by lane
    simd.storef8(p, 0, s0)
    simd.storef8(p, 8, s1)
    for j in range(KEYS):
        p[j] = cap * np.float32(math.tanh(p[j] / cap))
    return simd.loadf8(p, 0), simd.loadf8(p, 8)


@njit(nogil=True, cache=True)
def _rows_scalar(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window, softcap, sinks,
                 out, t0, t1, g):
    # head sizes that are not a multiple of 8: one query row at a time, one key at a time
    _, H, D = q.shape
    KVH = k_cache.shape[1]
    Dv = out.shape[2]
    group = H // KVH
    acc = np.zeros(Dv, np.float32)
    nv = kv_rotation.v_chunk(Dv) if kv_quantized(v_cache) else 0
    for t in range(t0, t1):
        pos = positions[t]
        row = token_seq[t]
        for h in range(g * group, (g + 1) * group):
            mx = np.float32(-np.inf)
            denom = np.float32(0.0)
            acc[:] = 0
            for j in range(_first_key(pos, window), pos + 1):
                slot = block_tables[row, j // block_size] * block_size + j % block_size
                s = np.float32(0.0)
                for dd in range(D):
                    s += q[t, h, dd] * kv_load(k_cache, slot, g, dd)
                s *= scale
                if softcap > 0:
                    s = softcap * np.float32(math.tanh(s / softcap))
                if s > mx:
                    corr = np.float32(math.exp(mx - s))
                    denom *= corr
                    for dd in range(Dv):
                        acc[dd] *= corr
                    mx = s
                pr = np.float32(math.exp(s - mx))
                denom += pr
                for dd in range(Dv):
                    acc[dd] += pr * kv_load(v_cache, slot, g, dd)
            if sinks.shape[0] > 0:
                denom += _sink_term(sinks[h], mx)
            for dd in range(Dv):
                out[t, h, dd] = acc[dd] / denom
            if nv:  # a quantized V's rotation undone (see _tile)
                kv_rotation.fwht(out[t, h], out[t, h], nv)

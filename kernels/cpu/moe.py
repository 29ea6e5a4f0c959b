"""Mixture-of-experts kernels: the router's choice of experts, the experts' matmuls grouped by expert, and
the weighted sum of their outputs.

A layer's FFN becomes, for tokens h (T, D) and k experts per token out of E:

1. `route`: router logits h @ R^T (R (E, D) float32), a softmax over the E experts, the k most probable
   (highest first), their probabilities as weights (renormalised to sum 1 and scaled where the model
   says so), as llama.cpp's build_moe_ffn with softmax gating;
2. `plan`: the T * k (token, slot) pairs sorted by expert (stable: by token within an expert), so each
   expert's tokens are one contiguous run of rows;
3. the gathered rows through each expert's gate/up and down matrices: `expert_matmuls` runs every
   active expert's row tasks in one parallel region (the compiled step; the per-op path calls the
   ordinary matmul once per expert): an expert's weights stream once per batch, whatever its number of
   tokens, and a decode step reads only the chosen experts' rows;
4. `combine`: out[t] = sum over slots j, in slot order, of weight[t, j] * y[t's row for slot j].

Each token's activation is quantized alone and each output element reduced in one fixed order, so a
token's result does not depend on the batch it came in, nor on whether the compiled step or the per-op
path computed it.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import simd, units


@njit(inline="always", cache=True)
def _ab(a, b, i):
    # a[i] b[i], or +0.0 past the end
    return a[i] * b[i] if i < a.shape[0] else np.float32(0.0)


@njit(nogil=True, cache=True)
def _dot8(a, b):
    # a (D,) . b (D,) in eight interleaved float32 partial sums, added pairwise: one fixed order (and no
    # scratch array: it runs once per token, for the shared expert's gate). The last step's missing
    # elements add +0.0, which changes no sum but a -0.0 (whose sign the gate's sigmoid does not see)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
    for i in range(0, a.shape[0], 8):
        s0 += _ab(a, b, i)
        s1 += _ab(a, b, i + 1)
        s2 += _ab(a, b, i + 2)
        s3 += _ab(a, b, i + 3)
        s4 += _ab(a, b, i + 4)
        s5 += _ab(a, b, i + 5)
        s6 += _ab(a, b, i + 6)
        s7 += _ab(a, b, i + 7)
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


# below this many tokens routing and combining run in a plain loop (a decode step), from it up in
# parallel; each token's arithmetic is its own either way
PAR_TOKENS = 16


@njit(nogil=True, cache=True)
def route(h, router_t, k, norm_w, w_scale, ids, wts):
    """h (T, D) float32, router_t (D, E) float32 (the router matrix transposed: one row of E weights per
    input element, so the E logits accumulate side by side in vectors, each over i in order) -> ids (T, k)
    int64: each token's k chosen experts, most probable first (ties: the lower index); wts (T, k)
    float32: their softmax probabilities, divided by their sum when norm_w, times w_scale when it is
    neither 0 nor 1."""
    T = h.shape[0]
    if T >= PAR_TOKENS:
        _route_par(h, router_t, k, norm_w, w_scale, ids, wts)
        return
    logits = np.empty(router_t.shape[1], np.float32)
    taken = np.zeros(router_t.shape[1], np.bool_)
    for t in range(T):
        _route_row(h, router_t, k, norm_w, w_scale, ids, wts, t, logits, taken)


@njit(parallel=True, nogil=True, cache=True)
def _route_par(h, router_t, k, norm_w, w_scale, ids, wts):
    for t_ in prange(h.shape[0]):
        logits = np.empty(router_t.shape[1], np.float32)
        taken = np.zeros(router_t.shape[1], np.bool_)
        _route_row(h, router_t, k, norm_w, w_scale, ids, wts, np.int64(t_), logits, taken)


@njit(nogil=True, cache=True)
def _route_row(h, router_t, k, norm_w, w_scale, ids, wts, t, logits, taken):
    # token t's experts and weights (see route); logits, taken: (E,) scratch
    _logits(h, router_t, t, logits)
    _softmax(logits)
    _pick(logits, logits[:0], k, ids, wts, t, taken)
    _weigh(wts, t, k, norm_w, w_scale)


@njit(inline="always", cache=True)
def _softmax(p):
    # p (E,) -> exp(p - max p) / their sum, in place (the sum in order)
    m = p[0]
    for e in range(1, p.shape[0]):
        m = max(m, p[e])
    s = np.float32(0.0)
    for e in range(p.shape[0]):
        p[e] = np.float32(math.exp(p[e] - m))
        s += p[e]
    for e in range(p.shape[0]):
        p[e] = p[e] / s


@njit(inline="always", cache=True)
def _pick(p, bias, k, ids, wts, t, taken):
    # token t's k experts: those of the largest p + bias (bias (E,); (0,): none), most first (ties: the lower
    # index) -> ids[t]; their p (unbiased) -> wts[t]. taken: (E,) scratch
    taken[:] = False
    for j in range(k):
        best = -1
        for e in range(p.shape[0]):
            if not taken[e] and (best < 0 or _biased(p, bias, e) > _biased(p, bias, best)):
                best = e
        taken[best] = True
        ids[t, j] = best
        wts[t, j] = p[best]


@njit(inline="always", cache=True)
def _biased(p, bias, e):
    return p[e] + bias[e] if bias.shape[0] else p[e]


@njit(inline="always", cache=True)
def _weigh(wts, t, k, norm_w, w_scale):
    # token t's k weights divided by their sum (clamped below at 6.103515625e-5, as llama.cpp; a softmax's k
    # largest sum to at least 1/E) when norm_w, times w_scale when it is neither 0 nor 1
    if norm_w:
        total = np.float32(0.0)
        for j in range(k):
            total += wts[t, j]
        total = max(total, np.float32(6.103515625e-5))
        for j in range(k):
            wts[t, j] = wts[t, j] / total
    if w_scale != 0.0 and w_scale != 1.0:
        for j in range(k):
            wts[t, j] = wts[t, j] * np.float32(w_scale)


@njit(parallel=True, nogil=True, cache=True)
def route_scored(h, router_t, k, sigmoid, bias, norm_w, w_scale, ids, wts):
    """route with llama.cpp's other gating (lfm2moe): probabilities by softmax or, where `sigmoid`, each
    expert's sigmoid; the k experts chosen by probability plus a per-expert selection bias (E,) (zeros: none),
    most first (ties: the lower index); their weights the unbiased probabilities, divided by their sum
    (clamped below at 6.103515625e-5, as llama.cpp) when norm_w, times w_scale when neither 0 nor 1."""
    E = router_t.shape[1]
    for t_ in prange(h.shape[0]):
        t = np.int64(t_)
        p = np.empty(E, np.float32)
        _logits(h, router_t, t, p)
        if sigmoid:
            for e in range(E):
                p[e] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-p[e])))
        else:
            _softmax(p)
        _pick(p, bias, k, ids, wts, t, np.empty(E, np.bool_))
        _weigh(wts, t, k, norm_w, w_scale)


@njit(parallel=True, nogil=True, cache=True)
def route_topk_softmax(h, router_t, bias, k, ids, wts):
    """gpt-oss's routing (llama.cpp's softmax_weight gating): the logits plus the router's bias (E,), the k
    largest chosen, most first (ties: the lower index), their weights a softmax over those k alone."""
    E = router_t.shape[1]
    for t_ in prange(h.shape[0]):
        t = np.int64(t_)
        p = np.empty(E, np.float32)
        _logits(h, router_t, t, p)
        for e in range(E):
            p[e] += bias[e]
        _pick(p, p[:0], k, ids, wts, t, np.empty(E, np.bool_))
        m = wts[t, 0]  # the largest: chosen first
        s = np.float32(0.0)
        for j in range(k):
            wts[t, j] = np.float32(math.exp(wts[t, j] - m))
            s += wts[t, j]
        inv = np.float32(1.0) / s
        for j in range(k):
            wts[t, j] *= inv


@njit(nogil=True, cache=True)
def _logits(h, router_t, t, logits):
    # logits[e] = h[t] . router_t[:, e]: for each expert a chain of fused multiply-adds over i in order,
    # 32 experts at a time in four f32x8 accumulators (the experts past a multiple of 8 one by one)
    D = h.shape[1]
    E = router_t.shape[1]
    E8 = E // 8 * 8
    for e0 in range(0, E8, 32):
        n = min(4, (E8 - e0) // 8)
        a0 = a1 = a2 = a3 = simd.zerof()
        for i in range(D):
            b = simd.splatf(h[t, i])
            row = i * E + e0
            a0 = simd.fma8(b, simd.loadf8(router_t, row), a0)
            if n > 1:
                a1 = simd.fma8(b, simd.loadf8(router_t, row + 8), a1)
            if n > 2:
                a2 = simd.fma8(b, simd.loadf8(router_t, row + 16), a2)
            if n > 3:
                a3 = simd.fma8(b, simd.loadf8(router_t, row + 24), a3)
        simd.storef8(logits, e0, a0)
        if n > 1:
            simd.storef8(logits, e0 + 8, a1)
        if n > 2:
            simd.storef8(logits, e0 + 16, a2)
        if n > 3:
            simd.storef8(logits, e0 + 24, a3)
    for e in range(E8, E):
        acc = np.float32(0.0)
        for i in range(D):
            acc = simd.fma1(h[t, i], router_t[i, e], acc)
        logits[e] = acc


@njit(nogil=True, cache=True)
def plan(ids, n_expert):
    """ids (T, k) -> offsets (E + 1,): expert e's rows are [offsets[e], offsets[e + 1]) of the sorted
    pairs; order (T * k,): the token of each sorted row; pos (T, k): the sorted row of (t, j)."""
    T, k = ids.shape
    offsets = np.zeros(n_expert + 1, np.int64)
    for t in range(T):
        for j in range(k):
            offsets[ids[t, j] + 1] += 1
    for e in range(n_expert):
        offsets[e + 1] += offsets[e]
    fill = offsets[:n_expert].copy()
    order = np.empty(T * k, np.int64)
    pos = np.empty((T, k), np.int64)
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            order[fill[e]] = t
            pos[t, j] = fill[e]
            fill[e] += 1
    return offsets, order, pos


@njit(nogil=True, cache=True)
def _rows(a, r0, r1):
    # rows [r0, r1) of each array of a quantized activation (rows of a 0-row stand-in stay empty)
    return a[0][r0:r1], a[1][r0:r1], a[2][r0:r1]


@njit(nogil=True, cache=True)
def _rows4(a, r0, r1):
    return a[0][r0:r1], a[1][r0:r1], a[2][r0:r1], a[3][r0:r1]


TASKS_PER_THREAD = 2


@njit(parallel=True, nogil=True, cache=True)
def expert_matmuls(experts, base, which, offsets, q8, q8k, luts, o0, o1, threads, table):
    """For every expert e with rows (offsets[e] < offsets[e + 1]): rows [offsets[e], offsets[e + 1]) of x
    (q8/q8k: x quantized, (R, K)) times expert e's matrices, in one parallel region. experts: a typed list
    of int8.as_tuple matrices, expert e's (gate, up, down) at base + 3 e + (0, 1, 2). which 0: gate -> o0
    and up -> o1 (R, F); which 2: down -> o0 (R, D)."""
    n_exp = offsets.shape[0] - 1
    n_m = 2 if which == 0 else 1
    first = np.zeros(n_exp + 1, np.int64)  # task ranges per expert
    per = np.zeros(n_exp, np.int64)
    n_out = o0.shape[1]
    active = 0
    for e in range(n_exp):
        if offsets[e + 1] > offsets[e]:
            active += 1
    # about TASKS_PER_THREAD tasks per thread over all the active experts' matrices (a multiple of 16 rows, as
    # dispatch.rows_per_task): each task starts new streams through memory, and an expert's matrix is small
    per_all = min(n_out, max(16, -(-(-(-(n_out * n_m * active) // (TASKS_PER_THREAD * threads))) // 16) * 16))
    for e in range(n_exp):
        first[e + 1] = first[e]
        if offsets[e + 1] > offsets[e]:
            per[e] = per_all
            first[e + 1] += n_m * (-(-n_out // per[e]))
    for task in prange(first[n_exp]):
        e = 0
        while first[e + 1] <= task:
            e += 1
        i = task - first[e]
        n_t = -(-n_out // per[e])
        m = i // n_t
        r = i % n_t
        w = experts[base + 3 * e + which + m]
        r0, r1 = offsets[e], offsets[e + 1]
        out = o0[r0:r1] if m == 0 else o1[r0:r1]
        units.call_rows(table[units.slot(w[0], r1 - r0)], w, _rows(q8, r0, r1), _rows4(q8k, r0, r1), luts, out, np.int64(r * per[e]),
                        np.int64(min(n_out, (r + 1) * per[e])))


@njit(nogil=True, cache=True)
def combine(y, pos, wts, out):
    """out[t] = sum_j wts[t, j] * y[pos[t, j]], j in order: y (T * k, D), pos and wts (T, k), out (T, D)."""
    if pos.shape[0] >= PAR_TOKENS:
        _combine_par(y, pos, wts, out)
    else:
        for t in range(pos.shape[0]):
            _combine_row(y, pos, wts, out, t)


@njit(parallel=True, nogil=True, cache=True)
def _combine_par(y, pos, wts, out):
    for t_ in prange(pos.shape[0]):
        _combine_row(y, pos, wts, out, np.int64(t_))


@njit(nogil=True, cache=True)
def _combine_row(y, pos, wts, out, t):
    k = pos.shape[1]
    D = y.shape[1]
    w0 = wts[t, 0]
    p0 = pos[t, 0]
    for i in range(D):
        out[t, i] = w0 * y[p0, i]
    for j in range(1, k):
        w = wts[t, j]
        p = pos[t, j]
        for i in range(D):
            out[t, i] += w * y[p, i]


@njit(nogil=True, cache=True)
def shared_gate_add(out, s, h, w_gate):
    """out[t] += sigmoid(h[t] . w_gate) * s[t]: qwen2moe's shared expert s (T, D), gated per token."""
    for t in range(out.shape[0]):
        g = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-_dot8(h[t], w_gate))))
        for i in range(out.shape[1]):
            out[t, i] += s[t, i] * g

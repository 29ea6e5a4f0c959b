"""Recurrent mixers: layers that keep a fixed-size state per sequence instead of KV.

Every kernel here runs the tokens of a batch in order, each reading and updating its own sequence's slot
of state (slots[token_seq[t]]), zeroed where the sequence starts (position 0): a prompt in chunks and a
batch of sequences give the same bits as one pass of each alone. Work is split over channels or heads,
never over tokens. Where snap[t] names a slot, the state after token t is copied there (each task its own
part): a checkpoint for prefix caching, taken in the same pass.

- shortconv, ssm_conv: the convolutions (LFM2's gated short one; Mamba2's and the delta net's), in conv.py.
- ssm_scan: Mamba2's selective state-space update (a scalar decay per head).
- gated_group_norm: Mamba2's output gate silu(z) * y and its RMS norm per group of channels.
- delta_rule: the gated delta rule (Qwen3.5's and Qwen3-Next's linear attention).
- norm_gate: the delta rule's output RMS-normed per head, times the norm's weights and silu(z).
The two scans go a token at a time, as decode does, and fast in prefill too: a task owns 32 columns of a
head's state (8 for the last few), laid out as one contiguous block (rows of those columns) that stays in L1
while the task takes the batch's tokens through it, its update and its sums over rows on whole vectors of
columns (no horizontal sums; the delta rule's sweep over a token's rows also takes the next token's sums).
A chunked form (llama.cpp's for the delta rule) would do more arithmetic for its matrix products, and give
other bits for other chunkings. Checkpoint slots (snap) are never a running sequence's slot.
"""

import math

import numpy as np
from numba import njit, prange

from . import simd
from .conv import shortconv, ssm_conv  # noqa: F401 (the recurrent mixers' kernels in one place)
from .ops import gated_act_range


@njit(inline="always", cache=True)
def _softplus(x):
    # llama.cpp's ggml_compute_softplus_f32
    return x if x > np.float32(20.0) else np.float32(math.log(np.float32(1.0) + np.float32(math.exp(x))))


@njit(parallel=True, nogil=True, cache=True)
def ssm_scan(xbc, dt, dt_bias, a, d, n_group, state, token_seq, positions, slots, snap, y):
    """Mamba2's scan. xbc (T, H P + 2 G N) C-contiguous, after the convolution: x (H heads of P, a multiple
    of 8), then B and C (G groups of N); dt (T, H) before its bias dt_bias (H,); a (H,) the decays
    (negative), d (H,) the skips; state (n_slots, H, P, N) C-contiguous, updated (copied to slot snap[t] after
    token t where that is not -1) -> y (T, H P) C-contiguous. Per head h and token: dt' = softplus(dt +
    dt_bias), s = s exp(dt' a) + dt' x B, y = s . C + d x (B and C of the head's group). A head's state is
    kept in blocks of 32 of its P channels (then of 8), each N rows of those channels (see _scan_columns)."""
    H, P, N = state.shape[1], state.shape[2], state.shape[3]
    if P % 8 or not (state.flags.c_contiguous and xbc.flags.c_contiguous and y.flags.c_contiguous):
        raise ValueError("ssm_scan takes C-contiguous arrays and heads of a multiple of 8 channels")
    if xbc.shape[1] != H * P + 2 * n_group * N or y.shape != (xbc.shape[0], H * P) or H % n_group:
        raise ValueError("ssm_scan's input, state and output disagree in shape")
    wide = P // 32
    per = wide + P % 32 // 8
    for task in prange(H * per):
        h, k = task // per, task % per
        if k < wide:
            _scan_columns(xbc, dt, dt_bias, a, d, n_group, state, token_seq, positions, slots, snap, y, h, 32 * k,
                          _FOUR)
        else:
            _scan_columns(xbc, dt, dt_bias, a, d, n_group, state, token_seq, positions, slots, snap, y, h,
                          32 * wide + 8 * (k - wide), _ONE)


# a task's vectors of eight channels (or state columns): 4, or 1 for the last few; as a tuple, whose length is
# known when the kernel compiles, so that the vectors it leaves out cost no branch in its inner loop
_FOUR, _ONE = (0, 0, 0, 0), (0,)


@njit(nogil=True, cache=True)
def _scan_columns(xbc, dt, dt_bias, a, d, n_group, state, token_seq, positions, slots, snap, y, h, p0, vectors):
    # channels [p0, p0 + 8 nv) of head h through every token in order. Their state is one contiguous block,
    # N rows of 8 nv channels (each a row of the (N, P) transposed state), so that a token's update and its
    # sums over N run on whole vectors of channels and a sequence's block stays in L1 from token to token;
    # each channel's sum over N in order, one FMA chain a vector
    T, C = xbc.shape
    H, P, N = state.shape[1], state.shape[2], state.shape[3]
    inner, nv = H * P, len(vectors)
    w = 8 * nv
    g = h // (H // n_group)
    b0, c0 = inner + g * N, inner + n_group * N + g * N
    z = simd.splatf(np.float32(0.0))
    dh = simd.splatf(d[h])
    for t in range(T):
        base = (slots[token_seq[t]] * H + h) * P * N + p0 * N
        if positions[t] == 0:
            for i in range(N):
                for u in range(nv):
                    simd.storef8(state, base + i * w + 8 * u, z)
        dts = _softplus(dt[t, h] + dt_bias[h])
        da, dv = simd.splatf(np.float32(math.exp(dts * a[h]))), simd.splatf(dts)
        xo = t * C + h * P + p0
        x0 = x1 = x2 = x3 = z
        x0 = simd.loadf8(xbc, xo)
        if nv > 1:
            x1 = simd.loadf8(xbc, xo + 8)
        if nv > 2:
            x2 = simd.loadf8(xbc, xo + 16)
        if nv > 3:
            x3 = simd.loadf8(xbc, xo + 24)
        u0, u1, u2, u3 = simd.mul8(x0, dv), simd.mul8(x1, dv), simd.mul8(x2, dv), simd.mul8(x3, dv)
        a0 = a1 = a2 = a3 = z
        bt, ct = xbc[t, b0:b0 + N], xbc[t, c0:c0 + N]
        for i in range(N):
            bn, cn = simd.splatf(bt[i]), simd.splatf(ct[i])
            o = base + i * w
            v = simd.fma8(u0, bn, simd.mul8(simd.loadf8(state, o), da))
            simd.storef8(state, o, v)
            a0 = simd.fma8(v, cn, a0)
            if nv > 1:
                v = simd.fma8(u1, bn, simd.mul8(simd.loadf8(state, o + 8), da))
                simd.storef8(state, o + 8, v)
                a1 = simd.fma8(v, cn, a1)
            if nv > 2:
                v = simd.fma8(u2, bn, simd.mul8(simd.loadf8(state, o + 16), da))
                simd.storef8(state, o + 16, v)
                a2 = simd.fma8(v, cn, a2)
            if nv > 3:
                v = simd.fma8(u3, bn, simd.mul8(simd.loadf8(state, o + 24), da))
                simd.storef8(state, o + 24, v)
                a3 = simd.fma8(v, cn, a3)
        yo = t * inner + h * P + p0
        simd.storef8(y, yo, simd.add8(a0, simd.mul8(x0, dh)))
        if nv > 1:
            simd.storef8(y, yo + 8, simd.add8(a1, simd.mul8(x1, dh)))
        if nv > 2:
            simd.storef8(y, yo + 16, simd.add8(a2, simd.mul8(x2, dh)))
        if nv > 3:
            simd.storef8(y, yo + 24, simd.add8(a3, simd.mul8(x3, dh)))
        if snap[t] >= 0:  # a prefix-cache checkpoint of these channels after this token
            to = (snap[t] * H + h) * P * N + p0 * N
            for i in range(N):
                for u in range(nv):
                    simd.storef8(state, to + i * w + 8 * u, simd.loadf8(state, base + i * w + 8 * u))


@njit(parallel=True, nogil=True, cache=True)
def gated_group_norm(y, z, w, n_group, eps, out):
    """out (T, E) = rmsnorm(silu(z) y) per group of E / n_group channels, times w (E,); y and out C-contiguous
    (out may be y), z any rows (a view of the input projection)."""
    T, E = y.shape
    per = E // n_group
    for t in prange(T):
        zt = z[t:t + 1].copy()  # C-contiguous
        gated_act_range(zt, y[t:t + 1], out[t:t + 1], False, 0, 0, E)  # silu(z) y, eight lanes at a time
        for g in range(n_group):
            ss = 0.0
            for i in range(g * per, (g + 1) * per):
                v = out[t, i]
                ss += np.float64(v) * np.float64(v)
            scale = np.float32(1.0 / math.sqrt(ss / per + eps))
            for i in range(g * per, (g + 1) * per):
                out[t, i] = out[t, i] * scale * w[i]


@njit(inline="always", cache=True)
def _l2_norm(x, eps, out):
    # llama.cpp's build_gdn_l2_norm: rms_norm(x, eps / n) / sqrt(n), the squares summed in float64
    n = x.shape[0]
    ss = 0.0
    for i in range(n):
        v = x[i] * x[i]
        ss += np.float64(v)
    fn = np.float32(n)
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(ss / n) + np.float32(eps) / fn))
    inv = np.float32(1.0) / np.float32(math.sqrt(fn))
    for i in range(n):
        out[i] = (x[i] * scale) * inv


@njit(parallel=True, nogil=True, cache=True)
def delta_rule(qkv, alpha, beta, dt_bias, a, n_kheads, interleaved, eps, state, token_seq, positions, slots, snap, y):
    """The gated delta rule. qkv (T, 2 Hk Dk + H Dv) after the convolution: q and k (Hk heads of Dk each),
    then v (H heads of Dv), C-contiguous, its q and k L2-normed in place; alpha, beta (T, H) before their
    activations; dt_bias, a (H,); state (n_slots, H, Dk, Dv) C-contiguous, each head's S (Dv a multiple of 8) in
    blocks of columns (_delta_columns), updated (copied to slot snap[t] after token t where that is not -1) ->
    y (T, H Dv) C-contiguous. Value head h reads key head h % Hk (Qwen3.5's layout), or h // (H / Hk) where
    `interleaved` (Qwen3-Next's). Per token: g = softplus(alpha + dt_bias) a, S = S exp(g),
    S += k ((v - S^T k) sigmoid(beta))^T, y = S^T q / sqrt(Dv), computed as sk = S^T k and sq = S^T q of the
    state before the token, d = (v - e sk) b, y = (e sq + d (k . q)) / sqrt(Dv), S = e S + k d^T (e = exp(g),
    b = sigmoid(beta))."""
    T = qkv.shape[0]
    H, DK, DV = state.shape[1], state.shape[2], state.shape[3]
    if DV % 8 or not (state.flags.c_contiguous and qkv.flags.c_contiguous and y.flags.c_contiguous):
        raise ValueError("delta_rule takes C-contiguous arrays and a state of a multiple of 8 columns")
    if qkv.shape[1] != 2 * n_kheads * DK + H * DV or y.shape != (T, H * DV) or H % n_kheads:
        raise ValueError("delta_rule's input, state and output disagree in shape")
    key = n_kheads * DK
    kq = np.empty((T, n_kheads), np.float32)  # k . q of the normed q and k
    eg = np.empty((T, H), np.float32)
    bt = np.empty((T, H), np.float32)
    for t in prange(T):
        for kh in range(n_kheads):
            qn, kn = qkv[t, kh * DK:(kh + 1) * DK], qkv[t, key + kh * DK:key + (kh + 1) * DK]
            _l2_norm(qn, eps, qn)
            _l2_norm(kn, eps, kn)
            s = np.float32(0.0)
            for i in range(DK):
                s += kn[i] * qn[i]
            kq[t, kh] = s
        for h in range(H):
            eg[t, h] = np.float32(math.exp(_softplus(alpha[t, h] + dt_bias[h]) * a[h]))
            bt[t, h] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-beta[t, h])))
    wide = DV // 32
    per = wide + DV % 32 // 8
    for task in prange(H * per):
        h, k = task // per, task % per
        kh = h // (H // n_kheads) if interleaved else h % n_kheads
        if k < wide:
            _delta_columns(qkv, kq, eg, bt, state, y, h, kh, 32 * k, _FOUR, key, DK, token_seq, positions, slots, snap)
        else:
            _delta_columns(qkv, kq, eg, bt, state, y, h, kh, 32 * wide + 8 * (k - wide), _ONE, key, DK, token_seq,
                           positions, slots, snap)


@njit(nogil=True, cache=True)
def _delta_columns(qkv, kq, eg, bt, state, y, h, kh, j0, vectors, key, DK, token_seq, positions, slots, snap):
    # columns [j0, j0 + 8 nv) of value head h's state through every token in order, each token's rows in one
    # sweep that also takes the next token's S^T k and S^T q where it continues the run (its sequence's next
    # token): a sequence's state block stays in L1 from token to token. The sums run over the rows in order,
    # one FMA chain per vector, in the sweep and in the first token's pass alike (the same bits wherever a
    # run is cut: chunked prefill, a batch of one token)
    T, C = qkv.shape
    H, DV = state.shape[1], state.shape[3]
    nv = len(vectors)
    w = 8 * nv  # the block's columns, its rows' stride
    scale = simd.splatf(np.float32(1.0) / np.float32(math.sqrt(np.float32(DV))))
    z = simd.splatf(np.float32(0.0))
    t = 0
    while t < T:
        s = slots[token_seq[t]]
        base = (s * H + h) * DK * DV + j0 * DK
        if positions[t] == 0:
            for i in range(DK):
                for u in range(nv):
                    simd.storef8(state, base + i * w + 8 * u, z)
        qn, kn = qkv[t, kh * DK:(kh + 1) * DK], qkv[t, key + kh * DK:key + (kh + 1) * DK]
        k0 = k1 = k2 = k3 = q0 = q1 = q2 = q3 = z
        for i in range(DK):
            o = base + i * w
            ki, qi = simd.splatf(kn[i]), simd.splatf(qn[i])
            x = simd.loadf8(state, o)
            k0, q0 = simd.fma8(x, ki, k0), simd.fma8(x, qi, q0)
            if nv > 1:
                x = simd.loadf8(state, o + 8)
                k1, q1 = simd.fma8(x, ki, k1), simd.fma8(x, qi, q1)
            if nv > 2:
                x = simd.loadf8(state, o + 16)
                k2, q2 = simd.fma8(x, ki, k2), simd.fma8(x, qi, q2)
            if nv > 3:
                x = simd.loadf8(state, o + 24)
                k3, q3 = simd.fma8(x, ki, k3), simd.fma8(x, qi, q3)
        while True:
            e, b, c = simd.splatf(eg[t, h]), simd.splatf(bt[t, h]), simd.splatf(kq[t, kh])
            vo, yo = t * C + 2 * key + h * DV + j0, (t * H + h) * DV + j0
            d0 = simd.mul8(simd.sub8(simd.loadf8(qkv, vo), simd.mul8(e, k0)), b)
            simd.storef8(y, yo, simd.mul8(simd.fma8(d0, c, simd.mul8(e, q0)), scale))
            d1 = d2 = d3 = z
            if nv > 1:
                d1 = simd.mul8(simd.sub8(simd.loadf8(qkv, vo + 8), simd.mul8(e, k1)), b)
                simd.storef8(y, yo + 8, simd.mul8(simd.fma8(d1, c, simd.mul8(e, q1)), scale))
            if nv > 2:
                d2 = simd.mul8(simd.sub8(simd.loadf8(qkv, vo + 16), simd.mul8(e, k2)), b)
                simd.storef8(y, yo + 16, simd.mul8(simd.fma8(d2, c, simd.mul8(e, q2)), scale))
            if nv > 3:
                d3 = simd.mul8(simd.sub8(simd.loadf8(qkv, vo + 24), simd.mul8(e, k3)), b)
                simd.storef8(y, yo + 24, simd.mul8(simd.fma8(d3, c, simd.mul8(e, q3)), scale))
            ks = qkv[t, key + kh * DK:key + (kh + 1) * DK]
            more = t + 1 < T and slots[token_seq[t + 1]] == s and positions[t + 1] != 0
            if more:  # S = e S + k d^T, and the next token's S^T k and S^T q of it
                qn, kn = qkv[t + 1, kh * DK:(kh + 1) * DK], qkv[t + 1, key + kh * DK:key + (kh + 1) * DK]
                k0 = k1 = k2 = k3 = q0 = q1 = q2 = q3 = z
                for i in range(DK):
                    o = base + i * w
                    kv, ki, qi = simd.splatf(ks[i]), simd.splatf(kn[i]), simd.splatf(qn[i])
                    x = simd.fma8(kv, d0, simd.mul8(simd.loadf8(state, o), e))
                    simd.storef8(state, o, x)
                    k0, q0 = simd.fma8(x, ki, k0), simd.fma8(x, qi, q0)
                    if nv > 1:
                        x = simd.fma8(kv, d1, simd.mul8(simd.loadf8(state, o + 8), e))
                        simd.storef8(state, o + 8, x)
                        k1, q1 = simd.fma8(x, ki, k1), simd.fma8(x, qi, q1)
                    if nv > 2:
                        x = simd.fma8(kv, d2, simd.mul8(simd.loadf8(state, o + 16), e))
                        simd.storef8(state, o + 16, x)
                        k2, q2 = simd.fma8(x, ki, k2), simd.fma8(x, qi, q2)
                    if nv > 3:
                        x = simd.fma8(kv, d3, simd.mul8(simd.loadf8(state, o + 24), e))
                        simd.storef8(state, o + 24, x)
                        k3, q3 = simd.fma8(x, ki, k3), simd.fma8(x, qi, q3)
            else:
                for i in range(DK):
                    o = base + i * w
                    kv = simd.splatf(ks[i])
                    simd.storef8(state, o, simd.fma8(kv, d0, simd.mul8(simd.loadf8(state, o), e)))
                    if nv > 1:
                        simd.storef8(state, o + 8, simd.fma8(kv, d1, simd.mul8(simd.loadf8(state, o + 8), e)))
                    if nv > 2:
                        simd.storef8(state, o + 16, simd.fma8(kv, d2, simd.mul8(simd.loadf8(state, o + 16), e)))
                    if nv > 3:
                        simd.storef8(state, o + 24, simd.fma8(kv, d3, simd.mul8(simd.loadf8(state, o + 24), e)))
            if snap[t] >= 0:  # a prefix-cache checkpoint of these columns after this token
                to = (snap[t] * H + h) * DK * DV + j0 * DK
                for i in range(DK):
                    for u in range(nv):
                        simd.storef8(state, to + i * w + 8 * u, simd.loadf8(state, base + i * w + 8 * u))
            t += 1
            if not more:
                break


@njit(parallel=True, nogil=True, cache=True)
def norm_gate(y, z, w, n_head, eps, out):
    """out (T, E) = rmsnorm(y) per head of E / n_head channels, times w (E / n_head,), times silu(z); y and
    out C-contiguous (out may be y), z any rows (as llama.cpp's qwen35 build_norm_gated)."""
    T, E = y.shape
    per = E // n_head
    for t in prange(T):
        zt = z[t:t + 1].copy()  # C-contiguous
        for h in range(n_head):
            ss = 0.0
            for i in range(h * per, (h + 1) * per):
                v = y[t, i] * y[t, i]
                ss += np.float64(v)
            scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(ss / per) + np.float32(eps)))
            for i in range(h * per, (h + 1) * per):
                out[t, i] = (y[t, i] * scale) * w[i - h * per]
        gated_act_range(zt, out[t:t + 1], out[t:t + 1], False, 0, 0, E)  # silu(z) * normed, eight lanes at a time

"""Recurrent mixers: layers that keep a fixed-size state per sequence instead of KV.

Every kernel here runs the tokens of a batch in order, each reading and updating its own sequence's slot
of state (slots[token_seq[t]]), zeroed where the sequence starts (position 0): a prompt in chunks and a
batch of sequences give the same bits as one pass of each alone. Work is split over channels or heads,
never over tokens. Where snap[t] names a slot, the state after token t is copied there (each task its own
part): a checkpoint for prefix caching, taken in the same pass.

- shortconv: LFM2's gated short convolution (models/parts/shortconv.py): c * conv(b * x).
- ssm_conv: Mamba2's causal depthwise convolution over x, B and C, plus its bias, then SiLU.
- ssm_scan: Mamba2's selective state-space update (a scalar decay per head), one token at a time.
- gated_group_norm: Mamba2's output gate silu(z) * y and its RMS norm per group of channels.
- delta_rule: the gated delta rule (Qwen3.5's and Qwen3-Next's linear attention), one token at a time.
- norm_gate: the delta rule's output RMS-normed per head, times the norm's weights and silu(z).
Convolution taps are added in order from 0.0, oldest first, as llama.cpp's ggml_ssm_conv.
"""

import math

import numpy as np
from numba import njit, prange

from .ops import gated_act_range

_CH = 64  # channels a task (state rows are contiguous in the channel)


@njit(parallel=True, nogil=True, cache=True)
def shortconv(bcx, w, state, token_seq, positions, slots, snap, out):
    """bcx (T, 3D) float32: b, c, x of every token; w (L, D) float32, the taps (tap L - 1 on the newest
    value); state (n_slots, L - 1, D) float32, updated; token_seq (T,) each token's sequence (a row of
    slots); positions (T,); slots (S,) int64 each sequence's state slot; snap (T,) int64: a slot to copy the
    state into after the token (a prefix-cache checkpoint), or -1 -> out (T, D) = c * conv(b * x)."""
    D = w.shape[1]
    for task in prange((D + _CH - 1) // _CH):
        c0 = task * _CH
        _conv_block(bcx, w, w[0], state, token_seq, positions, slots, snap, out, c0, min(c0 + _CH, D), True)


@njit(parallel=True, nogil=True, cache=True)
def ssm_conv(xbc, w, bias, state, token_seq, positions, slots, snap, out):
    """xbc (T, C) float32 (x, B and C of every token: a view of the input projection); w (L, C) the taps;
    bias (C,); state (n_slots, L - 1, C), updated (copied to slot snap[t] after token t where that is not
    -1) -> out (T, C) = silu(conv(xbc) + bias)."""
    C = w.shape[1]
    for task in prange((C + _CH - 1) // _CH):
        c0 = task * _CH
        _conv_block(xbc, w, bias, state, token_seq, positions, slots, snap, out, c0, min(c0 + _CH, C), False)


@njit(nogil=True, cache=True)
def _conv_block(src, w, bias, state, token_seq, positions, slots, snap, out, c0, c1, short):
    # channels [c0, c1) of every token, in one call (calls with arrays cost reference counts): the tokens of
    # a sequence in a row (a run, until another sequence's token or a sequence start) are laid end to end
    # after the state's L - 1 rows in one buffer, and each token's taps read L rows of it, so the state is
    # read and written once a run, not shifted every token. The input is b * x and the output c * conv for
    # the short convolution (src: b, c, x), xbc and silu(conv + bias) for Mamba2's (src: xbc). The inner
    # loops index rows taken as views from 0: an index LLVM cannot prove non-negative (numba wraps negative
    # ones) keeps a loop from vectorizing
    T, L, n = src.shape[0], w.shape[0], c1 - c0
    D = w.shape[1]
    wl = np.empty((L, n), np.float32)
    for i in range(L):
        wl[i] = w[i, c0:c1]
    hist = np.empty((T + L - 1, n), np.float32)
    acc = np.empty((T, n), np.float32)
    t = 0
    while t < T:
        s = slots[token_seq[t]]
        r1 = t + 1
        while r1 < T and slots[token_seq[r1]] == s and positions[r1] != 0:
            r1 += 1
        if positions[t] == 0:
            hist[:L - 1] = 0.0
        else:
            hist[:L - 1] = state[s, :, c0:c1]
        for u in range(r1 - t):
            h = hist[L - 1 + u]
            if short:
                b, x = src[t + u, c0:c1], src[t + u, 2 * D + c0:2 * D + c1]
                for j in range(n):
                    h[j] = b[j] * x[j]
            else:
                h[:] = src[t + u, c0:c1]
        for u in range(r1 - t):  # each sum in tap order from 0.0, oldest first
            a = acc[t + u]
            a[:] = 0.0
            for i in range(L):
                h, wi = hist[u + i], wl[i]
                for j in range(n):
                    a[j] += h[j] * wi[j]
            if snap[t + u] >= 0:
                state[snap[t + u], :, c0:c1] = hist[u + 1:u + L]
        state[s, :, c0:c1] = hist[r1 - t:r1 - t + L - 1]
        t = r1
    if short:
        for t in range(T):
            a, c, o = acc[t], src[t, D + c0:D + c1], out[t, c0:c1]
            for j in range(n):
                o[j] = c[j] * a[j]
        return
    bl = bias[c0:c1]
    for t in range(T):
        a = acc[t]
        for j in range(n):
            a[j] += bl[j]
    flat = acc.reshape((1, T * n))
    gated_act_range(flat, np.ones((1, T * n), np.float32), flat, False, 0, 0, T * n)  # SiLU eight lanes at a time
    for t in range(T):
        out[t, c0:c1] = acc[t]


@njit(inline="always", cache=True)
def _softplus(x):
    # llama.cpp's ggml_compute_softplus_f32
    return x if x > np.float32(20.0) else np.float32(math.log(np.float32(1.0) + np.float32(math.exp(x))))


@njit(nogil=True, cache=True, fastmath=True)
def _scan_row(st, b, c, da, xdt):
    # one row of a head's state (N,), updated: s = s da + b xdt, and s . c. A function of its own on
    # contiguous rows, with fast math, so that the update and the dot product vectorize (7x the strict loop
    # on avx512): the sum's order is the compiled loop's, the same for every token and batch
    acc = np.float32(0.0)
    for n in range(st.shape[0]):
        s = st[n] * da + b[n] * xdt
        st[n] = s
        acc += s * c[n]
    return acc


@njit(parallel=True, nogil=True, cache=True)
def ssm_scan(xbc, dt, dt_bias, a, d, n_group, state, token_seq, positions, slots, snap, y):
    """Mamba2's scan. xbc (T, H P + 2 G N) after the convolution: x (H heads of P), then B and C (G groups
    of N); dt (T, H) before its bias dt_bias (H,); a (H,) the decays (negative), d (H,) the skips; state
    (n_slots, H, P, N), updated (copied to slot snap[t] after token t where that is not -1) -> y (T, H P).
    Per head h and token: dt' = softplus(dt + dt_bias),
    s = s exp(dt' a) + dt' x B, y = s . C + d x (B and C of the head's group)."""
    T = xbc.shape[0]
    H, P, N = state.shape[1], state.shape[2], state.shape[3]
    inner = H * P
    per_group = H // n_group
    for h in prange(H):
        g = h // per_group
        b0 = inner + g * N
        c0 = inner + n_group * N + g * N
        for t in range(T):
            st = state[slots[token_seq[t]], h]
            if positions[t] == 0:
                st[:, :] = 0.0
            dts = _softplus(dt[t, h] + dt_bias[h])
            da = np.float32(math.exp(dts * a[h]))
            bv = xbc[t, b0:b0 + N]
            cv = xbc[t, c0:c0 + N]
            for p in range(P):
                xv = xbc[t, h * P + p]
                y[t, h * P + p] = _scan_row(st[p], bv, cv, da, xv * dts) + xv * d[h]
            if snap[t] >= 0:  # a prefix-cache checkpoint of the state after this token
                state[snap[t], h] = st


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


@njit(nogil=True, cache=True, fastmath=True)
def _delta_row(m, k, q, eg, v, beta):
    # one row j of a head's state (row j of the transposed S, (dk,)), updated by the gated delta rule:
    # m = m eg; d = (v_j - m . k) beta; m += d k; returns m . q. Fast math, so that each pass vectorizes
    # (the sums' order is the compiled loop's, the same for every token and batch)
    s = np.float32(0.0)
    for i in range(m.shape[0]):
        x = m[i] * eg
        m[i] = x
        s += x * k[i]
    d = (v - s) * beta
    acc = np.float32(0.0)
    for i in range(m.shape[0]):
        x = m[i] + d * k[i]
        m[i] = x
        acc += x * q[i]
    return acc


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
    then v (H heads of Dv); alpha, beta (T, H) before their activations; dt_bias, a (H,); state (n_slots,
    H, Dv, Dk), S transposed, updated (copied to slot snap[t] after token t where that is not -1) -> y (T, H Dv). Value head h reads key head h % Hk (Qwen3.5's layout),
    or h // (H / Hk) where `interleaved` (Qwen3-Next's); q and k L2-normed; per token:
    g = softplus(alpha + dt_bias) a, S = S exp(g), S += k ((v - S^T k) sigmoid(beta))^T, y = S^T q / sqrt(Dv)."""
    T = qkv.shape[0]
    H, DV, DK = state.shape[1], state.shape[2], state.shape[3]
    key = n_kheads * DK
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(DV)))
    for h in prange(H):
        kh = h // (H // n_kheads) if interleaved else h % n_kheads
        qn = np.empty(DK, np.float32)
        kn = np.empty(DK, np.float32)
        for t in range(T):
            st = state[slots[token_seq[t]], h]
            if positions[t] == 0:
                st[:, :] = 0.0
            _l2_norm(qkv[t, kh * DK:(kh + 1) * DK], eps, qn)
            _l2_norm(qkv[t, key + kh * DK:key + (kh + 1) * DK], eps, kn)
            g = _softplus(alpha[t, h] + dt_bias[h]) * a[h]
            eg = np.float32(math.exp(g))
            b = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-beta[t, h])))
            v0 = 2 * key + h * DV
            for j in range(DV):
                y[t, h * DV + j] = _delta_row(st[j], kn, qn, eg, qkv[t, v0 + j], b) * scale
            if snap[t] >= 0:  # a prefix-cache checkpoint of the state after this token
                state[snap[t], h] = st


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

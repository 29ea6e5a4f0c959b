"""Recurrent mixers: layers that keep a fixed-size state per sequence instead of KV.

Every kernel here runs the tokens of a batch in order, each reading and updating its own sequence's slot
of state (slots[token_seq[t]]), zeroed where the sequence starts (position 0): a prompt in chunks and a
batch of sequences give the same bits as one pass of each alone. Work is split over channels or heads,
never over tokens.

- shortconv: LFM2's gated short convolution (models/parts/shortconv.py): c * conv(b * x).
- ssm_conv: Mamba2's causal depthwise convolution over x, B and C, plus its bias, then SiLU.
- ssm_scan: Mamba2's selective state-space update (a scalar decay per head), one token at a time.
- gated_group_norm: Mamba2's output gate silu(z) * y and its RMS norm per group of channels.
Convolution taps are added in order from 0.0, oldest first, as llama.cpp's ggml_ssm_conv.
"""

import math

import numpy as np
from numba import njit, prange

_CH = 16  # channels a task: one vector of float32 on avx512 (state rows are contiguous in the channel)


@njit(inline="always", cache=True)
def _tap(st, w, ch, v):
    # one channel's convolution of its state st[:, ch] (oldest first) and the new value v, with the taps
    # w[:, ch] (w[-1] on the newest); the state moves on by one
    L = w.shape[0]
    acc = np.float32(0.0)
    for i in range(L - 1):
        acc += st[i, ch] * w[i, ch]
    acc += v * w[L - 1, ch]
    for i in range(L - 2):
        st[i, ch] = st[i + 1, ch]
    st[L - 2, ch] = v
    return acc


@njit(parallel=True, nogil=True, cache=True)
def shortconv(bcx, w, state, token_seq, positions, slots, out):
    """bcx (T, 3D) float32: b, c, x of every token; w (L, D) float32, the taps (tap L - 1 on the newest
    value); state (n_slots, L - 1, D) float32, updated; token_seq (T,) each token's sequence (a row of
    slots); positions (T,); slots (S,) int64 each sequence's state slot -> out (T, D) = c * conv(b * x)."""
    T = bcx.shape[0]
    D = w.shape[1]
    for task in prange((D + _CH - 1) // _CH):
        c0 = task * _CH
        c1 = min(c0 + _CH, D)
        for t in range(T):
            st = state[slots[token_seq[t]]]
            if positions[t] == 0:  # a sequence starts: nothing before it
                st[:, c0:c1] = 0.0
            for ch in range(c0, c1):
                out[t, ch] = bcx[t, D + ch] * _tap(st, w, ch, bcx[t, ch] * bcx[t, 2 * D + ch])


@njit(parallel=True, nogil=True, cache=True)
def ssm_conv(xbc, w, bias, state, token_seq, positions, slots, out):
    """xbc (T, C) float32 (x, B and C of every token: a view of the input projection); w (L, C) the taps;
    bias (C,); state (n_slots, L - 1, C), updated -> out (T, C) = silu(conv(xbc) + bias)."""
    T = xbc.shape[0]
    C = w.shape[1]
    for task in prange((C + _CH - 1) // _CH):
        c0 = task * _CH
        c1 = min(c0 + _CH, C)
        for t in range(T):
            st = state[slots[token_seq[t]]]
            if positions[t] == 0:
                st[:, c0:c1] = 0.0
            for ch in range(c0, c1):
                v = _tap(st, w, ch, xbc[t, ch]) + bias[ch]
                out[t, ch] = v / (np.float32(1.0) + np.float32(math.exp(-v)))


@njit(inline="always", cache=True)
def _softplus(x):
    # llama.cpp's ggml_compute_softplus_f32
    return x if x > np.float32(20.0) else np.float32(math.log(np.float32(1.0) + np.float32(math.exp(x))))


@njit(parallel=True, nogil=True, cache=True)
def ssm_scan(xbc, dt, dt_bias, a, d, n_group, state, token_seq, positions, slots, y):
    """Mamba2's scan. xbc (T, H P + 2 G N) after the convolution: x (H heads of P), then B and C (G groups
    of N); dt (T, H) before its bias dt_bias (H,); a (H,) the decays (negative), d (H,) the skips; state
    (n_slots, H, P, N), updated -> y (T, H P). Per head h and token: dt' = softplus(dt + dt_bias),
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
            for p in range(P):
                xv = xbc[t, h * P + p]
                xdt = xv * dts
                acc = np.float32(0.0)
                for n in range(N):
                    s = st[p, n] * da + xbc[t, b0 + n] * xdt
                    st[p, n] = s
                    acc += s * xbc[t, c0 + n]
                y[t, h * P + p] = acc + xv * d[h]


@njit(parallel=True, nogil=True, cache=True)
def gated_group_norm(y, z, w, n_group, eps, out):
    """out (T, E) = rmsnorm(silu(z) y) per group of E / n_group channels, times w (E,)."""
    T, E = y.shape
    per = E // n_group
    for t in prange(T):
        for g in range(n_group):
            ss = 0.0
            for i in range(g * per, (g + 1) * per):
                zi = z[t, i]
                v = zi / (np.float32(1.0) + np.float32(math.exp(-zi))) * y[t, i]
                out[t, i] = v
                ss += np.float64(v) * np.float64(v)
            scale = np.float32(1.0 / math.sqrt(ss / per + eps))
            for i in range(g * per, (g + 1) * per):
                out[t, i] = out[t, i] * scale * w[i]

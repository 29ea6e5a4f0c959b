"""The recurrent mixers' causal depthwise convolutions (kernels/cpu/recurrent.py has the rest and the conventions:
tokens in order through each sequence's slot of state, zeroed where a sequence starts, checkpoints by snap).

- shortconv: LFM2's gated short convolution (models/parts/shortconv.py): c * conv(b * x).
- ssm_conv: Mamba2's and the delta net's convolution over x, B and C (q, k and v), plus its bias, then SiLU.
Taps are added in order from 0.0, oldest first, as llama.cpp's ggml_ssm_conv. Checkpoint slots (snap) are never
a running sequence's slot: a run reads its slot's state as it goes.
"""

import numpy as np
from numba import njit, prange

from . import simd
from .ops import _act8

_CH = 64  # channels a task


@njit(parallel=True, nogil=True, cache=True)
def shortconv(bcx, w, state, token_seq, positions, slots, snap, out):
    """bcx (T, 3D) float32: b, c, x of every token (rows contiguous); w (L, D) float32 C-contiguous, the taps
    (tap L - 1 on the newest value); state (n_slots, L - 1, D) float32 C-contiguous, updated; token_seq (T,)
    each token's sequence (a row of slots); positions (T,); slots (S,) int64 each sequence's state slot; snap
    (T,) int64: a slot to copy the state into after the token (a prefix-cache checkpoint), or -1 -> out (T,
    D) C-contiguous = c * conv(b * x)."""
    D = w.shape[1]
    _check_conv(bcx, w, w[0], state, out, 3 * D)
    for task in prange((D + _CH - 1) // _CH):
        c0 = task * _CH
        _conv_block(bcx, w, w[0], state, token_seq, positions, slots, snap, out, c0, min(c0 + _CH, D), True)


@njit(parallel=True, nogil=True, cache=True)
def ssm_conv(xbc, w, bias, state, token_seq, positions, slots, snap, out):
    """xbc (T, C) float32 (x, B and C of every token: a view of the input projection, rows contiguous); w (L,
    C) the taps; bias (C,); state (n_slots, L - 1, C), updated (copied to slot snap[t] after token t where that
    is not -1) -> out (T, C) = silu(conv(xbc) + bias); w, state and out C-contiguous."""
    C = w.shape[1]
    _check_conv(xbc, w, bias, state, out, C)
    for task in prange((C + _CH - 1) // _CH):
        c0 = task * _CH
        _conv_block(xbc, w, bias, state, token_seq, positions, slots, snap, out, c0, min(c0 + _CH, C), False)


@njit(nogil=True, cache=True)
def _check_conv(src, w, bias, state, out, width):
    # the kernels index these arrays by flat offsets: their shapes and layouts checked first
    T, L, D = src.shape[0], w.shape[0], w.shape[1]
    if src.strides[1] != 4 or not (w.flags.c_contiguous and bias.flags.c_contiguous and state.flags.c_contiguous
                                   and out.flags.c_contiguous):
        raise ValueError("a convolution takes rows of contiguous channels and C-contiguous taps, bias, state and "
                         "output")
    if src.shape[1] != width or out.shape != (T, D) or state.shape[1:] != (L - 1, D) or bias.shape[0] < D:
        raise ValueError("a convolution's input, taps, state and output disagree in shape")


@njit(nogil=True, cache=True)
def _conv_block(src, w, bias, state, token_seq, positions, slots, snap, out, c0, c1, short):
    # channels [c0, c1) of every token: each output sums its L inputs times the taps in tap order from 0.0,
    # oldest first (a product, then a sum, each rounded), reading the inputs where they are: the tokens of
    # the run so far (a sequence's tokens in a row, until another sequence's token or a sequence start) in
    # src, the ones before it in the state (zeros where the run starts its sequence). The input is b * x and
    # the output c * conv for the short convolution (src: b, c, x), xbc and silu(conv + bias) for Mamba2's (src:
    # xbc). Eight channels at a time in vectors, the last few (a width not a multiple of 8) one at a time with
    # the same operations in the same order, their SiLU through the vector code (ops.gated_act_range's way)
    T, L = src.shape[0], w.shape[0]
    D = w.shape[1]
    rs = src.strides[0] // 4  # a token's row in src, in elements
    xo = 2 * D if short else 0  # where the convolved input starts in a row
    vend = c0 + (c1 - c0) // 8 * 8
    zero = simd.splatf(np.float32(0.0))
    one = simd.splatf(np.float32(1.0))
    buf = np.zeros(8, np.float32)
    flat = state.reshape(state.size)
    t = 0
    while t < T:
        s = slots[token_seq[t]]
        r1 = t + 1
        while r1 < T and slots[token_seq[r1]] == s and positions[r1] != 0:
            r1 += 1
        fresh = positions[t] == 0
        so = s * (L - 1) * D  # the state's first row
        for u in range(t, r1):
            for c in range(c0, vend, 8):
                a = zero
                if u - (L - 1) >= t:  # every tap's token in src
                    k0 = (u - (L - 1)) * rs + c
                    for i in range(L):
                        v = simd.loadf8(src, k0 + i * rs + xo)
                        if short:
                            v = simd.mul8(simd.loadf8(src, k0 + i * rs), v)
                        a = simd.add8(a, simd.mul8(v, simd.loadf8(w, i * D + c)))
                else:
                    for i in range(L):
                        k = u - (L - 1) + i  # this tap's token
                        if k >= t:
                            v = simd.loadf8(src, k * rs + xo + c)
                            if short:
                                v = simd.mul8(simd.loadf8(src, k * rs + c), v)
                        elif fresh:
                            v = zero
                        else:
                            v = simd.loadf8(state, so + (L - 1 - (t - k)) * D + c)
                        a = simd.add8(a, simd.mul8(v, simd.loadf8(w, i * D + c)))
                if short:
                    simd.storef8(out, u * D + c, simd.mul8(simd.loadf8(src, u * rs + D + c), a))
                else:
                    a = simd.add8(a, simd.loadf8(bias, c))
                    simd.storef8(out, u * D + c, _act8(a, one, 0))
            for c in range(vend, c1):
                x = np.float32(0.0)
                for i in range(L):
                    k = u - (L - 1) + i
                    if k >= t:
                        v1 = src[k, xo + c] * src[k, c] if short else src[k, c]
                    elif fresh:
                        v1 = np.float32(0.0)
                    else:
                        v1 = state[s, L - 1 - (t - k), c]
                    x += v1 * w[i, c]
                if short:
                    out[u, c] = src[u, D + c] * x
                else:
                    buf[0] = x + bias[c]
                    simd.storef8(buf, 0, _act8(simd.loadf8(buf, 0), one, 0))
                    out[u, c] = buf[0]
            if snap[u] >= 0:  # the state after token u: its last L - 1 inputs
                _conv_state(src, flat, snap[u] * (L - 1) * D, so, t, u + 1, fresh, c0, c1, rs, xo, short, L, D)
        _conv_state(src, flat, so, so, t, r1, fresh, c0, c1, rs, xo, short, L, D)
        t = r1


@njit(inline="always", cache=True)
def _conv_state(src, flat, to, so, t, end, fresh, c0, c1, rs, xo, short, L, D):
    # state rows at `to` of flat, the state as one vector (channels [c0, c1)) = the L - 1 inputs before token
    # `end` of the run that started at token t, whose earlier inputs are the state at `so`. In place (to == so)
    # too: row r reads row r + (end - t) of the old state, never one already written
    for r in range(L - 1):
        k = end - (L - 1) + r
        for c in range(c0, c1):
            if k >= t:
                v = src[k, xo + c] * src[k, c] if short else src[k, c]
            elif fresh:
                v = np.float32(0.0)
            else:
                v = flat[so + (L - 1 - (t - k)) * D + c]
            flat[to + r * D + c] = v

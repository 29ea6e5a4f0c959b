"""Recurrent mixers: layers that keep a fixed-size state per sequence instead of KV.

shortconv: LFM2's gated short convolution (models/parts/shortconv.py is its per-op use). Each channel is a
causal depthwise convolution of L taps over the sequence's b * x values; the sequence's last L - 1 of them
are its state, in the slot the block manager gave it, zeroed where the sequence starts (position 0). Tokens
of a batch run in order, each reading and updating its own sequence's slot, so a prompt in chunks and a
batch of sequences give the same bits as one pass of each alone. The L products are added in tap order
from 0.0, as llama.cpp's ggml_ssm_conv.
"""

import numpy as np
from numba import njit, prange

_CH = 16  # channels a task: one vector of float32 on avx512 (state rows are contiguous in the channel)


@njit(parallel=True, nogil=True, cache=True)
def shortconv(bcx, w, state, token_seq, positions, slots, out):
    """bcx (T, 3D) float32: b, c, x of every token; w (L, D) float32, the taps (tap L - 1 on the newest
    value); state (n_slots, L - 1, D) float32, updated; token_seq (T,) each token's sequence (a row of
    slots); positions (T,); slots (S,) int64 each sequence's state slot -> out (T, D) = c * conv(b * x)."""
    T = bcx.shape[0]
    L, D = w.shape
    for task in prange((D + _CH - 1) // _CH):
        c0 = task * _CH
        c1 = min(c0 + _CH, D)
        for t in range(T):
            st = state[slots[token_seq[t]]]
            if positions[t] == 0:  # a sequence starts: nothing before it
                st[:, c0:c1] = 0.0
            for ch in range(c0, c1):
                bx = bcx[t, ch] * bcx[t, 2 * D + ch]
                acc = np.float32(0.0)
                for i in range(L - 1):
                    acc += st[i, ch] * w[i, ch]
                acc += bx * w[L - 1, ch]
                for i in range(L - 2):
                    st[i, ch] = st[i + 1, ch]
                st[L - 2, ch] = bx
                out[t, ch] = bcx[t, D + ch] * acc

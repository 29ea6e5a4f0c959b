"""The structured-output mask on a logits row: llguidance's packed allowed-token bits applied as -inf.

A host kernel on both backends (the sampler reads host logits after either backend's forward pass);
the engine hands it to its grammar cache, so the constraint code itself imports no Numba."""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def mask_logits(logits, mask, vocab_size):
    """-inf on every logit whose bit in `mask` (llguidance's: bit i % 32 of word i // 32) is clear, and
    on rows past vocab_size. One pass over the words; a fully allowed word is skipped (a 262k-token
    vocabulary in about 0.1 ms, where numpy's boolean indexing took 0.45)."""
    # logits (V',) float32 in place; mask (ceil(V/32),) int32; vocab_size V
    n = logits.shape[0]
    limit = min(n, vocab_size)
    for w in range(mask.shape[0]):
        bits = np.int64(mask[w]) & 0xFFFFFFFF
        base = w * 32
        if bits == 0xFFFFFFFF and base + 32 <= limit:
            continue
        for j in range(32):
            i = base + j
            if i >= n:
                break
            if i >= limit or (bits >> j) & 1 == 0:
                logits[i] = -np.inf
    for i in range(mask.shape[0] * 32, n):
        logits[i] = -np.inf

"""ScheduledBatch -> the flat arrays of one forward pass -> logits for the sequences that sample."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..models.common import Batch
from .scheduler import ScheduledBatch


class Piece(NamedTuple):
    """One sequence's share of a forward pass: tokens at positions start.., and how many of the last of
    them get logits."""

    seq: object
    start: int
    tokens: list
    n_logits: int


def make_batch(pieces: list[Piece], block_size: int) -> Batch:
    token_ids, positions, token_seq, slots, logits_idx = [], [], [], [], []
    max_blocks = max(len(p.seq.block_table) for p in pieces)
    tables = np.zeros((len(pieces), max_blocks), np.int32)
    for i, (seq, start, tokens, n_logits) in enumerate(pieces):
        n = len(tokens)
        tables[i, : len(seq.block_table)] = seq.block_table
        pos = np.arange(start, start + n)
        bt = np.asarray(seq.block_table, np.int64)
        token_ids.extend(tokens)
        positions.append(pos)
        token_seq.append(np.full(n, i))
        slots.append(bt[pos // block_size] * block_size + pos % block_size)
        logits_idx.extend(range(len(token_ids) - n_logits, len(token_ids)))
    return Batch(token_ids, np.concatenate(positions), np.concatenate(token_seq), np.concatenate(slots), tables,
                 logits_idx)


def build_batch(sched: ScheduledBatch, block_size: int) -> tuple[Batch, list[tuple[int, int, int]]]:
    """Returns the Batch and, for each sequence that samples, (index into sched.seqs, its first logits
    row, its number of rows): one row, or k + 1 for a sequence verifying k proposed tokens."""
    pieces, sampling, row = [], [], 0
    for i, (seq, n, k) in enumerate(zip(sched.seqs, sched.num_tokens, sched.num_spec)):
        start = seq.num_computed_tokens
        tokens = seq.token_ids[start:start + n - k]
        if k:
            tokens = tokens + seq.spec.tokens[:k]
        n_logits = k + 1 if start + n - k == seq.num_tokens else 0  # the chunk reaches the end: it samples
        pieces.append(Piece(seq, start, tokens, n_logits))
        if n_logits:
            sampling.append((i, row, n_logits))
            row += n_logits
    return make_batch(pieces, block_size), sampling


class ModelRunner:
    def __init__(self, model, cache, block_size: int):
        self.model = model
        self.cache = cache
        self.block_size = block_size
        self.num_forward_tokens = 0  # counts every token computed (prefix-cache tests read it)

    def run(self, sched: ScheduledBatch) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        batch, sampling = build_batch(sched, self.block_size)
        self.num_forward_tokens += len(batch.token_ids)
        logits = self.model.forward(batch, self.cache) if len(batch.token_ids) else np.zeros((0, 0), np.float32)
        return logits, sampling

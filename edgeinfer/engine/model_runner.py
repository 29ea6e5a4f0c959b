"""ScheduledBatch -> the flat arrays of one forward pass -> logits for the sequences that sample."""

from __future__ import annotations

import numpy as np

from ..models.common import Batch
from .scheduler import ScheduledBatch


def build_batch(sched: ScheduledBatch, block_size: int) -> tuple[Batch, list[int]]:
    """Returns the Batch and, for each logits row, the index into sched.seqs it belongs to."""
    token_ids, positions, token_seq, slots, logits_idx, sampling = [], [], [], [], [], []
    max_blocks = max(len(s.block_table) for s in sched.seqs)
    tables = np.zeros((len(sched.seqs), max_blocks), np.int32)
    for i, (seq, n) in enumerate(zip(sched.seqs, sched.num_tokens)):
        start = seq.num_computed_tokens
        tables[i, : len(seq.block_table)] = seq.block_table
        pos = np.arange(start, start + n)
        bt = np.asarray(seq.block_table, np.int64)
        token_ids.extend(seq.token_ids[start:start + n])
        positions.append(pos)
        token_seq.append(np.full(n, i))
        slots.append(bt[pos // block_size] * block_size + pos % block_size)
        if start + n == seq.num_tokens:  # the chunk reaches the end: this sequence samples
            logits_idx.append(len(token_ids) - 1)
            sampling.append(i)
    batch = Batch(token_ids, np.concatenate(positions), np.concatenate(token_seq), np.concatenate(slots), tables,
                  logits_idx)
    return batch, sampling


class ModelRunner:
    def __init__(self, model, cache, block_size: int):
        self.model = model
        self.cache = cache
        self.block_size = block_size
        self.num_forward_tokens = 0  # counts every token computed (prefix-cache tests read it)

    def run(self, sched: ScheduledBatch) -> tuple[np.ndarray, list[int]]:
        batch, sampling = build_batch(sched, self.block_size)
        self.num_forward_tokens += len(batch.token_ids)
        if not sampling:
            # nothing samples this step (all prefill chunks); still compute the KV
            batch.logits_idx = np.zeros(0, np.int64)
        logits = self.model.forward(batch, self.cache) if len(batch.token_ids) else np.zeros((0, 0), np.float32)
        return logits, sampling

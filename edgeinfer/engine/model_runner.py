"""ScheduledBatch -> the flat arrays of one forward pass -> logits for the sequences that sample."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .kv_cache import KVCache
from .scheduler import ScheduledBatch


class Batch:
    """The flat arrays of one forward pass over a ragged batch of sequences.

    token_ids (T,) int64; positions (T,) int64; token_seq (T,) row of block_tables for each token;
    slot_mapping (T,) KV slot each token writes; block_tables (S, max_blocks) int32;
    logits_idx (L,) which tokens get logits (the last scheduled token of each sequence by default);
    state_slots (S,) int64 each sequence's slot of recurrent state (a hybrid model's; default: its row);
    state_snap (T,) int64 a slot the state after each token is copied to (a prefix-cache checkpoint), or -1
    (the default: none); window_slots (T,), window_tables (S, max_blocks): the same as slot_mapping and
    block_tables in the window pool of a cache that has one (KVCache.where; default: the same arrays);
    embeds: [(row, rows (n, dim))] rows given as embeddings (an image's) in place of the token ids' from that row;
    spans: [(t0, t1)] rows of one sequence that attend to each other non-causally (sequence.MediaSpan);
    lora: (T, adapters) float32 each row's scale of each of the model's LoRA adapters, or None: the model's own.
    """

    __slots__ = ("token_ids", "positions", "token_seq", "slot_mapping", "block_tables", "logits_idx", "state_slots",
                 "state_snap", "window_slots", "window_tables", "embeds", "spans", "lora")

    def __init__(self, token_ids, positions, token_seq, slot_mapping, block_tables, logits_idx, state_slots=None,
                 state_snap=None, window_slots=None, window_tables=None):
        self.token_ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        self.positions = np.ascontiguousarray(positions, dtype=np.int64)
        self.token_seq = np.ascontiguousarray(token_seq, dtype=np.int64)
        self.slot_mapping = np.ascontiguousarray(slot_mapping, dtype=np.int64)
        self.block_tables = np.ascontiguousarray(block_tables, dtype=np.int32)
        self.logits_idx = np.ascontiguousarray(logits_idx, dtype=np.int64)
        self.state_slots = np.ascontiguousarray(np.arange(len(self.block_tables)) if state_slots is None else state_slots,
                                                dtype=np.int64)
        self.state_snap = np.ascontiguousarray(np.full(len(self.token_ids), -1) if state_snap is None else state_snap,
                                               dtype=np.int64)
        self.window_slots = self.slot_mapping if window_slots is None else np.ascontiguousarray(window_slots, np.int64)
        self.window_tables = (self.block_tables if window_tables is None
                              else np.ascontiguousarray(window_tables, np.int32))
        self.embeds: list = []
        self.spans: list = []
        self.lora = None

    @classmethod
    def prefix(cls, token_ids, n_blocks: int, logits_idx) -> "Batch":
        """One sequence's tokens at positions 0.. in blocks 0..n_blocks-1 of a cache of its own (perplexity,
        a generative model's embeddings); logits (or hidden states) for the rows logits_idx."""
        n = len(token_ids)
        pos = np.arange(n)
        return cls(token_ids, pos, np.zeros(n), pos, np.arange(n_blocks)[None], logits_idx)


class Piece(NamedTuple):
    """One sequence's share of a forward pass: tokens at positions start.., and how many of the last of
    them get logits; snaps: slots to copy a hybrid model's state to after each of its first tokens (a
    verification's, for rollback), before a prefix-cache checkpoint's."""

    seq: object
    start: int
    tokens: list
    n_logits: int
    snaps: tuple = ()


def make_batch(pieces: list[Piece], block_size: int, window: bool = False, media: bool = True) -> Batch:
    """window: the cache has a window pool, addressed through the sequences' window tables (the blocks
    behind a sequence's window, -1 there, are never read); media: the sequences' media rows (images) go in as
    embeddings (a draft model's runner leaves them out: its width is not theirs)."""
    token_ids, positions, token_seq, slots, logits_idx, wslots = [], [], [], [], [], []
    embeds, spans, lora = [], [], []
    max_blocks = max(len(p.seq.block_table) for p in pieces)
    tables = np.zeros((len(pieces), max_blocks), np.int32)
    wtables = np.zeros((len(pieces), max_blocks), np.int32) if window else None
    state_slots = np.arange(len(pieces))
    snap = np.full(sum(len(p.tokens) for p in pieces), -1, np.int64)
    for i, (seq, start, tokens, n_logits, snaps) in enumerate(pieces):
        n = len(tokens)
        tables[i, : len(seq.block_table)] = seq.block_table
        if window:
            wtables[i, : len(seq.window_table)] = seq.window_table
        if seq.state_slot >= 0:
            state_slots[i] = seq.state_slot
        plan = getattr(seq, "snapshot", None)  # a checkpoint of the state after `upto` tokens (block_manager.py)
        if plan is not None and start < plan[1] <= start + n:
            snap[len(token_ids) + plan[1] - 1 - start] = plan[0]
        for j, s in enumerate(snaps):  # -1: none (a checkpoint's stays); else it wins, the checkpoint copied after
            if s >= 0:
                snap[len(token_ids) + j] = s
        if media:
            for m in getattr(seq, "media", ()):
                a, b = max(m.start, start), min(m.end, start + n)
                if a < b:
                    row = len(token_ids) + a - start
                    embeds.append((row, m.rows[a - m.start:b - m.start]))
                    if m.non_causal:
                        spans.append((row, row + b - a))
        if getattr(seq, "lora", None) is not None:
            lora.append(np.broadcast_to(seq.lora, (n, len(seq.lora))))
        pos = np.arange(start, start + n)
        bt = np.asarray(seq.block_table, np.int64)
        token_ids.extend(tokens)
        positions.append(pos)
        token_seq.append(np.full(n, i))
        slots.append(bt[pos // block_size] * block_size + pos % block_size)
        if window:
            wslots.append(wtables[i, pos // block_size].astype(np.int64) * block_size + pos % block_size)
        logits_idx.extend(range(len(token_ids) - n_logits, len(token_ids)))
    batch = Batch(token_ids, np.concatenate(positions), np.concatenate(token_seq), np.concatenate(slots), tables,
                  logits_idx, state_slots, snap, np.concatenate(wslots) if window else None, wtables)
    batch.embeds, batch.spans = embeds, spans
    if lora:  # (every sequence of a model with adapters has its scales)
        batch.lora = np.ascontiguousarray(np.concatenate(lora), np.float32)
    return batch


def build_batch(sched: ScheduledBatch, block_size: int, window: bool = False, media: bool = True
                ) -> tuple[Batch, list[tuple[int, int, int]]]:
    """Returns the Batch and, for each sequence that samples, (index into sched.seqs, its first logits
    row, its number of rows): one row, or k + 1 for a sequence verifying k proposed tokens."""
    pieces, sampling, row = [], [], 0
    for i, (seq, n, k) in enumerate(zip(sched.seqs, sched.num_tokens, sched.num_spec)):
        start = seq.num_computed_tokens
        tokens = seq.token_ids[start:start + n - k]
        if k:
            tokens = tokens + seq.spec.tokens[:k]
        n_logits = k + 1 if start + n - k == seq.num_tokens else 0  # the chunk reaches the end: it samples
        pieces.append(Piece(seq, start, tokens, n_logits, tuple(seq.spec_slots[:k])))
        if n_logits:
            sampling.append((i, row, n_logits))
            row += n_logits
    return make_batch(pieces, block_size, window, media), sampling


class ModelRunner:
    """A model and the KV cache it computes into: allocates the cache, turns scheduled batches into
    forward passes."""

    def __init__(self, model, n_blocks: int, block_size: int, kv_dtype: str = "f32", n_state_slots: int = 1,
                 n_window_blocks: int = 0, media: bool = True):
        self.model = model
        # n_state_slots: sequences at once with a recurrent state (a hybrid model's; the block manager's);
        # n_window_blocks: the window pool of its sliding-window layers (0: none, as for a draft model,
        # whose sequences' window tables are the target's)
        self.cache = KVCache.for_model(model.cfg, n_blocks, block_size, kv_dtype, kb=model.kb,
                                       n_state_slots=n_state_slots, n_window_blocks=n_window_blocks)
        # window tables only where this runner was given a window pool: a pool the cache makes itself (sliding
        # layers with rows of their own shape, Gemma 4's, in a draft model) is addressed as the full one is
        self.window = n_window_blocks > 0
        self.block_size = block_size
        self.media = media  # whether sequences' media rows go in (a draft's runner: no, see make_batch)
        self.num_forward_tokens = 0  # counts every token computed (prefix-cache tests read it)

    def run(self, sched: ScheduledBatch) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        batch, sampling = build_batch(sched, self.block_size, self.window, self.media)
        logits = self.forward(batch) if len(batch.token_ids) else np.zeros((0, 0), np.float32)
        return logits, sampling

    def run_pieces(self, pieces: list[Piece], hidden: bool = False) -> np.ndarray:
        """The logits (hidden: the final hidden states) of pieces of sequences whose block tables address this
        runner's cache."""
        return self.forward(make_batch(pieces, self.block_size, self.window, self.media), hidden)

    def forward(self, batch: Batch, hidden: bool = False) -> np.ndarray:
        self.num_forward_tokens += len(batch.token_ids)
        return self.model.forward(batch, self.cache, hidden)

    def scratch(self, n_tokens: int) -> "ModelRunner":
        """A runner over a KV cache of its own for n_tokens at positions 0.. (perplexity, a generative
        model's embeddings): this runner's blocks and the requests using them stay untouched."""
        return ModelRunner(self.model, -(-n_tokens // self.block_size), self.block_size, self.cache.dtype)

    def prefix(self, token_ids, logits_idx, hidden: bool = False) -> np.ndarray:
        """One sequence from position 0 through this runner's blocks from 0 (see scratch): the logits, or
        the final hidden states, of the rows logits_idx."""
        return self.forward(Batch.prefix(token_ids, self.cache.n_blocks, logits_idx), hidden)

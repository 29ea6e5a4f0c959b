"""Fixed-size KV blocks, per-sequence block tables, and prefix caching. Pure Python: no model, no numba.

Prefix caching: once a block is full of computed tokens it is hashed as a chain (the parent block's
hash, its token ids, the model identity) and registered. A later sequence whose prompt starts with the
same tokens reuses the block (ref count + 1) after the tokens are compared, and skips that prefill.
Free blocks sit in least-recently-freed order: a freed block keeps its contents and hash until it is
handed out again, so cached prefixes are evicted least-recently-used first.

The partly filled last block is never shared. When a whole prompt is cached, its last token is
computed again to get logits; that rewrites one slot of a shared block with identical values (the
kernels' results do not depend on the batch), so no copy is needed.

A hybrid model's recurrent layers keep a state per sequence, not per token: cached KV blocks are reusable
only with the state their last token left. When a step computes past a block boundary of a sequence (in
its prompt, the last one before its last token), the kernels copy the state there to a checkpoint slot in
the same pass (`plan_checkpoint`, seq.snapshot), registered under that block's hash once its block is
(`checkpoint`; at most num_checkpoints, least recently used evicted; past the prompt a sequence keeps only
its latest); a hit is cut back to the longest prefix that ends at a checkpoint, whose state is copied into
the sequence's slot before its first step (`restores`). With no checkpoint the prefix is recomputed, never
reused wrong.

A model with sliding-window layers (Gemma 2/3) keeps their KV in a second pool (`num_window_blocks`): a
sequence's `window_table` holds, for each of its blocks, the window pool's block or -1, and only the
blocks a step's queries can see (from `window` - 1 tokens before its first position on) are held; those
that fall wholly behind as the sequence advances are given back after each step (`release_behind`; kept,
cached, until handed out again).
A prefix hit needs the window pool's blocks its next token sees, found by the same chain hashes; it is cut
back to the longest prefix that has them.
"""

from __future__ import annotations

from collections import OrderedDict

from .pool import Pool
from .sequence import Sequence


class BlockManager:
    """num_state_slots: a hybrid model's slots of recurrent state (0: none); a sequence holds one from
    allocate to free_seq, so admission needs a free slot as well as its blocks. window, num_window_blocks:
    the sliding window (tokens) of the layers whose KV is in the window pool, and its size (0: none)."""

    def __init__(self, num_blocks: int, block_size: int = 16, model_id: str = "", enable_prefix_caching: bool = True,
                 num_state_slots: int = 0, num_checkpoints: int = 0, window: int = 0, num_window_blocks: int = 0,
                 num_spec_slots: int = 0):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        if num_window_blocks and (window < 1 or num_state_slots):
            raise ValueError("a window pool needs a window >= 1, and no recurrent state")
        self.window = window if num_window_blocks else 0
        self.win = Pool(num_window_blocks) if num_window_blocks else None
        self.num_state_slots = num_state_slots
        self.free_states = list(range(num_state_slots - 1, -1, -1))  # popped from the end: slot 0 first
        # a hybrid model's state checkpoints for prefix caching: slots after the sequences' own
        self.num_checkpoints = num_checkpoints if num_state_slots else 0
        self.free_checkpoints = list(range(num_state_slots + self.num_checkpoints - 1, num_state_slots - 1, -1))
        self.checkpoints: OrderedDict[int, int] = OrderedDict()  # block hash -> slot, least recently used first
        self.restores: list[tuple[int, int]] = []  # (checkpoint slot, sequence slot) to copy before the next step
        # speculative decoding on a hybrid model: a verifying sequence's state after each of its tokens but the
        # last is copied to a slot of these (after the checkpoints), so rejected proposals can be rolled back
        base = num_state_slots + self.num_checkpoints
        self.num_spec_slots = num_spec_slots if num_state_slots else 0
        self.free_spec = list(range(base + self.num_spec_slots - 1, base - 1, -1))
        self.block_size = block_size
        self.model_id = model_id
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = Pool(num_blocks)
        self.blocks, self.free, self.hash_to_block = self.pool.blocks, self.pool.free, self.pool.hash_to_block
        self.prefix_queries = 0  # full prompt blocks looked up
        self.prefix_hits = 0

    # -- counters --------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_window_blocks(self) -> int:
        return len(self.win.blocks) if self.win is not None else 0

    @property
    def num_window_used(self) -> int:
        return self.num_window_blocks - self.win.num_free if self.win is not None else 0

    @property
    def num_cached(self) -> int:
        return len(self.hash_to_block)

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- hashing ---------------------------------------------------------------------------------

    def chain_hash(self, parent: int | None, tokens) -> int:
        return hash((parent, tuple(tokens), self.model_id))

    def chain_hashes(self, token_ids, n: int) -> list[int]:
        """The chain hashes of the first n full blocks of token_ids."""
        bs, out, parent = self.block_size, [], None
        for i in range(n):
            parent = self.chain_hash(parent, token_ids[i * bs:(i + 1) * bs])
            out.append(parent)
        return out

    def cached_run(self, token_ids, n: int) -> tuple[list[int], list[int]]:
        """(the chain hashes of the first n full blocks of token_ids, the ids of the cached blocks holding them from
        the first, up to the first that is not cached)."""
        bs, hashes = self.block_size, self.chain_hashes(token_ids, n)
        hits = []
        for i, h in enumerate(hashes):
            bid = self.pool.lookup(h, token_ids[i * bs:(i + 1) * bs])
            if bid is None:
                break
            hits.append(bid)
        return hashes, hits

    def hit_limit(self, seq: Sequence) -> int:
        """The most full blocks of seq's tokens a prefix hit may cover (a hybrid model's leaves its last token
        to compute, its state coming from a checkpoint)."""
        return (seq.num_tokens - 1) // self.block_size if self.num_state_slots else seq.num_tokens // self.block_size

    # -- the window pool -------------------------------------------------------------------------

    def _first_seen(self, pos: int) -> int:
        """The first block a query at pos (or later) sees in a sliding-window layer."""
        return max(0, pos - self.window + 1) // self.block_size

    def window_seen(self, h: int, num_tokens: int) -> range:
        """The blocks whose window-pool KV the next token after a prefix hit of h blocks of a sequence of
        num_tokens sees (at least its last token is computed)."""
        return range(self._first_seen(min(h * self.block_size, num_tokens - 1)), h)

    def _window_hit(self, seq: Sequence, hits: list[int]) -> int:
        """How many of the prefix hits to keep: the most whose next token finds every block it sees in the
        window pool (by the hits' hashes)."""
        bs = self.block_size
        for h in range(len(hits), 0, -1):
            if all(self.win.lookup(self.blocks[hits[i]].hash, seq.hash_ids[i * bs:(i + 1) * bs]) is not None
                   for i in self.window_seen(h, seq.num_tokens)):
                return h
        return 0

    def _window_need(self, seq: Sequence, start: int, end: int) -> int:
        """The fresh window blocks a step over positions [start, end) needs."""
        table, first = seq.window_table, self._first_seen(start)
        return sum(1 for i in range(first, self.blocks_needed(end)) if i >= len(table) or table[i] < 0)

    def release_behind(self, seq: Sequence) -> None:
        """After a step: give back the window blocks behind what seq's next step can see (none without a
        window pool). Between steps a sequence holds its window alone, so the pool needs a window for each
        sequence and one step's tokens, shared (memory.py)."""
        if self.win is None:
            return
        table = seq.window_table
        for i, b in enumerate(table[:self._first_seen(seq.num_computed_tokens)]):
            if b >= 0:
                self.win.release(b)
                table[i] = -1

    def _window_slots(self, seq: Sequence, start: int, end: int) -> None:
        """Hold the window blocks a step over positions [start, end) sees."""
        table, first = seq.window_table, self._first_seen(start)
        self.release_behind(seq)
        for i in range(first, self.blocks_needed(end)):
            if i >= len(table):
                table.append(self.win.take().block_id)
            elif table[i] < 0:
                table[i] = self.win.take().block_id

    # -- allocation ------------------------------------------------------------------------------

    def _cached_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        """(block ids of the cached full blocks that start seq's tokens, the checkpoint slot of the state
        after them or -1). A hybrid model's hit is cut back to the longest prefix that ends at a checkpoint
        and leaves its last token to compute; a sliding-window model's to the longest whose window blocks
        are cached."""
        if not self.enable_prefix_caching:
            return [], -1
        hashes, hits = self.cached_run(seq.hash_ids, self.hit_limit(seq))
        ckpt, upto = -1, 0
        for i in range(len(hits)):
            if hashes[i] in self.checkpoints:
                ckpt, upto = self.checkpoints[hashes[i]], i + 1
        if self.num_state_slots:
            return hits[:upto], ckpt
        if self.win is not None:
            return hits[:self._window_hit(seq, hits)], -1
        return hits, -1

    def can_allocate(self, seq: Sequence, max_tokens: int | None = None) -> bool:
        """Whether seq can be admitted: its blocks, a state slot, and the window blocks of a first step of
        at most max_tokens tokens (all its tokens by default)."""
        if self.num_state_slots and not self.free_states:
            return False
        hits, _ = self._cached_prefix(seq)
        in_use = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        if self.win is not None:
            p = min(len(hits) * self.block_size, seq.num_tokens - 1)
            end = seq.num_tokens if max_tokens is None else min(seq.num_tokens, p + max_tokens)
            if self.blocks_needed(end) - self._first_seen(p) > self.win.num_free:
                return False
        return self.blocks_needed(seq.num_tokens) - in_use <= self.num_free

    def allocate(self, seq: Sequence) -> int:
        """Give seq blocks for all its tokens, reusing cached prefix blocks. Returns cached tokens. Its
        window blocks past the hits come with its steps (append_slots)."""
        assert not seq.block_table, "sequence already has blocks"
        if self.num_state_slots:
            seq.state_slot = self.free_states.pop()
        bs = self.block_size
        hits, ckpt = self._cached_prefix(seq)
        if ckpt >= 0:  # the state after the hit, into the sequence's slot before its first step
            self.checkpoints.move_to_end(self.blocks[hits[-1]].hash)
            self.restores.append((ckpt, seq.state_slot))
        n_full = seq.num_tokens // bs
        self.prefix_queries += n_full
        self.prefix_hits += len(hits)
        for bid in hits:
            seq.block_table.append(self.pool.take(bid).block_id)
        for _ in range(self.blocks_needed(seq.num_tokens) - len(hits)):
            seq.block_table.append(self.pool.take().block_id)
        # keep at least one token to compute, for its logits
        cached = min(len(hits) * bs, seq.num_tokens - 1)
        if not seq.num_preemptions:  # (readmitted after a preemption: its first admission counts)
            seq.num_cached_tokens = cached
        if self.win is not None:
            first = self._first_seen(cached)
            seq.window_table = [-1] * first
            for i in range(first, len(hits)):
                bid = self.win.lookup(self.blocks[hits[i]].hash, seq.hash_ids[i * bs:(i + 1) * bs])
                seq.window_table.append(self.win.take(bid).block_id)
        return cached

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        end = seq.num_computed_tokens + num_new_tokens
        if self.win is not None:
            if self._window_need(seq, seq.num_computed_tokens, end) > self.win.num_free:
                return False
        return self.blocks_needed(end) - len(seq.block_table) <= self.num_free

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room for seq's KV up to num_computed_tokens + num_new_tokens (and in the window pool, for
        what that step sees)."""
        end = seq.num_computed_tokens + num_new_tokens
        for _ in range(self.blocks_needed(end) - len(seq.block_table)):
            seq.block_table.append(self.pool.take().block_id)
        if self.win is not None:
            self._window_slots(seq, seq.num_computed_tokens, end)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Roll back: free seq's blocks past those num_tokens tokens need (speculative slots of rejected
        tokens). They held nothing cached, so they go to the front of the free list."""
        keep = self.blocks_needed(num_tokens)
        for pool, table in ((self.pool, seq.block_table), (self.win, seq.window_table)):
            for bid in table[keep:]:
                if bid >= 0:
                    block = pool.blocks[bid]
                    assert block.ref_count == 1 and block.hash is None, f"trimmed block {bid} is shared or cached"
                    pool.release(bid, front=True)
            del table[keep:]

    def commit(self, seq: Sequence, upto: int | None = None) -> None:
        """Register the full blocks whose tokens are all computed (the first `upto` tokens, by default
        num_computed_tokens), for later prefix hits; the window pool's blocks under the same hashes."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent = None
        n = seq.num_computed_tokens if upto is None else min(upto, seq.num_computed_tokens)
        win = seq.window_table
        for i in range(min(n // bs, len(seq.block_table))):
            block = self.blocks[seq.block_table[i]]
            tokens = tuple(seq.hash_ids[i * bs:(i + 1) * bs])
            if block.hash is None:
                self.pool.register(block.block_id, self.chain_hash(parent, tokens), tokens)
            if i < len(win) and win[i] >= 0 and self.win.blocks[win[i]].hash is None:
                self.win.register(win[i], block.hash, tokens)
            parent = block.hash

    def plan_checkpoint(self, seq: Sequence, n: int) -> None:
        """A hybrid model's sequence about to compute n tokens: if they cross a block boundary (a prompt's
        last before its last token), a checkpoint slot for the state there (seq.snapshot; the kernels copy
        it in the step)."""
        if not self.num_checkpoints:
            return
        self._drop_plan(seq)
        bs, done = self.block_size, seq.num_computed_tokens
        upto = (done + n) // bs * bs
        if done < seq.num_prompt_tokens:  # a prompt's: what the same prompt again can start from
            upto = min(upto, (seq.num_prompt_tokens - 1) // bs * bs)
        if upto <= done:
            return
        slot = self.free_checkpoints.pop() if self.free_checkpoints else self.checkpoints.popitem(last=False)[1]
        seq.snapshot = (slot, upto)

    def new_checkpoint(self, h: int) -> int | None:
        """A checkpoint slot registered under block hash h, for a state its caller writes in now (the prompt
        cache's, before the next step): a free one, or the least recently used that no admitted sequence is
        still to be restored from (those copies happen at the step's start); None where there is none."""
        if self.free_checkpoints:
            slot = self.free_checkpoints.pop()
        else:
            pending = {src for src, _ in self.restores}
            old = next((k for k, v in self.checkpoints.items() if v not in pending), None)
            if old is None:
                return None
            slot = self.checkpoints.pop(old)
        self.checkpoints[h] = slot
        return slot

    def _drop_plan(self, seq: Sequence) -> None:
        if seq.snapshot is not None:
            self.free_checkpoints.append(seq.snapshot[0])
            seq.snapshot = None

    def checkpoint(self, seq: Sequence) -> None:
        """After the step: register the state its kernels saved (seq.snapshot) under the hash of the block
        that ends there, unless that state is already saved (or the block is not registered). Past its prompt a
        sequence keeps one checkpoint, its latest (a conversation's next turn starts there), beside the one at
        its prompt's last boundary (a repeated prompt, the other choices of a request)."""
        if seq.snapshot is None:
            return
        slot, upto = seq.snapshot
        seq.snapshot = None
        bs = self.block_size
        h = self.blocks[seq.block_table[upto // bs - 1]].hash if upto <= seq.num_computed_tokens else None
        if h is None or h in self.checkpoints:  # the same tokens leave the same state
            if h is not None:
                self.checkpoints.move_to_end(h)
            self.free_checkpoints.append(slot)
            return
        if upto > seq.num_prompt_tokens:
            old, seq.decode_checkpoint = seq.decode_checkpoint, h
            if old is not None and old in self.checkpoints:
                self.free_checkpoints.append(self.checkpoints.pop(old))
        self.checkpoints[h] = slot

    def spec_room(self) -> int | None:
        """The tokens a sequence may propose this step as far as state slots go (None: no limit, no state)."""
        return len(self.free_spec) if self.num_state_slots else None

    def take_spec(self, seq: Sequence, k: int) -> None:
        """Slots for the state after each of a verifying sequence's first k tokens (a hybrid model's)."""
        if self.num_state_slots:
            seq.spec_slots = [self.free_spec.pop() for _ in range(k)]

    def release_spec(self, seq: Sequence) -> None:
        self.free_spec.extend(reversed(seq.spec_slots))
        seq.spec_slots = []

    def take_restores(self) -> list[tuple[int, int]]:
        """The queued state copies (checkpoint slot, sequence slot), handed over and forgotten."""
        out, self.restores = self.restores, []
        return out

    def free_seq(self, seq: Sequence) -> None:
        """Release seq's blocks; those no longer referenced join the free list (newest last)."""
        self._drop_plan(seq)
        self.release_spec(seq)
        for bid in reversed(seq.block_table):
            self.pool.release(bid)
        seq.block_table = []
        for bid in reversed(seq.window_table):
            if bid >= 0:
                self.win.release(bid)
        seq.window_table = []
        if seq.state_slot >= 0:
            self.free_states.append(seq.state_slot)
            seq.state_slot = -1

    def check_invariants(self, live: list[Sequence]) -> None:
        """For tests: ref counts equal table references (both pools), and free = unreferenced."""
        for pool, tables in ((self.pool, [s.block_table for s in live]), (self.win, [s.window_table for s in live])):
            if pool is None:
                assert not any(tables)
                continue
            refs = [0] * len(pool.blocks)
            for table in tables:
                for b in table:
                    if b >= 0:
                        refs[b] += 1
            pool.check(refs)
        held = [s.state_slot for s in live if s.state_slot >= 0]
        assert len(set(held)) == len(held) and not set(held) & set(self.free_states), (held, self.free_states)
        assert len(held) + len(self.free_states) == self.num_state_slots
        ckpts = list(self.checkpoints.values()) + [s.snapshot[0] for s in live if s.snapshot is not None]
        assert len(set(ckpts)) == len(ckpts) and not set(ckpts) & set(self.free_checkpoints)
        assert len(ckpts) + len(self.free_checkpoints) == self.num_checkpoints
        spec = [x for s in live for x in s.spec_slots]
        assert len(set(spec)) == len(spec) and not set(spec) & set(self.free_spec)
        assert len(spec) + len(self.free_spec) == self.num_spec_slots

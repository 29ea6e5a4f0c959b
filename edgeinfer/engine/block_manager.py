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
"""

from __future__ import annotations

from collections import OrderedDict

from .sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()

    def __repr__(self):
        return f"Block({self.block_id}, ref={self.ref_count}, hash={'-' if self.hash is None else 'y'})"


class BlockManager:
    """num_state_slots: a hybrid model's slots of recurrent state (0: none); a sequence holds one from
    allocate to free_seq, so admission needs a free slot as well as its blocks."""

    def __init__(self, num_blocks: int, block_size: int = 16, model_id: str = "", enable_prefix_caching: bool = True,
                 num_state_slots: int = 0, num_checkpoints: int = 0):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_state_slots = num_state_slots
        self.free_states = list(range(num_state_slots - 1, -1, -1))  # popped from the end: slot 0 first
        # a hybrid model's state checkpoints for prefix caching: slots after the sequences' own
        self.num_checkpoints = num_checkpoints if num_state_slots else 0
        self.free_checkpoints = list(range(num_state_slots + self.num_checkpoints - 1, num_state_slots - 1, -1))
        self.checkpoints: OrderedDict[int, int] = OrderedDict()  # block hash -> slot, least recently used first
        self.restores: list[tuple[int, int]] = []  # (checkpoint slot, sequence slot) to copy before the next step
        self.block_size = block_size
        self.model_id = model_id
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
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

    def _lookup(self, parent: int | None, tokens) -> tuple[int, int | None]:
        h = self.chain_hash(parent, tokens)
        bid = self.hash_to_block.get(h)
        if bid is not None and self.blocks[bid].token_ids != tuple(tokens):
            bid = None  # a hash collision: treat as a miss
        return h, bid

    # -- allocation ------------------------------------------------------------------------------

    def _take_free(self, block_id: int | None = None) -> Block:
        if block_id is None:
            block_id, _ = self.free.popitem(last=False)  # least recently freed
            block = self.blocks[block_id]
            if block.hash is not None:  # evict its cached contents
                if self.hash_to_block.get(block.hash) == block_id:
                    del self.hash_to_block[block.hash]
                block.hash = None
                block.token_ids = ()
        else:
            del self.free[block_id]
            block = self.blocks[block_id]
        block.ref_count = 1
        return block

    def _cached_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        """(block ids of the cached full blocks that start seq's tokens, the checkpoint slot of the state
        after them or -1). A hybrid model's hit is cut back to the longest prefix that ends at a checkpoint
        and leaves its last token to compute."""
        if not self.enable_prefix_caching:
            return [], -1
        bs = self.block_size
        n = (seq.num_tokens - 1) // bs if self.num_state_slots else seq.num_tokens // bs
        hits, parent, ckpt, upto = [], None, -1, 0
        for i in range(n):
            parent, bid = self._lookup(parent, seq.token_ids[i * bs:(i + 1) * bs])
            if bid is None:
                break
            hits.append(bid)
            if parent in self.checkpoints:
                ckpt, upto = self.checkpoints[parent], len(hits)
        if self.num_state_slots:
            return hits[:upto], ckpt
        return hits, -1

    def can_allocate(self, seq: Sequence) -> bool:
        if self.num_state_slots and not self.free_states:
            return False
        hits, _ = self._cached_prefix(seq)
        in_use = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        return self.blocks_needed(seq.num_tokens) - in_use <= self.num_free

    def allocate(self, seq: Sequence) -> int:
        """Give seq blocks for all its tokens, reusing cached prefix blocks. Returns cached tokens."""
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
            block = self.blocks[bid]
            if block.ref_count == 0:
                self._take_free(bid)
            else:
                block.ref_count += 1
            seq.block_table.append(bid)
        for _ in range(self.blocks_needed(seq.num_tokens) - len(hits)):
            seq.block_table.append(self._take_free().block_id)
        # keep at least one token to compute, for its logits
        cached = min(len(hits) * bs, seq.num_tokens - 1)
        seq.num_cached_tokens = cached
        return cached

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return need <= self.num_free

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room for seq's KV up to num_computed_tokens + num_new_tokens."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(need):
            seq.block_table.append(self._take_free().block_id)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Roll back: free seq's blocks past those num_tokens tokens need (speculative slots of rejected
        tokens). They held nothing cached, so they go to the front of the free list."""
        keep = self.blocks_needed(num_tokens)
        for bid in seq.block_table[keep:]:
            block = self.blocks[bid]
            block.ref_count -= 1
            assert block.ref_count == 0 and block.hash is None, f"trimmed block {bid} is shared or cached"
            self.free[bid] = None
            self.free.move_to_end(bid, last=False)
        del seq.block_table[keep:]

    def commit(self, seq: Sequence, upto: int | None = None) -> None:
        """Register the full blocks whose tokens are all computed (the first `upto` tokens, by default
        num_computed_tokens), for later prefix hits."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent = None
        n = seq.num_computed_tokens if upto is None else min(upto, seq.num_computed_tokens)
        for i in range(min(n // bs, len(seq.block_table))):
            block = self.blocks[seq.block_table[i]]
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            if block.hash is None:
                h = self.chain_hash(parent, tokens)
                block.hash = h
                block.token_ids = tokens
                # the newest block of these tokens: an older copy (a hybrid model's tokens computed again
                # past its last checkpoint) may be evicted first, and its eviction must not unregister them
                self.hash_to_block[h] = block.block_id
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

    def take_restores(self) -> list[tuple[int, int]]:
        """The queued state copies (checkpoint slot, sequence slot), handed over and forgotten."""
        out, self.restores = self.restores, []
        return out

    def free_seq(self, seq: Sequence) -> None:
        """Release seq's blocks; those no longer referenced join the free list (newest last)."""
        self._drop_plan(seq)
        for bid in reversed(seq.block_table):
            block = self.blocks[bid]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {bid} freed twice"
            if block.ref_count == 0:
                self.free[bid] = None
        seq.block_table = []
        if seq.state_slot >= 0:
            self.free_states.append(seq.state_slot)
            seq.state_slot = -1

    def check_invariants(self, live: list[Sequence]) -> None:
        """For tests: ref counts equal table references, and free = unreferenced."""
        refs = [0] * self.num_blocks
        for s in live:
            for b in s.block_table:
                refs[b] += 1
        for b in self.blocks:
            assert b.ref_count == refs[b.block_id], (b, refs[b.block_id])
            assert (b.block_id in self.free) == (b.ref_count == 0), b
        for h, bid in self.hash_to_block.items():
            assert self.blocks[bid].hash == h
        held = [s.state_slot for s in live if s.state_slot >= 0]
        assert len(set(held)) == len(held) and not set(held) & set(self.free_states), (held, self.free_states)
        assert len(held) + len(self.free_states) == self.num_state_slots
        ckpts = list(self.checkpoints.values()) + [s.snapshot[0] for s in live if s.snapshot is not None]
        assert len(set(ckpts)) == len(ckpts) and not set(ckpts) & set(self.free_checkpoints)
        assert len(ckpts) + len(self.free_checkpoints) == self.num_checkpoints

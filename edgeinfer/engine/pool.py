"""A pool of fixed-size KV blocks: ref counts, the free list in least-recently-freed order, and the
registry of full blocks by chain hash (prefix caching). The block manager keeps one for the attention
layers that see the whole context and, for a model with sliding-window layers, a second for those.
Pure Python."""

from __future__ import annotations

from collections import OrderedDict


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()

    def __repr__(self):
        return f"Block({self.block_id}, ref={self.ref_count}, hash={'-' if self.hash is None else 'y'})"


class Pool:
    """A freed block keeps its contents and hash until it is handed out again, so cached blocks are
    evicted least recently freed first."""

    def __init__(self, num_blocks: int):
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    def lookup(self, h: int, tokens) -> int | None:
        """The block registered under hash h holding these tokens, or None (a miss, or a collision)."""
        bid = self.hash_to_block.get(h)
        if bid is not None and self.blocks[bid].token_ids != tuple(tokens):
            bid = None
        return bid

    def take(self, block_id: int | None = None) -> Block:
        """A free block (the least recently freed, evicting what it cached), or block_id: a cached block
        taken back from the free list, or shared (its ref count + 1)."""
        if block_id is None:
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None:
                if self.hash_to_block.get(block.hash) == block_id:
                    del self.hash_to_block[block.hash]
                block.hash = None
                block.token_ids = ()
            block.ref_count = 1
            return block
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1
        return block

    def release(self, block_id: int, front: bool = False) -> None:
        """One reference fewer; unreferenced, the block joins the free list (newest last, or first:
        `front`, for a block that holds nothing worth keeping)."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed twice"
        if block.ref_count == 0:
            self.free[block_id] = None
            if front:
                self.free.move_to_end(block_id, last=False)

    def register(self, block_id: int, h: int, tokens: tuple) -> None:
        """Offer a full block for prefix hits under hash h. The newest block of these tokens wins: an older
        copy may be evicted first, and its eviction must not unregister them."""
        block = self.blocks[block_id]
        block.hash = h
        block.token_ids = tokens
        self.hash_to_block[h] = block_id

    def check(self, refs: list[int]) -> None:
        """For tests: ref counts equal the references given, free = unreferenced, the registry sound."""
        for b in self.blocks:
            assert b.ref_count == refs[b.block_id], (b, refs[b.block_id])
            assert (b.block_id in self.free) == (b.ref_count == 0), b
        for h, bid in self.hash_to_block.items():
            assert self.blocks[bid].hash == h

"""A prefix's KV as the parts an engine's pools hold it in, copied out of the caches and put back into them (the
prompt cache on disk, slot files). Each full block of a prefix has up to three parts:
- "" the block: its slots' rows in every array a block id addresses (every cache's full-context K and V: the
  target's and a draft model's; and the window arrays of a cache whose window pool is addressed as its full
  one);
- "window" its rows in the window pool (a sliding-window model's window layers), needed for the blocks the next
  token after a hit sees (BlockManager.window_seen);
- "state" a hybrid model's recurrent state at its end (a checkpoint slot's, in every cache): a hit must end at a
  block that has one.
Placing puts parts into the pools as the prefix cache registers them, so an admission finds them as any hit.
"""

from __future__ import annotations

import numpy as np

from .prompt_store import file_identity

PARTS = ("", "window", "state")
# how the scan kernels lay out a state: 2, each head's Mamba2 or delta-rule matrix in blocks of 32 of its
# columns (kernels/cpu/recurrent.py, since 2026-12-06); a state saved in another layout is not reused
STATE_LAYOUT = 2


def _shapes(arrays: list) -> list:
    return [[str(a.dtype), list(a.shape[:1] + a.shape[2:])] for a in arrays]


class KVParts:
    """The arrays behind each part, for a block manager and the caches its block ids address (target first)."""

    def __init__(self, block_manager, caches: list):
        self.bm = block_manager
        self.bs = block_manager.block_size
        target = caches[0]
        windowed = block_manager.win is not None
        self.arrays = {
            "": [a for c in caches for a in (c.k, c.v)
                 + ((c.wk, c.wv) if c.n_window_blocks and (c is not target or not windowed) else ())],
            "window": [target.wk, target.wv] if windowed else [],  # addressed by window block ids
            "state": [a for c in caches for a in c.states] if block_manager.num_checkpoints else [],
        }
        self.scans = any(getattr(c, "ssm", None) is not None for c in caches)  # Mamba2's or a delta net's state
        self.nbytes = {part: sum(a[:, :1 if part == "state" else self.bs].nbytes for a in arrays)
                       for part, arrays in self.arrays.items()}

    def key(self, model_path: str, kv_type: str, rope: str = "") -> dict:
        """What the bytes depend on: the model file's identity, the KV types, the block size, a LongRoPE model's
        factor set (K is stored after RoPE) and the rows' shapes."""
        key = {"model": file_identity(model_path), "kv_type": kv_type, "block_size": self.bs,
               "rope_factors": rope, "rows": _shapes(self.arrays[""])}
        for part in ("window", "state"):
            if self.arrays[part]:
                key[f"{part}_rows"] = _shapes(self.arrays[part])
        if self.arrays["state"] and self.scans:
            key["state_layout"] = STATE_LAYOUT
        return key

    def rows(self, part: str, index: int) -> list:
        """The views of a part: a block's slots (index: its id in its pool), or a checkpoint slot's state."""
        if part == "state":
            return [a[:, index] for a in self.arrays["state"]]
        s = slice(index * self.bs, (index + 1) * self.bs)
        return [a[:, s] for a in self.arrays[part]]

    def copy(self, part: str, index: int) -> list[np.ndarray]:
        return [r.copy() for r in self.rows(part, index)]

    def fill(self, part: str, index: int, data: bytes) -> None:
        at = 0
        for dst in self.rows(part, index):
            dst[...] = np.frombuffer(data[at:at + dst.nbytes], dst.dtype).reshape(dst.shape)
            at += dst.nbytes

    def in_memory(self, token_ids) -> list[tuple[int, str, int]]:
        """The parts of token_ids' full blocks the pools hold, as a hit would use them: (block, part, index in
        its pool or checkpoint slot) for the longest run of cached blocks from the first, cut back (a hybrid
        model) to the last that has a state checkpoint, and (a sliding-window model) to the longest whose window
        rows a continuation sees are cached, with those rows."""
        bm, bs = self.bm, self.bs
        hashes, found = bm.cached_run(token_ids, len(token_ids) // bs)
        h = len(found)
        if self.arrays["state"]:
            while h and hashes[h - 1] not in bm.checkpoints:
                h -= 1
        wins = {}
        if bm.win is not None:
            while h:
                seen = bm.window_seen(h, h * bs)
                wins = {i: bm.win.lookup(hashes[i], token_ids[i * bs:(i + 1) * bs]) for i in seen}
                if None not in wins.values():
                    break
                h -= 1
        out = [(i, "", found[i]) for i in range(h)]
        out += [(i, "window", wins[i]) for i in bm.window_seen(h, h * bs)] if h and bm.win is not None else []
        if h and self.arrays["state"]:
            out.append((h - 1, "state", bm.checkpoints[hashes[h - 1]]))
        return out


class Placing:
    """Parts of a prefix of token_ids put into the pools, registered as the prefix cache registers them; what the
    prefix already has in memory is held meanwhile (`hold`), so that taking a free block for one part never
    evicts another. close() frees them all, cached: an admission then takes them as hits."""

    def __init__(self, parts: KVParts, token_ids, n_blocks: int):
        self.parts, self.bm, self.bs = parts, parts.bm, parts.bs
        self.token_ids = token_ids
        self.hashes = self.bm.chain_hashes(token_ids, n_blocks)
        self.held: list[tuple[object, int]] = []  # (pool, block id)

    def tokens(self, i: int) -> tuple:
        return tuple(self.token_ids[i * self.bs:(i + 1) * self.bs])

    def _pool(self, part: str):
        return self.bm.win if part == "window" else self.bm.pool

    def cached(self, i: int, part: str = "") -> int | None:
        """Block i's part (the block, or its window rows) in memory: its id, or None."""
        return self._pool(part).lookup(self.hashes[i], self.tokens(i))

    def hold(self, i: int, part: str = "") -> bool:
        """Hold block i's part where memory has it; whether it does."""
        bid = self.cached(i, part)
        if bid is not None:
            self.held.append((self._pool(part), self._pool(part).take(bid).block_id))
        return bid is not None

    def put(self, i: int, part: str, data: bytes) -> bool:
        """Block i's part from data (parts.nbytes[part] bytes) into a free block (a checkpoint slot for "state"),
        registered; False where there is no room (a pool keeps one block free for the admission's own)."""
        if part == "state":
            if self.hashes[i] in self.bm.checkpoints:
                return True
            slot = self.bm.new_checkpoint(self.hashes[i])
            if slot is not None:
                self.parts.fill("state", slot, data)
            return slot is not None
        pool = self._pool(part)
        if pool.num_free <= (1 if part == "" else 0):
            return False
        block = pool.take()
        self.parts.fill(part, block.block_id, data)
        pool.register(block.block_id, self.hashes[i], self.tokens(i))
        self.held.append((pool, block.block_id))
        return True

    def close(self) -> None:
        for pool, bid in self.held:
            pool.release(bid)
        self.held = []

"""The prompt cache on disk, tied to an engine: full blocks the prefix cache registers are saved (their rows
copied in the step, written by the store's thread), and before a waiting sequence is admitted the blocks that
extend its in-memory prefix hit are read back from disk into free blocks and registered, so the admission
finds them as it finds any cached prefix (and frees them, least recently used, as it frees any).

What a block holds: the rows of its slots in every attention layer's K and V arrays of every cache the
sequences' slots address (the target's, and a draft model's). Models whose sequences keep more than their
blocks (a hybrid model's recurrent state, a sliding-window model's window pool) are not supported yet.
"""

from __future__ import annotations

import numpy as np

from .prompt_store import PromptStore, block_digest, file_identity
from .sequence import Sequence


def unsupported(cfg) -> str | None:
    """Why a model's KV cannot go to the disk prompt cache, or None."""
    if cfg.recurrent:
        return "a hybrid model's recurrent state"
    if cfg.sliding_window:
        return "a sliding-window model's window pool"
    return None


def for_engine(config, model, model_path: str, block_manager, caches: list):
    """An engine's DiskPrefixes where config.prompt_cache names a folder, else None; ValueError for a model
    it cannot hold, or a folder it cannot write."""
    if not config.prompt_cache:
        return None
    if config.backend != "cpu":
        raise ValueError("the prompt cache on disk is not on the CUDA backend yet: leave out --prompt-cache")
    if why := unsupported(model.cfg):
        raise ValueError(f"the prompt cache on disk does not hold {why} yet: leave out --prompt-cache")
    # K is stored after RoPE: a LongRoPE model's factor set (chosen by the context) is part of what it holds
    return DiskPrefixes.open(config.prompt_cache, config.prompt_cache_mb, model_path, config.kv_dtype,
                             block_manager, caches, rope=getattr(model, "rope_factors_used", ""))


class DiskState:
    """A sequence's part in the disk cache: its full blocks' chain digests so far, how many of its blocks were
    offered to the store, and whether its prompt was looked up there."""

    __slots__ = ("digests", "saved", "warmed")

    def __init__(self):
        self.digests: list[bytes] = []
        self.saved = 0
        self.warmed = False


def _state(seq: Sequence) -> DiskState:
    if seq.disk is None:
        seq.disk = DiskState()
    return seq.disk


class DiskPrefixes:
    """The engine's end of a PromptStore: `saved(seq)` after a step commits seq's blocks, `warm(seq)` before
    the scheduler tries to admit it."""

    def __init__(self, store: PromptStore, block_manager, caches: list):
        self.store = store
        self.bm = block_manager
        self.caches = caches  # the KVCaches whose full pools a block's rows are read from and written to
        self.bs = block_manager.block_size

    @classmethod
    def open(cls, path: str, max_mb: float, model_path: str, kv_type: str, block_manager, caches: list,
             rope: str = ""):
        key = {"model": file_identity(model_path), "kv_type": kv_type, "block_size": block_manager.block_size,
               "rope_factors": rope,
               "rows": [[str(a.dtype), list(a.shape[:1] + a.shape[2:])] for c in caches for a in (c.k, c.v)]}
        return cls(PromptStore(path, int(max_mb * 2**20), key), block_manager, caches)

    def _rows(self, block_id: int) -> list:
        s = slice(block_id * self.bs, (block_id + 1) * self.bs)
        return [a[:, s] for c in self.caches for a in (c.k, c.v)]

    def stats(self) -> dict:
        st = self.store
        return {"prompt_cache_hits": st.hits, "prompt_cache_misses": st.misses, "prompt_cache_damaged": st.damaged,
                "prompt_cache_written_bytes": st.bytes_written, "prompt_cache_read_bytes": st.bytes_read,
                "prompt_cache_write_errors": st.write_errors, "prompt_cache_bytes": st.size,
                "prompt_cache_entries": st.entries}

    @property
    def block_bytes(self) -> int:
        return sum(a[:, :self.bs].nbytes for c in self.caches for a in (c.k, c.v))

    def _digest(self, seq: Sequence, i: int) -> bytes:
        """The chain digest of seq's block i (its tokens and all before them)."""
        ds = _state(seq).digests
        while len(ds) <= i:
            j = len(ds)
            ds.append(block_digest(ds[-1] if ds else b"", seq.token_ids[j * self.bs:(j + 1) * self.bs]))
        return ds[i]

    def saved(self, seq: Sequence) -> None:
        """Offer seq's newly registered full blocks to the store (their rows copied now)."""
        blocks = self.bm.blocks
        i = _state(seq).saved
        n = min(seq.num_computed_tokens // self.bs, len(seq.block_table))
        while i < n:
            bid = seq.block_table[i]
            if blocks[bid].hash is None:  # not registered (a draft model behind): later
                break
            digest = self._digest(seq, i)
            if self.store.wants(digest):  # (not on disk, not queued, and room in the queue: then copied)
                self.store.save(digest, blocks[bid].token_ids, [r.copy() for r in self._rows(bid)])
            i += 1
        seq.disk.saved = i

    def warm(self, seq: Sequence) -> int:
        """Once per sequence: read from disk the blocks that extend its in-memory prefix hit (while more than
        one block is free; one token left to compute), registered as cached; returns how many. The hit's
        blocks and the loaded ones are held while it reads, so none evicts another."""
        if _state(seq).warmed:
            return 0
        seq.disk.warmed = True
        bm, bs, pool = self.bm, self.bs, self.bm.pool
        n = (seq.num_tokens - 1) // bs
        parent, i, held = None, 0, []
        while i < n:  # the in-memory hit
            tokens = seq.token_ids[i * bs:(i + 1) * bs]
            h = bm.chain_hash(parent, tokens)
            bid = pool.lookup(h, tokens)
            if bid is None:
                break
            held.append(pool.take(bid).block_id)
            parent, i = h, i + 1
        loaded = 0
        nbytes = self.block_bytes
        while i < n and pool.num_free > 1:
            digest = self._digest(seq, i)
            if digest not in self.store:
                self.store.misses += 1
                break
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            data = self.store.load(digest, tokens, nbytes)
            if data is None:
                break
            block = pool.take()
            at = 0
            for dst in self._rows(block.block_id):
                size = dst.nbytes
                dst[...] = np.frombuffer(data[at:at + size], dst.dtype).reshape(dst.shape)
                at += size
            h = bm.chain_hash(parent, tokens)
            pool.register(block.block_id, h, tokens)
            held.append(block.block_id)
            parent, i, loaded = h, i + 1, loaded + 1
        for bid in held:  # free and cached (the newest): the admission takes them as hits
            pool.release(bid)
        return loaded


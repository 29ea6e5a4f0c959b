"""The prompt cache on disk, tied to an engine: full blocks the prefix cache registers are saved (their rows
copied in the step, written by the store's thread), and before a waiting sequence is admitted what extends its
in-memory prefix hit is read back from disk, registered as the step registers it, so the admission finds it as
it finds any cached prefix (and frees it, least recently used, as it frees any).

What is stored, in entries of three parts (each its own file, named by the block's chain digest and the part):
- a block: its slots' rows in every K and V array its block id addresses (the full-context layers', in every
  cache the sequences' slots address: the target's, and a draft model's);
- a sliding-window model's window rows of the block (Gemma 2/3: the window pool's layers), read back for the
  blocks the next token after a hit sees;
- a hybrid model's recurrent state at the block's end (its checkpoint, in every cache), read back into a
  checkpoint slot for the last block of a hit: a hit needs one, as in memory.
"""

from __future__ import annotations

import numpy as np

from .prompt_store import PromptStore, block_digest, file_identity, part_digest
from .sequence import Sequence


def for_engine(config, model, model_path: str, block_manager, caches: list):
    """An engine's DiskPrefixes where config.prompt_cache names a folder, else None; ValueError for a backend
    it cannot read, or a folder it cannot write."""
    if not config.prompt_cache:
        return None
    if config.backend != "cpu":
        raise ValueError("the prompt cache on disk is not on the CUDA backend yet: leave out --prompt-cache")
    # K is stored after RoPE: a LongRoPE model's factor set (chosen by the context) is part of what it holds
    return DiskPrefixes.open(config.prompt_cache, config.prompt_cache_mb, model_path, config.kv_dtype,
                             block_manager, caches, rope=getattr(model, "rope_factors_used", ""))


def _shapes(arrays: list) -> list:
    return [[str(a.dtype), list(a.shape[:1] + a.shape[2:])] for a in arrays]


def _fill(dsts: list, data: bytes) -> None:
    at = 0
    for dst in dsts:
        dst[...] = np.frombuffer(data[at:at + dst.nbytes], dst.dtype).reshape(dst.shape)
        at += dst.nbytes


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
    """The engine's end of a PromptStore: `saved(seq)` after a step commits seq's blocks and registers its state
    checkpoint, `warm(seq)` before the scheduler tries to admit it."""

    def __init__(self, block_manager, caches: list):
        self.store: PromptStore | None = None  # (open's)
        self.bm = block_manager
        self.bs = block_manager.block_size
        target = caches[0]
        # the arrays a block id addresses: every cache's full-context K and V, and the window arrays of a cache
        # whose window pool is addressed as the full one (a draft's, or where the engine made no window pool)
        windowed = block_manager.win is not None
        self.block_arrays = [a for c in caches for a in (c.k, c.v)
                             + ((c.wk, c.wv) if c.n_window_blocks and (c is not target or not windowed) else ())]
        self.window_arrays = [target.wk, target.wv] if windowed else []  # addressed by window block ids
        self.state_arrays = [a for c in caches for a in c.states] if block_manager.num_checkpoints else []
        self.nbytes = {part: sum(a[:, :n].nbytes for a in arrays) for part, arrays, n in
                       (("", self.block_arrays, self.bs), ("window", self.window_arrays, self.bs),
                        ("state", self.state_arrays, 1))}

    @classmethod
    def open(cls, path: str, max_mb: float, model_path: str, kv_type: str, block_manager, caches: list,
             rope: str = ""):
        self = cls(block_manager, caches)
        key = {"model": file_identity(model_path), "kv_type": kv_type, "block_size": block_manager.block_size,
               "rope_factors": rope, "rows": _shapes(self.block_arrays)}
        if self.window_arrays:
            key["window_rows"] = _shapes(self.window_arrays)
        if self.state_arrays:
            key["state_rows"] = _shapes(self.state_arrays)
        self.store = PromptStore(path, int(max_mb * 2**20), key)
        return self

    def _rows(self, part: str, index: int) -> list:
        """The views a part of an entry is read from and written to: a block's slots, or a checkpoint slot."""
        if part == "state":
            return [a[:, index] for a in self.state_arrays]
        s = slice(index * self.bs, (index + 1) * self.bs)
        return [a[:, s] for a in (self.window_arrays if part == "window" else self.block_arrays)]

    def stats(self) -> dict:
        st = self.store
        return {"prompt_cache_hits": st.hits, "prompt_cache_misses": st.misses, "prompt_cache_damaged": st.damaged,
                "prompt_cache_written_bytes": st.bytes_written, "prompt_cache_read_bytes": st.bytes_read,
                "prompt_cache_write_errors": st.write_errors, "prompt_cache_bytes": st.size,
                "prompt_cache_entries": st.entries}

    def _digest(self, seq: Sequence, i: int, part: str = "") -> bytes:
        """The chain digest of seq's block i (its tokens and all before them), or of a part of its entry."""
        ds = _state(seq).digests
        while len(ds) <= i:
            j = len(ds)
            ds.append(block_digest(ds[-1] if ds else b"", seq.token_ids[j * self.bs:(j + 1) * self.bs]))
        return part_digest(ds[i], part) if part else ds[i]

    def _offer(self, seq: Sequence, i: int, part: str, index: int) -> None:
        digest = self._digest(seq, i, part)
        if self.store.wants(digest):  # (not on disk, not queued, and room in the queue: then copied)
            self.store.save(digest, self._tokens(seq, i), [r.copy() for r in self._rows(part, index)])

    def _tokens(self, seq: Sequence, i: int) -> tuple:
        return tuple(seq.token_ids[i * self.bs:(i + 1) * self.bs])

    def saved(self, seq: Sequence) -> None:
        """Offer seq's newly registered full blocks to the store (their rows copied now): the block, its window
        rows, and the state checkpoint registered at its end."""
        bm = self.bm
        i = _state(seq).saved
        n = min(seq.num_computed_tokens // self.bs, len(seq.block_table))
        while i < n:
            block = bm.blocks[seq.block_table[i]]
            if block.hash is None:  # not registered (a draft model behind): later
                break
            self._offer(seq, i, "", block.block_id)
            if self.window_arrays and i < len(seq.window_table) and seq.window_table[i] >= 0:
                self._offer(seq, i, "window", seq.window_table[i])
            if self.state_arrays and block.hash in bm.checkpoints:
                self._offer(seq, i, "state", bm.checkpoints[block.hash])
            i += 1
        seq.disk.saved = i

    def _on_disk(self, seq: Sequence, i: int, part: str = "") -> bool:
        return self._digest(seq, i, part) in self.store

    def _read(self, seq: Sequence, i: int, part: str = "") -> bytes | None:
        return self.store.load(self._digest(seq, i, part), self._tokens(seq, i), self.nbytes[part])

    def _load(self, seq: Sequence, i: int, h: int, pool, part: str = "") -> int | None:
        """Part of block i's entry read into a block taken from pool and registered there under its chain hash
        h: the block's id, or None where the entry fails (nothing taken)."""
        data = self._read(seq, i, part)
        if data is None:
            return None
        block = pool.take()
        _fill(self._rows(part, block.block_id), data)
        pool.register(block.block_id, h, self._tokens(seq, i))
        return block.block_id

    def warm(self, seq: Sequence) -> int:
        """Once per sequence: read from disk what extends its in-memory prefix hit, as far as the chain of blocks
        reaches in memory or on disk and, for a hybrid model, back to the last block with a state checkpoint,
        while more than one block is free; returns the blocks read. What the hit uses is held while it reads, so
        nothing evicts another part of it."""
        if _state(seq).warmed:
            return 0
        seq.disk.warmed = True
        bm, pool, win = self.bm, self.bm.pool, self.bm.win
        hashes = bm.chain_hashes(seq, bm.hit_limit(seq))
        mem = [pool.lookup(h, self._tokens(seq, i)) for i, h in enumerate(hashes)]
        h = 0  # the blocks the chain reaches
        while h < len(hashes) and (mem[h] is not None or self._on_disk(seq, h)):
            h += 1
        if h < len(hashes) and mem[h] is None:
            self.store.misses += 1
        if self.state_arrays:  # a hybrid model's hit ends where a state was saved
            while h and not (hashes[h - 1] in bm.checkpoints or self._on_disk(seq, h - 1, "state")):
                h -= 1
        if win is not None:  # a sliding-window model's needs the window rows its next token sees
            wmem = [win.lookup(x, self._tokens(seq, i)) for i, x in enumerate(hashes)]
            while h and not all(wmem[i] is not None or self._on_disk(seq, i, "window") for i in bm.window_seen(seq, h)):
                h -= 1
        held = [pool.take(mem[i]).block_id for i in range(h) if mem[i] is not None]
        loaded = 0
        for i in range(h):
            if mem[i] is None:
                bid = self._load(seq, i, hashes[i], pool) if pool.num_free > 1 else None
                if bid is None:  # a damaged entry, or no room: the admission's hit stops before it (nothing
                    h = 0  # more read: no window rows, no state)
                    break
                held.append(bid)
                loaded += 1
        wheld = []
        if win is not None:  # the window rows the next token after the hit sees
            seen = bm.window_seen(seq, h)
            wheld = [win.take(wmem[i]).block_id for i in seen if wmem[i] is not None]
            for i in seen:
                bid = self._load(seq, i, hashes[i], win, "window") if wmem[i] is None and win.num_free else None
                if bid is not None:
                    wheld.append(bid)
        if self.state_arrays and h and hashes[h - 1] not in bm.checkpoints:  # the state after the hit
            data = self._read(seq, h - 1, "state")
            if data is not None and (slot := bm.new_checkpoint(hashes[h - 1])) is not None:
                _fill(self._rows("state", slot), data)
        for bid in held:  # free and cached (the newest): the admission takes them as hits
            pool.release(bid)
        for bid in wheld:
            win.release(bid)
        return loaded

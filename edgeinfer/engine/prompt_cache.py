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

from .kv_parts import KVParts, Placing
from .prompt_store import PromptStore, block_digest, part_digest
from .sequence import Sequence


def for_engine(config, model, model_path: str, block_manager, caches: list):
    """An engine's DiskPrefixes where config.prompt_cache names a folder, else None; ValueError for a backend
    it cannot read, or a folder it cannot write."""
    if not config.prompt_cache:
        return None
    if config.backend != "cpu":
        raise ValueError("the prompt cache on disk is not on the CUDA backend yet: leave out --prompt-cache")
    parts = KVParts(block_manager, caches)
    key = parts.key(model_path, config.kv_dtype, getattr(model, "rope_factors_used", ""))
    if getattr(model, "lora", None) is not None:  # the model's adapters (their digests)
        key["lora"] = model.lora.key
    return DiskPrefixes(PromptStore(config.prompt_cache, int(config.prompt_cache_mb * 2**20), key), parts)


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

    def __init__(self, store: PromptStore, parts: KVParts):
        self.store = store
        self.parts = parts
        self.bm = parts.bm
        self.bs = parts.bs

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
            ds.append(block_digest(ds[-1] if ds else b"", seq.hash_ids[j * self.bs:(j + 1) * self.bs]))
        return part_digest(ds[i], part) if part else ds[i]

    def _tokens(self, seq: Sequence, i: int) -> tuple:
        return tuple(seq.hash_ids[i * self.bs:(i + 1) * self.bs])

    def _offer(self, seq: Sequence, i: int, part: str, index: int) -> None:
        digest = self._digest(seq, i, part)
        if self.store.wants(digest):  # (not on disk, not queued, and room in the queue: then copied)
            self.store.save(digest, self._tokens(seq, i), self.parts.copy(part, index))

    def saved(self, seq: Sequence) -> None:
        """Offer seq's newly registered full blocks to the store (their rows copied now): the block, its window
        rows, and the state checkpoint registered at its end."""
        bm, arrays = self.bm, self.parts.arrays
        i = _state(seq).saved
        n = min(seq.num_computed_tokens // self.bs, len(seq.block_table))
        while i < n:
            block = bm.blocks[seq.block_table[i]]
            if block.hash is None:  # not registered (a draft model behind): later
                break
            self._offer(seq, i, "", block.block_id)
            if arrays["window"] and i < len(seq.window_table) and seq.window_table[i] >= 0:
                self._offer(seq, i, "window", seq.window_table[i])
            if arrays["state"] and block.hash in bm.checkpoints:
                self._offer(seq, i, "state", bm.checkpoints[block.hash])
            i += 1
        seq.disk.saved = i

    def _on_disk(self, seq: Sequence, i: int, part: str = "") -> bool:
        return self._digest(seq, i, part) in self.store

    def _read(self, seq: Sequence, i: int, part: str = "") -> bytes | None:
        return self.store.load(self._digest(seq, i, part), self._tokens(seq, i), self.parts.nbytes[part])

    def warm(self, seq: Sequence) -> int:
        """Once per sequence: read from disk what extends its in-memory prefix hit, as far as the chain of blocks
        reaches in memory or on disk and, for a hybrid model, back to the last block with a state checkpoint,
        while more than one block is free; returns the blocks read. What the hit uses is held while it reads, so
        nothing evicts another part of it."""
        if _state(seq).warmed:
            return 0
        seq.disk.warmed = True
        bm, arrays = self.bm, self.parts.arrays
        place = Placing(self.parts, seq.hash_ids, bm.hit_limit(seq))
        n = len(place.hashes)
        mem = [place.cached(i) is not None for i in range(n)]
        h = 0  # the blocks the chain reaches
        while h < n and (mem[h] or self._on_disk(seq, h)):
            h += 1
        if h < n and not mem[h]:
            self.store.misses += 1
        if arrays["state"]:  # a hybrid model's hit ends where a state was saved
            while h and not (place.hashes[h - 1] in bm.checkpoints or self._on_disk(seq, h - 1, "state")):
                h -= 1
        if arrays["window"]:  # a sliding-window model's needs the window rows its next token sees
            while h and not all(place.cached(i, "window") is not None or self._on_disk(seq, i, "window")
                                for i in bm.window_seen(h, seq.num_tokens)):
                h -= 1
        for i in range(h):
            if mem[i]:
                place.hold(i)
        loaded = 0
        for i in range(h):
            if not mem[i]:
                data = self._read(seq, i)
                if data is None or not place.put(i, "", data):  # a damaged entry, or no room: the hit stops
                    h = i  # before it
                    break
                loaded += 1
        if arrays["window"]:  # the window rows the next token after the hit sees (those in memory held first)
            seen = bm.window_seen(h, seq.num_tokens)
            for i in [i for i in seen if not place.hold(i, "window")]:
                if self._on_disk(seq, i, "window") and (data := self._read(seq, i, "window")) is not None:
                    place.put(i, "window", data)
        if arrays["state"] and h and place.hashes[h - 1] not in bm.checkpoints:  # the state after the hit
            if self._on_disk(seq, h - 1, "state") and (data := self._read(seq, h - 1, "state")) is not None:
                place.put(h - 1, "state", data)
        place.close()
        return loaded

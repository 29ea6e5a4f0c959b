"""llama.cpp's slots (its server's `/slots` API), on an engine whose KV is one pool shared by every sequence.

A slot here is a name for a conversation: a request given `id_slot` (or, without one, the least recently used
idle slot) leaves its tokens there, prompt and answer. Saving a slot writes the KV of those tokens that the
prefix cache holds (its full blocks from the first; a hybrid model's up to its last state checkpoint; a
sliding-window model's window rows the next token sees) to a file; restoring reads such a file back into the
prefix cache, where the next request starting with those tokens finds it, whatever its slot (the pool is
shared: a restored prefix is a cached one, kept until evicted least recently used as any).

A slot file: MAGIC, a little-endian u32 header length, a JSON header (the KV key: model file identity, KV types,
block size, row shapes, layout version; the token count; the parts stored), the tokens (int32), the parts' bytes,
and a blake2b digest of everything before it. Written to a temporary name and renamed; read back whole and
checked (damaged, truncated or another model's or KV type's: an error naming why, nothing placed).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np

from .kv_parts import PARTS, KVParts, Placing
from .prompt_store import LAYOUT_VERSION

MAGIC = b"EISLOT01"
_DIGEST = 32


class SlotError(ValueError):
    """A slot file that cannot be written or used (the message says why)."""


class NoRoom(SlotError):
    """Too few free KV blocks to restore a slot file now (a retry may find them)."""


class Slot:
    __slots__ = ("id", "tokens", "active", "last_used")

    def __init__(self, i: int):
        self.id, self.tokens, self.active, self.last_used = i, [], 0, 0.0

    @property
    def processing(self) -> bool:
        return self.active > 0


class SlotTable:
    """n slots (as many as sequences run at once). A slot may run more than one request at once (the pool is
    shared; llama.cpp would make the later one wait): the last to finish leaves its tokens."""

    def __init__(self, n: int):
        self.slots = [Slot(i) for i in range(max(1, n))]
        self._lock = threading.Lock()  # (assigned on the event loop, finished on the compute thread)

    def check(self, id_slot) -> int:
        if not isinstance(id_slot, int) or isinstance(id_slot, bool) or not 0 <= id_slot < len(self.slots):
            raise ValueError(f"id_slot must be an integer from 0 to {len(self.slots) - 1}, got {id_slot!r}")
        return id_slot

    def assign(self, id_slot: int | None = None) -> Slot:
        """The slot a request runs in: id_slot's (-1 or None: the least recently used idle one, else the least
        recently used)."""
        with self._lock:
            if id_slot is not None and id_slot != -1:
                slot = self.slots[self.check(id_slot)]
            else:
                slot = min(self.slots, key=lambda s: (s.active, s.last_used))
            slot.active += 1
            slot.last_used = time.monotonic()
            return slot

    def finish(self, slot: Slot, tokens: list[int] | None) -> None:
        """A request in slot is done: tokens (None: a request that never ran) become the slot's."""
        with self._lock:
            slot.active = max(0, slot.active - 1)
            slot.last_used = time.monotonic()
            if tokens is not None:
                slot.tokens = list(tokens)


def _parts(engine) -> tuple[KVParts, dict]:
    if engine.config.backend != "cpu":
        raise SlotError("saving and restoring slots is not on the CUDA backend yet")
    parts = engine.disk.parts if engine.disk is not None else KVParts(engine.block_manager, engine.caches())
    key = parts.key(engine.block_manager.model_id, engine.config.kv_dtype,
                    getattr(engine.model, "rope_factors_used", ""))
    return parts, {**key, "layout": LAYOUT_VERSION}


def collect(engine, token_ids: list[int]) -> tuple[int, list]:
    """The cached KV of token_ids, copied (run between engine steps, quickly): the tokens it covers and the
    pieces of a slot file, for `write` (in any thread)."""
    parts, key = _parts(engine)
    found = parts.in_memory(token_ids)
    n = max((i + 1 for i, part, _ in found if part == ""), default=0) * parts.bs
    header = json.dumps({"key": key, "tokens": n, "parts": [[i, part] for i, part, _ in found]}).encode()
    pieces = [MAGIC, struct.pack("<I", len(header)), header, np.asarray(token_ids[:n], "<i4").tobytes()]
    return n, pieces + [r for _, part, index in found for r in parts.copy(part, index)]


def write(path: Path, pieces: list) -> int:
    """A slot file of collect's pieces, written whole or not at all: its size."""
    h = hashlib.blake2b(digest_size=_DIGEST)
    tmp = path.with_name(f".{path.name[:200]}.{os.getpid()}.tmp")
    size = 0
    try:
        with open(tmp, "wb") as f:
            for piece in pieces:
                b = piece if isinstance(piece, bytes) else np.ascontiguousarray(piece).tobytes()
                h.update(b)
                f.write(b)
                size += len(b)
            f.write(h.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return size + _DIGEST


def save(engine, token_ids: list[int], path: Path) -> dict:
    """collect and write at once (the server collects on the compute thread and writes in another)."""
    t0 = time.perf_counter()
    n, pieces = collect(engine, token_ids)
    return {"n_saved": n, "n_written": write(path, pieces), "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def read(engine, path: Path) -> tuple[list[int], list, memoryview]:
    """A slot file's tokens, parts and their bytes, checked whole (in any thread): SlotError naming what is
    wrong with it."""
    parts, key = _parts(engine)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SlotError(f"no slot file {path.name}") from None
    except OSError as e:
        raise SlotError(f"could not read {path.name}: {e.strerror or e}") from None
    head = len(MAGIC) + 4
    if len(data) < head + _DIGEST or data[:len(MAGIC)] != MAGIC:
        raise SlotError(f"{path.name} is not a slot file")
    if hashlib.blake2b(data[:-_DIGEST], digest_size=_DIGEST).digest() != data[-_DIGEST:]:
        raise SlotError(f"{path.name} is damaged or truncated (its digest does not match)")
    (size,) = struct.unpack_from("<I", data, len(MAGIC))
    malformed = SlotError(f"{path.name} has a malformed header")
    try:
        header = json.loads(data[head:head + size])
        n, stored = int(header["tokens"]), [(int(i), str(p)) for i, p in header["parts"]]
    except (ValueError, KeyError, TypeError):
        raise malformed from None
    if header.get("key") != key:
        raise SlotError(f"{path.name} was saved from another model file, KV type or layout")
    at = head + size
    if not (0 <= n and n % parts.bs == 0 and at + 4 * n <= len(data)
            and all(p in PARTS and 0 <= i < n // parts.bs for i, p in stored)
            and at + 4 * n + sum(parts.nbytes[p] for _, p in stored) == len(data) - _DIGEST):
        raise malformed
    tokens = np.frombuffer(data, "<i4", n, at).tolist()
    return tokens, stored, memoryview(data)[at + 4 * n:len(data) - _DIGEST]


def place(engine, tokens: list[int], stored: list, payload) -> int:
    """A read slot file's parts into the prefix cache (run between engine steps): the tokens it placed, from the
    first (its blocks held or placed, and for a hybrid model the state after the last). NoRoom where there are
    too few free KV blocks (nothing placed)."""
    parts, _ = _parts(engine)
    placing = Placing(parts, tokens, len(tokens) // parts.bs)
    missing = {(i, p) for i, p in stored if p == "state" or not placing.hold(i, p)}  # (held: none is evicted)
    need, free = sum(1 for i, p in missing if p == ""), engine.block_manager.pool.num_free
    if need and need >= free:  # (one block stays free for an admission's own)
        placing.close()
        raise NoRoom(f"restoring needs {need} free KV blocks and {free} are free: try again when fewer requests run")
    ok, at = {(i, p) for i, p in stored if (i, p) not in missing}, 0
    for i, part in stored:
        if (i, part) in missing and placing.put(i, part, payload[at:at + parts.nbytes[part]]):
            ok.add((i, part))
        at += parts.nbytes[part]
    placing.close()
    n = 0
    while (n, "") in ok:
        n += 1
    if parts.arrays["state"] and not any(p == "state" and i == n - 1 and (i, p) in ok for i, p in stored):
        n = 0  # (a hybrid model's blocks are of no use without the state after them)
    return n * parts.bs


def restore(engine, path: Path) -> dict:
    """read and place at once (the server reads in another thread and places on the compute thread)."""
    t0 = time.perf_counter()
    tokens, stored, payload = read(engine, path)
    n = place(engine, tokens, stored, payload)
    return {"token_ids": tokens[:n], "n_restored": n, "n_read": len(payload),
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}

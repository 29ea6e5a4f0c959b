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
import time
from pathlib import Path

import numpy as np

from .kv_parts import KVParts, Placing
from .prompt_store import LAYOUT_VERSION

MAGIC = b"EISLOT01"
_DIGEST = 32


class SlotError(ValueError):
    """A slot file that cannot be used (the message says why)."""


class Slot:
    __slots__ = ("id", "tokens", "processing", "last_used")

    def __init__(self, i: int):
        self.id, self.tokens, self.processing, self.last_used = i, [], False, 0.0


class SlotTable:
    """n slots (as many as sequences run at once); thread-safe enough for the server (its event loop assigns,
    the engine thread's callbacks record)."""

    def __init__(self, n: int):
        self.slots = [Slot(i) for i in range(max(1, n))]

    def check(self, id_slot) -> int:
        if not isinstance(id_slot, int) or isinstance(id_slot, bool) or not 0 <= id_slot < len(self.slots):
            raise ValueError(f"id_slot must be an integer from 0 to {len(self.slots) - 1}, got {id_slot!r}")
        return id_slot

    def assign(self, id_slot: int | None = None) -> Slot:
        """The slot a request runs in: id_slot's (-1 or None: the least recently used idle one, else the least
        recently used)."""
        if id_slot is not None and id_slot != -1:
            slot = self.slots[self.check(id_slot)]
        else:
            slot = min(self.slots, key=lambda s: (s.processing, s.last_used))
        slot.processing, slot.last_used = True, time.monotonic()
        return slot

    def finish(self, slot: Slot, tokens: list[int]) -> None:
        slot.tokens, slot.processing, slot.last_used = list(tokens), False, time.monotonic()


def _parts(engine) -> tuple[KVParts, dict]:
    parts = engine.disk.parts if engine.disk is not None else KVParts(engine.block_manager, engine.caches())
    key = parts.key(engine.block_manager.model_id, engine.config.kv_dtype,
                    getattr(engine.model, "rope_factors_used", ""))
    return parts, {**key, "layout": LAYOUT_VERSION}


def save(engine, token_ids: list[int], path: Path) -> dict:
    """Write the cached KV of token_ids to path (run between engine steps): llama.cpp's answer fields."""
    t0 = time.perf_counter()
    parts, key = _parts(engine)
    found = parts.in_memory(token_ids)
    n = max((i + 1 for i, part, _ in found if part == ""), default=0) * parts.bs
    header = json.dumps({"key": key, "tokens": n, "parts": [[i, part] for i, part, _ in found]}).encode()
    body = [MAGIC, struct.pack("<I", len(header)), header, np.asarray(token_ids[:n], "<i4").tobytes()]
    body += [np.ascontiguousarray(r).tobytes() for i, part, index in found for r in parts.rows(part, index)]
    data = b"".join(body)
    data += hashlib.blake2b(data, digest_size=_DIGEST).digest()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise SlotError(f"could not write {path.name}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return {"n_saved": n, "n_written": len(data), "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def _read(path: Path, key: dict, parts: KVParts) -> tuple[list[int], list, memoryview]:
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
    try:
        header = json.loads(data[head:head + size])
        n, stored = int(header["tokens"]), [(int(i), str(p)) for i, p in header["parts"]]
    except (ValueError, KeyError, TypeError):
        raise SlotError(f"{path.name} has a malformed header") from None
    if header.get("key") != key:
        raise SlotError(f"{path.name} was saved from another model file, KV type or layout")
    at = head + size
    tokens = np.frombuffer(data, "<i4", n, at).tolist()
    at += 4 * n
    if at + sum(parts.nbytes[p] for _, p in stored) != len(data) - _DIGEST:
        raise SlotError(f"{path.name} has a malformed header")
    return tokens, stored, memoryview(data)[at:]


def restore(engine, path: Path) -> dict:
    """Read a slot file into the prefix cache (run between engine steps): its tokens and llama.cpp's answer
    fields. Its blocks need free KV blocks; where there are too few, nothing is placed and SlotError says so."""
    t0 = time.perf_counter()
    parts, key = _parts(engine)
    tokens, stored, payload = _read(path, key, parts)
    place = Placing(parts, tokens, len(tokens) // parts.bs)
    need = sum(1 for i, p in stored if p == "" and place.cached(i) is None)
    free = engine.block_manager.pool.num_free
    if need >= free:
        raise SlotError(f"restoring {path.name} needs {need} free KV blocks and {free} are free: try when fewer "
                        "requests run")
    missing = {(i, p) for i, p in stored if p == "state" or not place.hold(i, p)}  # (held: none is evicted)
    at = 0
    for i, part in stored:
        if (i, part) in missing:
            place.put(i, part, payload[at:at + parts.nbytes[part]])  # (a state already there is kept)
        at += parts.nbytes[part]
    place.close()
    return {"token_ids": tokens, "n_restored": len(tokens), "n_read": len(payload),
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}

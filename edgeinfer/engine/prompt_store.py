"""A prompt cache on disk: computed KV blocks that outlive the process, so a prefix seen before a restart skips
its prefill after it.

One file per full KV block, named by the block's chain digest (blake2b over the parent block's digest and the
block's token ids: the whole prefix up to and including the block), in a folder named by a digest of what the
bytes depend on: the model file's identity (its size and the digest of its first and last MiB), the KV types,
the block size, the cache's row shapes and LAYOUT_VERSION. Another model, another KV type or another layout
finds another folder: never a foreign entry.

An entry is a header (MAGIC, the layout version, the token count, the payload's length and its blake2b
digest) and the payload: the block's token ids (int32) then the KV rows' bytes. Reading one checks all of it
(a damaged, truncated or foreign file is removed and counts as a miss, never used) and the tokens against the
prompt's. Writing is the writer thread's (the engine's step only copies the rows and queues them): a
temporary file in the folder, flushed, then renamed over the entry's name, so a kill -9 mid-write leaves a
temporary file (removed at the next start) and never a partial entry. The folder is bounded: past `max_bytes`
the least recently used entries (by modification time, which a hit refreshes) are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
from pathlib import Path

import numpy as np

LAYOUT_VERSION = 1
MAGIC = b"EIKVBLK1"
_HEADER = struct.Struct("<8sIIQ32s")  # magic, layout version, tokens, payload bytes, payload digest
_SUFFIX = ".kvb"


def block_digest(parent: bytes, tokens) -> bytes:
    """The chain digest of a block of token ids after the block whose digest is parent (b"" for the first)."""
    return hashlib.blake2b(parent + np.asarray(tokens, "<i4").tobytes(), digest_size=16).digest()


def part_digest(digest: bytes, part: str) -> bytes:
    """The digest of a part of a block's entry stored on its own (its window rows, its state checkpoint)."""
    return hashlib.blake2b(digest + b"/" + part.encode(), digest_size=16).digest()


def _writing(name: str) -> bool:
    """Whether the temporary file `name` (ENTRY.PID.tmp) belongs to a live process other than this one."""
    try:
        pid = int(name.split(".")[-2])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # alive, another user's
    return True


def file_identity(path: str) -> str:
    """A model file's identity: its size and a digest of its first and last MiB (a copy or a re-download of
    the same file keeps it; another file, or a rewritten one, does not)."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return f"{size}:{h.hexdigest()}"


class PromptStore:
    """KV blocks on disk under root, at most max_bytes, for the cache described by `key` (a JSON-able dict)."""

    def __init__(self, root: str, max_bytes: int, key: dict):
        if max_bytes <= 0:
            raise ValueError(f"the prompt cache needs a size above 0 MB, got {max_bytes / 2**20:g}")
        name = hashlib.blake2b(json.dumps({**key, "layout": LAYOUT_VERSION}, sort_keys=True).encode(),
                               digest_size=8).hexdigest()
        self.dir = Path(root) / name
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "key.json").write_text(json.dumps({**key, "layout": LAYOUT_VERSION}, indent=1))
        except OSError as e:
            raise ValueError(f"the prompt cache folder {root} cannot be written: {e.strerror or e}") from None
        self.max_bytes = max_bytes
        self.hits = self.misses = self.bytes_written = self.bytes_read = self.damaged = self.write_errors = 0
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._pending: set[bytes] = set()  # queued, not yet written
        for p in self.dir.iterdir():
            try:
                if p.name.endswith(".tmp") and not _writing(p.name):  # a write a kill interrupted
                    p.unlink(missing_ok=True)
                elif p.name.endswith(_SUFFIX):
                    self._sizes[p.name] = p.stat().st_size
            except OSError:  # (another process's eviction, meanwhile)
                pass
        self._queue: queue.Queue = queue.Queue(maxsize=256)
        self._writer = threading.Thread(target=self._write_loop, name="prompt-cache-writer", daemon=True)
        self._writer.start()

    @property
    def size(self) -> int:
        """Bytes of entries on disk."""
        with self._lock:
            return sum(self._sizes.values())

    @property
    def entries(self) -> int:
        with self._lock:
            return len(self._sizes)

    def _path(self, digest: bytes) -> Path:
        return self.dir / (digest.hex() + _SUFFIX)

    def __contains__(self, digest: bytes) -> bool:
        with self._lock:
            return digest.hex() + _SUFFIX in self._sizes

    # -- reading -------------------------------------------------------------------------------------

    def load(self, digest: bytes, tokens, nbytes: int) -> bytes | None:
        """The KV bytes (nbytes of them) stored for the block of these tokens under digest, or None: a miss,
        or an entry that fails a check (removed)."""
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except OSError:
            self._forget(path)
            self.misses += 1
            return None
        tok = np.asarray(tokens, "<i4").tobytes()
        ok = len(data) == _HEADER.size + len(tok) + nbytes
        if ok:
            magic, version, n, length, check = _HEADER.unpack_from(data)
            payload = memoryview(data)[_HEADER.size:]
            ok = (magic == MAGIC and version == LAYOUT_VERSION and n == len(tokens) and length == len(payload)
                  and hashlib.blake2b(payload, digest_size=32).digest() == check and payload[:len(tok)] == tok)
        if not ok:
            self.damaged += 1
            self.misses += 1
            self._forget(path, remove=True)
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        self.hits += 1
        self.bytes_read += nbytes
        return bytes(payload[len(tok):])

    def _forget(self, path: Path, remove: bool = False) -> None:
        with self._lock:
            self._sizes.pop(path.name, None)
        if remove:
            path.unlink(missing_ok=True)

    # -- writing -------------------------------------------------------------------------------------

    def wants(self, digest: bytes) -> bool:
        """Whether save would take this block: not on disk, not queued, and the writer not far behind (a
        cache: a block it does not take is simply not stored)."""
        return digest not in self and digest not in self._pending and not self._queue.full()

    def save(self, digest: bytes, tokens, rows: list[np.ndarray]) -> None:
        """Queue the block's KV rows (copies the caller no longer touches) for the writer."""
        if not self.wants(digest):
            return
        self._pending.add(digest)
        try:
            self._queue.put_nowait((digest, tuple(tokens), rows))
        except queue.Full:
            self._pending.discard(digest)

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self._queue.join()

    def _write_loop(self) -> None:
        while True:
            digest, tokens, rows = self._queue.get()
            try:
                if digest not in self:
                    self._write(digest, tokens, rows)
            except Exception:  # a full or read-only disk, a folder removed: the block is not stored, the server
                self.write_errors += 1  # goes on (and the writer with it)
            finally:
                self._pending.discard(digest)
                self._queue.task_done()

    def _write(self, digest: bytes, tokens, rows: list[np.ndarray]) -> None:
        payload = np.asarray(tokens, "<i4").tobytes() + b"".join(np.ascontiguousarray(r).tobytes() for r in rows)
        header = _HEADER.pack(MAGIC, LAYOUT_VERSION, len(tokens), len(payload),
                              hashlib.blake2b(payload, digest_size=32).digest())
        path = self._path(digest)
        self.dir.mkdir(parents=True, exist_ok=True)  # (removed while the server ran: made again)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        with self._lock:
            self._sizes[path.name] = len(header) + len(payload)
        self.bytes_written += len(header) + len(payload)
        self._evict()

    def _evict(self) -> None:
        # least recently used first, until the folder is within max_bytes
        if self.size <= self.max_bytes:
            return
        with self._lock:
            names = list(self._sizes)
        ages = []
        for name in names:
            try:
                ages.append(((self.dir / name).stat().st_mtime_ns, name))
            except OSError:
                self._forget(self.dir / name)
        for _, name in sorted(ages):
            if self.size <= self.max_bytes:
                break
            self._forget(self.dir / name, remove=True)

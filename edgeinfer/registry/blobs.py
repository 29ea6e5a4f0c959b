"""Ollama's blobs: files a client uploads (POST /api/blobs/sha256:HEX) before an /api/create names them by digest
(a LoRA adapter in `adapters`, a GGUF model in `files`). Each is `<cache>/blobs/sha256-HEX`, written to a
temporary file while its digest is computed and renamed only when the digest is the one named: a kill mid-write
or a wrong digest leaves no blob, and a blob is never half a file."""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

from ..errors import EdgeInferError
from .cache import models_dir

DIR = "blobs"
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


class BlobError(EdgeInferError):
    """A digest that is not sha256:HEX, or an upload whose bytes are not the digest it named."""


def hex_of(digest: str) -> str:
    """The 64 hex digits of a digest "sha256:HEX" (Ollama's; "sha256-HEX" too); BlobError otherwise."""
    m = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise BlobError(f"{str(digest)[:80]!r} is not a blob digest: expected sha256:<64 lowercase hex digits>")
    return m.group(1)


def path(digest: str) -> Path:
    """Where the blob of this digest is (whether or not it is there)."""
    return models_dir() / DIR / f"sha256-{hex_of(digest)}"


def exists(digest: str) -> bool:
    return path(digest).is_file()


STALE_S = 24 * 3600  # a temporary file untouched this long is an upload a kill cut short


def _sweep(folder: Path) -> None:
    """Remove the temporary files of uploads a kill cut short (none is written to for a day)."""
    now = time.time()
    for p in folder.glob(".sha256-*.partial"):
        try:
            if now - p.stat().st_mtime > STALE_S:
                p.unlink()
        except OSError:
            pass


class Upload:
    """A blob being written: `write` each chunk, then `finish` (renamed into place when its digest is the one
    named; BlobError and nothing kept otherwise) or `abort`."""

    def __init__(self, digest: str):
        self.want = hex_of(digest)
        self.dest = path(digest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        _sweep(self.dest.parent)
        self.tmp = self.dest.with_name(f".{self.dest.name}.{os.getpid()}.{id(self)}.partial")
        self.f = open(self.tmp, "wb")
        self.h = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.h.update(chunk)
        self.f.write(chunk)
        self.size += len(chunk)

    def finish(self) -> Path:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        got = self.h.hexdigest()
        if got != self.want:
            self.tmp.unlink(missing_ok=True)
            raise BlobError(f"the upload's digest is sha256:{got}, not the sha256:{self.want} it was sent as "
                            f"({self.size} bytes): nothing was kept")
        os.replace(self.tmp, self.dest)
        return self.dest

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)

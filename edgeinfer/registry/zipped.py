"""One member inflated out of the joined bytes of a zip archive cut into wheels (a catalog entry with a
zip_member). The pieces hold only part of the archive, without its central directory, so zipfile cannot
open them: the member is found by its local file header at the offset the catalog records."""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path

from .cache import _progress_bar
from .catalog import ZipMember
from .errors import PullError


_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # zip's local file header: 30 bytes, then the name and extra field


def _extract_member(joined: Path, m: ZipMember, size: int, out_path: Path, progress: bool):
    """Inflate one member out of joined zip-archive bytes, streamed (never all in memory), checking its
    local header (signature, name, method, and sizes and CRC where the header carries them) and its
    CRC-32 and size once inflated. Returns (bytes written, sha256 object)."""
    where = f"the archive's member {m.name}"
    with open(joined, "rb") as f:
        f.seek(m.header_offset)
        raw = f.read(_LOCAL_HEADER.size)
        if len(raw) < _LOCAL_HEADER.size or raw[:4] != b"PK\x03\x04":
            raise PullError(f"no zip local file header at byte {m.header_offset} of the joined pieces "
                            f"(found {raw[:4]!r}): the pieces are not the expected archive")
        _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len = _LOCAL_HEADER.unpack(raw)
        name = f.read(name_len).decode("utf-8", "replace")
        if name != m.name:
            raise PullError(f"the zip entry at byte {m.header_offset} is {name!r}, expected {m.name!r}")
        if method != 8:
            raise PullError(f"{where} uses compression method {method}; expected deflate (8)")
        if not flags & 8:  # sizes and CRC are in the header (else in a descriptor after the data)
            if crc != m.crc32 or (csize != 0xFFFFFFFF and csize != m.compressed_size) \
                    or (usize != 0xFFFFFFFF and usize != size):
                raise PullError(f"{where} has CRC {crc:#010x}, {csize} bytes compressed, {usize} inflated; expected "
                                f"{m.crc32:#010x}, {m.compressed_size} and {size}")
        f.seek(extra_len, 1)
        inflate = zlib.decompressobj(-15)  # raw deflate: no zlib header
        digest, crc, written, left = hashlib.sha256(), 0, 0, m.compressed_size
        with open(out_path, "wb") as out, _progress_bar(size, f"inflate {Path(m.name).name}", progress) as bar:
            def emit(data: bytes):
                nonlocal crc, written
                if written + len(data) > size:
                    raise PullError(f"{where} inflates to more than the expected {size} bytes")
                out.write(data)
                digest.update(data)
                crc = zlib.crc32(data, crc)
                written += len(data)
                bar.update(len(data))

            while left:
                chunk = f.read(min(1 << 20, left))
                if not chunk:
                    raise PullError(f"the joined pieces end {left} bytes into {where}'s compressed data")
                left -= len(chunk)
                try:
                    emit(inflate.decompress(chunk))
                except zlib.error as e:
                    raise PullError(f"{where} is not valid deflate data: {e}") from None
            emit(inflate.flush())
            if not inflate.eof:
                raise PullError(f"{where}'s compressed data ends before its deflate stream does")
    if crc != m.crc32:
        raise PullError(f"{where} inflated with CRC-32 {crc:#010x}, expected {m.crc32:#010x}")
    return written, digest

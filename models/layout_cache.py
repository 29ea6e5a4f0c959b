"""The repacked weights of a model kept as a file, mapped at the next load instead of rebuilt.

Loading repacks every quantized matrix into the kernels' layout (quant/repack.py, the interleaved
layout of the SIMD paths): on Qwen2.5-Coder 1.5B that is 1.1 GB of fresh memory written at every start.
The first load on the CPU backend writes what it built to ``$EDGEINFER_HOME/layouts/NAME-LAYOUT-ID.layout``;
later loads map that file copy-on-write (never written to, so its pages stay the shared, evictable
page cache, as llama.cpp's mapped GGUF does) and read nothing of the GGUF's weights. LAYOUT names the
layout the kernel path reads (kernels/cpu/layout.layout_id: every SIMD path reads the same interleaved
bytes), never the path itself: one file per model and layout serves every path that reads those bytes.
Files named after the kernel path (before VERSION 4: two model-sized files where vnni and avx512 shared
the bytes) are removed when found.

A layout file is trusted only when everything checks out: the magic, the format version, the model's
identity (its resolved path, size, modification and change times, inode and the sha256 of its first and
last 4 MiB: a replaced, copied or edited model file is another model), the layout, every array's place
inside the file, and every array's CRC-32 (computed in threads at load). Anything else, from a torn write
to a flipped bit, is reported as stale, the file is removed, and the layout is rebuilt from the GGUF and
written again. A file is written under a temporary name and renamed into place whole, so a killed load
leaves none.

Layout of the file: ``MAGIC, u32 version, u64 header length, header JSON, pad to 4096, arrays (each at a
4096-aligned offset from there), END`` where the header lists, per tensor, its metadata and
``[field, dtype, shape, offset, crc32]`` for each of its arrays.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MAGIC = b"EILAYOUT"
END = b"EILAYEND"
VERSION = 6  # bump when the repacked layouts (kernels/formats, kernels/cpu/layout.py) or this file's header change
ALIGN = 4096


class StaleLayout(Exception):
    """A layout file that is not to be trusted; the message says why."""


def clear() -> int:
    """Remove every layout file; bytes freed."""
    import shutil

    from ..kernels.cpu.cache import dir_size

    d = layouts_dir()
    freed = dir_size(d)[0]
    shutil.rmtree(d, ignore_errors=True)
    return freed


def model_identity(path: str) -> str:
    """What makes a model file the same file: path, size, times, inode and its head and tail."""
    st = os.stat(path)
    # ctime moves on every write and cannot be set back (unlike mtime, which copies keep); with the
    # resolved path and the inode, a file rewritten in place or a new file on a reused inode is another
    h = hashlib.sha256(f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}".encode())
    with open(path, "rb") as f:
        h.update(f.read(4 << 20))
        if st.st_size > 8 << 20:
            f.seek(-(4 << 20), os.SEEK_END)
            h.update(f.read(4 << 20))
    return h.hexdigest()


def layouts_dir() -> str:
    from .. import registry

    return str(registry.home() / "layouts")


def _data_start(header_len: int) -> int:
    # where the arrays begin: past the magic, version, header length and header, on a page boundary
    return -(-(len(MAGIC) + 12 + header_len) // ALIGN) * ALIGN


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(_bytes(a)) & 0xFFFFFFFF


def _bytes(a: np.ndarray) -> np.ndarray:
    # an array's bytes as a flat uint8 array (empty arrays included)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


class LayoutStore:
    """The layout file of one model for the layout one kernel path reads: `get` serves mapped matrices
    from it when it is valid; otherwise `put` records what the load built and `finish` writes the file."""

    def __init__(self, model_path: str, kernel_path: str, directory: str | None = None):
        from ..kernels.cpu.layout import layout_id

        self.identity = model_identity(model_path)
        # named by the layout, not the path: every path that reads the same bytes shares the file, so a
        # machine that moves from one to another keeps it instead of writing a second model-sized one
        self.layout = layout_id(kernel_path)
        stem = os.path.splitext(os.path.basename(model_path))[0]
        self.path = os.path.join(directory or layouts_dir(), f"{stem}-{self.layout}-{self.identity[:16]}.layout")
        self._remove_path_named(stem)
        self.tensors: dict[str, dict] = {}  # name -> {"meta": {...}, field: array}, from the file
        self.recorded: dict[str, tuple] = {}  # name -> (meta, {field: array}) to write
        self.stale_reason: str | None = None
        self._map = None
        try:
            self._open()
        except FileNotFoundError:
            pass
        except (StaleLayout, OSError, ValueError, KeyError, TypeError, struct.error) as e:
            self.stale_reason = str(e) or type(e).__name__
            self.tensors = {}
            self._map = None
            try:
                os.unlink(self.path)
            except OSError:
                pass

    @property
    def valid(self) -> bool:
        return bool(self.tensors)

    def _open(self) -> None:
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(MAGIC) + 12 + len(END):
                raise StaleLayout("truncated")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        if mm[:len(MAGIC)] != MAGIC or mm[-len(END):] != END:
            raise StaleLayout("not a complete layout file")
        version, hlen = struct.unpack_from("<IQ", mm, len(MAGIC))
        if version != VERSION:
            raise StaleLayout(f"layout version {version}, this edgeinfer writes {VERSION}")
        header = json.loads(bytes(mm[len(MAGIC) + 12:len(MAGIC) + 12 + hlen]))
        start = _data_start(hlen)
        if header["identity"] != self.identity or header["layout"] != self.layout:
            raise StaleLayout("made for another model file or layout")
        arrays = []
        for name, entry in header["tensors"].items():
            t = {"meta": entry["meta"]}
            for field, dtype, shape, rel, crc in entry["arrays"]:
                dt = np.dtype(dtype)
                n = int(np.prod(shape, dtype=np.int64))
                offset = start + rel
                if rel % ALIGN or rel < 0 or offset + n * dt.itemsize > size - len(END):
                    raise StaleLayout(f"array {name}.{field} lies outside the file")
                a = np.frombuffer(mm, dt, n, offset).reshape(shape)
                t[field] = a
                arrays.append((a, crc, f"{name}.{field}"))
            self.tensors[name] = t
        with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:  # zlib drops the GIL
            for (a, crc, what), got in zip(arrays, pool.map(lambda x: _crc(x[0]), arrays)):
                if got != crc:
                    raise StaleLayout(f"array {what} is damaged (CRC mismatch)")
        self._map = mm

    def _remove_path_named(self, stem: str) -> None:
        # this model's files named after a kernel path (VERSION 3 and before), of any identity: stale by
        # their version, each a model's size
        from ..kernels.cpu.simd import PATHS

        d = os.path.dirname(self.path)
        old = re.compile(rf"{re.escape(stem)}-({'|'.join(PATHS)})-[0-9a-f]{{16}}\.layout")
        try:
            names = os.listdir(d)
        except OSError:
            return
        for name in names:
            if old.fullmatch(name):
                try:
                    os.unlink(os.path.join(d, name))
                except OSError:
                    pass

    def _remove_older(self) -> None:
        # layouts of earlier versions of this model file in this layout are dead weight (a model's size)
        d, own = os.path.split(self.path)
        prefix = own[: -len(self.identity[:16]) - len(".layout")]
        for name in os.listdir(d):
            if name.startswith(prefix) and name.endswith(".layout") and name != own \
                    and len(name) == len(own):
                try:
                    os.unlink(os.path.join(d, name))
                except OSError:
                    pass

    def get(self, name: str):
        """The stored tensor `name` as (meta, {field: array}), or None."""
        t = self.tensors.get(name)
        if t is None:
            return None
        return t["meta"], {f: t[f] for f in t if f != "meta"}

    def put(self, name: str, meta: dict, arrays: dict) -> None:
        if not self.valid:
            self.recorded[name] = (meta, arrays)

    def finish(self) -> bool:
        """Write the recorded tensors (when the file was absent or stale); True if written. A failure to
        write (a full disk, a read-only home) leaves no file and is not an error: the next load repacks."""
        if self.valid or not self.recorded:
            return False
        entries, blobs, offset = {}, [], 0
        for name, (meta, arrays) in self.recorded.items():
            rows = []
            for field, a in arrays.items():
                a = np.ascontiguousarray(a)
                rows.append([field, a.dtype.str, list(a.shape), offset, _crc(a)])
                blobs.append((offset, a))
                offset += -(-a.nbytes // ALIGN) * ALIGN
            entries[name] = {"meta": meta, "arrays": rows}
        header = json.dumps({"identity": self.identity, "layout": self.layout, "tensors": entries}).encode()
        start = _data_start(len(header))
        tmp = f"{self.path}.{os.getpid()}.partial"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<IQ", VERSION, len(header)) + header)
                for off, a in blobs:
                    f.seek(start + off)
                    f.write(_bytes(a))
                f.seek(start + offset)
                f.write(END)
            os.replace(tmp, self.path)
            self._remove_older()
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        self.recorded = {}
        return True

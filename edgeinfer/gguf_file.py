"""A strict, memory-mapped GGUF reader.

Every malformed input raises :class:`GGUFError` (a ``ValueError``) whose message names the problem
and the byte offset. Counts read from the file are checked against the bytes that remain before
anything is allocated, so a tiny file that declares a huge array fails at once instead of hanging.
Tensor data is exposed as zero-copy numpy views over the memory map. This module reads the header,
the tensor infos and the data; gguf_values.py reads the metadata values and checks their types.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .gguf_values import KEY_SCHEMA, Cursor, GGUFError, check_type, read_value, value_type

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (fastest-varying)
    ggml_type: GGMLQuantizationType
    offset: int  # relative to the start of the data section
    n_elements: int
    n_bytes: int

    @property
    def type_name(self) -> str:
        return self.ggml_type.name


def _new_name(cur: Cursor, seen, what: str, empty: str, duplicate: str) -> tuple[int, str]:
    """(offset, name) of a metadata key or tensor name read at the cursor, which must be non-empty and not
    in `seen`; the two messages name the offset as {off} (and the name as {name!r})."""
    off = cur.pos
    name = cur.string(what)
    if not name:
        raise GGUFError(empty.format(off=off))
    if name in seen:
        raise GGUFError(duplicate.format(name=name, off=off))
    return off, name


class GGUFFile:
    """A validated GGUF file: ``metadata`` (key -> value), ``tensors`` (name -> TensorInfo)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise GGUFError(f"cannot open {self.path}: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise GGUFError("empty file (0 bytes): not a GGUF file")
            self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.file_size = size
        try:
            self._parse(memoryview(self._mmap), self._mmap)
        except GGUFError:
            self.close()
            raise

    def close(self) -> None:
        mm = getattr(self, "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views are still alive; the map closes when they are gone

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _parse(self, buf, raw) -> None:
        cur = Cursor(buf, raw)
        cur.need(4, "magic")
        magic = bytes(buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"bad magic {magic!r} at offset 0: not a GGUF file (expected b'GGUF')")
        cur.pos = 4
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            swapped = struct.unpack("<I", struct.pack(">I", version))[0]
            if swapped in SUPPORTED_VERSIONS:
                raise GGUFError("big-endian GGUF files are unsupported (version field at offset 4 is byte-swapped)")
            raise GGUFError(f"unsupported GGUF version {version} at offset 4 (supported: 2, 3)")
        self.version = version
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata key count")
        left = cur.size - cur.pos
        # A key needs at least 8 (length) + 1 (name) + 4 (type) + 1 byte; a tensor info 8+1+4+8+4+8.
        if n_kv > left // 14:
            raise GGUFError(f"metadata key count {n_kv} at offset 16 is larger than the {left} bytes left could hold")
        if n_tensors > left // 33:
            raise GGUFError(f"tensor count {n_tensors} at offset 8 is larger than the {left} bytes left could hold")

        metadata: dict[str, Any] = {}
        types: dict[str, tuple[GGUFValueType, GGUFValueType | None, int]] = {}
        for i in range(n_kv):
            key = _new_name(cur, metadata, f"metadata key #{i}", f"empty metadata key #{i} at offset {{off}}",
                            "duplicate metadata key {name!r} at offset {off}")[1]
            type_off = cur.pos
            vtype = value_type(cur.u32(f"type of {key!r}"), type_off, f"key {key!r}")
            etype = None
            if vtype == GGUFValueType.ARRAY:
                cur.need(4, f"element type of {key!r}")
                etype = value_type(struct.unpack_from("<I", buf, cur.pos)[0], cur.pos, f"elements of {key!r}")
            metadata[key] = read_value(cur, vtype, f"value of {key!r}")
            types[key] = (vtype, etype, type_off)
        self.metadata = metadata
        self.metadata_types = types

        arch = metadata.get("general.architecture")
        for pattern, (want, want_elem) in KEY_SCHEMA.items():
            key = pattern.replace("ARCH", arch) if isinstance(arch, str) else pattern
            if "ARCH" in key or key not in types:
                continue
            vtype, etype, off = types[key]
            check_type(key, vtype, etype, want, want_elem, off)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"general.alignment {alignment} at offset {types['general.alignment'][2]} is not a power of two")
        self.alignment = alignment

        tensors: dict[str, TensorInfo] = {}
        for i in range(n_tensors):
            info_off, name = _new_name(cur, tensors, f"name of tensor #{i}",
                                       f"tensor #{i} at offset {{off}} has an empty name",
                                       "duplicate tensor name {name!r} at offset {off}")
            n_dims = cur.u32(f"dimension count of tensor {name!r}")
            if n_dims == 0 or n_dims > MAX_DIMS:
                raise GGUFError(f"tensor {name!r} at offset {info_off} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
            dims = []
            for d in range(n_dims):
                dim = cur.u64(f"dimension {d} of tensor {name!r}")
                if dim == 0:
                    raise GGUFError(f"tensor {name!r} at offset {info_off} has a zero dimension {d}")
                if dim >= 1 << 62:
                    raise GGUFError(f"tensor {name!r} at offset {info_off}: dimension {d} ({dim}) overflows")
                dims.append(dim)
            type_off = cur.pos
            raw_type = cur.u32(f"type of tensor {name!r}")
            try:
                gtype = GGMLQuantizationType(raw_type)
            except ValueError:
                raise GGUFError(f"tensor {name!r} has unknown ggml type {raw_type} at offset {type_off}") from None
            if gtype not in GGML_QUANT_SIZES:
                raise GGUFError(f"tensor {name!r} has unsupported ggml type {gtype.name} at offset {type_off}")
            offset = cur.u64(f"data offset of tensor {name!r}")
            n_el = 1
            for dim in dims:
                n_el *= dim
                if n_el >= 1 << 62:
                    raise GGUFError(f"tensor {name!r} at offset {info_off}: element count overflows")
            block, type_size = GGML_QUANT_SIZES[gtype]
            if dims[0] % block:
                raise GGUFError(
                    f"tensor {name!r} at offset {info_off}: row length {dims[0]} is not a multiple of "
                    f"the {gtype.name} block size {block}"
                )
            n_bytes = n_el // block * type_size
            if offset % alignment:
                raise GGUFError(f"tensor {name!r}: data offset {offset} (at {type_off + 4}) is not aligned to {alignment}")
            tensors[name] = TensorInfo(name, tuple(dims), gtype, offset, n_el, n_bytes)

        self.data_offset = -(-cur.pos // alignment) * alignment
        data_size = self.file_size - self.data_offset
        spans = sorted((t.offset, t.offset + t.n_bytes, t.name) for t in tensors.values())
        prev_end, prev_name = 0, None
        for start, end, name in spans:
            if end > data_size:
                raise GGUFError(
                    f"tensor {name!r} data [{self.data_offset + start}, {self.data_offset + end}) "
                    f"runs past the end of the file ({self.file_size} bytes)"
                )
            if start < prev_end:
                raise GGUFError(f"tensor {name!r} data at offset {self.data_offset + start} overlaps tensor {prev_name!r}")
            prev_end, prev_name = end, name
        self.tensors = tensors

    # -- accessors -------------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if arch is None:
            raise GGUFError("missing metadata key 'general.architecture'")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"missing metadata key {key!r}")
        return self.metadata[key]

    def tensor_bytes(self, name: str) -> np.ndarray:
        """Raw bytes of a tensor as a zero-copy uint8 view, shaped (rows..., bytes per row)."""
        t = self.tensors[name]
        block, type_size = GGML_QUANT_SIZES[t.ggml_type]
        arr = np.frombuffer(self._mmap, dtype=np.uint8, count=t.n_bytes, offset=self.data_offset + t.offset)
        row_bytes = t.shape[0] // block * type_size
        return arr.reshape(tuple(reversed(t.shape[1:])) + (row_bytes,))

    def tensor(self, name: str) -> np.ndarray:
        """A zero-copy view of a tensor: F32/F16 as floats, others as raw block bytes (numpy shape order)."""
        t = self.tensors[name]
        raw = self.tensor_bytes(name)
        if t.ggml_type == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(tuple(reversed(t.shape)))
        if t.ggml_type == GGMLQuantizationType.F16:
            return raw.view(np.float16).reshape(tuple(reversed(t.shape)))
        return raw

    def release(self, name: str, row0: int = 0, row1: int | None = None) -> None:
        """Drop a tensor's pages (or those of its rows row0 .. row1) from this process's memory once they
        have been copied (repacked).

        The file stays mapped; reading the tensor again just faults the pages back in."""
        t = self.tensors[name]
        page = mmap.PAGESIZE
        rows = max(1, t.n_elements // t.shape[0])
        row_bytes = t.n_bytes // rows
        row1 = rows if row1 is None else row1
        start = self.data_offset + t.offset + row0 * row_bytes
        first = -(-start // page) * page  # whole pages only: neighbours may still be needed
        last = (self.data_offset + t.offset + row1 * row_bytes) // page * page
        if last > first and hasattr(self._mmap, "madvise"):
            try:
                self._mmap.madvise(mmap.MADV_DONTNEED, first, last - first)
            except (OSError, ValueError):
                pass

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return counts

    def type_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.type_name] = out.get(t.type_name, 0) + t.n_bytes
        return out

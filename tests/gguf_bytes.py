"""Hand-built GGUF bytes for malformed-file tests (GGUFWriter refuses to write broken files)."""

from __future__ import annotations

import struct

from gguf.constants import GGUFValueType as VT

FMT = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
       VT.FLOAT32: "<f", VT.BOOL: "<B", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, value) -> bytes:
    out = s(key) + struct.pack("<I", vtype)
    if vtype == VT.STRING:
        return out + s(value)
    if vtype == VT.ARRAY:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        for it in items:
            out += s(it) if etype == VT.STRING else struct.pack(FMT[VT(etype)], it)
        return out
    return out + struct.pack(FMT[VT(vtype)], value)


def tensor_info(name: str, dims, ggml_type: int, offset: int) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ggml_type, offset)


def build(kvs=(), tensors=(), data: bytes = b"", version: int = 3, magic: bytes = b"GGUF",
          n_kv: int | None = None, n_tensors: int | None = None, alignment: int = 32) -> bytes:
    """kvs: encoded kv() blobs; tensors: encoded tensor_info() blobs; data is padded to alignment."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    pad = (-len(body)) % alignment
    return body + b"\0" * pad + data


def valid(n_floats: int = 64) -> bytes:
    """A small valid file: an architecture key and one F32 tensor."""
    return build(
        kvs=[kv("general.architecture", VT.STRING, "llama")],
        tensors=[tensor_info("w", [n_floats], 0, 0)],
        data=struct.pack(f"<{n_floats}f", *range(n_floats)),
    )

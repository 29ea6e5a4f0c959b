"""GGUF's values: bounds-checked little-endian reads, metadata values of every type (scalars, strings,
arrays, arrays of arrays), and the types the runtime expects of the keys it reads. Every malformed value
raises GGUFError with the problem and its offset (gguf_file.py reads the file with these)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from gguf.constants import GGUFValueType

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SCALAR_DTYPES = {
    GGUFValueType.UINT8: np.uint8,
    GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32,
    GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32,
    GGUFValueType.BOOL: np.uint8,
    GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT64: np.float64,
}
_INT_TYPES = {
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
}
_FLOAT_TYPES = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}

# Types of metadata the runtime reads. A key present with another type is a malformed file.
# "ARCH" stands for the value of general.architecture.
KEY_SCHEMA: dict[str, tuple[str, GGUFValueType | None]] = {
    "general.architecture": ("str", None),
    "general.name": ("str", None),
    "general.alignment": ("uint32", None),
    "general.file_type": ("int", None),
    "general.quantization_version": ("int", None),
    "tokenizer.ggml.model": ("str", None),
    "tokenizer.ggml.pre": ("str", None),
    "tokenizer.ggml.tokens": ("array", GGUFValueType.STRING),
    "tokenizer.ggml.scores": ("array", GGUFValueType.FLOAT32),
    "tokenizer.ggml.token_type": ("array", GGUFValueType.INT32),
    "tokenizer.ggml.merges": ("array", GGUFValueType.STRING),
    "tokenizer.ggml.bos_token_id": ("int", None),
    "tokenizer.ggml.eos_token_id": ("int", None),
    "tokenizer.ggml.eot_token_id": ("int", None),
    "tokenizer.ggml.unknown_token_id": ("int", None),
    "tokenizer.ggml.padding_token_id": ("int", None),
    "tokenizer.ggml.add_bos_token": ("bool", None),
    "tokenizer.ggml.add_eos_token": ("bool", None),
    "tokenizer.ggml.add_space_prefix": ("bool", None),
    "tokenizer.chat_template": ("str", None),
    "ARCH.context_length": ("int", None),
    "ARCH.embedding_length": ("int", None),
    "ARCH.block_count": ("int", None),
    # per layer in some models (Gemma 3n/4, OpenELM): an integer or an array of integers, as llama.cpp reads them
    "ARCH.feed_forward_length": ("int_or_ints", None),
    "ARCH.attention.head_count": ("int_or_ints", None),
    "ARCH.attention.head_count_kv": ("int_or_ints", None),
    "ARCH.attention.key_length": ("int", None),
    "ARCH.attention.value_length": ("int", None),
    "ARCH.attention.layer_norm_rms_epsilon": ("float", None),
    "ARCH.attention.sliding_window": ("int", None),
    "ARCH.rope.freq_base": ("float", None),
    "ARCH.rope.dimension_count": ("int", None),
    "ARCH.rope.scaling.type": ("str", None),
    "ARCH.rope.scaling.factor": ("float", None),
    "ARCH.rope.scaling.original_context_length": ("int", None),
    "ARCH.rope.scaling.yarn_beta_fast": ("float", None),
    "ARCH.rope.scaling.yarn_beta_slow": ("float", None),
    "ARCH.rope.scaling.yarn_log_multiplier": ("float", None),
    "ARCH.attention.temperature_scale": ("float", None),
    "ARCH.vocab_size": ("int", None),
    "ARCH.final_logit_softcapping": ("float", None),
    "ARCH.attn_logit_softcapping": ("float", None),
}


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported. The message names the problem and the offset."""


class Cursor:
    """Bounds-checked little-endian reads over a buffer."""

    __slots__ = ("buf", "raw", "pos", "size")

    def __init__(self, buf, raw, pos: int = 0):
        self.buf = buf  # memoryview, for numpy views
        self.raw = raw  # the mmap itself: slicing it gives bytes
        self.pos = pos
        self.size = len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"truncated file: {what} needs {n} bytes at offset {self.pos}, "
                f"but only {self.size - self.pos} remain"
            )

    def scalar(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise GGUFError(
                f"{what} at offset {start} declares length {n}, "
                f"larger than the {self.size - self.pos} bytes left"
            )
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{what} at offset {start} is not valid UTF-8 ({e.reason})") from None


def value_type(raw: int, offset: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(f"unknown value type {raw} for {what} at offset {offset}") from None


MAX_STRINGS = 1 << 21  # strings in one array: 8x the largest real vocabulary (Gemma 3's 262,144)


def _read_string_array(cur: Cursor, count: int, what: str) -> list[str]:
    if count > MAX_STRINGS:  # refused before reading: a file of 10 million empty strings is only 80 MB
        raise GGUFError(f"{what} holds {count:,} strings; at most {MAX_STRINGS:,} are allowed")
    # Tight loop: Gemma's 262,144 vocabulary strings must load in a fraction of a second.
    # Slicing the underlying mmap/bytes object yields bytes directly (one copy, no memoryview).
    raw, pos, size = cur.raw, cur.pos, cur.size
    unpack = struct.Struct("<Q").unpack_from
    out = [None] * count
    try:
        for i in range(count):
            (n,) = unpack(raw, pos)
            pos += 8
            if n > size - pos:
                raise GGUFError(
                    f"{what}[{i}] at offset {pos - 8} declares length {n}, larger than the {size - pos} bytes left"
                )
            out[i] = raw[pos:pos + n].decode("utf-8")
            pos += n
    except struct.error:
        raise GGUFError(f"truncated file: length of {what}[{i}] at offset {pos}") from None
    except UnicodeDecodeError as e:
        raise GGUFError(f"{what}[{i}] at offset {pos} is not valid UTF-8 ({e.reason})") from None
    cur.pos = pos
    return out


def read_value(cur: Cursor, vtype: GGUFValueType, what: str, depth: int = 0) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(what)
    if vtype == GGUFValueType.ARRAY:
        start = cur.pos
        etype = value_type(cur.u32(f"element type of {what}"), start, f"elements of {what}")
        count = cur.u64(f"element count of {what}")
        left = cur.size - cur.pos
        if etype == GGUFValueType.ARRAY:
            if depth >= 1:
                raise GGUFError(f"{what} at offset {start}: arrays nested deeper than two levels")
            min_size = 12  # an empty inner array still needs its type and count
        elif etype == GGUFValueType.STRING:
            min_size = 8
        else:
            min_size = struct.calcsize(_SCALAR_FORMATS[etype])
        if count > left // min_size:
            raise GGUFError(
                f"{what} at offset {start} declares {count} elements, "
                f"more than the {left} bytes left could hold"
            )
        if etype == GGUFValueType.STRING:
            return _read_string_array(cur, count, what)
        if etype == GGUFValueType.ARRAY:
            return [read_value(cur, etype, f"{what}[{i}]", depth + 1) for i in range(count)]
        dtype = np.dtype(_SCALAR_DTYPES[etype]).newbyteorder("<")
        # a copy, not a view: metadata must outlive the file mapping, which closes after loading
        arr = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos).copy()
        cur.pos += count * dtype.itemsize
        if etype == GGUFValueType.BOOL:
            return [bool(x) for x in arr]
        return arr
    v = cur.scalar(_SCALAR_FORMATS[vtype], what)
    if vtype == GGUFValueType.BOOL:
        if v not in (0, 1):
            raise GGUFError(f"{what} at offset {cur.pos - 1} is a bool with value {v}, not 0 or 1")
        return bool(v)
    return v


def check_type(key: str, vtype: GGUFValueType, etype: GGUFValueType | None, want: str,
                want_elem: GGUFValueType | None, offset: int) -> None:
    ok = {
        "str": vtype == GGUFValueType.STRING,
        "bool": vtype == GGUFValueType.BOOL,
        "int": vtype in _INT_TYPES,
        "int_or_ints": vtype in _INT_TYPES or (vtype == GGUFValueType.ARRAY and etype in _INT_TYPES),
        "uint32": vtype == GGUFValueType.UINT32,
        "float": vtype in _FLOAT_TYPES,
        "array": vtype == GGUFValueType.ARRAY and etype == want_elem,
    }[want]
    if not ok:
        got = vtype.name + (f" of {etype.name}" if etype is not None else "")
        exp = {"str": "STRING", "bool": "BOOL", "int": "an integer", "int_or_ints": "an integer or an array of integers",
               "uint32": "UINT32",
               "float": "FLOAT32 or FLOAT64",
               "array": f"ARRAY of {want_elem.name if want_elem else ''}"}[want]
        raise GGUFError(f"metadata key {key!r} at offset {offset} has type {got}, expected {exp}")

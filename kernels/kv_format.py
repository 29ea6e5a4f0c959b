"""The KV cache's row formats: how one row of d values (one head's K or V at one slot) is stored.

The one table of KV types. The kernels write and read these rows (write_kv, paged attention, the
compiled step's units per KV type); the engine allocates them and memory.py counts them, reaching this
table through the backend object (`kb.KV_FORMATS`) or, for an estimate before any backend is loaded, by
importing it: it imports nothing, so every layer may.

A cache is, per layer, (n_slots, n_kv_head, row_len(d)) elements of `storage`:
  f32   float32 values
  f16   float16 bit patterns (uint16): half of f32, the CPU default (as llama.cpp's)
  q8_0  int8: the row's d quants (blocks of 32), then the blocks' float16 scales as little-endian byte
        pairs: d + d/16 bytes, 1.0625 bytes per value (llama.cpp's q8_0 block: 34 bytes per 32 values)
  bf16  bfloat16 bit patterns
  q5_1, q5_0, q4_1, q4_0, iq4_nl
        bytes: the row's d/32 blocks, each ggml's block of that type byte for byte (q4_0: a float16 scale and
        16 bytes of 4-bit quants, 18 bytes per 32 values; q4_1 20, q5_0 22, q5_1 24, iq4_nl 18)

bf16 and the 4- and 5-bit types share their element types with others, so each has a numpy type of its own:
a record of one field named after the format (`tagged`), which a compiled kernel tells apart by its type.

K and V may have types of their own: a KV type is one name (both) or "K/V" (`kv_pair`, `kv_name`), as
llama.cpp's -ctk and -ctv. Each cache array is in its own type's rows; the kernels read each by its
array's element type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


@dataclass(frozen=True)
class KVFormat:
    name: str
    storage: type  # the cache arrays' element type
    block: int = 0  # values per quantization block; 0: none
    block_bytes: int = 0  # bytes per block (q8_0: d quants then the blocks' scales; the others: ggml's blocks)

    def row_len(self, d: int) -> int:
        """Elements in one row of d values: d, or d / block blocks' bytes."""
        return d // self.block * self.block_bytes if self.block else d

    def check(self, *dims: int) -> None:
        """ValueError when a model's head sizes (of the rows this format holds) do not fit its blocks."""
        if self.block and any(d % self.block for d in dims):
            raise ValueError(f"a {self.name} KV cache needs head sizes that are multiples of {self.block} (this "
                             f"model's are {' and '.join(map(str, dims))}): use kv_type 'f16'")

    def row_bytes(self, d: int) -> int:
        return self.row_len(d) * np.dtype(self.storage).itemsize

    def bytes_per_token(self, cfg, n_layers: int | None = None) -> int:
        """Bytes one token's K and V take in every attention layer of a model config cfg (a recurrent
        layer keeps none), or in n_layers of them."""
        n = len(cfg.kv_layers) if n_layers is None else n_layers
        return n * cfg.n_kv_head * (self.row_bytes(cfg.head_dim) + self.row_bytes(cfg.v_head_dim))


def kv_pair(kv: str) -> tuple[str, str]:
    """A KV type, one name (K and V both) or "K/V", as (K's type, V's)."""
    k, _, v = kv.partition("/")
    return k, v or k


def kv_name(k: str, v: str) -> str:
    """The KV type of K in k and V in v: one name where they are the same."""
    return k if k == v else f"{k}/{v}"


def tagged(name: str, base) -> np.dtype:
    """The element type of a format that shares `base` with another: a record of one field, `name`."""
    return np.dtype([(name, base)])


def _blocks(name: str, storage) -> KVFormat:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    return KVFormat(name, storage, block, size)


KV_FORMATS = {f.name: f for f in (KVFormat("f32", np.float32), KVFormat("f16", np.uint16),
                                  KVFormat("bf16", tagged("bf16", np.uint16)), _blocks("q8_0", np.int8),
                                  *(_blocks(n, tagged(n, np.uint8)) for n in ("q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")))}
# every KV type: each format for K with each for V
KV_TYPES_ALL = tuple(kv_name(k, v) for k in KV_FORMATS for v in KV_FORMATS)

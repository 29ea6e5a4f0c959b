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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KVFormat:
    name: str
    storage: type  # the cache arrays' element type
    block: int = 0  # values per quantization block, each with a float16 scale after the row's quants; 0: none

    def row_len(self, d: int) -> int:
        """Elements in one row of d values: d, or d quants + 2 bytes of scale per block."""
        return d + 2 * d // self.block if self.block else d

    def check(self, head_dim: int, v_head_dim: int) -> None:
        """ValueError when a model's head sizes do not fit this format's blocks."""
        if self.block and (head_dim % self.block or v_head_dim % self.block):
            raise ValueError(f"a {self.name} KV cache needs head sizes that are multiples of {self.block} (this "
                             f"model's are {head_dim} and {v_head_dim}): use kv_type 'f16'")

    def bytes_per_token(self, cfg, n_layers: int | None = None) -> int:
        """Bytes one token's K and V take in every attention layer of a model config cfg (a recurrent
        layer keeps none), or in n_layers of them."""
        row = self.row_len(cfg.head_dim) + self.row_len(cfg.v_head_dim)
        n = len(cfg.kv_layers) if n_layers is None else n_layers
        return n * cfg.n_kv_head * row * np.dtype(self.storage).itemsize


KV_FORMATS = {f.name: f for f in (KVFormat("f32", np.float32), KVFormat("f16", np.uint16),
                                  KVFormat("q8_0", np.int8, 32))}

"""The paged KV cache's storage: per layer, fixed-size blocks of K and V rows, in one of the backend's row
formats (kb.KV_FORMATS, the table in kernels/kv_format.py: the engine reaches it through the backend
object it is given, never by importing the kernels)."""

from __future__ import annotations

import numpy as np

from ..pages import MADV_NOHUGEPAGE, madvise


class KVCache:
    """Paged KV storage: for each layer, (n_blocks * block_size) slots of n_kv_head rows in the row format
    `dtype` names (f32, f16 bits or q8_0 blocks; kernels/kv_format.py). The attention kernel widens or
    dequantizes as it reads. kb: the backend the cache is for (its row formats and its arrays)."""

    @classmethod
    def for_model(cls, cfg, n_blocks: int, block_size: int, dtype: str = "f32", *, kb) -> "KVCache":
        """A cache of n_blocks blocks shaped for the model config cfg."""
        return cls(cfg.n_layer, n_blocks, block_size, cfg.n_kv_head, cfg.head_dim, cfg.v_head_dim, dtype, kb=kb)

    def __init__(self, n_layer: int, n_blocks: int, block_size: int, n_kv_head: int, head_dim: int,
                 v_head_dim: int, dtype: str = "f32", *, kb):
        if dtype not in kb.KV_FORMATS:
            raise ValueError(f"kv cache dtype must be one of {', '.join(kb.KV_FORMATS)}, got {dtype!r}")
        fmt = kb.KV_FORMATS[dtype]
        fmt.check(head_dim, v_head_dim)
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.dtype = dtype
        n_slots = n_blocks * block_size
        self.k = kb.zeros((n_layer, n_slots, n_kv_head, fmt.row_len(head_dim)), fmt.storage)
        self.v = kb.zeros((n_layer, n_slots, n_kv_head, fmt.row_len(v_head_dim)), fmt.storage)
        # Each layer touches its own slice: with transparent huge pages, the first token would make
        # every layer's K and V resident 2 MB at a time. Small pages keep memory to the blocks used.
        for a in (self.k, self.v):
            if isinstance(a, np.ndarray):
                madvise(a, MADV_NOHUGEPAGE)

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

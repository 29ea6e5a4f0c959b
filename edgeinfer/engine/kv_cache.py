"""The paged KV cache's storage: per layer, fixed-size blocks of K and V rows, in one of three row formats."""

from __future__ import annotations

import numpy as np

from ..pages import MADV_NOHUGEPAGE, madvise


class KVCache:
    """Paged KV storage: for each layer, (n_blocks * block_size) slots of n_kv_head rows, stored as
    float32, float16 bits (uint16) or q8_0 (int8: a row's quants, then its per-32 float16 scales; see
    kernels.cpu.ops.kv_put_head). The attention kernel widens or dequantizes as it reads."""

    DTYPES = {"f32": np.float32, "f16": np.uint16, "q8_0": np.int8}

    @classmethod
    def for_model(cls, cfg, n_blocks: int, block_size: int, dtype: str = "f32", kb=None) -> "KVCache":
        """A cache of n_blocks blocks shaped for the model config cfg."""
        return cls(cfg.n_layer, n_blocks, block_size, cfg.n_kv_head, cfg.head_dim, cfg.v_head_dim, dtype, kb=kb)

    def __init__(self, n_layer: int, n_blocks: int, block_size: int, n_kv_head: int, head_dim: int,
                 v_head_dim: int, dtype: str = "f32", kb=None):
        if dtype not in self.DTYPES:
            raise ValueError(f"kv cache dtype must be one of {', '.join(self.DTYPES)}, got {dtype!r}")
        check_kv_type(dtype, head_dim, v_head_dim)
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.dtype = dtype
        n_slots = n_blocks * block_size
        zeros = kb.zeros if kb is not None else np.zeros
        self.k = zeros((n_layer, n_slots, n_kv_head, row_len(head_dim, dtype)), self.DTYPES[dtype])
        self.v = zeros((n_layer, n_slots, n_kv_head, row_len(v_head_dim, dtype)), self.DTYPES[dtype])
        # Each layer touches its own slice: with transparent huge pages, the first token would make
        # every layer's K and V resident 2 MB at a time. Small pages keep memory to the blocks used.
        for a in (self.k, self.v):
            if isinstance(a, np.ndarray):
                madvise(a, MADV_NOHUGEPAGE)

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)

    @staticmethod
    def bytes_per_token(cfg, dtype: str = "f32") -> int:
        return cfg.n_layer * cfg.n_kv_head * (row_len(cfg.head_dim, dtype) + row_len(cfg.v_head_dim, dtype)) \
            * np.dtype(KVCache.DTYPES[dtype]).itemsize


def row_len(d: int, dtype: str) -> int:
    """Elements in one KV row of d values: d, or d quants + d/32 float16 scales (2 bytes each) for q8_0."""
    return d + d // 16 if dtype == "q8_0" else d


def check_kv_type(dtype: str, head_dim: int, v_head_dim: int) -> None:
    if dtype == "q8_0" and (head_dim % 32 or v_head_dim % 32):
        raise ValueError(f"a q8_0 KV cache needs head sizes that are multiples of 32 (this model's are "
                         f"{head_dim} and {v_head_dim}): use kv_type 'f16'")

"""The model's memory by layer kind: the paged KV cache of its attention layers (fixed-size blocks of K and
V rows, in one of the backend's row formats: kb.KV_FORMATS, the table in kernels/kv_format.py; the engine
reaches it through the backend object it is given, never by importing the kernels), and the recurrent
state of its other layers (a fixed-size state per sequence slot, never paged by tokens)."""

from __future__ import annotations

import numpy as np

from ..pages import MADV_NOHUGEPAGE, madvise


class KVCache:
    """Paged KV storage: for each attention layer, (n_blocks * block_size) slots of n_kv_head rows in the
    row format `dtype` names (f32, f16 bits or q8_0 blocks; kernels/kv_format.py). The attention kernel
    widens or dequantizes as it reads. kb: the backend the cache is for (its row formats and its arrays).

    kv_layers: the model layers that have KV, in order (None: all n_layer); `layer(i)` is model layer i's
    (K, V). A hybrid model's recurrent layers keep a state per sequence slot instead (n_state_slots of
    them, a sequence's slot chosen by the block manager): `conv` (n_conv_layers, n_state_slots,
    conv_l_cache - 1, dim) float32, the last inputs of each short convolution; a Mamba2 layer's `ssm_conv`
    (n_ssm_layers, slots, ssm_conv - 1, conv channels) and `ssm` (n_ssm_layers, slots, heads, head dim,
    d_state) float32. Each is zeroed where a sequence starts (position 0), by the kernels."""

    @classmethod
    def for_model(cls, cfg, n_blocks: int, block_size: int, dtype: str = "f32", *, kb,
                  n_state_slots: int = 0) -> "KVCache":
        """A cache of n_blocks blocks shaped for the model config cfg, with n_state_slots sequence slots of
        recurrent state where the model has recurrent layers."""
        cache = cls(cfg.n_layer, n_blocks, block_size, cfg.n_kv_head, cfg.head_dim, cfg.v_head_dim, dtype, kb=kb,
                    kv_layers=cfg.kv_layers)
        slots = max(n_state_slots, 1)
        if cfg.conv_layers:
            cache.conv = kb.zeros((len(cfg.conv_layers), slots, cfg.conv_l_cache - 1, cfg.dim), np.float32)
            cache.state_index.update({layer: i for i, layer in enumerate(cfg.conv_layers)})
        if cfg.ssm_layers:
            n, heads = len(cfg.ssm_layers), cfg.ssm_heads
            cache.ssm_conv = kb.zeros((n, slots, cfg.ssm_conv - 1, cfg.ssm_conv_dim), np.float32)
            cache.ssm = kb.zeros((n, slots, heads, cfg.ssm_inner // heads, cfg.ssm_state), np.float32)
            cache.state_index.update({layer: i for i, layer in enumerate(cfg.ssm_layers)})
        return cache

    def __init__(self, n_layer: int, n_blocks: int, block_size: int, n_kv_head: int, head_dim: int,
                 v_head_dim: int, dtype: str = "f32", *, kb, kv_layers=None):
        if dtype not in kb.KV_FORMATS:
            raise ValueError(f"kv cache dtype must be one of {', '.join(kb.KV_FORMATS)}, got {dtype!r}")
        fmt = kb.KV_FORMATS[dtype]
        fmt.check(head_dim, v_head_dim)
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.dtype = dtype
        kv_layers = tuple(range(n_layer)) if kv_layers is None else tuple(kv_layers)
        self.kv_index = {layer: i for i, layer in enumerate(kv_layers)}
        self.conv = None  # recurrent state (for_model makes it for a hybrid model)
        self.ssm_conv = self.ssm = None
        self.state_index: dict = {}  # a recurrent layer -> its index in its kind's state arrays
        n_slots = n_blocks * block_size
        self.k = kb.zeros((len(kv_layers), n_slots, n_kv_head, fmt.row_len(head_dim)), fmt.storage)
        self.v = kb.zeros((len(kv_layers), n_slots, n_kv_head, fmt.row_len(v_head_dim)), fmt.storage)
        # Each layer touches its own slice: with transparent huge pages, the first token would make
        # every layer's K and V resident 2 MB at a time. Small pages keep memory to the blocks used.
        for a in (self.k, self.v):
            if isinstance(a, np.ndarray):
                madvise(a, MADV_NOHUGEPAGE)

    def layer(self, layer: int):
        """Model layer `layer`'s K and V arrays (an attention layer)."""
        i = self.kv_index[layer]
        return self.k[i], self.v[i]

    @property
    def states(self) -> list:
        """The recurrent state arrays, (layers of the kind, slots, ...) each."""
        return [a for a in (self.conv, self.ssm_conv, self.ssm) if a is not None]

    def copy_states(self, pairs) -> None:
        """Copy each (src, dst) slot's recurrent state, every layer (prefix caching's checkpoints)."""
        for src, dst in pairs:
            for a in self.states:
                a[:, dst] = a[:, src]

    @property
    def nbytes(self) -> int:
        """The KV blocks' bytes."""
        return int(self.k.nbytes + self.v.nbytes)

    @property
    def state_nbytes(self) -> int:
        """The recurrent state's bytes (every slot)."""
        return sum(int(a.nbytes) for a in self.states)

"""The model's memory by layer kind: the paged KV cache of its attention layers (fixed-size blocks of K and
V rows, in one of the backend's row formats: kb.KV_FORMATS, the table in kernels/kv_format.py; the engine
reaches it through the backend object it is given, never by importing the kernels), and the recurrent
state of its other layers (a fixed-size state per sequence slot, never paged by tokens)."""

from __future__ import annotations

import numpy as np

from ..pages import MADV_NOHUGEPAGE, madvise


class KVCache:
    """Paged KV storage: for each attention layer, (n_blocks * block_size) slots of n_kv_head rows in the
    row format `dtype` names (f32, f16 bits or q8_0 blocks; kernels/kv_format.py), or "K/V" (K's rows in one,
    V's in the other: k_dtype, v_dtype). The attention kernel
    widens or dequantizes as it reads. kb: the backend the cache is for (its row formats and its arrays).

    kv_layers: the model layers that have KV, in order (None: all n_layer); `layer(i)` is model layer i's
    (K, V). A hybrid model's recurrent layers keep a state per sequence slot instead (n_state_slots of
    them, a sequence's slot chosen by the block manager): `conv` (n_conv_layers, n_state_slots,
    conv_l_cache - 1, dim) float32, the last inputs of each short convolution; a Mamba2 layer's `ssm_conv`
    (n_ssm_layers, slots, ssm_conv - 1, conv channels) and `ssm` (n_ssm_layers, slots, heads, head dim,
    d_state) float32 (a delta net's heads of (Dk, Dv), Dk = Dv); within a head the elements are in the scan
    kernels' blocks of columns (kernels/cpu/recurrent.py), so a slot is copied whole, never read element by
    element. Each is zeroed where a sequence starts (position 0), by the kernels.

    window_layers, n_window_blocks: sliding-window layers whose K and V live in a pool of their own,
    `wk`/`wv` (n_window_layers, n_window_blocks * block_size, n_kv_head, row), addressed through the
    sequences' window tables (Batch.window_slots, Batch.window_tables): a sequence holds only the blocks its
    window sees there. `where` (n_layer, 2) int64: each layer's pool (0 the full-context one, 1 the window
    one, -1 none) and its index in it."""

    @classmethod
    def for_model(cls, cfg, n_blocks: int, block_size: int, dtype: str = "f32", *, kb,
                  n_state_slots: int = 0, n_window_blocks: int = 0) -> "KVCache":
        """A cache of n_blocks blocks shaped for the model config cfg, with n_state_slots sequence slots of
        recurrent state where the model has recurrent layers, and n_window_blocks blocks for its
        sliding-window layers where it has them (0: those layers in the full-context pool)."""
        if len({cfg.pool_shape(cfg.is_sliding(i)) for i in cfg.kv_layers}) > 1 and not n_window_blocks:
            # sliding-window layers with rows of their own shape (Gemma 4) keep a pool of their own even where the
            # caller asks for none: as many blocks as the full pool, addressed as it is (the batch's window
            # tables default to its block tables)
            n_window_blocks = n_blocks
        window_layers = tuple(i for i in cfg.kv_layers if cfg.is_sliding(i)) if n_window_blocks else ()
        cache = cls(cfg.n_layer, n_blocks, block_size, *cfg.pool_shape(False), dtype, kb=kb,
                    kv_layers=cfg.kv_layers, window_layers=window_layers, n_window_blocks=n_window_blocks,
                    window_shape=cfg.pool_shape(True))
        for layer in range(cfg.n_layer):  # a layer that shares an earlier layer's KV reads it where it is
            if cfg.kv_of(layer) != layer:
                cache.where[layer] = cache.where[cfg.kv_of(layer)]
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
                 v_head_dim: int, dtype: str = "f32", *, kb, kv_layers=None, window_layers=(), n_window_blocks=0,
                 window_shape=None):
        k_type, _, v_type = dtype.partition("/")  # "K/V": K's and V's rows each in their own format
        v_type = v_type or k_type
        for t in (k_type, v_type):
            if t not in kb.KV_FORMATS:
                raise ValueError(f"kv cache dtype must be one of {', '.join(kb.KV_FORMATS)} (or K/V), got {dtype!r}")
        fk, fv = kb.KV_FORMATS[k_type], kb.KV_FORMATS[v_type]
        fk.check(head_dim)
        fv.check(v_head_dim)
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.k_dtype, self.v_dtype = k_type, v_type
        kv_layers = tuple(range(n_layer)) if kv_layers is None else tuple(kv_layers)
        window_layers = [i for i in kv_layers if i in set(window_layers)] if n_window_blocks else []
        full = [i for i in kv_layers if i not in window_layers]
        self.n_window_blocks = n_window_blocks if window_layers else 0
        self.where = np.full((n_layer, 2), -1, np.int64)
        for pool, layers in enumerate((full, window_layers)):
            for i, layer in enumerate(layers):
                self.where[layer] = pool, i
        self.conv = None  # recurrent state (for_model makes it for a hybrid model)
        self.ssm_conv = self.ssm = None
        self.state_index: dict = {}  # a recurrent layer -> its index in its kind's state arrays
        n_slots = n_blocks * block_size
        w_slots = max(self.n_window_blocks * block_size, 1)
        try:
            self.k = kb.zeros((len(full), n_slots, n_kv_head, fk.row_len(head_dim)), fk.storage)
            self.v = kb.zeros((len(full), n_slots, n_kv_head, fv.row_len(v_head_dim)), fv.storage)
        except MemoryError:  # (the system refused the pool: a context far past what the memory holds)
            size = len(full) * n_slots * n_kv_head * (fk.row_bytes(head_dim) + fv.row_bytes(v_head_dim))
            raise ValueError(f"the KV pool ({size / 2**20:.0f} MB: {n_slots} tokens of {dtype} KV) does not fit in "
                             "memory: a shorter --max-context (or none: sized by memory), or a smaller --kv-type"
                             ) from None
        w_heads, w_dim, w_vdim = window_shape or (n_kv_head, head_dim, v_head_dim)  # (Gemma 4's are their own)
        fk.check(w_dim)
        fv.check(w_vdim)
        self.wk = kb.zeros((len(window_layers), w_slots, w_heads, fk.row_len(w_dim)), fk.storage)
        self.wv = kb.zeros((len(window_layers), w_slots, w_heads, fv.row_len(w_vdim)), fv.storage)
        # Each layer touches its own slice: with transparent huge pages, the first token would make
        # every layer's K and V resident 2 MB at a time. Small pages keep memory to the blocks used.
        for a in (self.k, self.v, self.wk, self.wv):
            if isinstance(a, np.ndarray):
                madvise(a, MADV_NOHUGEPAGE)

    def layer(self, layer: int):
        """Model layer `layer`'s K and V arrays (an attention layer), in its pool."""
        pool, i = self.where[layer]
        assert pool >= 0, f"layer {layer} keeps no KV"
        return (self.wk[i], self.wv[i]) if pool else (self.k[i], self.v[i])

    def windowed(self, layer: int) -> bool:
        """Whether layer's KV is in the window pool (addressed through the batch's window tables)."""
        return bool(self.where[layer, 0] == 1)

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
        """The KV blocks' bytes (both pools)."""
        return int(self.k.nbytes + self.v.nbytes + self.wk.nbytes + self.wv.nbytes)

    @property
    def window_nbytes(self) -> int:
        """The window pool's bytes."""
        return int(self.wk.nbytes + self.wv.nbytes)

    @property
    def state_nbytes(self) -> int:
        """The recurrent state's bytes (every slot)."""
        return sum(int(a.nbytes) for a in self.states)

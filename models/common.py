"""What the architectures share: metadata access, weight loading, the KV cache, the attention block."""

from __future__ import annotations

import os

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from ..errors import EdgeInferError
from ..gguf_file import GGUFError, GGUFFile
from ..quant.repack import (ARRAYS, DIRECT_TYPES, KIND, MADV_NOHUGEPAGE, SUPPORTED_TYPES, QTensor, madvise,
                            repack_interleaved, repack_rows)


class ModelLoadError(EdgeInferError):
    """A GGUF file that parses but cannot be run: a missing tensor, a wrong shape, an unsupported type."""


def meta(gf: GGUFFile, arch: str, key: str, default=None, *, required: bool = False):
    full = f"{arch}.{key}"
    if full not in gf.metadata:
        if required:
            raise ModelLoadError(f"missing metadata key {full!r}")
        return default
    v = gf.metadata[full]
    if isinstance(v, (list, np.ndarray)):  # per-layer values: models with them are not supported yet
        raise ModelLoadError(f"metadata key {full!r} gives one value per layer; edgeinfer supports models with one "
                             f"value for all layers")
    return v


class WeightLoader:
    """Loads tensors by name, checking shapes, repacking 2-D quantized weights into kernel layout. On the
    CPU backend the repacked matrices come from the model's layout file when it is valid, and are written
    to one otherwise (layout_cache.py; `finish` writes it)."""

    def __init__(self, gf: GGUFFile, kb, layouts: bool = True):
        self.gf = gf
        self.kb = kb  # weights are handed to the backend (uploaded, for a device backend)
        self.store = None
        if layouts and getattr(kb, "NAME", "") == "cpu" and os.environ.get("EDGEINFER_LAYOUT_CACHE", "1") != "0":
            from .layout_cache import LayoutStore

            try:
                self.store = LayoutStore(gf.path, kb.KERNEL_PATH)
            except OSError:  # an unreadable model path or home: load as without a store
                self.store = None

    def finish(self) -> None:
        """Once every matrix is loaded: write the layout file if there was none (or a stale one)."""
        if self.store is not None:
            self.store.finish()

    def has(self, name: str) -> bool:
        return name in self.gf.tensors

    def vector(self, name: str, size: int) -> np.ndarray:
        info = self._info(name, (size,))
        if info.ggml_type not in (T.F32, T.F16):
            raise ModelLoadError(f"tensor {name!r} has type {info.ggml_type.name}; norms must be F32 or F16")
        return self.kb.upload(np.array(self.gf.tensor(name), dtype=np.float32))

    def matrix(self, name: str, rows: int, cols: int):
        info = self._info(name, (cols, rows))
        if info.ggml_type not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"tensor {name!r} has type {info.ggml_type.name}, which edgeinfer cannot compute yet "
                f"(supported: {', '.join(t.name for t in SUPPORTED_TYPES)})"
            )
        stored = self.store.get(name) if self.store is not None else None
        if stored is not None:
            meta, arrays = stored
            if meta.get("float"):
                return arrays["w"]
            return QTensor(T(meta["ggml_type"]), meta["kind"], meta["n_rows"], meta["n_cols"], **arrays)
        w = self._build(name, info, rows, cols)
        if self.store is not None:
            if isinstance(w, np.ndarray):
                self.store.put(name, {"float": True}, {"w": w})
            else:
                self.store.put(name, {"ggml_type": int(w.ggml_type), "kind": w.kind, "n_rows": w.n_rows,
                                      "n_cols": w.n_cols}, {f: getattr(w, f) for f in ARRAYS})
        return w

    def _build(self, name: str, info, rows: int, cols: int):
        # the matrix repacked from the file's bytes, uploaded
        if info.ggml_type == T.F32:
            w = np.array(self.gf.tensor(name), dtype=np.float32).reshape(rows, cols)
        elif info.ggml_type in DIRECT_TYPES and self.kb.interleaves(KIND[info.ggml_type]):
            # the backend's interleaved layout, built straight from the file a chunk of rows at a time
            w = repack_interleaved(self.gf.tensor_bytes(name), info.ggml_type, info.shape,
                                   release=lambda r0, r1: self.gf.release(name, r0, r1))
        else:
            # a chunk of rows at a time, each chunk's file pages dropped once copied: the repacked copy
            # replaces the file's pages, and the two are never both resident
            w = repack_rows(self.gf.tensor_bytes(name), info.ggml_type, info.shape,
                            release=lambda r0, r1: self.gf.release(name, r0, r1))
        self.gf.release(name)
        return self.kb.upload(w)

    def float_matrix(self, name: str, rows: int | None, cols: int) -> np.ndarray:
        """An F16 or F32 matrix (rows, cols) as it is in the file, not repacked (encoders multiply by it
        through BLAS; F16 stays F16); rows None: any number."""
        info = self._info(name, (cols, rows) if rows is not None else None)
        if info.ggml_type not in (T.F16, T.F32):
            raise ModelLoadError(f"tensor {name!r} has type {info.ggml_type.name}; this architecture is run from "
                                 "F16 or F32 weights")
        return np.array(self.gf.tensor(name)).reshape(-1, cols)  # a copy: the file can close

    def _info(self, name: str, shape: tuple[int, ...] | None):
        info = self.gf.tensors.get(name)
        if info is None:
            raise ModelLoadError(f"missing tensor {name!r}")
        if shape is not None and tuple(info.shape) != shape:
            raise ModelLoadError(f"tensor {name!r} has shape {list(info.shape)}, expected {list(shape)}")
        return info


def matrix_kinds(gf: GGUFFile, kb) -> set[int]:
    """The kinds of the quantized matrices of a file as the backend `kb` will hold them (what its kernels
    must be compiled for)."""
    return {kb.kind_of(KIND[t.ggml_type]) for t in gf.tensors.values()
            if len(t.shape) == 2 and KIND.get(t.ggml_type, 0) >= 2}


def rope_inv_freq(dim: int, base: float, freq_scale: float = 1.0, factors: np.ndarray | None = None) -> np.ndarray:
    # angle_i = pos * freq_scale * base^(-2i/dim) / factor_i, i < dim/2
    inv = freq_scale * base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    if factors is not None:
        inv = inv / factors.astype(np.float64)
    return inv


class KVCache:
    """Paged KV storage: for each layer, (n_blocks * block_size) slots of n_kv_head rows, stored as
    float32, float16 bits (uint16) or q8_0 (int8: a row's quants, then its per-32 float16 scales; see
    kernels.cpu.ops.kv_put_head). The attention kernel widens or dequantizes as it reads."""

    DTYPES = {"f32": np.float32, "f16": np.uint16, "q8_0": np.int8}

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

    @staticmethod
    def bytes_per_block(cfg, block_size: int, dtype: str = "f32") -> int:
        return block_size * KVCache.bytes_per_token(cfg, dtype)


def row_len(d: int, dtype: str) -> int:
    """Elements in one KV row of d values: d, or d quants + d/32 float16 scales (2 bytes each) for q8_0."""
    return d + d // 16 if dtype == "q8_0" else d


def check_kv_type(dtype: str, head_dim: int, v_head_dim: int) -> None:
    if dtype == "q8_0" and (head_dim % 32 or v_head_dim % 32):
        raise ValueError(f"a q8_0 KV cache needs head sizes that are multiples of 32 (this model's are "
                         f"{head_dim} and {v_head_dim}): use kv_type 'f16'")


class Batch:
    """The flat arrays of one forward pass over a ragged batch of sequences.

    token_ids (T,) int64; positions (T,) int64; token_seq (T,) row of block_tables for each token;
    slot_mapping (T,) KV slot each token writes; block_tables (S, max_blocks) int32;
    logits_idx (L,) which tokens get logits (the last scheduled token of each sequence by default).
    """

    __slots__ = ("token_ids", "positions", "token_seq", "slot_mapping", "block_tables", "logits_idx")

    def __init__(self, token_ids, positions, token_seq, slot_mapping, block_tables, logits_idx):
        self.token_ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        self.positions = np.ascontiguousarray(positions, dtype=np.int64)
        self.token_seq = np.ascontiguousarray(token_seq, dtype=np.int64)
        self.slot_mapping = np.ascontiguousarray(slot_mapping, dtype=np.int64)
        self.block_tables = np.ascontiguousarray(block_tables, dtype=np.int32)
        self.logits_idx = np.ascontiguousarray(logits_idx, dtype=np.int64)


def attention(kb, cfg, layer: int, lw, h: np.ndarray, batch: Batch, cache: KVCache, inv_freq: np.ndarray,
              qk_norm: bool) -> np.ndarray:
    """Self-attention of one layer for the batch: h (T, dim) -> (T, dim)."""
    t = h.shape[0]
    hq = kb.quantize_input(h)  # one quantized activation for q, k and v
    q2, k2, v2 = kb.matmul(lw.wq, hq), kb.matmul(lw.wk, hq), kb.matmul(lw.wv, hq)
    if getattr(lw, "bq", None) is not None:  # qwen2: biases on q, k and v
        kb.add_bias_(q2, lw.bq)
        kb.add_bias_(k2, lw.bk)
        kb.add_bias_(v2, lw.bv)
    q = q2.reshape(t, cfg.n_head, cfg.head_dim)
    k = k2.reshape(t, cfg.n_kv_head, cfg.head_dim)
    v = v2.reshape(t, cfg.n_kv_head, cfg.v_head_dim)
    if qk_norm:
        qf = q.reshape(t * cfg.n_head, cfg.head_dim)
        kf = k.reshape(t * cfg.n_kv_head, cfg.head_dim)
        kb.rmsnorm(qf, lw.q_norm, cfg.norm_eps, qf)
        kb.rmsnorm(kf, lw.k_norm, cfg.norm_eps, kf)
    if cfg.rope_dim < cfg.head_dim:
        kb.rope(q[:, :, : cfg.rope_dim], batch.positions, inv_freq, cfg.rope_neox)
        kb.rope(k[:, :, : cfg.rope_dim], batch.positions, inv_freq, cfg.rope_neox)
    else:
        kb.rope(q, batch.positions, inv_freq, cfg.rope_neox)
        kb.rope(k, batch.positions, inv_freq, cfg.rope_neox)
    kc, vc = cache.k[layer], cache.v[layer]
    kb.write_kv(kb.kv_store(k, cache.dtype), kb.kv_store(v, cache.dtype), batch.slot_mapping, kc, vc)
    out = kb.empty((t, cfg.n_head, cfg.v_head_dim))
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / np.sqrt(cfg.head_dim)
    window = cfg.sliding_window if cfg.is_sliding(layer) else 0
    kb.paged_attention(q, kc, vc, batch.token_seq, batch.positions, batch.block_tables, cache.block_size,
                       np.float32(scale), window, np.float32(cfg.attn_softcap), out)
    return kb.matmul(lw.wo, out.reshape(t, cfg.n_head * cfg.v_head_dim))


def check_vocab(gf: GGUFFile, n_vocab: int) -> None:
    tokens = gf.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != n_vocab:
        raise ModelLoadError(f"the vocabulary has {len(tokens)} tokens but token_embd has {n_vocab} rows")


__all__ = ["GGUFError", "ModelLoadError", "WeightLoader", "KVCache", "Batch", "attention", "meta", "rope_inv_freq"]

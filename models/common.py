"""What every architecture uses: metadata access, weight loading, RoPE frequencies, vocabulary checks."""

from __future__ import annotations

import os

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from ..errors import EdgeInferError
from ..gguf_file import GGUFError, GGUFFile
from ..quant.repack import ARRAYS, DIRECT_TYPES, KIND, SUPPORTED_TYPES, QTensor, repack_interleaved, repack_rows


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

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """A one-line error unless the file has tensor `name` of this (gguf-order) shape."""
        self._info(name, shape)

    def vector(self, name: str, size: int) -> np.ndarray:
        info = self._info(name, (size,))
        if info.ggml_type not in (T.F32, T.F16):
            raise ModelLoadError(f"tensor {name!r} has type {info.ggml_type.name}; norms must be F32 or F16")
        return self.kb.upload(np.array(self.gf.tensor(name), dtype=np.float32))

    def matrix(self, name: str, rows: int, cols: int):
        return self._matrix(name, self._info(name, (cols, rows)), name, 0, rows)

    def matrix_rows(self, name: str, shape: tuple[int, ...], parts: list[int]) -> list:
        """A 2-D tensor (rows, cols) or a 3-D one (n, rows, cols) (numpy order: `shape`), read as one
        matrix of all its rows, cut into consecutive matrices of `parts` rows each: a fused q/k/v or
        gate/up projection, or a layer's experts (n parts of `rows`). Each part is repacked on its own,
        so no row group straddles two of them."""
        info = self._info(name, tuple(reversed(shape)))
        if sum(parts) != int(np.prod(shape[:-1])):
            raise ModelLoadError(f"tensor {name!r}: {sum(parts)} rows expected, it has {int(np.prod(shape[:-1]))}")
        out, r0 = [], 0
        for n in parts:
            out.append(self._matrix(f"{name}[{r0}:{r0 + n}]", info, name, r0, r0 + n))
            r0 += n
        self.gf.release(name)
        return out

    def _matrix(self, key: str, info, name: str, r0: int, r1: int):
        # rows [r0, r1) of tensor `name` as a matrix, from the layout file (under `key`) or built
        cols = int(info.shape[0])
        if info.ggml_type not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"tensor {name!r} has type {info.ggml_type.name}, which edgeinfer cannot compute yet "
                f"(supported: {', '.join(t.name for t in SUPPORTED_TYPES)})"
            )
        stored = self.store.get(key) if self.store is not None else None
        if stored is not None:
            meta, arrays = stored
            if meta.get("float"):
                return arrays["w"]
            return QTensor(T(meta["ggml_type"]), meta["kind"], meta["n_rows"], meta["n_cols"], **arrays)
        whole = (r0, r1) == (0, int(np.prod(info.shape[1:])))
        w = self._build(name, info, r0, r1, cols, whole)
        if self.store is not None:
            if isinstance(w, np.ndarray):
                self.store.put(key, {"float": True}, {"w": w})
            else:
                self.store.put(key, {"ggml_type": int(w.ggml_type), "kind": w.kind, "n_rows": w.n_rows,
                                     "n_cols": w.n_cols}, {f: getattr(w, f) for f in ARRAYS})
        return w

    def _build(self, name: str, info, r0: int, r1: int, cols: int, whole: bool):
        # rows [r0, r1) of the matrix repacked from the file's bytes, uploaded
        rows = r1 - r0
        if info.ggml_type == T.F32:  # only this part's rows copied (a 3-D tensor is read once in all)
            w = np.array(np.asarray(self.gf.tensor(name)).reshape(-1, cols)[r0:r1], dtype=np.float32)
            if whole:
                self.gf.release(name)
            return self.kb.upload(w)
        raw = self.gf.tensor_bytes(name)
        raw = raw.reshape(-1, raw.shape[-1])[r0:r1]
        release = (lambda a, b: self.gf.release(name, r0 + a, r0 + b)) if whole else None
        if info.ggml_type in DIRECT_TYPES and self.kb.interleaves(KIND[info.ggml_type]):
            # the backend's interleaved layout, built straight from the file a chunk of rows at a time
            w = repack_interleaved(raw, info.ggml_type, (cols, rows), release=release)
        else:
            # a chunk of rows at a time, each chunk's file pages dropped once copied: the repacked copy
            # replaces the file's pages, and the two are never both resident
            w = repack_rows(raw, info.ggml_type, (cols, rows), release=release)
        if whole:
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
    from ..kernels.kinds import is_quantized

    return {kb.kind_of(KIND[t.ggml_type]) for t in gf.tensors.values()
            if len(t.shape) in (2, 3) and t.ggml_type in KIND and is_quantized(KIND[t.ggml_type])}


def has_experts(gf: GGUFFile) -> bool:
    """Whether a file's layers hold a mixture of experts (blk.N.ffn_*_exps tensors)."""
    return any("_exps." in name for name in gf.tensors)


def step_mixers(gf: GGUFFile) -> tuple:
    """The recurrent mixers of a file's layers that the compiled step runs as units of their own: LFM2's short
    convolution (blk.N.shortconv.* tensors), the gated delta net (Qwen3.5's blk.N.ssm_beta, Qwen3-Next's
    ssm_ba), Mamba2 (blk.N.ssm_d); and "altup" where the layers run in a walk of their own instead (Gemma 3n's
    streams: blk.N.altup_router)."""
    names = gf.tensors
    return tuple(m for m, there in (("shortconv", any(".shortconv." in n for n in names)),
                                    ("deltanet", any(".ssm_beta." in n or ".ssm_ba." in n for n in names)),
                                    ("mamba2", any(n.endswith(".ssm_d") for n in names)),
                                    ("altup", any(".altup_router." in n for n in names))) if there)


def rope_inv_freq(dim: int, base: float, freq_scale: float = 1.0, factors: np.ndarray | None = None) -> np.ndarray:
    # angle_i = pos * freq_scale * base^(-2i/dim) / factor_i, i < dim/2
    inv = freq_scale * base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    if factors is not None:
        inv = inv / factors.astype(np.float64)
    return inv


def check_vocab(gf: GGUFFile, n_vocab: int) -> None:
    tokens = gf.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != n_vocab:
        raise ModelLoadError(f"the vocabulary has {len(tokens)} tokens but token_embd has {n_vocab} rows")


__all__ = ["GGUFError", "ModelLoadError", "WeightLoader", "check_vocab", "has_experts", "matrix_kinds", "meta",
           "rope_inv_freq", "step_mixers"]

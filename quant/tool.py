"""The quantize-model tool: GGUF in, GGUF out, tensor by tensor, through gguf.GGUFWriter.

Metadata and tokenizer are copied; general.file_type and general.quantization_version are set. A 3-D
tensor (an MoE layer's experts) is converted expert by expert and written back with its own shape. The
output is streamed into `.NAME.partial` beside the destination and renamed into place at the end, so an
interrupted or failed run (a full disk, Ctrl-C) never leaves a partial file behind, and one killed
outright leaves only that hidden file, which the next run replaces.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFValueType as VT

from . import kquants, lowbit
from .mixes import QUANTIZED, TYPES, PlannedTensor, loader_order, plan

READABLE = {T.F32, T.F16, T.BF16} | QUANTIZED  # source tensor types we can turn into float32
SKIP_KEYS = {"general.architecture", "general.file_type", "general.quantization_version", "general.alignment"}


class QuantizeError(ValueError):
    """Bad input for the quantize tool: a clear one-line message."""


@dataclass
class Summary:
    src_bytes: int
    dst_bytes: int
    n_params: int
    seconds: float
    plan: list[PlannedTensor]

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.dst_bytes / max(1, self.n_params)


def to_float32(raw: np.ndarray, src: T, shape: tuple[int, ...]) -> np.ndarray:
    """A source tensor (raw GGUF bytes or a float view) as float32, numpy shape (rows, k)."""
    k = shape[0]
    if src == T.F32:
        return np.asarray(raw, np.float32).reshape(-1, k)
    if src == T.F16:
        return np.asarray(raw, np.float16).astype(np.float32).reshape(-1, k)
    return gguf.quants.dequantize(np.asarray(raw, np.uint8).reshape(-1, np.asarray(raw).shape[-1]), src).reshape(-1, k)


# the quantizers that take an importance matrix row (llama.cpp's `_impl` quantizers with quant_weights)
WEIGHTED = {T.Q2_K: lowbit.quantize_q2_k, T.Q3_K: lowbit.quantize_q3_k, T.IQ4_NL: lowbit.quantize_iq4_nl,
            T.IQ4_XS: lowbit.quantize_iq4_xs, T.Q4_K: kquants.quantize_q4_k, T.Q5_K: kquants.quantize_q5_k,
            T.Q6_K: kquants.quantize_q6_k}
# the 32-element types whose llama.cpp quantizers take one too (without it: gguf's, the reference ones)
LEGACY_WEIGHTED = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)


def quantize_rows(x: np.ndarray, dst: T, weights: np.ndarray | None = None) -> np.ndarray:
    """x (rows, k) float32 -> the tensor's data in type dst: uint8 blocks, or float16/float32/bf16 bits.
    weights: the columns' importance (an imatrix row, (k,)), for the types in WEIGHTED and LEGACY_WEIGHTED;
    ignored by the others."""
    block = GGML_QUANT_SIZES[dst][0]
    if x.ndim != 2 or x.shape[1] % block:
        raise QuantizeError(f"rows of {x.shape[-1]} values cannot be {dst.name} (blocks of {block})")
    if dst == T.F32:
        return np.ascontiguousarray(x, np.float32)
    if dst == T.F16:
        return x.astype(np.float16)
    with np.errstate(over="ignore"):  # as the C code, which overflows silently on absurd magnitudes
        if dst in WEIGHTED:
            return WEIGHTED[dst](x, weights)
        if dst in LEGACY_WEIGHTED and weights is not None:
            return lowbit.quantize_legacy_weighted(x, dst.name, weights)
    # BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: gguf's own quantizers, so the output is bit-exact with them
    return gguf.quants.quantize(np.ascontiguousarray(x, np.float32), dst)


# values per quantizer call: the searches hold several temporaries of their input's size (7-8x in all), so a
# 150k x 1536 embedding goes through in 16 MB slices, never as one 7 GB working set
CHUNK_VALUES = 1 << 22


def _quantize_parallel(x: np.ndarray, dst: T, threads: int, weights: np.ndarray | None = None,
                       name: str = "") -> np.ndarray:
    if not np.isfinite(x).all():
        raise QuantizeError(f"tensor {name or '?'} has NaN or infinite values: it cannot be quantized")
    n = -(-x.size // CHUNK_VALUES)
    if threads > 1 and x.shape[0] >= 64:
        n = max(n, threads)
    chunks = np.array_split(x, min(n, x.shape[0])) if n > 1 else [x]
    if threads <= 1 or len(chunks) == 1:
        return np.concatenate([quantize_rows(c, dst, weights) for c in chunks], axis=0)
    with ThreadPoolExecutor(threads) as pool:  # numpy releases the GIL in its array work
        parts = list(pool.map(lambda c: quantize_rows(c, dst, weights), chunks))
    return np.concatenate(parts, axis=0)


def _copy_metadata(src, writer: gguf.GGUFWriter) -> None:
    for key, value in src.metadata.items():
        if key in SKIP_KEYS:
            continue
        vtype, etype, _ = src.metadata_types[key]
        if vtype == VT.ARRAY:
            items = value.tolist() if isinstance(value, np.ndarray) else list(value)
            writer.add_key_value(key, items, vtype, sub_type=etype)
        else:
            writer.add_key_value(key, value, vtype)


def expert_count(src) -> int:
    """The model's experts: ARCH.expert_count, else the last dimension of its 3-D expert tensors; 0 if dense."""
    n = src.get(f"{src.get('general.architecture')}.expert_count")
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0:
        return int(n)
    dims = {t.shape[2] for t in src.tensors.values() if len(t.shape) == 3 and "_exps." in t.name}
    return max(dims) if dims else 0


def make_plan(src, type_name: str, *, pure=False, output_type=None, token_embedding_type=None, has_imatrix=False):
    if type_name not in TYPES:
        raise QuantizeError(f"unknown type {type_name!r} (choose from {', '.join(TYPES)})")
    tensors = [(t.name, tuple(t.shape), t.ggml_type) for t in src.tensors.values()]
    unreadable = sorted({t.ggml_type.name for t in src.tensors.values() if t.ggml_type not in READABLE})
    if unreadable:
        raise QuantizeError(f"unsupported source tensor type {', '.join(unreadable)} "
                            f"(readable: {', '.join(sorted(t.name for t in READABLE))})")
    arch = src.get("general.architecture")
    return plan(tensors, type_name, pure=pure, output_type=output_type, token_embedding_type=token_embedding_type,
                n_expert=expert_count(src), n_head=src.get(f"{arch}.attention.head_count"),
                n_head_kv=src.get(f"{arch}.attention.head_count_kv"), has_imatrix=has_imatrix)


def convert(src, x: PlannedTensor, threads: int = 1, importance: np.ndarray | None = None) -> np.ndarray:
    """Tensor x's data in its planned type. A tensor of more than two dimensions (an MoE layer's
    experts: numpy shape (n_expert, rows, cols)) is converted one matrix at a time, so only one
    expert is ever held as float32, and the results are stacked: the same rows in the same order, so
    the output has the source's shape. importance: the tensor's imatrix, (matrices, cols) float32."""
    if x.dst_type == x.src_type:  # kept as it is: copy the bytes
        return np.array(src.tensor_bytes(x.name))
    raw = src.tensor(x.name)
    if importance is not None:
        importance = np.asarray(importance, np.float32).reshape(-1, x.shape[0])
    if len(x.shape) <= 2:
        w = None if importance is None else importance[0]
        return _quantize_parallel(to_float32(raw, x.src_type, x.shape), x.dst_type, threads, w, x.name)
    mats = raw.reshape((-1,) + raw.shape[-2:])  # (matrices, rows, cols or bytes per row)
    rows = mats.shape[1]
    parts = []
    for e in range(mats.shape[0]):
        w = None if importance is None else importance[e if importance.shape[0] > 1 else 0]
        parts.append(_quantize_parallel(to_float32(mats[e], x.src_type, x.shape[:2]), x.dst_type, threads, w,
                                        f"{x.name} (expert {e})"))
        src.release(x.name, e * rows, (e + 1) * rows)
    return np.stack(parts)


def quantize_model(src, dst_path, type_name: str, *, pure: bool = False, output_type: T | None = None,
                   token_embedding_type: T | None = None, threads: int = 0, force: bool = False,
                   progress: bool = True, warn: Callable[[str], None] | None = None, imatrix=None) -> Summary:
    """src: an opened, validated GGUF reader (edgeinfer's GGUFFile); the file goes to dst_path. imatrix: an
    importance matrix (quant/imatrix.py's Imatrix, checked against src), used for every tensor whose type
    takes one (WEIGHTED), as llama-quantize does; the output records it under quantize.imatrix.*."""
    warn = warn or (lambda m: print(f"warning: {m}", file=sys.stderr))
    t0 = time.perf_counter()
    src_path, dst_path = Path(src.path), Path(dst_path)
    if dst_path.exists() and not force:
        raise QuantizeError(f"{dst_path} already exists: pass --force to overwrite it")
    if dst_path.resolve() == src_path.resolve():
        raise QuantizeError("the output must be a different file from the input")
    if not dst_path.parent.is_dir():
        raise QuantizeError(f"the output folder {dst_path.parent} does not exist")
    p = make_plan(src, type_name, pure=pure, output_type=output_type, token_embedding_type=token_embedding_type,
                  has_imatrix=imatrix is not None)
    # written in llama-quantize's order, its loader's (by block, then name), whatever the source's order
    p = sorted(p, key=lambda x: loader_order(x.name))
    requant = sorted({x.src_type.name for x in p if x.src_type in QUANTIZED and x.dst_type != x.src_type})
    if requant:
        warn(f"the source is already quantized ({', '.join(requant)}): re-quantizing loses quality; "
             "an F32/F16/BF16 source gives the best result")
    threads = threads or (os.cpu_count() or 1)
    # One fixed name beside the output, so a run killed outright (kill -9, power loss) leaves a file the
    # next run replaces rather than a new one each time; a lock on it keeps two runs from sharing it.
    tmp = dst_path.parent / f".{dst_path.name}.partial"
    if tmp.is_symlink():
        tmp.unlink()
    lock = _lock_partial(tmp, dst_path)
    try:
        writer = gguf.GGUFWriter(tmp, src.architecture)
        _copy_metadata(src, writer)
        # llama-quantize sets these two in this order: new keys land at the end in it
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_file_type(int(TYPES[type_name][0]))
        if imatrix is not None:
            _add_imatrix_keys(writer, imatrix)
        for x in p:
            rows = x.shape[1:][::-1]
            if x.dst_type == T.F32:
                writer.add_tensor_info(x.name, rows + (x.shape[0],), np.dtype(np.float32), x.n_bytes)
            elif x.dst_type == T.F16:
                writer.add_tensor_info(x.name, rows + (x.shape[0],), np.dtype(np.float16), x.n_bytes)
            else:
                row_bytes = x.shape[0] // GGML_QUANT_SIZES[x.dst_type][0] * GGML_QUANT_SIZES[x.dst_type][1]
                writer.add_tensor_info(x.name, rows + (row_bytes,), np.dtype(np.uint8), x.n_bytes, raw_dtype=x.dst_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        from tqdm import tqdm

        bar = tqdm(p, desc="quantize", unit="tensor", disable=not progress, file=sys.stderr)
        for x in bar:
            bar.set_postfix_str(f"{x.name} -> {x.dst_type.name}", refresh=False)
            takes = x.dst_type in WEIGHTED or x.dst_type in LEGACY_WEIGHTED
            importance = imatrix.importance(x.name) if imatrix is not None and takes else None
            data = convert(src, x, threads, importance)
            writer.write_tensor_data(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
            src.release(x.name)
        writer.close()
        os.replace(tmp, dst_path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and (e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or e.errno is None):
            why = os.strerror(e.errno) if e.errno else f"a short write, the disk is probably full ({e})"
            raise QuantizeError(f"cannot write {dst_path}: {why}; nothing was saved") from None
        raise
    finally:
        lock.close()
    n_params = sum(int(np.prod(x.shape)) for x in p)
    return Summary(src_path.stat().st_size, dst_path.stat().st_size, n_params, time.perf_counter() - t0, p)


def _add_imatrix_keys(writer, imatrix) -> None:
    # llama-quantize's record of the matrix it used (LLM_KV_QUANTIZE_IMATRIX_*)
    writer.add_string("quantize.imatrix.file", str(imatrix.path))
    if imatrix.datasets:
        writer.add_string("quantize.imatrix.dataset", imatrix.datasets[0])
    writer.add_int32("quantize.imatrix.entries_count", len(imatrix.names))
    if imatrix.chunk_count:
        writer.add_int32("quantize.imatrix.chunks_count", int(imatrix.chunk_count))


def _lock_partial(tmp: Path, dst_path: Path):
    """Open the partial file (not truncated: another run may hold it), with an exclusive lock for the run;
    GGUFWriter then rewrites it from the start."""
    f = open(tmp, "ab")
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return f
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise QuantizeError(f"another quantize-model run is writing {dst_path}") from None
    return f


def estimate(p: list[PlannedTensor]) -> int:
    return sum(x.n_bytes for x in p)

"""Importance matrices (llama.cpp's imatrix): the two file formats and one loaded form.

An importance matrix holds, for each weight matrix NAME of a model, the sum over calibration tokens of
the square of each input column of its matmul, x_j^2, and how many tokens were counted (per expert for a
mixture-of-experts tensor: only the tokens routed to that expert). The quantizers weigh each column's
rounding error by the mean, in_sum2 / counts.

Files (both as llama.cpp's tools/imatrix/imatrix.cpp writes and reads them; either may be loaded, and
`Imatrix.load` tells them apart by the GGUF magic, as llama.cpp does):
- GGUF (llama.cpp's current format): per NAME a F32 tensor `NAME.in_sum2` (numpy (n_mat, n_cols); 1-D
  when n_mat is 1), `NAME.counts` (numpy (n_mat, 1); 1-D (1,) when n_mat is 1) and, from newer
  llama.cpp, `NAME.in_sum` (the sums of x_j, the shape of in_sum2). Keys: general.type "imatrix",
  imatrix.datasets (strings), imatrix.chunk_count and imatrix.chunk_size (uint32). No architecture.
- legacy `.dat`: int32 entry count; per entry int32 name length, the name, int32 ncall (chunks), int32
  nval, nval float32 values = in_sum2 / counts * ncall; then, optionally, int32 chunk count, int32
  length and the dataset's name.

`importance(name)` is what llama-quantize (tools/quantize/quantize.cpp, load_imatrix) hands the
quantizers: GGUF: in_sum2 / counts per matrix row, 1.0 where a row's count is 0 (an expert no token
reached); legacy: values / ncall (the values as they are when ncall is 0).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

KV_DATASETS = "imatrix.datasets"
KV_CHUNK_COUNT = "imatrix.chunk_count"
KV_CHUNK_SIZE = "imatrix.chunk_size"
SUFFIXES = (".in_sum2", ".counts", ".in_sum")
MAX_NAME = 1 << 16  # a legacy entry's name length that is plainly not a name


class ImatrixError(ValueError):
    """A malformed or unfitting importance matrix: one line naming the file or tensor and the problem."""


@dataclass
class Entry:
    """One weight tensor's statistics: sums (n_mat, n_cols) of x^2 (legacy files: the stored values),
    counts (n_mat,) tokens per matrix (legacy: one, ncall), in_sum (n_mat, n_cols) sums of x or None."""

    sums: np.ndarray
    counts: np.ndarray
    in_sum: np.ndarray | None = None

    @property
    def n_mat(self) -> int:
        return int(self.sums.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.sums.shape[1])


class Imatrix:
    """An importance matrix: `entries` (tensor name -> Entry), `datasets` (the calibration files named
    in it), `chunk_count`, `chunk_size` (0 when unknown: legacy files) and `legacy` (values as a .dat
    stores them, not sums)."""

    def __init__(self, entries: dict[str, Entry] | None = None, *, datasets: Iterable[str] = (),
                 chunk_count: int = 0, chunk_size: int = 0, legacy: bool = False, path: str | None = None):
        self.entries = dict(entries or {})
        self.datasets = list(datasets)
        self.chunk_count = int(chunk_count)
        self.chunk_size = int(chunk_size)
        self.legacy = legacy
        self.path = path

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def names(self) -> list[str]:
        return sorted(self.entries)

    # -- what the quantizers use -------------------------------------------------------------------

    def importance(self, name: str) -> np.ndarray | None:
        """The weights for tensor `name`'s columns, float32 (n_mat, n_cols): row e for expert e (n_mat 1
        for a dense matrix); None if the imatrix has no entry for it (llama-quantize then quantizes the
        tensor without weights). A legacy file's MoE entry is one row of n_expert * n_cols values until
        `check` has given it the model's shape."""
        e = self.entries.get(name)
        if e is None:
            return None
        sums = np.asarray(e.sums, np.float32)
        counts = np.asarray(e.counts, np.float32)
        if self.legacy:  # values / ncall, the values as they are for ncall 0
            return sums / counts[0] if counts[0] > 0 else sums.copy()
        out = np.ones_like(sums)
        live = counts > 0
        out[live] = sums[live] / counts[live][:, None]
        return out

    def check(self, model_tensors) -> None:
        """Raise ImatrixError unless every entry is a tensor of the model with its column count (and its
        expert count, for a 3-D tensor). model_tensors: a GGUFFile (its `.tensors`), a mapping of name ->
        TensorInfo or ggml-order shape (ne0, the columns, first), or an iterable of (name, shape, ...)
        tuples in that order. A model tensor without an entry is fine. An entry stored as one row of
        n_mat * n_cols values (a legacy file's MoE tensor, or a GGUF file converted from one) is reshaped
        to (n_mat, n_cols) here, its count shared by every expert, as llama.cpp's tools do."""
        shapes = _model_shapes(model_tensors)
        missing = [n for n in self.entries if n not in shapes]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ImatrixError(f"imatrix entry {sorted(missing)[0]!r}{more} is not a tensor of the model: was the "
                               f"imatrix computed for another model?")
        for name, e in self.entries.items():
            shape = shapes[name]
            n_cols, n_mat = int(shape[0]), math.prod(shape[2:])  # (cols, rows[, experts]) in ggml order
            if (e.n_mat, e.n_cols) == (n_mat, n_cols):
                continue
            if e.n_mat == 1 and e.n_cols == n_mat * n_cols and n_mat > 1:
                self.entries[name] = Entry(e.sums.reshape(n_mat, n_cols), np.repeat(e.counts, n_mat),
                                           None if e.in_sum is None else e.in_sum.reshape(n_mat, n_cols))
                continue
            what = f"{n_mat} x {n_cols}" if n_mat > 1 else f"{n_cols} columns"
            have = f"{e.n_mat} x {e.n_cols}" if e.n_mat > 1 else f"{e.n_cols} columns"
            raise ImatrixError(f"imatrix entry {name!r} has {have}, but the model's tensor {list(shape)} has {what}: "
                               "was the imatrix computed for another model?")

    # -- building one ------------------------------------------------------------------------------

    def accumulate(self, name: str, x: np.ndarray, expert: int = 0, n_mat: int = 1) -> None:
        """Add the tokens x (T, n_cols) of one matmul input of tensor `name` (matrix `expert` of n_mat)."""
        self.add_sums(name, *column_sums(x), expert, n_mat)

    def add_sums(self, name: str, sq: np.ndarray, s1: np.ndarray, n_tokens: int, expert: int = 0,
                 n_mat: int = 1) -> None:
        """Add column_sums of n_tokens inputs of tensor `name` (matrix `expert` of n_mat)."""
        e = self.entries.get(name)
        if e is None:
            k = sq.shape[0]
            e = self.entries[name] = Entry(np.zeros((n_mat, k)), np.zeros(n_mat), np.zeros((n_mat, k)))
        if e.n_cols != sq.shape[0] or e.n_mat != n_mat:
            raise ImatrixError(f"inconsistent size for {name}: inputs of {sq.shape[0]} columns to matrix {expert} of "
                               f"{n_mat}, where it had {e.n_mat} x {e.n_cols}")
        if not np.all(np.isfinite(sq)):
            raise ImatrixError(f"a non-finite activation (inf or NaN) reached {name}")
        e.sums[expert] += sq
        e.counts[expert] += n_tokens
        if e.in_sum is not None:
            e.in_sum[expert] += s1

    def as_sums(self, chunk_size: int) -> Imatrix:
        """This imatrix with sums and token counts (a legacy file's values times ncall * chunk_size and
        ncall * chunk_size tokens, as llama-imatrix reads one to combine it); itself if it has them."""
        if not self.legacy:
            return self
        entries = {n: Entry(np.asarray(e.sums, np.float64) * chunk_size, np.asarray(e.counts, np.float64) * chunk_size)
                   for n, e in self.entries.items()}
        return Imatrix(entries, datasets=self.datasets, chunk_count=self.chunk_count, chunk_size=chunk_size)

    def merge(self, other: Imatrix, chunk_size: int) -> None:
        """Add other's sums and counts to these (llama-imatrix --in-file). chunk_size: the tokens a
        legacy file's chunk held."""
        if self.legacy:
            raise ImatrixError("cannot add to a legacy imatrix: convert it with as_sums first")
        other = other.as_sums(chunk_size)
        for name, o in other.entries.items():
            e = self.entries.get(name)
            if e is None:
                self.entries[name] = Entry(np.array(o.sums, np.float64), np.array(o.counts, np.float64),
                                           None if o.in_sum is None else np.array(o.in_sum, np.float64))
                continue
            sums, counts = e.sums, e.counts
            if o.sums.size != sums.size:
                raise ImatrixError(f"cannot combine the imatrix entries for {name}: {o.sums.size} values and "
                                   f"{sums.size}")
            if e.n_mat != o.n_mat:  # one shared count (an old file) meets per-expert counts: broadcast it
                if e.n_mat == 1:
                    sums, counts = sums.reshape(o.sums.shape), np.repeat(counts, o.n_mat)
                elif o.n_mat != 1:
                    raise ImatrixError(f"cannot combine the imatrix entries for {name}: {o.n_mat} and {e.n_mat} "
                                       "matrices")
            in_sum = None
            if e.in_sum is not None and o.in_sum is not None:
                in_sum = e.in_sum.reshape(sums.shape) + o.in_sum.reshape(sums.shape)
            self.entries[name] = Entry(sums + o.sums.reshape(sums.shape), counts + o.counts, in_sum)
        self.datasets += other.datasets
        self.chunk_size = self.chunk_size or chunk_size

    # -- files -------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike) -> Imatrix:
        """Read a GGUF or legacy .dat imatrix (the GGUF magic decides, as llama.cpp does); a malformed
        file is an ImatrixError naming the file and the problem."""
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ImatrixError(f"cannot read {path}: {e.strerror}") from None
        return _load_gguf(path) if magic == b"GGUF" else _load_legacy(path)

    def save(self, path: str | os.PathLike, fmt: str | None = None, chunk_size: int | None = None) -> str:
        """Write to path: fmt "gguf" or "dat" (None: "dat" for a .dat name, else "gguf"). chunk_size: the
        tokens per chunk (default: this imatrix's; legacy ncall and the GGUF chunk_size key need it).
        Returns the format written."""
        path = os.fspath(path)
        fmt = fmt or ("dat" if path.lower().endswith(".dat") else "gguf")
        if fmt not in ("gguf", "dat"):
            raise ImatrixError(f"unknown imatrix format {fmt!r} (gguf or dat)")
        cs = int(chunk_size or self.chunk_size or 512)
        m = self.as_sums(cs)
        chunks = max([int(np.max(e.counts)) for e in m.entries.values() if e.counts.size] + [0]) // cs
        tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.partial")
        try:
            if fmt == "gguf":
                _save_gguf(m, tmp, chunks, cs)
            else:
                _save_legacy(m, tmp, chunks, cs)
            os.replace(tmp, path)
        except OSError as e:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise ImatrixError(f"cannot write {path}: {e.strerror or e}") from None
        return fmt


def column_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """x (T, n_cols) -> (sum of x^2 per column, sum of x per column (float64), T)."""
    x = np.asarray(x)
    return np.square(x, dtype=np.float64).sum(axis=0), x.sum(axis=0, dtype=np.float64), x.shape[0]


# -- the GGUF format ---------------------------------------------------------------------------------


def _load_gguf(path: str) -> Imatrix:
    from gguf.constants import GGMLQuantizationType as T

    from ..gguf_file import GGUFError, GGUFFile

    try:
        gf = GGUFFile(path)
    except GGUFError as e:
        raise ImatrixError(f"{path}: {e}") from None
    with gf:
        kind = gf.get("general.type")
        if kind is not None and kind != "imatrix":
            raise ImatrixError(f"{path} is a GGUF file of type {kind!r}, not an imatrix")
        for key in (KV_DATASETS, KV_CHUNK_COUNT, KV_CHUNK_SIZE):  # llama-quantize refuses a file without them
            if key not in gf.metadata:
                raise ImatrixError(f"{path} is not an imatrix: missing metadata key {key!r}")
        datasets = gf.metadata[KV_DATASETS]
        if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
            raise ImatrixError(f"{path}: {KV_DATASETS} must be an array of strings")
        meta = {}
        for key in (KV_CHUNK_COUNT, KV_CHUNK_SIZE):
            v = gf.metadata[key]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ImatrixError(f"{path}: {key} must be a non-negative integer, got {v!r}")
            meta[key] = int(v)
        parts: dict[str, dict[str, object]] = {}
        for t in gf.tensors.values():
            for suffix in SUFFIXES:  # (other tensors are ignored, as llama.cpp does)
                if t.name.endswith(suffix) and len(t.name) > len(suffix):
                    if t.ggml_type != T.F32:
                        raise ImatrixError(f"{path}: tensor {t.name!r} is {t.type_name}; imatrix tensors are F32")
                    parts.setdefault(t.name[: -len(suffix)], {})[suffix] = t
                    break
        if not parts:
            raise ImatrixError(f"{path} holds no importance matrices (no NAME.in_sum2 / NAME.counts tensors)")
        entries = {}
        for name, p in sorted(parts.items()):
            if ".in_sum2" not in p or ".counts" not in p:
                raise ImatrixError(f"{path}: mismatched sums and counts for {name!r} (each needs NAME.in_sum2 and "
                                   "NAME.counts)")
            sums_t, counts_t, in_sum_t = p[".in_sum2"], p[".counts"], p.get(".in_sum")
            n_mat = counts_t.n_elements
            if sums_t.n_elements % n_mat or (in_sum_t is not None and in_sum_t.n_elements != sums_t.n_elements):
                raise ImatrixError(f"{path}: {name!r} has {sums_t.n_elements} sums for {n_mat} counts")
            sums = np.array(gf.tensor(sums_t.name), np.float32).reshape(n_mat, -1)
            counts = np.array(gf.tensor(counts_t.name), np.float32).reshape(n_mat)
            in_sum = None if in_sum_t is None else np.array(gf.tensor(in_sum_t.name), np.float32).reshape(sums.shape)
            _check_values(path, name, sums, counts, in_sum)
            entries[name] = Entry(sums, np.floor(counts + 0.5), in_sum)  # llama.cpp rounds the counts (lround)
    return Imatrix(entries, datasets=datasets, chunk_count=meta[KV_CHUNK_COUNT], chunk_size=meta[KV_CHUNK_SIZE],
                   path=path)


def _check_values(path: str, name: str, sums: np.ndarray, counts: np.ndarray, in_sum) -> None:
    for label, a in (("sums", sums), ("counts", counts), ("sums of x", in_sum)):
        if a is not None and not np.all(np.isfinite(a)):
            raise ImatrixError(f"{path}: the {label} of {name!r} hold inf or NaN")
    if np.any(sums < 0) or np.any(counts < 0):
        raise ImatrixError(f"{path}: {name!r} has negative sums of squares or counts")


def _gguf_writer(path: str):
    import gguf
    from gguf.constants import GGUFValueType as VT

    class Writer(gguf.GGUFWriter):
        def add_architecture(self) -> None:  # an imatrix names no architecture
            pass

        def _pack_val(self, val, vtype, add_vtype, *args, **kw):
            if vtype == VT.ARRAY and len(val) == 0:  # gguf-py refuses empty arrays; llama.cpp writes them
                head = self._pack("I", vtype) if add_vtype else b""
                return head + self._pack("I", VT.STRING) + self._pack("Q", 0)  # (only datasets can be empty)
            return super()._pack_val(val, vtype, add_vtype, *args, **kw)

    return Writer(path, "")


def _save_gguf(m: Imatrix, path: str, chunks: int, chunk_size: int) -> None:
    from gguf.constants import GGUFValueType as VT

    w = _gguf_writer(path)
    w.add_string("general.type", "imatrix")
    w.add_key_value(KV_DATASETS, list(m.datasets), VT.ARRAY)
    w.add_uint32(KV_CHUNK_COUNT, chunks)
    w.add_uint32(KV_CHUNK_SIZE, chunk_size)
    for name in m.names:
        e = m.entries[name]
        if e.sums.size == 0 or e.counts.size == 0:
            continue
        one = e.n_mat == 1  # ggml drops trailing dimensions of 1: llama.cpp's files have 1-D tensors then
        w.add_tensor(f"{name}.in_sum2", _f32(e.sums.reshape(-1) if one else e.sums))
        w.add_tensor(f"{name}.counts", _f32(e.counts.reshape(-1) if one else e.counts.reshape(-1, 1)))
        if e.in_sum is not None:
            w.add_tensor(f"{name}.in_sum", _f32(e.in_sum.reshape(-1) if one else e.in_sum))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32)


# -- the legacy .dat format --------------------------------------------------------------------------


def _save_legacy(m: Imatrix, path: str, chunks: int, chunk_size: int) -> None:
    out = []
    names = [n for n in m.names if m.entries[n].counts.size and np.any(m.entries[n].counts > 0)]  # no data: skipped
    out.append(struct.pack("<i", len(names)))
    for name in names:
        e = m.entries[name]
        raw = name.encode("utf-8")
        ncall = -(-int(np.max(e.counts)) // chunk_size)  # ceiling, so no entry reads as 0 chunks
        counts = np.asarray(e.counts, np.float32)
        sums = np.asarray(e.sums, np.float32)
        empty = counts == 0  # an expert no token reached: stored as 1 (count 1), as llama.cpp does
        vals = np.where(empty[:, None], np.float32(1.0), sums / np.where(empty, np.float32(1), counts)[:, None])
        vals = (vals * np.float32(ncall)).astype("<f4")
        out += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, vals.size), vals.tobytes()]
    dataset = (m.datasets[-1] if m.datasets else "").encode("utf-8")
    out += [struct.pack("<ii", chunks, len(dataset)), dataset]
    with open(path, "wb") as f:
        f.write(b"".join(out))


def _load_legacy(path: str) -> Imatrix:
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise ImatrixError(f"cannot read {path}: {e.strerror}") from None
    pos = 0

    def i32(what: str) -> int:
        nonlocal pos
        if pos + 4 > len(buf):
            raise ImatrixError(f"{path}: truncated: the file ends at byte {len(buf)} before {what}")
        (v,) = struct.unpack_from("<i", buf, pos)
        pos += 4
        return v

    if not buf:
        raise ImatrixError(f"{path} is empty: not an imatrix file")
    n = i32("the entry count")
    # an entry needs at least 4 (name length) + 1 (name) + 4 (ncall) + 4 (nval) + 4 (one value) bytes
    if n < 1 or n > (len(buf) - 4) // 17:
        raise ImatrixError(f"{path} is not an imatrix file (neither GGUF nor llama.cpp's legacy format): it "
                           f"declares {n} entries in {len(buf)} bytes")
    entries = {}
    for i in range(n):
        size = i32(f"the name length of entry {i + 1}")
        if size < 1 or size > MAX_NAME or pos + size > len(buf):
            raise ImatrixError(f"{path}: entry {i + 1} has a name length of {size} at byte {pos - 4}, past what the "
                               f"file holds: truncated or not an imatrix file")
        try:
            name = buf[pos:pos + size].decode("utf-8")
        except UnicodeDecodeError:
            raise ImatrixError(f"{path}: the name of entry {i + 1} at byte {pos} is not UTF-8: not an imatrix "
                               "file") from None
        if "\0" in name:
            raise ImatrixError(f"{path}: the name of entry {i + 1} at byte {pos} holds a NUL byte")
        pos += size
        ncall = i32(f"the chunk count of {name!r}")
        nval = i32(f"the value count of {name!r}")
        if ncall < 0:
            raise ImatrixError(f"{path}: {name!r} has a negative chunk count {ncall}")
        if nval < 1 or pos + 4 * nval > len(buf):
            raise ImatrixError(f"{path}: {name!r} declares {nval} values at byte {pos - 4}, more than the "
                               f"{max(0, len(buf) - pos) // 4} the file has left: truncated")
        vals = np.frombuffer(buf, "<f4", nval, pos).astype(np.float32)
        pos += 4 * nval
        if name in entries:
            raise ImatrixError(f"{path}: entry {name!r} appears twice")
        counts = np.array([ncall], np.float32)
        _check_values(path, name, vals, counts, None)
        entries[name] = Entry(vals.reshape(1, -1), counts)
    chunks, datasets = 0, []
    if pos < len(buf):  # the trailer (llama.cpp writes it; very old files lack it): chunks, dataset name
        chunks = i32("the chunk count")
        if pos < len(buf):
            size = i32("the dataset name length")
            if size < 0 or pos + size > len(buf):
                raise ImatrixError(f"{path}: truncated: the dataset name of {size} bytes at byte {pos} runs past the "
                                   "end of the file")
            name = buf[pos:pos + size].split(b"\0")[0].decode("utf-8", "replace")
            if name:
                datasets.append(name)
    return Imatrix(entries, datasets=datasets, chunk_count=max(0, chunks), legacy=True, path=path)


# -- the model's side --------------------------------------------------------------------------------


def _model_shapes(model_tensors) -> dict[str, tuple[int, ...]]:
    src = getattr(model_tensors, "tensors", model_tensors)
    items = src.items() if isinstance(src, Mapping) else ((t[0], t[1]) for t in src)
    out = {}
    for name, t in items:
        shape = tuple(int(d) for d in getattr(t, "shape", t))
        if not shape or math.prod(shape) <= 0:
            raise ImatrixError(f"model tensor {name!r} has shape {list(shape)}")
        out[name] = shape
    return out


__all__ = ["Entry", "Imatrix", "ImatrixError", "column_sums"]

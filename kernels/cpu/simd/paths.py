"""The choice of instruction-set path, and the `isa` tag that carries it (and the matrix kinds a
compiled function handles) in its type. See the package docstring."""

from __future__ import annotations

import os

import numpy as np

from ... import kinds as _kinds

PATHS = ("portable", "avx2", "vnni")


ALL_KINDS = _kinds.QUANTIZED  # the quantized matrix kinds (kinds.py: row-major and interleaved)


def host_features() -> set[str]:
    import llvmlite.binding as llvm

    try:
        llvm.initialize_native_target()
    except RuntimeError:
        pass
    feats = llvm.get_host_cpu_features()
    return {name for name, on in feats.items() if on}


def available_paths() -> list[str]:
    """The paths this CPU can execute, slowest first."""
    f = host_features()
    paths = ["portable"]
    if "avx2" in f and "fma" in f and "f16c" in f:
        paths.append("avx2")
        if "avxvnni" in f or ("avx512vnni" in f and "avx512vl" in f):
            paths.append("vnni")
    return paths


def choose_path() -> str:
    forced = os.environ.get("EDGEINFER_KERNELS", "").strip().lower()
    have = available_paths()
    if forced:
        if forced not in PATHS:
            raise ValueError(f"EDGEINFER_KERNELS must be one of {', '.join(PATHS)}, got {forced!r}")
        if forced not in have:
            raise ValueError(f"EDGEINFER_KERNELS={forced}: this CPU cannot run that path (it can run {', '.join(have)})")
        return forced
    return have[-1]


def isa_tag(path: str, kinds=None) -> np.ndarray:
    """The `isa` argument that selects `path` in the kernels, and the matrix kinds they must handle (None:
    every kind). Both live in the argument's type (an empty array of a record dtype whose field names
    say them), so a compiled function holds the code of that path and those kinds alone: a model's
    forward pass compiles the matmul kernels of its own weight types, not of all sixteen."""
    kinds = ALL_KINDS if kinds is None else tuple(sorted({int(k) for k in kinds}))
    if path not in PATHS or not kinds or not set(kinds) <= set(ALL_KINDS):
        raise ValueError(f"bad kernel tag: path {path!r}, kinds {kinds}")
    return np.empty(0, np.dtype([(path, np.uint8)] + [(f"k{k}", np.uint8) for k in kinds]))


def path_of(isa) -> str:
    """Inside an @overload: the path an `isa` argument's type names."""
    return next(iter(isa.dtype.fields))


def kinds_of(isa) -> frozenset:
    """Inside an @overload: the matrix kinds an `isa` argument's type names."""
    return frozenset(int(name[1:]) for name in isa.dtype.fields if name.startswith("k"))

"""Separately compiled kernel units, called by address.

Numba links every callee's LLVM module into its caller and optimises and emits the whole again, so a
kernel called from the compiled step was compiled once for itself and again in every function above it,
and nothing of the step could be compiled in another process. Here each kernel family (per ISA path and
matrix-kind family), paged attention (per KV type) and a mixture-of-experts FFN (step.call_experts, for
models with experts alone) is its own compiled, cached unit. The step and
`int8.matmuls` take an int64 table of the units' entry addresses (`table`) and call through it with
`call_rows` / `call_attention`: an indirect call in Numba's own calling convention, a few nanoseconds,
made once per task of rows (never per element).

A unit is compiled for one fixed signature, declared in calls.py next to the table slot it fills, with the
call intrinsics, which accept exactly those argument types: a mismatch fails the caller's compile, never a
call with the wrong arguments. calls.py is a leaf, so int8.matmuls calls units without importing this
module, which compiles int8's rows kernels into units.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..kinds import FAMILIES, is_quantized
from . import simd
# the calls into the units and their signatures (calls.py); the compiled step, the MoE kernels and
# parallel_compile read them here as units.*
from .calls import (ATTENTION, EXPERTS, KV_DTYPES, LORA, MIXER, LUTS, MAT, Q8, Q8K, ROWS_SIG, SMALL, TABLE_SIZE, attention_sig,  # noqa: F401
                    call_attention, call_rows, slot)
from .int8 import rows_any
from .quant import dequant_rows_of


def address(dispatcher, sig: tuple) -> int:
    """The entry address of `dispatcher` compiled (or loaded from the cache) for the argument types sig."""
    dispatcher.compile(sig)
    cres = dispatcher.overloads[tuple(sig)]
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)


# FAMILIES: the quantized matrix kinds by kernel family (kinds.py); one unit per family and path
FAMILY_OF = {k: name for name, ks in FAMILIES.items() for k in ks}


# -- the units ------------------------------------------------------------------------------------

_rows_units: dict = {}


def rows_unit(path: str, family: str):
    """The unit computing rows of a matmul of `family`'s kinds on `path`: int8.rows_any compiled for
    those kinds alone (its own qualified name, so its own cache index file: units compiled in parallel
    processes never rewrite one another's index)."""
    key = (path, family)
    unit = _rows_units.get(key)
    if unit is None:
        tag = simd.isa_tag(path, FAMILIES[family])

        def rows(w, q8, q8k, luts, out, n0, n1):
            rows_any(w, q8, q8k, luts, out, n0, n1, tag)

        rows.__qualname__ = rows.__name__ = f"rows_{path}_{family}"
        unit = _rows_units[key] = njit(nogil=True, cache=True)(rows)
    return unit


_embedding_units: dict = {}


def embedding_unit(kind: int):
    """The unit decoding rows of a matrix of `kind` (quant.dequant_rows_of for that kind alone): the embedding
    lookup, compiled per kind a model has rather than for all of them."""
    unit = _embedding_units.get(kind)
    if unit is None:
        # simd.isa_tag's form (simd.kinds_of reads it), for any kind: F16 and BF16 embeddings too
        tag = np.empty(0, np.dtype([("portable", np.uint8), (f"k{int(kind)}", np.uint8)]))

        def rows(kind, qs, qh, sc, d, m, luts, ids, out):
            dequant_rows_of(kind, qs, qh, sc, d, m, luts, ids, out, tag)

        rows.__qualname__ = rows.__name__ = f"embedding_k{kind}"
        unit = _embedding_units[kind] = njit(nogil=True, cache=True, fastmath=True)(rows)
    return unit


def attention_unit():
    from .attention import paged_attention

    return paged_attention


class Table:
    """The addresses of one process's units, filled on demand: `for_kinds` gives the int64 table the
    step and the matmuls take, with the units of those kinds (and attention for a KV type) loaded from
    the cache or compiled. small_path: the path of the small matmuls' units (simd.small_path), `path` by
    default."""

    def __init__(self, path: str, small_path: str | None = None, small_ready=None):
        self.path = path
        self.small_path = small_path or path
        self.addr = np.zeros(TABLE_SIZE, np.int64)
        self._attention: dict = {}
        # small_ready(): whether the few-token units may load now; until then (a background compile makes
        # them: background.py) the path's own units serve every token count, with the same bits
        self.small_ready = small_ready or (lambda: True)
        self._provisional: set = set()  # the families whose few-token slots hold the path's units meanwhile

    def for_kinds(self, kinds, kv: str | None = None) -> np.ndarray:
        if self._provisional and self.small_ready():
            for fam in self._provisional:
                s = address(rows_unit(self.small_path, fam), ROWS_SIG)
                for k2 in FAMILIES[fam]:
                    self.addr[SMALL + k2] = s
            self._provisional.clear()
        for k in kinds:
            if is_quantized(k) and self.addr[k] == 0:
                fam = FAMILY_OF[k]
                a = address(rows_unit(self.path, fam), ROWS_SIG)
                if self.small_path == self.path:
                    s = a
                elif self.small_ready():
                    s = address(rows_unit(self.small_path, fam), ROWS_SIG)
                else:
                    s = a
                    self._provisional.add(fam)
                for k2 in FAMILIES[fam]:
                    self.addr[k2] = a
                    self.addr[SMALL + k2] = s
        if kv is None:
            return self.addr
        out = self.addr.copy()
        if kv not in self._attention:
            self._attention[kv] = address(attention_unit(), attention_sig(kv))
        out[ATTENTION] = self._attention[kv]
        return out

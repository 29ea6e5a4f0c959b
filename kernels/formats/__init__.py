"""The weight formats: one module per family of GGML types, as gguf-py registers its quant formats.

Each module declares its types once (base.py says what: the block's field ranges, the repack to the
kernel arrays, the CPU and CUDA decodes, the regrouping into the interleaved layout); the loaded size
follows from its repack. Everything that depends on a type is driven from this registry, never from a
chain over types: quant/repack.py's `repack`, `repack_interleaved` and `loaded_bytes`,
kernels/cpu/quant.py's `decode_group` and kernels/cuda/quant.py's `_dq` (each a dispatch generated here
over the modules' decodes), kernels/cpu/layout.py's `interleave8`.

Every module of this package but base is a format module, found at import: a new type on an existing
kernel family (its kinds in kernels/kinds.py) is one file here and its row in tests/test_formats.py.

Imports nothing of ours but the kinds table (kernels/ import nothing outside kernels/), and no Numba code
generator: the backends compile the decodes.
"""

from __future__ import annotations

import importlib
import pkgutil

from gguf.constants import GGMLQuantizationType as T

from .. import kinds
from .base import Type

MODULES = tuple(importlib.import_module(f"{__name__}.{m.name}")
                for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
                if m.name != "base" and not m.name.startswith("_"))


def _register() -> tuple[dict, dict]:
    types, module_of = {}, {}
    for mod in MODULES:
        for t in mod.TYPES:
            if t.ggml in types:
                raise ImportError(f"{t.ggml.name} is declared by both {module_of[t.ggml].__name__} and {mod.__name__}")
            types[t.ggml], module_of[t.ggml] = t, mod
    return types, module_of


TYPES, MODULE_OF = _register()  # GGML type -> its Type, GGML type -> the module declaring it


def of(ggml_type: T) -> Type:
    """The Type of a GGML type the loader reads (KeyError for the others)."""
    return TYPES[ggml_type]


def module_of_kind(kind: int):
    """The format module whose decode and regrouping serve matrices of `kind`."""
    return MODULE_OF[kinds.info(kind).ggml]


def kinds_of(module) -> tuple[int, ...]:
    """Every kind (row-major and interleaved) of the GGML types `module` declares, in id order."""
    own = {t.ggml for t in module.TYPES}
    return tuple(k.id for k in kinds.KINDS if k.ggml in own)


def dispatch(name: str, params: str, callees: dict, domain, returns: bool):
    """A function `name(params)` that hands `kind` (the first parameter) to callees[module] for the kinds
    of each module that has one: a chain of comparisons of `kind` with integer constants (kinds.comparison),
    each over the kinds the earlier ones left, the last an `else`. So a backend compiles one function per
    decode, over every kind, as it did from the chain written out by hand. `returns`: whether the
    callees' values are returned. The generated source is the function's `source`."""
    remaining = frozenset(domain)
    branches = [(frozenset(kinds_of(mod)) & remaining, fn) for mod, fn in callees.items()]
    branches = [(members, fn) for members, fn in branches if members]
    lines = [f"def {name}({params}):"]
    scope = {}
    for i, (members, fn) in enumerate(branches):
        expr = kinds.comparison(members, remaining)
        remaining = remaining - members
        scope[f"_{i}"] = fn
        call = f"{'return ' if returns else ''}_{i}({params})"
        if i == len(branches) - 1:
            lines += (["    else:"] if i else []) + [f"    {'    ' if i else ''}{call}"]
        else:
            lines += [f"    {'if' if i == 0 else 'elif'} {expr}:", f"        {call}"]
    if remaining:
        raise ValueError(f"no decode for kinds {sorted(remaining)}")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<formats.dispatch {name}>", "exec"), scope)  # noqa: S102 (the source is made above)
    fn = scope[name]
    fn.source = source
    return fn

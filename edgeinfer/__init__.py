"""edgeinfer: a CPU-first runtime for quantized GGUF language models.

    from edgeinfer import LLM, SamplingParams
    llm = LLM("smollm2-135m-instruct")
    print(llm.generate("The capital of France is", SamplingParams(max_tokens=16))[0].text)
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# pyproject.toml's package-dir installs the sibling folders of this one as these subpackages. Installed (a wheel
# or an editable install) they are found as any package; in a source checkout that is not installed, the finder
# below maps exactly these names to those folders, so that nothing else of the checkout (tests/, benchmarks/,
# edgeinfer/ itself) becomes importable as edgeinfer.* (tests/test_packaging.py holds the two to each other).
_SIBLINGS = {"edgeinfer.kernels": "kernels", "edgeinfer.quant": "quant", "edgeinfer.models": "models",
            "edgeinfer.cli": "cli"}


class _SiblingFinder:
    """A meta path finder for _SIBLINGS in the checkout at `root`."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        folder = _SIBLINGS.get(fullname)
        if folder is None:
            return None
        import importlib.util

        where = _os.path.join(self.root, folder)
        return importlib.util.spec_from_file_location(fullname, _os.path.join(where, "__init__.py"),
                                                      submodule_search_locations=[where])


def _checkout_root() -> str | None:
    """The source checkout this package is the edgeinfer/ folder of (with pyproject.toml and every sibling
    folder beside it), or None: an installed copy."""
    root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    if not _os.path.isfile(_os.path.join(root, "pyproject.toml")):
        return None
    if not all(_os.path.isfile(_os.path.join(root, f, "__init__.py")) for f in _SIBLINGS.values()):
        return None
    return root


_root = _checkout_root()
if _root is not None and not any(isinstance(f, _SiblingFinder) and f.root == _root for f in _sys.meta_path):
    # first, so that a checkout always uses its own folders (not those of another checkout installed editable)
    _sys.meta_path.insert(0, _SiblingFinder(_root))

_LAZY = {
    "LLM": "edgeinfer.llm",
    "Completion": "edgeinfer.llm",
    "SamplingParams": "edgeinfer.sampling",
    "GGUFFile": "edgeinfer.gguf_file",
    "GGUFError": "edgeinfer.gguf_file",
    "EdgeInferError": "edgeinfer.errors",
}


def __getattr__(name):
    # Lazy, so that `import edgeinfer` (and the CLI's --help) stays fast and never loads numba.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edgeinfer' has no attribute {name!r}")


__all__ = list(_LAZY)

"""edgeinfer: a CPU-first runtime for quantized GGUF language models.

    from edgeinfer import LLM, SamplingParams
    llm = LLM("smollm2-135m-instruct")
    print(llm.generate("The capital of France is", SamplingParams(max_tokens=16))[0].text)
"""

import os as _os

# In a source checkout the sibling folders kernels/, quant/ and cli/ are the subpackages
# edgeinfer.kernels, edgeinfer.quant and edgeinfer.cli (pyproject.toml maps them for installs).
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
    _os.path.join(_root, "kernels", "__init__.py")
):
    __path__.append(_root)  # noqa: F821 - a package's __path__

__version__ = "0.1.0"

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

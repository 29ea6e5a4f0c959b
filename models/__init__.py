"""One module per architecture, each exporting ``config_from_gguf`` and ``Model``."""

from __future__ import annotations

from . import gemma3, llama, nomic_bert, qwen2
from .common import ModelLoadError

ARCHITECTURES = {llama.ARCH: llama, gemma3.ARCH: gemma3, qwen2.ARCH: qwen2, nomic_bert.ARCH: nomic_bert}


def _module(gf):
    arch = gf.architecture
    module = ARCHITECTURES.get(arch)
    if module is None:
        raise ModelLoadError(
            f"unsupported architecture {arch!r} (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return module


def model_config(gf):
    """The ModelConfig of the model in gf, without loading its weights."""
    return _module(gf).config_from_gguf(gf)


def load_model(gf, kb):
    module = _module(gf)
    return module.Model(gf, kb, module.config_from_gguf(gf))

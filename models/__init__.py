"""The architectures: decoders declared by an ArchSpec each (llama.py, gemma3.py, qwen2.py; read by
decoder.py), and the nomic-bert encoder, a module of its own."""

from __future__ import annotations

from . import decoder, gemma3, llama, nomic_bert, qwen2
from .common import ModelLoadError

DECODERS = {s.name: s for s in (llama.SPEC, gemma3.SPEC, qwen2.SPEC)}
ENCODERS = {nomic_bert.ARCH: nomic_bert}
ARCHITECTURES = sorted([*DECODERS, *ENCODERS])


def _check(gf) -> str:
    arch = gf.architecture
    if arch not in DECODERS and arch not in ENCODERS:
        raise ModelLoadError(f"unsupported architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")
    return arch


def model_config(gf):
    """The ModelConfig of the model in gf, without loading its weights."""
    arch = _check(gf)
    return decoder.config_from_gguf(gf, DECODERS[arch]) if arch in DECODERS else ENCODERS[arch].config_from_gguf(gf)


def load_model(gf, kb):
    arch = _check(gf)
    if arch in DECODERS:
        return decoder.Model(gf, kb, DECODERS[arch])
    module = ENCODERS[arch]
    return module.Model(gf, kb, module.config_from_gguf(gf))

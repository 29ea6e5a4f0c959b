"""The architectures: decoders declared by an ArchSpec each (llama.py (and smollm3), qwen2.py, qwen3.py, gemma2.py,
gemma3.py, gemma3n.py (its model of its own), gemma4.py, phi3.py, olmo2.py, lfm2.py (a hybrid with short convolutions), mamba2.py (state-space layers),
granite.py, nemotron_h.py and falcon_h1.py (hybrids of Mamba2 and attention), qwen35.py (gated delta nets and
gated attention), moe.py's mixture-of-experts models and gpt_oss.py; read by decoder.py), and the nomic-bert
encoder, a module of its own."""

from __future__ import annotations

from . import (decoder, falcon_h1, gemma2, gemma3, gemma3n, gemma4, gpt_oss, granite, lfm2, llama, mamba2, moe, nemotron_h, nomic_bert,
               olmo2, phi3, qwen2, qwen3, qwen35)
from .common import ModelLoadError

DECODERS = {s.name: s for s in (llama.SPEC, qwen2.SPEC, qwen3.SPEC, gemma2.SPEC, gemma3.SPEC, gemma3n.SPEC, gemma4.SPEC, phi3.SPEC, olmo2.SPEC,
                                 lfm2.SPEC, lfm2.MOE, mamba2.SPEC, granite.HYBRID, nemotron_h.SPEC, qwen35.SPEC, qwen35.MOE,
                                 qwen35.NEXT, falcon_h1.SPEC, llama.SMOLLM3, llama.MISTRAL3, granite.DENSE, granite.MOE,
                                 gpt_oss.SPEC, *moe.SPECS)}
ENCODERS = {nomic_bert.ARCH: nomic_bert}
MODELS = {"gemma3n": gemma3n.Model}  # decoders with a forward pass of their own
ARCHITECTURES = sorted([*DECODERS, *ENCODERS])


def _check(gf) -> str:
    arch = gf.architecture
    if arch not in DECODERS and arch not in ENCODERS:
        raise ModelLoadError(f"unsupported architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")
    return arch


def model_config(gf):
    """The ModelConfig of the model in gf, without loading its weights."""
    arch = _check(gf)
    return decoder.config_from_gguf(gf, decoder.resolve(gf, DECODERS[arch])) if arch in DECODERS else ENCODERS[arch].config_from_gguf(gf)


def load_model(gf, kb, n_ctx: int | None = None):
    """The model in gf on backend kb; n_ctx: the context a sequence may reach (LongRoPE files choose
    their rope factors by it; None: the engine's default)."""
    arch = _check(gf)
    if arch in DECODERS:
        return MODELS.get(arch, decoder.Model)(gf, kb, decoder.resolve(gf, DECODERS[arch]), n_ctx=n_ctx)
    module = ENCODERS[arch]
    return module.Model(gf, kb, module.config_from_gguf(gf))

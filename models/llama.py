"""The `llama` architecture (Llama 2/3, SmolLM2, ...): RMSNorm, RoPE, GQA, SwiGLU: the plain decoder layer
(models/decoder.py) with nothing added."""

from .decoder import ArchSpec

SPEC = ArchSpec("llama")

"""The `llama` architecture (Llama 2/3, SmolLM2, ...): RMSNorm, RoPE, GQA, SwiGLU: the plain decoder layer
(models/decoder.py) with nothing added. `smollm3` (SmolLM3): the same layer, every fourth one without RoPE
(llama.cpp's src/models/smollm3.cpp)."""

from .decoder import ArchSpec

SPEC = ArchSpec("llama")
SMOLLM3 = ArchSpec("smollm3", nope_interval=4)

"""The `llama` architecture (Llama 2/3, SmolLM2, ...): RMSNorm, RoPE, GQA, SwiGLU: the plain decoder layer
(models/decoder.py) with nothing added. `smollm3` (SmolLM3): the same layer, every fourth one without RoPE
(llama.cpp's src/models/smollm3.cpp). `mistral3` (Ministral 3, Mistral Small 3.x): the llama layer with
YaRN RoPE and, past the original context, Llama 4's attention temperature on the queries (mistral3.cpp)."""

from .decoder import ArchSpec

SPEC = ArchSpec("llama")
SMOLLM3 = ArchSpec("smollm3", nope_interval=4)
MISTRAL3 = ArchSpec("mistral3", attn_temp=True)  # YaRN RoPE (any architecture's rope.scaling.type "yarn")

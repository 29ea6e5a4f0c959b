"""The `qwen2` architecture (Qwen2, Qwen2.5): the llama layer with biases on q, k and v, NeoX RoPE
(a large base, 1,000,000 in Qwen2.5), GQA, SwiGLU, a separate or tied output matrix."""

from .decoder import ArchSpec

SPEC = ArchSpec("qwen2", rope_neox=True, qkv_bias=True)

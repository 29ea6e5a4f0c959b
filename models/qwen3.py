"""The `qwen3` architecture (Qwen3 0.6B-32B): the llama layer with an RMS norm on each q and k head
before RoPE, no q/k/v biases, NeoX RoPE."""

from .decoder import ArchSpec

SPEC = ArchSpec("qwen3", rope_neox=True, qk_norm=True)

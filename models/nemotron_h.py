"""The `nemotron_h` architecture (NVIDIA Nemotron-H 4B/8B, Nemotron Nano 9B v2 and 12B v2): each layer one
block after an RMS norm: a Mamba2 mixer (models/parts/mamba2.py), attention without positions (GQA, no
RoPE), or a feed-forward block alone (models/parts/mlp.py: up, ReLU squared, down), which given per layer by
head_count_kv and feed_forward_length (both 0: Mamba2; feed_forward_length 0: attention). As llama.cpp's
src/models/nemotron-h.cpp."""

from .decoder import ArchSpec

SPEC = ArchSpec("nemotron_h", recurrent="mamba2", mlp_layers=True, feed_forward=False, rope=False)

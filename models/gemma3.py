"""The `gemma3` architecture: scaled embeddings, q/k norms, GELU-gated FFN, post-norms, sliding-window
layers (every sixth global) with their own RoPE base, logit softcaps where the file sets them."""

from .decoder import ArchSpec

SPEC = ArchSpec("gemma3", rope_neox=True, qk_norm=True, post_norms=True, activation="gelu_tanh", embed_scale=True,
                swa_pattern=6,  # layers 5, 11, 17, ... are global
                rope_base_local=10000.0,  # the sliding-window layers' RoPE base
                softcaps=True)

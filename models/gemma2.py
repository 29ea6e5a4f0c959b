"""The `gemma2` architecture: scaled embeddings, GELU-gated FFN, post-norms, attention- and final-logit
softcapping (50 and 30 where the file does not say), every other layer (0, 2, 4, ...) within the
sliding window, one RoPE base, attention scale 1/sqrt(head_dim) (1/sqrt(dim / n_head) in the 27B)."""

from .decoder import ArchSpec

SPEC = ArchSpec("gemma2", rope_neox=True, post_norms=True, activation="gelu_tanh", embed_scale=True, swa_pattern=2,
                softcaps=True, softcap_defaults=(50.0, 30.0), gemma2_scale=True)

"""The `olmo2` architecture (OLMo 2): no norms before attention and FFN, RMS norms on their outputs
before each residual add, RMS norms on q and k over each token's whole projection (not per head),
NeoX RoPE."""

from .decoder import ArchSpec

SPEC = ArchSpec("olmo2", rope_neox=True, pre_norms=False, post_norms=True, qk_norm_full=True)

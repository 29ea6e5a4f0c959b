"""The mixture-of-experts decoders: a router picks k of E expert FFNs per token (softmax gating) in place
of the dense FFN (kernels/cpu/moe.py computes it).

- `qwen3moe` (Qwen3-30B-A3B, ...): Qwen3's attention (per-head q/k norms), the chosen experts' weights
  renormalised to sum 1;
- `olmoe` (OLMoE): q/k norms over the whole projection, weights not renormalised;
- `qwen2moe` (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases), weights not
  renormalised, plus a shared expert whose output is gated per token by a sigmoid.
"""

from .decoder import ArchSpec

QWEN3MOE = ArchSpec("qwen3moe", rope_neox=True, qk_norm=True, moe=True, moe_norm_w=True)
OLMOE = ArchSpec("olmoe", rope_neox=True, qk_norm_full=True, moe=True)
QWEN2MOE = ArchSpec("qwen2moe", rope_neox=True, qkv_bias=True, moe=True, shared_expert=True)
SPECS = (QWEN3MOE, OLMOE, QWEN2MOE)

"""The `phi3` architecture (Phi-3, Phi-3.5, Phi-4-mini): q, k and v in one fused `attn_qkv` matrix (or
three), the gate and up projections in one `ffn_up` of twice the FFN's rows (gate first), NeoX RoPE,
partial rotary where the file says so, and LongRoPE: `rope_factors_short`/`rope_factors_long` chosen by
the context length, cos and sin scaled by the file's attn_factor. llama.cpp ignores phi3 files' sliding
window (it is disabled there), and so does this."""

from .decoder import ArchSpec

SPEC = ArchSpec("phi3", rope_neox=True, fused_gate_up=True)

"""The `qwen35`, `qwen35moe` and `qwen3next` architectures (Qwen3.5 and Qwen3.6, dense and mixture-of-experts,
and Qwen3-Next): three of every four layers a gated delta net (models/parts/deltanet.py: linear attention
with a recurrent state per sequence), the fourth gated full attention (per-head q/k RMS norms, each head's
output times the sigmoid of a gate that attn_q also projects, interleaved multi-section RoPE on a part of
each head; Qwen3-Next: plain RoPE), which layers are which given by attention.recurrent_layers or
full_attention_interval; the norm before the FFN is the file's post_attention_norm; a SiLU-gated FFN, or
(qwen35moe, qwen3next) a mixture of experts with a gated shared expert. As llama.cpp's
src/models/qwen35.cpp, qwen35moe.cpp and qwen3next.cpp."""

from gguf.constants import MODEL_TENSOR as TN

from .decoder import ArchSpec

SPEC = ArchSpec("qwen35", rope_neox=True, qk_norm=True, recurrent="deltanet", attn_gate=True,
                ffn_norm=TN.ATTN_POST_NORM, imrope=True)
MOE = ArchSpec("qwen35moe", rope_neox=True, qk_norm=True, recurrent="deltanet", attn_gate=True,
               ffn_norm=TN.ATTN_POST_NORM, imrope=True, moe=True, moe_norm_w=True, shared_expert=True,
               moe_scale_w=True)
# Qwen3-Next (80B-A3B): the same layers, plain (NeoX) RoPE, Qwen3-Next's delta-net layout, experts in every
# layer with a gated shared expert
NEXT = ArchSpec("qwen3next", rope_neox=True, qk_norm=True, recurrent="deltanet", attn_gate=True,
                ffn_norm=TN.ATTN_POST_NORM, delta_next=True, moe=True, moe_norm_w=True, shared_expert=True,
                moe_scale_w=True)

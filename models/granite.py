"""IBM's Granite family. `granite` (Granite 3.x dense): the llama layer with Granite's multipliers, and
`granitemoe` (Granite 3.x MoE, and MoE Shared: with a shared expert) with experts in its layers (llama.cpp's
src/models/granite.cpp). `granitehybrid` (Granite 4.0 H Micro/Tiny/Small): Mamba2 layers (models/parts/
mamba2.py) and attention layers (GQA, no RoPE in the Granite 4 H files: rope.scaling.finetuned false), which
layers are which given by a head_count_kv of 0 per Mamba2 layer; a SiLU-gated FFN in every layer, or (Tiny,
Small) a mixture of experts with softmax routing, renormalised weights and an ungated shared expert; Granite's
multipliers on the embeddings, each block's output, the attention scores and the logits. As llama.cpp's
src/models/granite-hybrid.cpp."""

from .decoder import ArchSpec

# softmax routing, renormalised weights, scaled by expert_weights_scale, an ungated shared expert where sized
EXPERTS = (("moe", True), ("moe_norm_w", True), ("moe_scale_w", True), ("shared_expert", True))
DENSE = ArchSpec("granite", granite=True)  # Granite 3.x: the llama layer with the multipliers (granite.cpp)
MOE = ArchSpec("granitemoe", granite=True, with_experts=EXPERTS, shared_gate=False)  # Granite 3.x MoE
HYBRID = ArchSpec("granitehybrid", recurrent="mamba2", granite=True, with_experts=EXPERTS, shared_gate=False)

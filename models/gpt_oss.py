"""OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b; `gpt-oss` in GGUF files, llama.cpp's src/models/openai-moe.cpp):
a mixture of experts in every layer (a biased router, the k largest logits weighted by a softmax over them, each
expert's gate, up and down with biases, the clamped SwiGLU), attention with q/k/v and output biases and a learned
sink per head, sliding-window layers alternating with full ones (every second layer full), NeoX RoPE with YaRN
scaling, the FFN's norm named post_attention_norm. Its experts come in MXFP4 (kernels/formats/mxfp4.py)."""

from gguf.constants import MODEL_TENSOR as TN

from .decoder import ArchSpec

SPEC = ArchSpec("gpt-oss", rope_neox=True, qkv_bias=True, swa_pattern=2, moe=True, attn_sinks=True, oai_experts=True,
                ffn_norm=TN.ATTN_POST_NORM)

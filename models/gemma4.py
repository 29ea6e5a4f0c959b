"""The `gemma4` architecture (dense, and its mixture of experts: parts/gemma4_moe.py): Gemma 3's layer (scaled embeddings, q/k norms, GELU-gated FFN, post-norms,
final logit softcap) with sliding-window and full-attention layers of their own head sizes, rotated dimensions
and RoPE bases (the full layers' "proportional" RoPE through rope_freqs), V RMS-normed (V = K where a layer has
no attn_v), unscaled scores, per-layer token inputs (per_layer.py), a scale on each layer's output, and the last
attention.shared_kv_layers layers reading an earlier layer's KV (llama.cpp's gemma4.cpp)."""

from .decoder import ArchSpec

SPEC = ArchSpec("gemma4", rope_neox=True, qk_norm=True, post_norms=True, activation="gelu_tanh", embed_scale=True,
                softcaps=True, layer_shapes=True, per_layer_input=True, v_norm=True, layer_scale=True,
                attn_scale_one=True,
                # a file with experts (26B-A4B): a dense FFN and the experts side by side in each layer
                with_experts=(("gemma4_moe", True), ("moe_norm_w", True)))

"""The `lfm2` and `lfm2moe` architectures (Liquid's LFM2 and LFM2.5, dense and mixture-of-experts): a hybrid
of gated short-convolution layers (models/parts/shortconv.py, a recurrent state per sequence) and attention layers (per-head q/k RMS norms,
NeoX RoPE, GQA), which layers are which given by a head_count_kv of 0 per convolution layer; a SiLU-gated
FFN in every layer (lfm2moe: after the first leading_dense_block_count layers, experts chosen by sigmoid
scores plus a per-expert selection bias, their weights renormalised); the final norm is the file's
token_embd_norm."""

from .decoder import ArchSpec

SPEC = ArchSpec("lfm2", rope_neox=True, qk_norm=True, recurrent="shortconv", output_norm="token_embd_norm")
MOE = ArchSpec("lfm2moe", rope_neox=True, qk_norm=True, recurrent="shortconv", output_norm="token_embd_norm",
               moe=True, moe_norm_w=True, moe_scale_w=True, moe_bias=True)

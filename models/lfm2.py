"""The `lfm2` architecture (Liquid's LFM2 and LFM2.5, dense): a hybrid of gated short-convolution layers
(models/parts/shortconv.py, a recurrent state per sequence) and attention layers (per-head q/k RMS norms,
NeoX RoPE, GQA), which layers are which given by a head_count_kv of 0 per convolution layer; a SiLU-gated
FFN in every layer; the final norm is the file's token_embd_norm."""

from .decoder import ArchSpec

SPEC = ArchSpec("lfm2", rope_neox=True, qk_norm=True, recurrent="shortconv", output_norm="token_embd_norm")

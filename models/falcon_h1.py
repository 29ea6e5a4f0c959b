"""The `falcon-h1` architecture (TII's Falcon-H1 0.5B-34B): in every layer attention (GQA, NeoX RoPE) and a
Mamba2 mixer side by side on the same RMS-normed input, their outputs summed into the residual
(models/parts/parallel.py), then a SiLU-gated FFN (its norm blk.N.ffn_norm, no suffix, as the converter writes it); Falcon-H1's multipliers are folded into the weights by
the converter; the Mamba2 layers' grouped norm where the file has it. As llama.cpp's src/models/falcon-h1.cpp."""

from .decoder import ArchSpec

SPEC = ArchSpec("falcon-h1", rope_neox=True, recurrent="attn_mamba2", ssm_norm_optional=True, ffn_norm_part="")

"""Integer dot-product matmuls over repacked weights, as llama.cpp computes them.

Activations are quantized once per matmul input, per token row (``quantize_q8`` / ``quantize_q8k``):

- Q8 (for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL weights): 32-element blocks, int8 values, a float scale and
  the scaled block sum (the min/offset term of the weight type is folded through it);
- Q8_K (for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256-element blocks, int8 values, a float scale, int sums per 32 and 16.

A weight block times an activation block is an exact integer dot product, scaled once per block
(legacy types) or once per 256-element super-block (K-quants, whose sub-block scales are applied in the
integer domain). Every output element is computed by the same sequence of operations whatever the
number of tokens, so batched and single-token results are bit-identical.

`matmuls` is the one entry point (up to three matrices reading the same input, in one parallel
region). Two layouts, two families of kernels:

- row-major (quant/repack.py's QTensor; kinds.py's Q8_0 .. Q6_K, IQ4_NL, Q3_K, Q2_K): plain integer loops, one row and
  one token at a time; the portable path's layout (on the SIMD paths the backend regroups every
  quantized matrix, layout.interleave8, and only the interleaved kernels run);
- eight rows interleaved (layout.py; kinds.py's Q4_0_X8 .. Q8_0_X8, IQ4_NL_X8, Q3_K_X8, Q2_K_X8): the SIMD paths' layout. A
  vector's eight lanes are eight output rows (u8 x s8 with the idioms of simd/; vpdpbusd on vnni,
  vpmaddubsw + vpmaddwd on avx2, chosen by the type of the `isa` argument); each has a portable twin
  that computes the lanes one by one, to the same bits.

Helpers inside the loops take vectors and scalars, never arrays: an array argument costs reference
counting on every call (measured 10x slower).

The package, by kernel family (kinds.FAMILIES): quantize.py (the activations), dispatch.py (`matmuls`,
`rows_any`), common.py (what the families share), and one module per family: q8_0, q45, k45, q6_k
(row-major, IQ4_NL's in q45) and x8, kx8, q8x8 (interleaved; q8x8.py also runs nlx8, IQ4_NL's; kx8.py's
kernels are a module per path: kx8_simd (vnni, aarch64), kx8_avx2, kx8_zmm (avx512)); k23.py holds both of
Q3_K's and Q2_K's families (k23 row-major, k23x8 interleaved).
"""

from .dispatch import as_tuple, matmuls, rows_any, rows_per_task  # noqa: F401
from .quantize import (quantize_q8, quantize_q8_blocks, quantize_q8_row, quantize_q8k,  # noqa: F401
                       quantize_q8k_blocks, quantize_q8k_row)

"""Named vector operations for the int8 dot-product kernels, and the choice of instruction-set path.

Each operation is a Numba intrinsic that emits one LLVM vector instruction (or a short fixed
sequence), named as ggml names its x86 idioms. LLVM never emits ``vpmaddubsw`` by itself, so the
integer dot products are written in these names (see int8/).

The path is chosen once, at import, from the host CPU's features (llvmlite.binding), or forced with
EDGEINFER_KERNELS=portable|avx2|vnni|avx512|neon|dotprod|i8mm:

- ``avx512``: AVX-512 VNNI on 512-bit registers, two groups of eight rows per vector (vec.py), in the
  families that have that form; the vnni path's kernels in the others;
- ``vnni``: AVX-512 VNNI (with VL) or AVX-VNNI: u8 x s8 dot products in one ``vpdpbusd``;
- ``avx2``: ``vpmaddubsw`` then ``vpmaddwd`` with ones (u8 x s8 -> s16 pairs -> s32);
- ``i8mm`` (aarch64, ARMv8.6): ``smmla`` for two tokens at once in batches, ``sdot`` otherwise;
- ``dotprod`` (aarch64, ARMv8.2): ``sdot``, four bytes per 32-bit lane;
- ``neon`` (aarch64, ARMv8.0): ``smull``/``smlal`` into 16 bits, then ``saddlp`` and ``addp``;
- ``portable``: plain Numba integer loops that LLVM vectorizes for whatever CPU this is.

Kernels take the path as an argument, ``isa``: a 0-length array of a record dtype whose first field
names the path (and the others the matrix kinds, paths.isa_tag). Its type, not its value, selects the
code at compile time, so
each path is a separate specialization in Numba's on-disk cache (forcing another path never loads
the wrong one) and calling costs no more than passing an array.

Kernels call everything as ``simd.NAME``; the package is split by what it holds: paths.py (the path
choice and the `isa` tag), vec.py (the vector types, ymm and zmm, and the typing of an operation that takes
either width), ints.py (integer operations: loads, byte arithmetic, the x86 dot products), neon.py (the
aarch64 dot products), floats.py (float vector operations).
"""

from .floats import *  # noqa: F401,F403
from .ints import *  # noqa: F401,F403
from .neon import *  # noqa: F401,F403
from .paths import ALL_KINDS, ARM_PATHS, PATHS, SMALL_ENV, SMALL_TOKENS, SMALL_TOKENS_KX8, SMALL_TOKENS_OF, VNNI_PATHS, X86_PATHS, EMULATE_ENV, arm_hwcaps, available_paths, choose_path, host_cpu, host_features, isa_tag, kinds_of, native_paths, path_of, small_path  # noqa: F401
from .vec import Vec, f32x8, f32x16, i8x32, i8x64, i16x16, i32x8, i32x16, vec_of  # noqa: F401

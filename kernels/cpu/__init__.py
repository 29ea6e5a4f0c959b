"""CPU backend (Numba).

On import, before anything compiles, the code generator is pinned to the ISA tier of the kernel path
this process runs (EDGEINFER_KERNELS or the best the CPU has), and this package's cached kernels are
filed under $EDGEINFER_HOME/kernels (or $NUMBA_CACHE_DIR) by tier, Numba/llvmlite/Python versions and a
hash of the kernel sources: see cache.py. Machines of one tier share a cache; a copy serves another.
"""

from . import cache, simd

try:
    cache.configure(simd.choose_path(), simd.host_features())
except ValueError:  # a bad EDGEINFER_KERNELS: backend.py says so, at the first use of the kernels
    cache.configure("portable", simd.host_features())

"""Memory advice for the kernel's pages (Linux madvise): huge pages for weights, small ones for the KV
cache, a whole range mapped in one call. A leaf: it imports nothing of ours (and no numba), so the weight
repacking and the engine's KV cache both use it.
"""

from __future__ import annotations

import numpy as np

MADV_HUGEPAGE = 14
MADV_NOHUGEPAGE = 15
MADV_POPULATE_READ = 22  # Linux 5.14+: map a range's pages in one call instead of a fault per page


def madvise(a: np.ndarray, advice: int) -> None:
    """madvise over the whole pages inside a's memory; silently nothing where Linux lacks the advice."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = -(-a.ctypes.data // page) * page
    length = (a.ctypes.data + a.nbytes) // page * page - start
    if length <= 0:
        return
    try:
        ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), ctypes.c_int(advice))
    except (OSError, AttributeError):
        pass

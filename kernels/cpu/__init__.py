"""CPU backend (Numba).

Numba's on-disk cache is invalidated only when a function's own source file changes, but a compiled
kernel holds inlined copies of what it calls in other files: after an edit to ops.py, the cached step
(step.py) would still run the old ops. So, unless NUMBA_CACHE_DIR chooses a place, the kernels are cached
under a directory named after a hash of every source file here: any change to any of them starts afresh.
"""

import hashlib
import os

import numba


def _kernel_cache_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return os.path.join(here, "__pycache__", "numba-" + h.hexdigest()[:16])


if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = _kernel_cache_dir()

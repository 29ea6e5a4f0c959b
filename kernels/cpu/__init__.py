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


def _prune_old(current: str, max_age_s: float = 3600.0) -> None:
    # caches of earlier sources (5-10 MB each), untouched for an hour, are dead weight
    import shutil
    import time

    parent = os.path.dirname(current)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        if name.startswith("numba-") and path != current:
            try:
                if time.time() - os.path.getmtime(path) > max_age_s:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass


if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = _kernel_cache_dir()
    _prune_old(numba.config.CACHE_DIR)

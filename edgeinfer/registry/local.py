"""Local pulls: a .gguf file, checked to be one, copied into the cache under a name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .cache import _cache_file, _check_gguf, _check_space, _no_link, cache_lock
from .catalog import _stem
from .errors import PullError


def _pull_local(path: Path, *, name: str | None, force: bool) -> Path:
    _check_gguf(path)
    stem = name or path.name
    final = _cache_file(_stem(stem), write=True)
    if final.exists() and final.resolve() == path.resolve():
        return final
    if final.is_file() and not force:
        return final
    with cache_lock(final.stem, quiet=True):
        tmp = _no_link(final.with_name(f".{final.name}.partial"))  # one fixed name: a killed copy is replaced
        try:
            _check_space(path.stat().st_size, final.name)
            shutil.copyfile(path, tmp)
            os.replace(tmp, final)
        except OSError as e:
            raise PullError(f"could not copy {path} into the model cache: {e}; nothing was saved") from None
        finally:
            tmp.unlink(missing_ok=True)
    return final

"""The local model cache (EDGEINFER_HOME/models): its paths, never a link out of it, what every pull goes
through (the lock, the disk-space checks, _pull_once's frame and _install's checked rename), a catalog
pull's staging folder and resume state, listing and removal."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .catalog import _NAME_RE, CATALOG, CatalogEntry, _stem, check_name, lookup
from .errors import InvalidNameError, ModelNotFoundError, PullError
from .refs import parse_ref


def home() -> Path:
    return Path(os.environ.get("EDGEINFER_HOME") or Path.home() / ".cache" / "edgeinfer")


def models_dir() -> Path:
    return home() / "models"


def _outside_cache(path: Path) -> Path | None:
    """Where `path` (in the cache) really leads when that is outside the cache; None when it stays in."""
    target = path.resolve()
    try:
        target.relative_to(models_dir().resolve())
    except ValueError:
        return target
    return None


def _cache_file(stem: str, write: bool = False) -> Path:
    """The cache's file for a model name: never a link out of the cache. To read, such a link is an
    error; to write (a pull), it is removed first, so nothing is written through it."""
    path = models_dir() / f"{check_name(stem)}.gguf"
    if path.is_symlink() and (target := _outside_cache(path)) is not None:
        if not write:
            raise InvalidNameError(f"{path} is a link to {target}, outside the model cache; it is not used")
        path.unlink()
    return path


def _no_link(path: Path) -> Path:
    """A path the cache is about to write: a link planted there is removed, so nothing is written through it."""
    if path.is_symlink():
        path.unlink()
    return path


@contextlib.contextmanager
def cache_lock(name: str, quiet: bool = False, wait: bool = True):
    """Hold the cache's lock for one model name (fcntl; a no-op where there is none); yields True. With
    wait False, a lock another process holds is not waited for: it yields False, holding nothing."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield True
        return
    locks = home() / "locks"  # beside the models, not among them; kept (removing a lock file races)
    locks.mkdir(parents=True, exist_ok=True)
    with open(_no_link(locks / f"{name}.lock"), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if not quiet:
                print(f"waiting for another process pulling {name} to finish", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _space_error(e: OSError, what: str) -> PullError:
    return PullError(f"cannot write {what}: {os.strerror(e.errno)} in {models_dir()}; nothing was saved")


def _check_space(need: int, what: str) -> None:
    free = shutil.disk_usage(models_dir()).free
    if need > free:
        raise PullError(f"not enough disk space for {what}: it needs {need:,} bytes in {models_dir()}, and "
                        f"{free:,} are free; nothing was saved")


def cached_path(entry_or_name: CatalogEntry | str) -> Path:
    name = entry_or_name.name if isinstance(entry_or_name, CatalogEntry) else entry_or_name
    return _cache_file(name)


# -- what every pull shares -------------------------------------------------------------------------


def _sha256(path: Path):
    """A sha256 object fed with the file's bytes (more can be added to it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h


class _CallbackBar:
    """What a pull's progress bar is asked to do, reported to a callback instead of drawn:
    callback(desc, bytes so far, total or None), on every update (the HTTP server's pull route)."""

    def __init__(self, callback, total: int | None, desc: str, initial: int = 0):
        self.callback, self.total, self.desc, self.n = callback, total, desc, initial
        callback(desc, initial, total)

    def update(self, n: int) -> None:
        self.n += n
        self.callback(self.desc, self.n, self.total)

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _progress_bar(total: int | None, desc: str, enabled, initial: int = 0):
    """A tqdm bar on stderr when `enabled` is true; when it is a callable (pull(progress=callback)),
    progress goes to it instead."""
    from tqdm import tqdm

    if callable(enabled):
        return _CallbackBar(enabled, total, desc, initial)
    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not enabled, file=sys.stderr, leave=True)


def _check_gguf(path: Path) -> None:
    from ..gguf_file import GGUFError, GGUFFile

    try:
        GGUFFile(path).close()
    except GGUFError as e:
        raise PullError(f"the downloaded file is not a valid GGUF model: {e}") from None


def _pull_once(final: Path, what: str, progress, force: bool, pull, clean_up) -> Path:
    """The frame of every download: a file already in the cache is kept (unless force); else pull() runs
    under the model's lock, after a second look (another process may have pulled it while this one
    waited); a full disk calls clean_up() (the partial work is useless) and becomes a PullError on `what`."""
    if final.is_file() and not force:
        return final
    with cache_lock(final.stem, quiet=not progress):
        if final.is_file() and not force:  # another process pulled it while this one waited
            return final
        try:
            return pull()
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            clean_up()
            raise _space_error(e, what) from None


def _install(partial: Path, final: Path, check=None) -> Path:
    """Move a finished download into the cache once check() (if given) passes and it reads as GGUF; a
    bad one is deleted, so the next pull starts over rather than resuming it."""
    try:
        if check is not None:
            check()
        _check_gguf(partial)
    except PullError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, final)
    return final


# -- a catalog pull's resume state ------------------------------------------------------------------


def staging_dir(entry: CatalogEntry) -> Path:
    """Where a catalog pull keeps its work until the whole file checks out (hidden from `list`)."""
    return models_dir() / f".pull-{entry.name}"


def _resume_point(entry: CatalogEntry, staging: Path, out_path: Path):
    """(parts done, bytes written, sha256 of those bytes) of an earlier interrupted pull of the same
    entry, or a fresh start."""
    state_path = staging / "state.json"
    try:
        state = json.loads(state_path.read_text())
        done, written = int(state["parts_done"]), int(state["bytes"])
        if state.get("sha256") != entry.sha256 or not 0 < done <= len(entry.parts) \
                or out_path.stat().st_size < written:
            raise ValueError("stale")
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0, hashlib.sha256()
    os.truncate(out_path, written)  # bytes past the last finished part are from the part cut short
    return done, written, _sha256(out_path)


def _write_state(staging: Path, state: dict) -> None:
    tmp = staging / "state.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, staging / "state.json")


# -- listing ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path
    size: int


def list_local() -> list[LocalModel]:
    """The whole models in the cache (a pull in progress writes elsewhere; links out of the cache are skipped)."""
    d = models_dir()
    if not d.is_dir():
        return []
    return [LocalModel(p.stem, p, p.stat().st_size) for p in sorted(d.glob("*.gguf"))
            if _NAME_RE.match(p.stem) and p.is_file() and not (p.is_symlink() and _outside_cache(p))
            and not p.name.endswith(".mmproj.gguf")]


def projector_for(path) -> Path | None:
    """The vision projector pulled with a cached model (hf.py: NAME.mmproj.gguf beside NAME.gguf), or None."""
    p = Path(path)
    proj = p.with_name(p.stem + ".mmproj.gguf")
    return proj if p.parent == models_dir() and proj.is_file() else None


def remove(model: str, catalog: dict[str, CatalogEntry] | None = None) -> Path:
    catalog = CATALOG if catalog is None else catalog
    entry = lookup(model, catalog)
    ref = None if entry else parse_ref(model)  # hf.co/ORG/REPO:QUANT: its cache name
    stem = entry.name if entry else ref.name if ref else _stem(model)
    path = models_dir() / f"{check_name(stem)}.gguf"
    if not path.is_file() and not path.is_symlink():
        have = ", ".join(m.name for m in list_local()) or "none"
        raise ModelNotFoundError(f"model {model!r} is not in the cache ({models_dir()}); downloaded: {have}")
    path.unlink()
    path.with_name(path.stem + ".mmproj.gguf").unlink(missing_ok=True)  # its projector, pulled with it
    # its repacked weight layouts (models/layout_cache.py: NAME-LAYOUT-ID.layout), a model's size each
    for layout in (home() / "layouts").glob(f"{stem}-*.layout"):
        if layout.name.count("-") == stem.count("-") + 2:
            layout.unlink(missing_ok=True)
    return path

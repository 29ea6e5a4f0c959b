"""URL pulls: a model fetched over http(s) into a .partial file, which a later pull resumes with a Range
request, checked to be a GGUF file, then renamed into the cache."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from .cache import _NO_SPACE, _cache_file, _check_space, _install, _no_link, _progress_bar, _pull_once
from .catalog import _NAME_RE, _stem
from .errors import InvalidNameError, PullError


def _name_from_url(url: str) -> str:
    base = urllib.parse.unquote(os.path.basename(urllib.parse.urlparse(url).path)) or "model.gguf"
    base = base if base.endswith(".gguf") else base + ".gguf"
    if not _NAME_RE.match(base[:-5]):
        raise InvalidNameError(f"the URL's file name {base!r} is not a valid model name: give one with --name")
    return base


def _pull_url(url: str, *, name: str | None, progress: bool, force: bool, timeout: float = 60.0) -> Path:
    final = _cache_file(_stem(name or _name_from_url(url)), write=True)
    partial = final.with_name(final.name + ".partial")
    return _pull_once(final, final.name, progress, force, lambda: _pull_url_locked(url, final, progress, timeout),
                      lambda: partial.unlink(missing_ok=True))


def _pull_url_locked(url: str, final: Path, progress: bool, timeout: float) -> Path:
    partial = _no_link(final.with_name(final.name + ".partial"))  # kept on interruption: the next pull resumes
    _fetch_resumable(url, partial, final.name, progress, timeout)
    return _install(partial, final)


def _fetch_resumable(url: str, partial: Path, what: str, progress: bool, timeout: float,
                     headers: dict[str, str] | None = None) -> int:
    """Download `url` into `partial`, resuming with a Range request after the bytes it already holds (a
    server that ignores the Range starts it over). `headers` go with the request but not with a redirect
    (so a token meant for a model hub never reaches the storage it redirects to). Returns the file's size."""
    import http.client
    import urllib.error
    import urllib.request

    have = partial.stat().st_size if partial.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "edgeinfer"})
    for key, value in (headers or {}).items():
        if key.lower() != "user-agent":
            req.add_unredirected_header(key.capitalize(), value)
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # already complete
            return have
        raise PullError(f"download failed: HTTP {e.code} {e.reason} for {url}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise PullError(f"download failed: cannot reach {url}: {reason}") from None
    with resp:
        if have and resp.status != 206:
            have = 0  # the server ignored the Range header: start over
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        if length and length.isdigit():
            _check_space(int(length), what)
        mode = "ab" if have else "wb"
        try:
            with open(partial, mode) as out, _progress_bar(total, f"pull {what}", progress, have) as bar:
                while True:
                    chunk = resp.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    bar.update(len(chunk))
        except (OSError, urllib.error.URLError, http.client.HTTPException) as e:
            if isinstance(e, OSError) and e.errno in _NO_SPACE:
                raise
            raise PullError(f"download interrupted ({e}); run the same pull again to resume") from None
        got = partial.stat().st_size
        if total is not None and got < total:
            raise PullError(f"download interrupted after {got} of {total} bytes; run the same pull again to resume")
    return got

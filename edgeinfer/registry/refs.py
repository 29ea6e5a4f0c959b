"""What a model source names, before any transport is chosen: a Hugging Face reference (`hf.co/ORG/REPO[:QUANT]`,
`huggingface.co/...`, the repo's https page, `hf://ORG/REPO/FILE.gguf`), and the name a model goes by.

It builds on the catalog's name rules only; the cache (removing a model by its reference), the Hugging Face
transport and the package's resolve/pull build on it, so no transport is imported to read a name.

Names: a ref's model is cached as ORG--REPO--QUANT (QUANT upper-cased; ORG--REPO for the default
choice) and hf://ORG/REPO/FILE.gguf as ORG--REPO--FILE. The Hub allows no `--` in its names, so a name
reads back unambiguously; `run`, `chat`, `serve` and `resolve` take the ref itself, and a ref whose file
is cached needs no network.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

from ..errors import EdgeInferError
from .catalog import _NAME_RE, _stem, lookup
from .errors import InvalidNameError, PullError

_HOSTS = ("hf.co", "huggingface.co", "www.huggingface.co")
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # an org or repo name on the Hub
_REPO_RE = re.compile(rf"^({_PART})/({_PART})(?::([A-Za-z0-9][A-Za-z0-9._-]*))?$")


@dataclass(frozen=True)
class HFRef:
    repo: str  # ORG/REPO
    quant: str | None = None  # a quant tag (upper case); None: the default choice
    filename: str | None = None  # one file in the repo (hf://); then quant is None
    revision: str = "main"

    @property
    def name(self) -> str:
        """The model's name in the cache."""
        org, repo = self.repo.split("/")
        if self.filename is not None:
            tail = _stem(self.filename).replace("/", "--")
            rev = "" if self.revision == "main" else f"--{self.revision[:12]}"
            name = f"{org}--{repo}--{tail}{rev}"
        else:
            name = f"{org}--{repo}" + (f"--{self.quant}" if self.quant else "")
        if not _NAME_RE.match(name):
            raise InvalidNameError(f"{self} makes the cache name {name!r}, which is too long or not a valid name: "
                                   "give one with --name")
        return name

    def __str__(self) -> str:
        if self.filename is not None:
            rev = "" if self.revision == "main" else f" (revision {self.revision})"
            return f"hf://{self.repo}/{self.filename}{rev}"
        return f"hf.co/{self.repo}" + (f":{self.quant}" if self.quant else "")


def parse_ref(source: str) -> HFRef | None:
    """The Hugging Face reference `source` is, or None when it is none (a catalog name, a path, another
    URL, or a Hub URL of one file under /resolve/, which url.py downloads as any URL). A string that starts
    like a reference but is not a valid one is a PullError."""
    if not isinstance(source, str):
        return None
    if source.startswith("hf://"):
        rest = source[len("hf://"):]
        parts = rest.split("/")
        if len(parts) >= 3 and parts[-1].lower().endswith(".gguf"):
            return _file_ref(f"{parts[0]}/{parts[1]}", "/".join(parts[2:]), "main", source)
        return _repo_ref(rest, source)
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        if (parsed.hostname or "").lower() not in _HOSTS:
            return None
        parts = [urllib.parse.unquote(p) for p in parsed.path.strip("/").split("/")]
        if len(parts) == 2:  # the repo's page
            return _repo_ref("/".join(parts), source)
        if len(parts) >= 5 and parts[2] == "blob" and parts[-1].lower().endswith(".gguf"):  # a file's page
            return _file_ref(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), parts[3], source)
        return None
    for host in _HOSTS:
        if source.lower().startswith(host + "/"):
            return _repo_ref(source[len(host) + 1:], source)
    return None


def _repo_ref(text: str, source: str) -> HFRef:
    m = _REPO_RE.match(text)
    if not m or ".." in text or "--" in m.group(1) + m.group(2):
        raise PullError(f"{source!r} is not a Hugging Face model reference: use hf.co/ORG/REPO[:QUANT] "
                        "or hf://ORG/REPO/FILE.gguf")
    quant = m.group(3)
    quant = None if quant is None or quant.lower() == "latest" else quant.upper()
    return HFRef(f"{m.group(1)}/{m.group(2)}", quant)


def _file_ref(repo: str, filename: str, revision: str, source: str) -> HFRef:
    if not re.match(rf"^{_PART}/{_PART}$", repo) or "--" in repo or any(
            p in ("", ".", "..") for p in filename.split("/")) or not revision or "/" in revision:
        raise PullError(f"{source!r} is not a Hugging Face file reference: use hf://ORG/REPO/FILE.gguf")
    return HFRef(repo, None, filename, revision)


def model_name(source: str) -> str:
    """The name a model goes by (served, and in outputs): its catalog name, or its file name without .gguf."""
    entry = lookup(source)
    if entry is not None:
        return entry.name
    try:
        ref = parse_ref(source)
        if ref is not None:
            return ref.name
    except EdgeInferError:  # not a valid reference: named after its file, as any other source
        pass
    base = os.path.basename(source)
    return _stem(base)

"""Models created from others (Ollama's /api/create and /api/copy): a small manifest over a base model's
file, never a copy of its weights. A created model is its base's file with its own defaults: a system
message, a chat template (Jinja, as a GGUF file carries one), Ollama's parameters (sampling defaults and
stop strings a request's own values override), messages put before every conversation, license text, and
LoRA adapters (uploaded blobs, edgeinfer.registry.blobs) it loads with.
A `quantize`d one has a file of its own, written beside the manifests and deleted with it.

The manifests live in the model cache, `<cache>/created/NAME.json` (edgeinfer.registry.cache.models_dir),
one JSON object each, written to a temporary file and renamed, so a kill mid-write leaves the old manifest
or none, never half of one; a manifest that does not read back is reported by name (`DamagedManifest`)
and listed as damaged, never served.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import EdgeInferError
from .cache import cache_lock, models_dir
from .catalog import check_name

DIR = "created"
_FIELDS = {"name": str, "base": str, "file": str, "own_file": bool, "system": (str, type(None)),
           "template": (str, type(None)), "parameters": dict, "messages": list, "license": list,
           "created_at": (int, float), "adapters": list}


class DamagedManifest(EdgeInferError):
    """A manifest that does not read back: the message names its file and what is wrong."""


@dataclass(frozen=True)
class Created:
    name: str
    base: str  # the model it was created from, as named then
    file: str  # the GGUF file it serves: its base's, or its own (own_file: written by quantize)
    own_file: bool = False
    system: str | None = None
    template: str | None = None  # a Jinja chat template, in place of the file's
    parameters: dict = field(default_factory=dict)  # Ollama's names: temperature, top_p, stop, num_ctx, ...
    messages: list = field(default_factory=list)  # [{role, content}, ...] before every conversation
    license: list = field(default_factory=list)
    created_at: float = 0.0
    adapters: list = field(default_factory=list)  # LoRA adapter files (uploaded blobs), each at scale 1

    @property
    def path(self) -> Path:
        return Path(self.file)


def folder() -> Path:
    return models_dir() / DIR


def manifest(name: str) -> Path:
    """Where created model `name`'s manifest is (EdgeInferError for a name no model can have)."""
    return folder() / f"{check_name(name)}.json"



def own_file(name: str) -> Path:
    """Where a quantized created model's own file goes."""
    return folder() / f"{check_name(name)}.gguf"


def load(name: str) -> Created | None:
    """The created model `name`, or None where there is none; DamagedManifest where its manifest is broken."""
    path = manifest(name)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DamagedManifest(f"created model {name!r}: its manifest {path} cannot be read: {e}") from None
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise DamagedManifest(f"created model {name!r}: its manifest {path} is not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise DamagedManifest(f"created model {name!r}: its manifest {path} is not a JSON object")
    for key, kind in _FIELDS.items():
        if key in ("name", "base", "file") and key not in obj:
            raise DamagedManifest(f"created model {name!r}: its manifest {path} has no {key!r}")
        if key in obj and not isinstance(obj[key], kind):
            raise DamagedManifest(f"created model {name!r}: its manifest {path} has a malformed {key!r}")
    if not all(isinstance(a, str) for a in obj.get("adapters", ())):
        raise DamagedManifest(f"created model {name!r}: its manifest {path} has a malformed 'adapters'")
    if obj["name"] != name:
        raise DamagedManifest(f"created model {name!r}: its manifest {path} names {obj['name']!r}")
    return Created(**{k: v for k, v in obj.items() if k in _FIELDS})


def save(c: Created) -> Path:
    """Write (or replace) c's manifest: whole or not at all."""
    path = manifest(c.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    data = json.dumps({**asdict(c), "created_at": c.created_at or time.time()}, ensure_ascii=False, indent=1)
    with cache_lock(f"created-{c.name}", quiet=True):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return path


def delete(name: str) -> Created | None:
    """Remove a created model (its manifest, and its own file if it has one); None where there is none. A
    damaged manifest is removed too (there is nothing else to do with it)."""
    try:
        c = load(name)
    except DamagedManifest:  # its own file, if it had one, goes too (nothing can name it now)
        manifest(name).unlink(missing_ok=True)
        own_file(name).unlink(missing_ok=True)
        return Created(name, "", "")
    if c is None:
        return None
    with cache_lock(f"created-{name}", quiet=True):
        manifest(name).unlink(missing_ok=True)
        if c.own_file:
            Path(c.file).unlink(missing_ok=True)
    return c


def names() -> list[str]:
    d = folder()
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        try:
            out.append(check_name(p.stem))
        except EdgeInferError:
            continue
    return out


def list_all() -> tuple[list[Created], list[str]]:
    """(the created models that read back, the messages of those that do not)."""
    good, bad = [], []
    for n in names():
        try:
            c = load(n)
        except DamagedManifest as e:
            bad.append(str(e))
            continue
        if c is not None:
            good.append(c)
    return good, bad


def standing_on(name: str) -> list[str]:
    """The other created models made over created model `name`'s own (quantized) file: while there are any,
    it is neither deleted nor replaced."""
    try:
        c = load(name)
    except DamagedManifest:
        return []
    return [n for n in over(c.file) if n != name] if c is not None and c.own_file else []


def over(path) -> list[str]:
    """The created models whose manifests serve the file at `path` (not their own files)."""
    real = Path(path).resolve()
    return [c.name for c in list_all()[0] if not c.own_file and Path(c.file).resolve() == real]

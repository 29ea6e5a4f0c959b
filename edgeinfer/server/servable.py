"""What this server can serve, loaded or not: the command-line models, models registered while serving,
downloaded catalog models and the rest of the local cache, and the .gguf files under each --models-dir;
how a request's model name finds one of them (or the 404 or 403 that says why not), and what a model
will cost in memory before it is loaded (the estimate the memory budget counts). Blocking where it reads
folders or files: the server calls it in worker threads."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .. import memory, registry
from ..registry import created
from ..config import EngineConfig
from ..errors import EdgeInferError
from ..openai import protocol as P


@dataclass(frozen=True)
class Servable:
    """A model that can be served: its name, its file, the file's size in bytes and modification time
    (seconds since the epoch), and where it was found ("command line", "catalog", "cache", "models-dir",
    "registered")."""

    name: str
    path: Path
    size: int
    modified: float
    origin: str


def servable(name: str, path: Path, origin: str) -> Servable:
    st = path.stat()
    return Servable(name, path, st.st_size, st.st_mtime, origin)


def _not_found(name, known: list[str]) -> P.APIError:
    return P.APIError(404, f"model {name!r} is not served here; models that can be served: "
                      f"{', '.join(known) or 'none'}", param="model", code="model_not_found")


def _refused(name: str, why: str) -> P.APIError:
    return P.APIError(403, f"model path {name!r} is refused: {why}", param="model", type_="permission_error",
                      code="model_path_not_allowed")


def describe(path: str, config: EngineConfig, by_memory: bool = False, held: int = 0, mmproj: str = "") -> dict:
    """What the server says about a model before loading it: its estimated bytes in memory (weights,
    step buffers and the KV pool its engine config allocates; edgeinfer.memory), Ollama's details, and the
    context it counted (max_context; context_from: why). A config with no context: with by_memory, the
    model's trained context cut to the memory available (as LLM sizes it), else (under the server's memory
    budget) the model's capped at memory.DEFAULT_MAX_CONTEXT; held: the bytes the models already loaded hold
    without having touched them yet (their KV pools), which the memory available does not show; mmproj: its vision
    projector, whose weights and encoding buffers count too."""
    from ..gguf_file import GGUFFile
    from ..info import parameters

    with GGUFFile(path) as gf:
        from ..file_estimate import estimate_file  # reads the file's tensors: models and quant, loaded lazily

        why = "as configured (--max-context, or the memory budget)"
        if not config.max_context:
            why = f"the model's, capped at {memory.DEFAULT_MAX_CONTEXT} under the memory budget"
            if by_memory:
                from ..file_estimate import context_for_memory

                config, why = context_for_memory(gf, config, held)
        est = estimate_file(gf, config)
        arch = gf.architecture
        n_params = parameters(gf)[0]
        by_bytes = gf.type_bytes()
    blocks = config.num_kv_blocks or memory.default_blocks(est, config)
    kv = memory.pool_bytes(est, config, blocks)
    vision = {"weights": 0, "buffers": 0}
    if mmproj:
        from ..models.clip import memory_bytes

        vision = memory_bytes(mmproj)
    quant = max(by_bytes, key=by_bytes.get) if by_bytes else ""
    size = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.1f}M"
    weights, buffers = est.weights + vision["weights"], est.buffers + vision["buffers"]
    return {"size": weights + buffers + kv, "weights": weights, "buffers": buffers, "kv": kv,
            "max_context": est.max_context, "context_from": why,
            "details": {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                        "parameter_size": size, "quantization_level": quant}}


def estimated_bytes(path: str, config: EngineConfig) -> int:
    """The bytes a model counts for against --memory-budget, loaded with `config` (tests size budgets by it)."""
    return describe(path, config)["size"]


def digest(path: str) -> str:
    entry = registry.lookup(registry.model_name(path))
    if entry is not None and Path(path) == registry.cached_path(entry):
        return entry.sha256
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Servables:
    """The models a server can serve, by name (ModelManager's base: what is in memory is ModelManager's):
    `command_line` (name -> source, in the order given), `registered` (models pulled while serving) and
    the --models-dir folders."""

    def __init__(self, config):
        self.models_dirs = [Path(d).expanduser().resolve() for d in (config.models_dirs or [])]
        self.command_line: dict[str, str] = {}  # name -> source, in the order given
        self.registered: dict[str, Path] = {}  # models pulled while serving
        for source in config.models:
            name = registry.model_name(source)
            if name in self.command_line:
                raise EdgeInferError(f"model {name!r} is given twice")
            self.command_line[name] = source

    def available(self) -> list[Servable]:
        """Every model this server can serve, loaded or not, each once by name (the first found wins):
        the command-line models, models registered while serving, downloaded catalog models and the
        rest of the local cache, then the .gguf files under each --models-dir (by file name without
        .gguf; files whose real path leaves the folder are skipped)."""
        out: dict[str, Servable] = {}

        def add(name, path, origin):
            if name not in out:
                try:
                    out[name] = servable(name, Path(path), origin)
                except OSError:  # gone since it was named
                    pass

        for name in self.command_line:
            try:
                add(name, self._command_line_path(name), "command line")
            except P.APIError:  # its file is gone: not servable now
                pass
        for name, path in self.registered.items():
            add(name, path, "registered")
        for c in created.list_all()[0]:
            add(c.name, c.path, "created")
        for m in registry.list_local():
            add(m.name, m.path, "catalog" if registry.lookup(m.name) else "cache")
        for d in self.models_dirs:
            for path in sorted(d.rglob("*.gguf")) if d.is_dir() else ():
                if self._inside_dirs(path) and path.is_file() and re.match(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$", path.stem):
                    add(path.stem, path, "models-dir")
        return list(out.values())

    def _command_line_path(self, name: str) -> Path:
        try:
            return registry.resolve(self.command_line[name], pull_missing=False, progress=False)
        except EdgeInferError as e:
            raise P.APIError(404, f"model {name!r} cannot be served: {e}", param="model", code="model_not_found") from None

    def register(self, name: str, path) -> None:
        """A model pulled while serving (Ollama's /api/pull): from now on `name` serves the file at `path`."""
        self.registered[registry.check_name(name)] = Path(path)

    def _inside_dirs(self, path: Path) -> Path | None:
        """The real path of `path` when it lies under one of the --models-dir folders, else None."""
        real = path.resolve()
        return real if any(real.is_relative_to(d) for d in self.models_dirs) else None

    def default_name(self) -> str:
        """The model a request that names none gets: the one command-line model, else the catalog's default."""
        if len(self.command_line) == 1:
            return next(iter(self.command_line))
        if self.command_line:
            raise P.bad("model", f"this server serves several models ({', '.join(self.command_line)}): say which "
                        "one in 'model'")
        return registry.DEFAULT_MODEL

    def _path_source(self, name: str) -> Servable:
        """A request's model given as a path: a .gguf file under a --models-dir (absolute, or relative to one)."""
        if not self.models_dirs:
            raise _refused(name, "this server serves no paths (start it with --models-dir DIR to allow a folder)")
        p = Path(name)
        if ".." in p.parts:
            raise _refused(name, "'..' is not allowed in a model path")
        if p.suffix != ".gguf":
            raise _refused(name, "a model path must name a .gguf file")
        candidates = [p] if p.is_absolute() else [d / p for d in self.models_dirs]
        for c in candidates:
            if c.exists():
                real = self._inside_dirs(c)
                if real is None:
                    raise _refused(name, f"it is outside the allowed folders ({', '.join(map(str, self.models_dirs))})")
                if not real.is_file():
                    raise _refused(name, "it is not a file")
                return servable(registry.model_name(str(real)), real, "models-dir")
        if p.is_absolute() and self._inside_dirs(p) is None:
            raise _refused(name, f"it is outside the allowed folders ({', '.join(map(str, self.models_dirs))})")
        raise _not_found(name, [s.name for s in self.available()])

    def find(self, name: str) -> Servable:
        """What a request's model names, if it can be served: a 404 naming it and what can be served, a
        404 saying to pull a catalog model that is not downloaded, a 403 for a path outside --models-dir."""
        if not isinstance(name, str) or not name:
            raise P.bad("model", "'model' must be a model name")
        if any(ord(c) < 32 or 0xD800 <= ord(c) < 0xE000 for c in name):
            raise P.bad("model", f"'model' holds a control character or a lone surrogate: {name[:80]!r} is no model "
                                 "name or path")
        if name in self.command_line:
            return servable(name, self._command_line_path(name), "command line")
        entry = registry.lookup(name)
        if entry is not None:
            if entry.name in self.command_line:
                return self.find(entry.name)
            path = registry.cached_path(entry)
            if not path.is_file():
                raise P.APIError(404, f"model {entry.name!r} is not downloaded: run `edgeinfer pull {entry.name}` on "
                                 "the server's machine", param="model", code="model_not_found")
            return servable(entry.name, path, "catalog")
        ref = _hf_ref(name)
        if ref is not None:  # hf.co/ORG/REPO[:QUANT]: served once pulled, as catalog models
            path = registry.cached_path(ref.name)
            if not path.is_file():
                raise P.APIError(404, f"model {name!r} is not downloaded: run `edgeinfer pull {name}` on the "
                                 "server's machine", param="model", code="model_not_found")
            return servable(ref.name, path, "cache")
        made = _created(name)
        if made is not None:
            return servable(name, made.path, "created")
        if "/" in name or "\\" in name or name.endswith(".gguf"):
            for cname, source in self.command_line.items():  # the operator's own paths
                if Path(source).expanduser().resolve() == Path(name).expanduser().resolve():
                    return self.find(cname)
            return self._path_source(name)
        for s in self.available():
            if s.name == name:
                return s
        raise _not_found(name, [s.name for s in self.available()])


def _created(name: str):
    """The created model `name` (edgeinfer.registry.created), or None; a 500 naming a damaged manifest."""
    try:
        c = created.load(name)
    except created.DamagedManifest as e:
        raise P.APIError(500, f"{e}; remove it with DELETE /api/delete", param="model") from None
    except EdgeInferError:  # not a name a manifest can have
        return None
    if c is not None and not c.path.is_file():
        raise P.APIError(404, f"model {name!r} was created from {c.base!r}, whose file {c.file} is gone",
                         param="model", code="model_not_found")
    return c


def _hf_ref(name: str):
    """A Hugging Face reference (registry.parse_ref), or None for anything else (a path, a bad reference)."""
    parse = getattr(registry, "parse_ref", None)
    if parse is None:
        return None
    try:
        return parse(name)
    except (EdgeInferError, ValueError):  # not a valid reference: treated as a path or a name
        return None

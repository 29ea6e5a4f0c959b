"""Ollama's model-catalog routes on `edgeinfer serve`: /api/tags and /api/show (what a model file is,
read without loading it, once per file; a created model's own defaults), /api/version, /api/pull (catalog
models and hf.co references, with `serve --allow-pull`), and the routes this server does not have (501;
/api/create, /api/copy and /api/delete are server.ollama_manage's). HTTP only, under the route scaffold, with
server.ollama's error body; what is answered is edgeinfer.openai.ollama_models' and ollama_replies'."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..openai import ollama_models as OM
from ..openai import ollama_options as OO
from ..openai import ollama_replies as OR
from ..openai import ollama_requests as OQ
from ..openai import protocol as P
from .ollama import NDJSON, error, line, read_body_json
from .scaffold import Call, route


def _available(state) -> dict[str, str]:
    """name -> GGUF path of every model this server can serve, loaded or not (the model manager's
    available(); without one, the served models). Blocking (it reads folders): called in a worker thread."""
    models = getattr(state, "models", None)
    if models is not None and hasattr(models, "available"):
        return {s.name: str(s.path) for s in models.available()}
    return {name: _path(sm) for name, sm in state.served.items()}


def _find(state, name: str) -> tuple[str, str]:
    """(name, path) of the model a request names, loaded or not, without loading it: a 404 when it
    cannot be served. Blocking: called in a worker thread."""
    models = getattr(state, "models", None)
    if models is not None and hasattr(models, "find"):
        s = models.find(name)
        return s.name, str(s.path)
    available = _available(state)
    if name not in available:
        raise P.APIError(404, f"model {name!r} not found; models that can be served: {', '.join(available)}")
    return name, available[name]


def _path(sm) -> str:
    """The GGUF file a served model is read from (never pulled here)."""
    from .. import registry

    if sm.llm is not None:
        return str(sm.llm.path)
    return str(registry.resolve(sm.source, pull_missing=False, progress=False))


def _file_facts(path: str) -> dict:
    """What /api/tags and /api/show tell about a file, read in a worker thread: its size, time, facts
    and sha256 (the catalog's when the file is a catalog model's, else hashed once)."""
    from .. import registry
    from ..gguf_file import GGUFFile

    st = os.stat(path)
    with GGUFFile(path) as gf:
        facts = OM.model_facts(gf)
    digest = None
    for entry in registry.CATALOG.values():
        with contextlib.suppress(Exception):
            if entry.size == st.st_size and os.path.samefile(registry.cached_path(entry), path):
                digest = entry.sha256
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()
    return {"size": st.st_size, "mtime": st.st_mtime, "facts": facts, "digest": digest, "path": path}


async def file_facts(request: Request, path: str) -> dict:
    """_file_facts of a model file, computed once per file (path, size and time) and shared by concurrent
    requests; kept on the app (app.state.ollama_files)."""
    app_state = request.app.state
    cache = getattr(app_state, "ollama_files", None)
    if cache is None:
        cache = app_state.ollama_files = {}
    try:
        st = os.stat(path)
    except OSError as e:  # a model file that went away
        raise P.APIError(404, f"the model file {path} cannot be read: {e.strerror}") from None
    key = (path, st.st_size, st.st_mtime_ns)
    task = cache.get(key)
    if task is None:
        task = cache[key] = asyncio.ensure_future(asyncio.to_thread(_file_facts, path))
    try:
        return await asyncio.shield(task)
    except Exception as e:
        cache.pop(key, None)
        raise P.APIError(500, f"cannot read the model file {path}: {e}") from None


@route(error=error)
async def tags(request: Request, call: Call):
    """Ollama's /api/tags: every model this server can serve, loaded or not, as NAME:latest with its
    file's size, sha256 and details."""
    models = []
    for name, path in (await asyncio.to_thread(_available, call.state)).items():
        try:
            f = await file_facts(request, path)
        except P.APIError:
            continue  # a file that went away, or is not a model: not listed
        models.append(OM.tag_entry(name, f["size"], f["mtime"], f["digest"], f["facts"]))
    return JSONResponse({"models": models})


@route(error=error)
async def show(request: Request, call: Call):
    """Ollama's /api/show: details, model_info (the GGUF metadata), template, parameters, capabilities;
    the model is not loaded for it."""
    body = await read_body_json(request)
    name, path = await asyncio.to_thread(_find, call.state, OO.parse_model(body))
    f = await file_facts(request, path)
    reply = OM.show_reply(name, path, f["mtime"], f["facts"])
    if _projector(call.state, name):  # served with --mmproj: it reads images
        reply["capabilities"] = [*reply["capabilities"], "vision"]
    made = await asyncio.to_thread(_created, name)
    if made is not None:  # a created model: its own defaults, as Ollama shows a Modelfile's
        from ..openai.ollama_create import modelfile

        reply["modelfile"], reply["parameters"] = modelfile(made, f["facts"]["context_length"])
        reply["details"] = {**reply["details"], "parent_model": made.base}
        reply.update(system=made.system or "", license="\n".join(made.license), messages=made.messages,
                     template=made.template or reply["template"])
    return JSONResponse(reply)


def _projector(state, name: str) -> str:
    """The vision projector a model is served with (serve's --mmproj), or ""."""
    models = getattr(getattr(state, "models", None), "models", None) or {}
    sm = models.get(name)
    return (getattr(sm, "speculation", None) or {}).get("mmproj", "") if sm is not None else ""


def _created(name: str):
    from ..registry import created

    try:
        return created.load(name)
    except Exception:  # not a manifest's name (a damaged one made _find a 500 already)
        return None


@route(error=error)
async def version(request: Request, call: Call):
    return JSONResponse({"version": __version__})


# -- /api/pull ----------------------------------------------------------------------------------------


@route(error=error)
async def pull(request: Request, call: Call):
    """Ollama's /api/pull, for catalog names and aliases and hf.co references, only with `serve --allow-pull`. The pull
    runs in a worker thread (edgeinfer.registry.pull, which writes a temporary file and renames it once its
    sha256 checks out); its progress is streamed as Ollama streams it. A client that goes away stops
    getting progress; the pull itself finishes (or fails) on its own and never leaves a partial model."""
    body = await read_body_json(request)
    if not getattr(call.state.config, "allow_pull", False):
        raise P.APIError(403, "pulling models is off on this server: start it with `edgeinfer serve --allow-pull`")
    entry, stream = OQ.parse_pull(body)
    events: asyncio.Queue = asyncio.Queue()
    aloop = asyncio.get_running_loop()
    last = [0.0]

    def progress(desc: str, completed: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.1 or (total and completed >= total) or completed == 0:
            last[0] = now
            aloop.call_soon_threadsafe(events.put_nowait, OR.pull_progress(entry, desc, completed, total))

    task = asyncio.ensure_future(asyncio.to_thread(_pull, getattr(entry, "source", entry.name), progress))
    task.add_done_callback(lambda t: events.put_nowait(None))

    async def results():
        yield {"status": "pulling manifest"}
        while True:
            ev = await events.get()
            if ev is None:
                break
            yield ev
        exc = task.exception()
        if exc is not None:
            yield {"error": f"pull {entry.name}: {exc}"}
            return
        yield {"status": "verifying sha256 digest"}
        yield {"status": "success"}

    if stream:
        async def lines():
            async for obj in results():
                yield line(obj)

        return StreamingResponse(lines(), media_type=NDJSON)
    last_obj = {}
    async for obj in results():
        last_obj = obj
    if "error" in last_obj:
        return JSONResponse(last_obj, status_code=500)
    return JSONResponse(last_obj)


def _pull(name: str, progress) -> str:
    from .. import registry

    return str(registry.pull(name, progress=progress))


# -- what this server does not do -------------------------------------------------------------------


def _unsupported(what: str):
    @route(error=error)
    async def refuse(request: Request, call: Call):
        raise P.APIError(501, f"{what} is not supported by edgeinfer: models come from its catalog "
                              "(`edgeinfer pull`), a URL or a .gguf file")

    return refuse


ROUTES = [
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/api/pull", pull, methods=["POST"]),
    Route("/api/push", _unsupported("pushing a model (/api/push)"), methods=["POST"]),
]

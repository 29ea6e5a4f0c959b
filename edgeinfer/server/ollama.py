"""Over the layout's 450 lines, kept as one file for now: the model-catalog routes (tags, show, pull)
should move to a module of their own next.

Ollama's API on `edgeinfer serve` (/api/*), for the tools that speak it (Open WebUI, editor plugins, the
`ollama` Python client). HTTP only, as server.routes: the API key, the body limits and read timeout, the
model's lease, streaming as NDJSON, metrics; what a body means and what is answered is
edgeinfer.openai.ollama_*'s. Errors are Ollama's {"error": message}, with the status a client checks
(404 for an unknown model: clients offer to pull it)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..engine.loop import exclusive
from ..openai import handlers as H
from ..openai import ollama_models as OM
from ..openai import ollama_options as OO
from ..openai import ollama_replies as OR
from ..openai import ollama_requests as OQ
from ..openai import protocol as P
from .routes import LEASES, check_auth, read_body, use_model
from .streaming import submit

NDJSON = "application/x-ndjson"


def _state(request: Request):
    return request.app.state.server


def message(e: P.APIError) -> str:
    """An error's message as Ollama's one string: it names the field it is about."""
    if e.param and e.param not in e.message:
        return f"{e.param}: {e.message}"
    return e.message


def error(e: P.APIError) -> JSONResponse:
    return JSONResponse({"error": message(e)}, status_code=e.status, headers=e.headers)


def _line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def read_body_json(request: Request) -> dict:
    """The API key check, then the body as a JSON object: routes.read_json's limit, read timeout and
    strict decoding, but any Content-Type (Ollama's examples are `curl -d`, which sends a form type)."""
    check_auth(request)
    config = _state(request).config
    try:
        raw = await asyncio.wait_for(read_body(request, config.max_body_bytes), config.read_timeout)
    except asyncio.TimeoutError:
        raise P.APIError(408, f"the request body did not arrive within {config.read_timeout:g} s") from None
    if not raw.strip():
        raise P.APIError(400, "the request body is empty: send a JSON object")
    body = await asyncio.to_thread(P.loads, raw) if len(raw) > 1 << 16 else P.loads(raw)
    if not isinstance(body, dict):
        raise P.APIError(400, "the request body must be a JSON object")
    return body


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


# -- /api/chat and /api/generate --------------------------------------------------------------------


async def chat(request: Request):
    return await _generation(request, OQ.parse_chat, "ollama_chat")


async def generate(request: Request):
    return await _generation(request, OQ.parse_generate, "ollama_generate")


async def _generation(request: Request, parse, endpoint: str):
    state = _state(request)
    t0 = time.monotonic()
    labels = ("?", endpoint)
    lease = None
    try:
        req = parse(await read_body_json(request))
        lease = await use_model(request, req.model, req.keep_alive)
        sm = lease.sm
        labels = (sm.name, endpoint)
        timings = OR.Timings(t0, time.monotonic())
        if req.load_only:  # Ollama's load / unload call: the lease taken (with its keep_alive) is all it asks
            lease.release()
            state.metrics.finish(labels, "200", 0, 0)
            return JSONResponse(OR.load_reply(req, timings.stats(0, 0)))
        fmt = "none" if req.think is False else getattr(state.config, "reasoning_format", "auto")
        gen = await asyncio.to_thread(OQ.prepare, sm.llm, sm.name, req, fmt)
        rid, queue = submit(state, sm, gen.prompt_ids, gen.params, 0, gen.guide)
        job = _Submitted(sm, rid)
        request.scope.setdefault(LEASES, []).append(job)
    except P.APIError as e:
        if lease is not None:
            lease.release()
        state.metrics.finish(labels, str(e.status), 0, 0)
        return error(e)
    except ClientDisconnect:
        if lease is not None:
            lease.release()
        return Response(status_code=499)
    replies = OR.Replies(gen, req, sm.llm.tokenizer)
    outputs = _outputs(state, request, job, queue, timings, labels, watch_disconnect=not req.stream)
    if req.stream:
        return StreamingResponse(_lines(state, gen, replies, outputs, timings, labels, lease), media_type=NDJSON)
    n_prompt, text, ids, lps, reason = len(gen.prompt_ids), [], [], [], None
    try:
        async with contextlib.aclosing(outputs):
            async for out in outputs:
                text.append(out.delta_text)
                ids += out.new_token_ids
                lps += out.logprobs or []
                reason = out.finish_reason if out.finished else reason
    except P.APIError as e:
        state.metrics.finish(labels, str(e.status), n_prompt, len(ids))
        return error(e)
    except ClientDisconnect:
        state.metrics.finish(labels, "499", n_prompt, len(ids))
        return Response(status_code=499)
    finally:
        lease.release()
    timings.end = time.monotonic()
    state.metrics.finish(labels, "200", n_prompt, len(ids))
    return JSONResponse(replies.whole("".join(text), lps, reason, timings.stats(n_prompt, len(ids)),
                                      gen.prompt_ids + ids))


class _Submitted:
    """A generation on a model's engine loop, aborted (its KV blocks freed) if its response ends before it
    finished, however it ends: release() runs when _outputs stops early, and app._ReleaseLeases calls it
    for a streamed response whose body never started (the client left first)."""

    def __init__(self, sm, rid: str):
        self.sm, self.rid, self.finished = sm, rid, False

    def release(self) -> None:
        if not self.finished:
            self.finished = True
            self.sm.loop.abort(self.rid)


async def _outputs(state, request: Request, job: _Submitted, queue: asyncio.Queue, timings: OR.Timings, labels,
                   watch_disconnect: bool):
    """A generation's engine outputs as they come, until the finished one; the request timeout (a 504
    APIError) and, unstreamed, a client that went away (ClientDisconnect) end it early. Ended early,
    however (a streamed client that went away closes this generator), the request is aborted."""
    deadline = timings.start + state.config.request_timeout
    finished = False
    try:
        while not finished:
            left = deadline - time.monotonic()
            if left <= 0:  # checked on every output: a busy stream must time out too
                raise P.APIError(504, f"the request took longer than {state.config.request_timeout:g} s")
            try:
                out = await asyncio.wait_for(queue.get(), timeout=min(0.5, max(0.01, left)))
            except asyncio.TimeoutError:
                if watch_disconnect and await request.is_disconnected():
                    raise ClientDisconnect() from None
                continue
            if out.new_token_ids:
                now = time.monotonic()
                state.metrics.token(labels, now - (timings.first or timings.start), timings.first is None)
                timings.first = timings.first or now
            finished = job.finished = out.finished
            if out.finish_reason == "error":
                raise P.APIError(500, f"generation failed: {job.sm.loop.last_error}")
            yield out
    finally:
        job.release()


async def _lines(state, gen, replies: OR.Replies, outputs, timings: OR.Timings, labels, lease):
    """The streamed answer, one JSON object a line: the deltas, then the final object with the timings;
    an {"error"} line if it fails midway (Ollama's clients raise it). The lease is released however it ends."""
    n_prompt, ids, status = len(gen.prompt_ids), [], "499"
    reason = None
    try:
        async with contextlib.aclosing(outputs):
            async for out in outputs:
                ids += out.new_token_ids
                reason = out.finish_reason if out.finished else reason
                for obj in replies.deltas(out.delta_text, out.logprobs or [], out.finished):
                    yield _line(obj)
        timings.end = time.monotonic()
        yield _line(replies.final(reason, timings.stats(n_prompt, len(ids)), gen.prompt_ids + ids))
        status = "200"
    except P.APIError as e:
        status = str(e.status)
        yield _line({"error": message(e)})
    finally:
        state.metrics.finish(labels, status, n_prompt, len(ids))
        lease.release()


# -- /api/embed and /api/embeddings -----------------------------------------------------------------


async def embed(request: Request):
    """Ollama's /api/embed: {"embeddings": [...]} (normalised), with the timings."""
    return await _embedding(request, OQ.parse_embed, legacy=False)


async def embeddings(request: Request):
    """Ollama's older /api/embeddings: {"embedding": [...]} of one prompt, not normalised (as Ollama)."""
    return await _embedding(request, OQ.parse_embeddings, legacy=True)


async def _embedding(request: Request, parse, legacy: bool):
    state = _state(request)
    t0 = time.monotonic()
    labels = ("?", "ollama_embeddings" if legacy else "ollama_embed")
    lease = None
    try:
        req = parse(await read_body_json(request))
        lease = await use_model(request, req.model, req.keep_alive)
        sm = lease.sm
        labels = (sm.name, labels[1])
        timings = OR.Timings(t0, time.monotonic())
        vecs, n = [], 0
        if req.inputs:  # none: a load call
            try:
                seqs = await asyncio.to_thread(H.embedding_inputs, sm.llm, sm.name, req.inputs, req.dimensions,
                                               req.truncate)
            except P.APIError as e:
                raise P.bad("prompt", e.message) if legacy and e.param == "input" else e from None
            n = sum(len(s) for s in seqs)
            try:
                work = asyncio.to_thread(exclusive, sm.llm.embed_ids, seqs, normalize=not legacy,
                                         dimensions=req.dimensions)
                vecs = await asyncio.wait_for(work, state.config.request_timeout)
            except asyncio.TimeoutError:
                raise P.APIError(504, f"the request took longer than {state.config.request_timeout:g} s") from None
    except P.APIError as e:
        state.metrics.finish(labels, str(e.status), 0, 0)
        return error(e)
    except ClientDisconnect:
        return Response(status_code=499)
    finally:
        if lease is not None:
            lease.release()
    timings.end = time.monotonic()
    state.metrics.finish(labels, "200", n, 0)
    if legacy:
        return JSONResponse({"embedding": [float(x) for x in vecs[0]] if len(vecs) else []})
    return JSONResponse(OR.embed_reply(req.model, vecs, timings.stats(n, 0)))


# -- /api/tags, /api/show, /api/version ---------------------------------------------------------------


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


async def tags(request: Request):
    """Ollama's /api/tags: every model this server can serve, loaded or not, as NAME:latest with its
    file's size, sha256 and details."""
    try:
        check_auth(request)
        models = []
        for name, path in (await asyncio.to_thread(_available, _state(request))).items():
            try:
                f = await file_facts(request, path)
            except P.APIError:
                continue  # a file that went away, or is not a model: not listed
            models.append(OM.tag_entry(name, f["size"], f["mtime"], f["digest"], f["facts"]))
    except P.APIError as e:
        return error(e)
    return JSONResponse({"models": models})


async def show(request: Request):
    """Ollama's /api/show: details, model_info (the GGUF metadata), template, parameters, capabilities;
    the model is not loaded for it."""
    try:
        body = await read_body_json(request)
        name, path = await asyncio.to_thread(_find, _state(request), OO.parse_model(body))
        f = await file_facts(request, path)
        reply = OM.show_reply(name, path, f["mtime"], f["facts"])
    except P.APIError as e:
        return error(e)
    except ClientDisconnect:
        return Response(status_code=499)
    return JSONResponse(reply)


async def version(request: Request):
    try:
        check_auth(request)
    except P.APIError as e:
        return error(e)
    return JSONResponse({"version": __version__})


# -- /api/pull ----------------------------------------------------------------------------------------


async def pull(request: Request):
    """Ollama's /api/pull, for catalog names and aliases only, and only with `serve --allow-pull`. The pull
    runs in a worker thread (edgeinfer.registry.pull, which writes a temporary file and renames it once its
    sha256 checks out); its progress is streamed as Ollama streams it. A client that goes away stops
    getting progress; the pull itself finishes (or fails) on its own and never leaves a partial model."""
    state = _state(request)
    try:
        body = await read_body_json(request)
        if not getattr(state.config, "allow_pull", False):
            raise P.APIError(403, "pulling models is off on this server: start it with `edgeinfer serve --allow-pull`")
        entry, stream = OQ.parse_pull(body)
    except P.APIError as e:
        return error(e)
    except ClientDisconnect:
        return Response(status_code=499)
    events: asyncio.Queue = asyncio.Queue()
    aloop = asyncio.get_running_loop()
    last = [0.0]

    def progress(desc: str, completed: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.1 or (total and completed >= total) or completed == 0:
            last[0] = now
            aloop.call_soon_threadsafe(events.put_nowait, OR.pull_progress(entry, desc, completed, total))

    task = asyncio.ensure_future(asyncio.to_thread(_pull, entry.name, progress))
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
                yield _line(obj)

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
    async def route(request: Request):
        try:
            check_auth(request)
        except P.APIError as e:
            return error(e)
        return error(P.APIError(501, f"{what} is not supported by edgeinfer: models come from its catalog "
                                     "(`edgeinfer pull`), a URL or a .gguf file"))

    return route


ROUTES = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/api/pull", pull, methods=["POST"]),
    Route("/api/copy", _unsupported("copying a model (/api/copy)"), methods=["POST"]),
    Route("/api/delete", _unsupported("deleting a model (/api/delete)"), methods=["DELETE"]),
    Route("/api/create", _unsupported("creating a model (/api/create)"), methods=["POST"]),
    Route("/api/push", _unsupported("pushing a model (/api/push)"), methods=["POST"]),
    Route("/api/blobs/{digest}", _unsupported("uploading blobs (/api/blobs)"), methods=["HEAD", "POST"]),
]

"""The server's routes: plain async functions of the request, reading the server's shared state
(app.ServerState) from request.app.state.server. HTTP only: authentication, reading the body, picking
the model, metrics; what a body means and what is answered is edgeinfer.openai's."""

from __future__ import annotations

import asyncio
import hmac
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..engine.loop import exclusive
from ..openai import handlers as H
from ..openai import protocol as P
from ..openai import responses as R
from ..openai.times import rfc3339
from .streaming import collect, collect_choices, stream, submit, submit_choices


def error_response(e: P.APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _state(request: Request):
    return request.app.state.server


def check_auth(request: Request) -> None:
    state = _state(request)
    if not state.config.api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    # compared in constant time; neither key is ever logged or echoed
    if not (scheme.lower() == "bearer"
            and hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), state.api_key)):
        raise P.APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise P.APIError(413, f"the request body is {int(length)} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise P.APIError(413, f"the request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request):
    config = _state(request).config
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise P.APIError(415, f"Content-Type must be application/json, got {ctype or 'nothing'!r}")
    try:  # a client that sends its body slowly does not hold a connection for ever
        raw = await asyncio.wait_for(read_body(request, config.max_body_bytes), config.read_timeout)
    except asyncio.TimeoutError:
        raise P.APIError(408, f"the request body did not arrive within {config.read_timeout:g} s") from None
    if len(raw) > 1 << 16:  # a big body decodes in a worker thread, never holding up the event loop
        return await asyncio.to_thread(P.loads, raw)
    return P.loads(raw)


LEASES = "edgeinfer.leases"  # the scope key of a request's leases (app._ReleaseLeases releases what is left)


class Lease:
    """A served model held for one request: `sm` is ready to use until `release()` (called once the
    response, streamed or not, is done; calling it again does nothing). Models loaded on demand are not
    unloaded while a lease on them is held."""

    def __init__(self, sm, on_release=None):
        self.sm = sm
        self._on_release = on_release

    def release(self) -> None:
        cb, self._on_release = self._on_release, None
        if cb is not None:
            cb(self.sm)


async def use_model(request: Request, name: str | None, keep_alive: float | None = None) -> Lease:
    """The model a request names (None: the only command-line model, or the catalog's default when the
    server was started with none), loaded if need be (server.models), held until the lease is released.
    keep_alive: seconds it stays loaded once idle (Ollama's; None: the server's default, 0: unload when
    the last lease goes, negative: keep it). An APIError: 404 unknown (or a catalog model not downloaded),
    403 a path outside --models-dir, 500 a failed load, 503/507 no room under the memory budget, 504 a
    load that outlasts the request timeout."""
    state = _state(request)
    sm, release = await state.models.acquire(name, keep_alive, state.config.request_timeout)
    lease = Lease(sm, release)
    request.scope.setdefault(LEASES, []).append(lease)
    return lease


# -- endpoints -----------------------------------------------------------------------------------


async def chat_completions(request: Request):
    return await generate(request, chat=True)


async def completions(request: Request):
    return await generate(request, chat=False)


async def generate(request: Request, chat: bool):
    state = _state(request)
    metrics = state.metrics
    endpoint = "chat" if chat else "completions"
    t0 = time.monotonic()
    labels = ("?", endpoint)
    lease = None
    try:
        check_auth(request)
        body = await read_json(request)
        req = P.parse_common(body, chat=chat)
        lease = await use_model(request, req.model)
        sm = lease.sm
        labels = (sm.name, endpoint)
        # the prompt through the chat template, the parameters, the compiled constraint: in a worker
        # thread, never on the event loop or the engine thread
        gen = await asyncio.to_thread(H.prepare_generation, sm.llm, sm.name, body, req, chat,
                                      state.config.reasoning_format)
        choices, queue = submit_choices(state, sm, gen)  # n choices (req.n), sharing the prompt's KV blocks
    except P.APIError as e:
        if lease is not None:
            lease.release()
        metrics.finish(labels, str(e.status), 0, 0)
        return error_response(e)
    except ClientDisconnect:
        if lease is not None:
            lease.release()
        return Response(status_code=499)

    cid = R.new_id("chatcmpl" if chat else "cmpl")
    created = R.now()
    tok = sm.llm.tokenizer
    n_prompt = len(gen.prompt_ids)
    if req.stream:
        return stream(state, sm, choices, queue, t0, labels, R.Chunks(gen, sm.name, tok, cid, created),
                      req.include_usage, n_prompt, on_close=lease.release)
    try:
        outputs = await collect_choices(state, request, sm, choices, queue, t0, labels)
    except P.APIError as e:
        metrics.finish(labels, str(e.status), n_prompt, 0)
        return error_response(e)
    except ClientDisconnect:
        metrics.finish(labels, "499", n_prompt, 0)
        return Response(status_code=499)
    finally:
        lease.release()
    metrics.finish(labels, "200", n_prompt, sum(len(o.ids) for o in outputs))
    return JSONResponse(R.completion_response(gen, sm.name, tok, outputs, cid, created))


async def tokenize(request: Request):
    """llama.cpp's and vLLM's /tokenize: {"tokens": [...], "count": n}; load generators use it."""
    try:
        check_auth(request)
        body = await read_json(request)
        text, add_special = P.parse_tokenize(body)
        lease = await use_model(request, P.parse_model(body))
    except P.APIError as e:
        return error_response(e)
    sm = lease.sm
    try:
        ids = await asyncio.to_thread(sm.llm.tokenizer.encode, text, None if add_special else False, False)
    finally:
        lease.release()
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": sm.llm.embed_context if sm.llm.is_encoder
                         else sm.llm.engine.max_context})


async def embeddings(request: Request):
    """OpenAI's /v1/embeddings: one vector per input (an encoder's pooled output, or a generative
    model's mean-pooled final hidden state), normalised; `dimensions` keeps the first n, renormalised."""
    state = _state(request)
    t0 = time.monotonic()
    labels = ("?", "embeddings")
    lease = None
    try:
        check_auth(request)
        body = await read_json(request)
        inputs, fmt, dims, truncate = P.parse_embeddings(body)
        lease = await use_model(request, P.parse_model(body))
        sm = lease.sm
        labels = (sm.name, "embeddings")
        llm = sm.llm
        seqs = await asyncio.to_thread(H.embedding_inputs, llm, sm.name, inputs, dims, truncate)
        try:
            vecs = await asyncio.wait_for(asyncio.to_thread(exclusive, llm.embed_ids, seqs, dimensions=dims),
                                          state.config.request_timeout)
        except asyncio.TimeoutError:
            raise P.APIError(504, f"the request took longer than {state.config.request_timeout:g} s") from None
    except P.APIError as e:
        state.metrics.finish(labels, str(e.status), 0, 0)
        return error_response(e)
    finally:
        if lease is not None:
            lease.release()
    n = sum(len(s) for s in seqs)
    state.metrics.finish(labels, "200", n, 0)
    state.metrics.token(labels, time.monotonic() - t0, True)
    return JSONResponse(R.embeddings_response(sm.name, vecs, n, fmt))


async def detokenize(request: Request):
    try:
        check_auth(request)
        body = await read_json(request)
        ids = P.parse_detokenize(body)
        lease = await use_model(request, P.parse_model(body))
    except P.APIError as e:
        return error_response(e)
    try:
        P.check_token_ids(ids, lease.sm.llm.tokenizer.vocab_size, "tokens")
        text = lease.sm.llm.tokenizer.decode(ids)
    except P.APIError as e:
        return error_response(e)
    finally:
        lease.release()
    return JSONResponse({"content": text, "prompt": text})  # llama.cpp's key and vLLM's


async def list_models(request: Request):
    """OpenAI's model list: the models in memory first (status "loaded", then "loading", with their
    estimated memory and, once loaded, when they expire), then the ones loadable on demand ("available")."""
    try:
        check_auth(request)
    except P.APIError as e:
        return error_response(e)
    models = _state(request).models
    data = []
    for sm in sorted((m for m in models.models.values() if m.status != "unloading"), key=lambda m: m.status != "loaded"):
        entry = {"id": sm.name, "object": "model", "created": sm.created, "owned_by": "edgeinfer",
                 "status": sm.status, "memory_bytes": sm.size}
        if sm.status == "loaded":
            entry["expires_at"] = rfc3339(models.expires(sm))
        data.append(entry)
    listed = {d["id"] for d in data}
    data += [{"id": s.name, "object": "model", "created": int(s.modified), "owned_by": "edgeinfer",
              "status": "available", "size_bytes": s.size} for s in models.available() if s.name not in listed]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request):
    """ok once the command-line models are loaded (models loaded on demand never make it 503); 500
    naming the command-line models whose load failed."""
    models = _state(request).models
    if models.startup_errors:
        return JSONResponse({"status": "error", "errors": dict(models.startup_errors)}, status_code=500)
    loading = [n for n in models.command_line if n in models.startup_pending]
    if loading:
        return JSONResponse({"status": "loading", "loading": loading}, status_code=503)
    return JSONResponse({"status": "ok", "models": [sm.name for sm in models.loaded()]})


async def ps(request: Request):
    """Ollama's GET /api/ps: the models in memory, their estimated size and when each will be unloaded."""
    try:
        check_auth(request)
    except P.APIError as e:
        return error_response(e)
    return JSONResponse(_state(request).models.ps())


async def openapi(request: Request):
    return JSONResponse(_state(request).openapi_doc)


async def metrics(request: Request):
    data, ctype = _state(request).metrics.render()
    return Response(data, media_type=ctype)


async def infill(request: Request):
    """llama.cpp's /infill: fill in between input_prefix and input_suffix (input_extra: other files as
    context), answered in llama.cpp's /completion shape (`content`, `stop`, `stop_type`, `timings`), or
    streamed as its `data: {"content", "stop"}` events (no [DONE])."""
    from ..openai import fim as F

    state = _state(request)
    metrics = state.metrics
    t0 = time.monotonic()
    labels = ("?", "infill")
    lease = None
    try:
        check_auth(request)
        body = await read_json(request)
        req, inp = P.parse_infill(body)
        lease = await use_model(request, req.model)
        sm = lease.sm
        labels = (sm.name, "infill")
        gen = await asyncio.to_thread(H.prepare_infill, sm.llm, sm.name, req, inp)
        rid, queue = submit(state, sm, gen.prompt_ids, gen.params, req.priority, gen.guide)
    except P.APIError as e:
        if lease is not None:
            lease.release()
        metrics.finish(labels, str(e.status), 0, 0)
        return error_response(e)
    except ClientDisconnect:
        if lease is not None:
            lease.release()
        return Response(status_code=499)

    tracker = F.Tracker(queue, t0)
    n_ctx = sm.llm.engine.max_context
    stops = sm.llm.tokenizer.stop_ids | set(gen.params.stop_token_ids)
    n_prompt = len(gen.prompt_ids)
    if req.stream:
        chunks = F.InfillChunks(sm.name, gen, tracker, n_ctx, stops, inp.return_tokens)
        return stream(state, sm, rid, tracker, t0, labels, chunks, False, n_prompt, on_close=lease.release,
                      done_event=False)
    try:
        text, ids, _, reason = await collect(state, request, sm, rid, tracker, t0, labels)
    except P.APIError as e:
        metrics.finish(labels, str(e.status), n_prompt, 0)
        return error_response(e)
    except ClientDisconnect:
        metrics.finish(labels, "499", n_prompt, 0)
        return Response(status_code=499)
    finally:
        lease.release()
    metrics.finish(labels, "200", n_prompt, len(ids))
    return JSONResponse(F.infill_body(sm.name, gen, text, ids, reason, tracker, n_ctx, stops, inp.return_tokens))


# -- errors Starlette raises before a route runs --------------------------------------------------


async def not_found(request: Request, exc):
    return error_response(P.APIError(404, f"no route {request.method} {request.url.path}"))


async def method_not_allowed(request: Request, exc):
    status = getattr(exc, "status_code", 405)
    return error_response(P.APIError(status, f"{request.method} is not allowed on {request.url.path}"))


async def server_error(request: Request, exc):
    return error_response(P.APIError(500, f"internal error: {type(exc).__name__}"))

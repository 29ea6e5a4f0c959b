"""Ollama's API on `edgeinfer serve` (/api/*), for the tools that speak it (Open WebUI, editor plugins, the
`ollama` Python client): its generation and embedding routes, and what its other routes share (the body,
the error body, NDJSON lines); the model-catalog routes are server.ollama_models'. HTTP only, under the
route scaffold (server.scaffold: the API key, the body limits and read timeout, the model's lease,
metrics); streaming as NDJSON; what a body means and what is answered is edgeinfer.openai.ollama_*'s.
Errors are Ollama's {"error": message}, with the status a client checks (404 for an unknown model:
clients offer to pull it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..engine.loop import exclusive
from ..openai import handlers as H
from ..openai import ollama_replies as OR
from ..openai import ollama_requests as OQ
from ..openai.ollama_create import with_created
from ..openai import protocol as P
from .scaffold import LEASES, Call, decode, read_raw, route
from .streaming import submit

NDJSON = "application/x-ndjson"


def message(e: P.APIError) -> str:
    """An error's message as Ollama's one string: it names the field it is about."""
    if e.param and e.param not in e.message:
        return f"{e.param}: {e.message}"
    return e.message


def error(e: P.APIError) -> JSONResponse:
    return JSONResponse({"error": message(e)}, status_code=e.status, headers=e.headers)


def line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def read_body_json(request: Request) -> dict:
    """The body as a JSON object: scaffold.read_json's limit, read timeout and strict decoding, but any
    Content-Type (Ollama's examples are `curl -d`, which sends a form type)."""
    raw = await read_raw(request)
    if not raw.strip():
        raise P.APIError(400, "the request body is empty: send a JSON object")
    body = await decode(raw)
    if not isinstance(body, dict):
        raise P.APIError(400, "the request body must be a JSON object")
    return body


# -- /api/chat and /api/generate --------------------------------------------------------------------


@route("ollama_chat", error)
async def chat(request: Request, call: Call):
    return await _generation(request, call, OQ.parse_chat, "ollama_chat")


@route("ollama_generate", error)
async def generate(request: Request, call: Call):
    return await _generation(request, call, OQ.parse_generate, "ollama_generate")


async def _generation(request: Request, call: Call, parse, api: str):
    state = call.state
    req = parse(await with_created(await read_body_json(request), api, state))
    sm = await call.use(req.model, req.keep_alive)
    timings = OR.Timings(call.t0, time.monotonic())
    if req.load_only:  # Ollama's load / unload call: the lease taken (with its keep_alive) is all it asks
        return JSONResponse(OR.load_reply(req, timings.stats(0, 0)))
    fmt = "none" if req.think is False else getattr(state.config, "reasoning_format", "auto")
    gen = await asyncio.to_thread(OQ.prepare, sm.llm, sm.name, req, fmt)
    rid, queue = submit(state, sm, gen.prompt_ids, gen.params, 0, gen.guide)
    job = _Submitted(sm, rid)
    request.scope.setdefault(LEASES, []).append(job)
    call.n_prompt = len(gen.prompt_ids)
    replies = OR.Replies(gen, req, sm.llm.tokenizer)
    outputs = _outputs(state, request, job, queue, timings, call.labels, watch_disconnect=not req.stream)
    if req.stream:
        return call.stream(StreamingResponse(_lines(state, gen, replies, outputs, timings, call.labels, call.lease),
                                             media_type=NDJSON))
    text, ids, lps, reason = [], [], [], None
    async with contextlib.aclosing(outputs):
        async for out in outputs:
            text.append(out.delta_text)
            ids += out.new_token_ids
            call.n_out = len(ids)
            lps += out.logprobs or []
            reason = out.finish_reason if out.finished else reason
    timings.end = time.monotonic()
    return JSONResponse(replies.whole("".join(text), lps, reason, timings.stats(call.n_prompt, len(ids)),
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
                    yield line(obj)
        timings.end = time.monotonic()
        yield line(replies.final(reason, timings.stats(n_prompt, len(ids)), gen.prompt_ids + ids))
        status = "200"
    except P.APIError as e:
        status = str(e.status)
        yield line({"error": message(e)})
    finally:
        state.metrics.finish(labels, status, n_prompt, len(ids))
        lease.release()


# -- /api/embed and /api/embeddings -----------------------------------------------------------------


@route("ollama_embed", error)
async def embed(request: Request, call: Call):
    """Ollama's /api/embed: {"embeddings": [...]} (normalised), with the timings."""
    return await _embedding(request, call, OQ.parse_embed, legacy=False)


@route("ollama_embeddings", error)
async def embeddings(request: Request, call: Call):
    """Ollama's older /api/embeddings: {"embedding": [...]} of one prompt, not normalised (as Ollama)."""
    return await _embedding(request, call, OQ.parse_embeddings, legacy=True)


async def _embedding(request: Request, call: Call, parse, legacy: bool):
    timeout = call.state.config.request_timeout
    req = parse(await read_body_json(request))
    sm = await call.use(req.model, req.keep_alive, adapters=False)
    timings = OR.Timings(call.t0, time.monotonic())
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
            vecs = await asyncio.wait_for(work, timeout)
        except asyncio.TimeoutError:
            raise P.APIError(504, f"the request took longer than {timeout:g} s") from None
    call.n_prompt = n  # counted once the vectors are there (an error counts none)
    timings.end = time.monotonic()
    if legacy:
        return JSONResponse({"embedding": [float(x) for x in vecs[0]] if len(vecs) else []})
    return JSONResponse(OR.embed_reply(req.model, vecs, timings.stats(n, 0)))


ROUTES = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
]

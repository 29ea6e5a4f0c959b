"""The server's OpenAI-style routes: handlers of (request, call) under the one route scaffold
(server.scaffold: the API key, the body, the model's lease, metrics, errors, a client gone), reading the
server's shared state (app.ServerState) from call.state. HTTP only: what a body means and what is
answered is edgeinfer.openai's."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..engine.loop import exclusive
from ..openai import handlers as H
from ..openai import protocol as P
from ..openai.ollama_create import with_created
from ..openai import responses as R
from ..openai.times import rfc3339
from .scaffold import Call, error_response, read_json, route
from .streaming import collect, collect_choices, stream, submit, submit_choices


def _state(request: Request):
    return request.app.state.server


# -- endpoints -----------------------------------------------------------------------------------


@route("chat")
async def chat_completions(request: Request, call: Call):
    return await generate(request, call, chat=True)


@route("completions")
async def completions(request: Request, call: Call):
    return await generate(request, call, chat=False)


async def generate(request: Request, call: Call, chat: bool):
    state = call.state
    body = await with_created(await read_json(request), "chat" if chat else "completions", state)
    req = P.parse_common(body, chat=chat)
    sm = await call.use(req.model)
    # the prompt through the chat template, the parameters, the compiled constraint: in a worker
    # thread, never on the event loop or the engine thread
    gen = await asyncio.to_thread(H.prepare_generation, sm.llm, sm.name, body, req, chat,
                                  state.config.reasoning_format)
    choices, queue = submit_choices(state, sm, gen)  # n choices (req.n), sharing the prompt's KV blocks
    call.n_prompt = len(gen.prompt_ids)
    cid = R.new_id("chatcmpl" if chat else "cmpl")
    created = R.now()
    tok = sm.llm.tokenizer
    if req.stream:
        return call.stream(stream(state, sm, choices, queue, call.t0, call.labels,
                                  R.Chunks(gen, sm.name, tok, cid, created), req.include_usage, call.n_prompt,
                                  on_close=call.lease.release))
    outputs = await collect_choices(state, request, sm, choices, queue, call.t0, call.labels)
    call.n_out = sum(len(o.ids) for o in outputs)
    return JSONResponse(R.completion_response(gen, sm.name, tok, outputs, cid, created))


@route()
async def tokenize(request: Request, call: Call):
    """llama.cpp's and vLLM's /tokenize: {"tokens": [...], "count": n}; load generators use it."""
    body = await read_json(request)
    text, add_special, parse_special = P.parse_tokenize(body)
    sm = await call.use(P.parse_model(body))
    ids = await asyncio.to_thread(sm.llm.tokenizer.encode, text, None if add_special else False, parse_special)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": sm.llm.embed_context if sm.llm.is_encoder
                         else sm.llm.engine.max_context})


@route("embeddings")
async def embeddings(request: Request, call: Call):
    """OpenAI's /v1/embeddings: one vector per input (an encoder's pooled output, or a generative
    model's mean-pooled final hidden state), normalised; `dimensions` keeps the first n, renormalised."""
    timeout = call.state.config.request_timeout
    body = await read_json(request)
    inputs, fmt, dims, truncate = P.parse_embeddings(body)
    sm = await call.use(P.parse_model(body), adapters=False)
    llm = sm.llm
    seqs = await asyncio.to_thread(H.embedding_inputs, llm, sm.name, inputs, dims, truncate)
    try:
        vecs = await asyncio.wait_for(asyncio.to_thread(exclusive, llm.embed_ids, seqs, dimensions=dims), timeout)
    except asyncio.TimeoutError:
        raise P.APIError(504, f"the request took longer than {timeout:g} s") from None
    call.n_prompt = n = sum(len(s) for s in seqs)  # counted once the vectors are there (an error counts none)
    call.state.metrics.token(call.labels, time.monotonic() - call.t0, True)
    return JSONResponse(R.embeddings_response(sm.name, vecs, n, fmt))


@route()
async def apply_template(request: Request, call: Call):
    """llama.cpp's POST /apply-template: the prompt text a chat body makes through the model's chat template
    (tools and chat_template_kwargs included), not tokenized: {"prompt": text}."""
    body = await read_json(request)
    req = P.parse_common(body, chat=True)
    sm = await call.use(req.model)
    if sm.llm.is_encoder:
        raise P.bad("model", f"model {sm.name!r} is an embedding model: it has no chat template")
    text, *_ = await asyncio.to_thread(H.chat_prompt, sm.llm, sm.name, body, req, True)
    return JSONResponse({"prompt": text})


@route()
async def detokenize(request: Request, call: Call):
    body = await read_json(request)
    ids = P.parse_detokenize(body)
    sm = await call.use(P.parse_model(body))
    P.check_token_ids(ids, sm.llm.tokenizer.vocab_size, "tokens")
    text = sm.llm.tokenizer.decode(ids)
    return JSONResponse({"content": text, "prompt": text})  # llama.cpp's key and vLLM's


@route()
async def list_models(request: Request, call: Call):
    """OpenAI's model list: the models in memory first (status "loaded", then "loading", with their
    estimated memory and, once loaded, when they expire), then the ones loadable on demand ("available")."""
    models = call.state.models
    data = []
    for sm in sorted((m for m in models.models.values() if m.status != "unloading"), key=lambda m: m.status != "loaded"):
        entry = {"id": sm.name, "object": "model", "created": sm.created, "owned_by": "edgeinfer",
                 "status": sm.status, "memory_bytes": sm.size}
        if sm.status == "loaded":
            entry["expires_at"] = rfc3339(models.expires(sm))
        data.append(entry)
        data += [{"id": a, "object": "model", "created": sm.created, "owned_by": "edgeinfer", "status": sm.status,
                  "parent": sm.name} for a, base in models.adapters.items() if base == sm.name]  # (vLLM's)
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


@route()
async def ps(request: Request, call: Call):
    """Ollama's GET /api/ps: the models in memory, their estimated size and when each will be unloaded."""
    return JSONResponse(call.state.models.ps())


async def openapi(request: Request):
    return JSONResponse(_state(request).openapi_doc)


async def metrics(request: Request):
    data, ctype = _state(request).metrics.render()
    return Response(data, media_type=ctype)


@route("infill")
async def infill(request: Request, call: Call):
    """llama.cpp's /infill: fill in between input_prefix and input_suffix (input_extra: other files as
    context), answered in llama.cpp's /completion shape (`content`, `stop`, `stop_type`, `timings`), or
    streamed as its `data: {"content", "stop"}` events (no [DONE])."""
    from ..openai import fim as F

    state = call.state
    body = await read_json(request)
    req, inp = P.parse_infill(body)
    sm = await call.use(req.model)
    gen = await asyncio.to_thread(H.prepare_infill, sm.llm, sm.name, req, inp)
    rid, queue = submit(state, sm, gen.prompt_ids, gen.params, req.priority, gen.guide, id_slot=req.id_slot)
    call.n_prompt = len(gen.prompt_ids)
    tracker = F.Tracker(queue, call.t0, max(0, sm.loop.slot_of(rid)))
    n_ctx = sm.llm.engine.max_context
    stops = sm.llm.tokenizer.stop_ids | set(gen.params.stop_token_ids)
    if req.stream:
        chunks = F.InfillChunks(sm.name, gen, tracker, n_ctx, stops, inp.return_tokens)
        return call.stream(stream(state, sm, rid, tracker, call.t0, call.labels, chunks, False, call.n_prompt,
                                  on_close=call.lease.release, done_event=False))
    text, ids, _, reason = await collect(state, request, sm, rid, tracker, call.t0, call.labels)
    call.n_out = len(ids)
    return JSONResponse(F.infill_body(sm.name, gen, text, ids, reason, tracker, n_ctx, stops, inp.return_tokens))


# -- errors Starlette raises before a route runs --------------------------------------------------


async def not_found(request: Request, exc):
    return error_response(P.APIError(404, f"no route {request.method} {request.url.path}"))


async def method_not_allowed(request: Request, exc):
    status = getattr(exc, "status_code", 405)
    return error_response(P.APIError(status, f"{request.method} is not allowed on {request.url.path}"))


async def server_error(request: Request, exc):
    return error_response(P.APIError(500, f"internal error: {type(exc).__name__}"))

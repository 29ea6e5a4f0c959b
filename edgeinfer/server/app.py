"""`edgeinfer serve`: an OpenAI-compatible HTTP server on the continuous-batching engine.

Every model's engine is stepped by the process's one compute thread (EngineLoop); the asyncio event
loop only parses, queues and streams, so it never blocks on compute. A request's outputs come back through
its own asyncio queue; a client that goes away has its request aborted and its KV blocks freed.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import threading
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..config import EngineConfig
from ..engine.loop import exclusive
from ..errors import EdgeInferError
from ..registry import model_name
from ..tools import StreamParser
from . import handlers as H
from . import protocol as P
from . import schemas as S
from .metrics import Metrics

DEFAULT_MAX_BODY = 4 * 1024 * 1024


@dataclass
class ServerConfig:
    models: list[str]
    threads: int = 0
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    max_queue: int = 64  # requests waiting for a slot, per model; past it: 503 + Retry-After
    request_timeout: float = 600.0
    read_timeout: float = 30.0  # the whole request body must arrive within this
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_seqs: int = 0
    backend: str = "cpu"
    engine_config: EngineConfig | None = None
    model_configs: dict | None = None  # model source -> its own EngineConfig (a shared memory budget)
    # model source -> LLM keyword arguments for speculative decoding (draft, speculate, draft_tokens)
    speculation: dict | None = None


class ServedModel:
    """One model: loaded in the background, then served through its engine loop."""

    def __init__(self, name: str, source: str, engine_config: EngineConfig, speculation: dict | None = None):
        self.name = name
        self.source = source
        self.engine_config = engine_config
        self.speculation = speculation or {}
        self.llm = None
        self.loop = None
        self.error: str | None = None
        self.created = P.now()

    @property
    def ready(self) -> bool:
        return self.loop is not None or (self.llm is not None and self.llm.is_encoder and self.error is None)

    def load(self) -> None:
        from ..engine.loop import EngineLoop
        from ..llm import LLM

        try:
            # loaded on the compute thread, which will step it (edgeinfer.engine.loop says why)
            self.llm = exclusive(LLM, self.source, engine_config=self.engine_config, progress=False,
                                 **self.speculation)
            if self.llm.is_encoder:  # an embedding model: no engine; /v1/embeddings computes in a worker thread
                return
            self.llm.chat_template  # compiled now: a template that does not parse fails the load, not a request
            self.loop = EngineLoop(self.llm.engine, self.name).start()
        except Exception as e:  # reported by /health and every request to this model
            self.error = f"{type(e).__name__}: {e}"
            print(f"error: could not load model {self.name!r}: {e}", file=sys.stderr, flush=True)


def error_response(e: P.APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(config: ServerConfig) -> Starlette:
    engine_config = config.engine_config or EngineConfig(threads=config.threads, max_seqs=config.max_seqs,
                                                         backend=config.backend)
    served: dict[str, ServedModel] = {}
    for source in config.models:
        name = model_name(source)
        if name in served:
            raise EdgeInferError(f"model {name!r} is given twice")
        served[name] = ServedModel(name, source, (config.model_configs or {}).get(source, engine_config),
                                   (config.speculation or {}).get(source))
    metrics = Metrics(served)
    api_key = (config.api_key or "").encode("utf-8", "surrogateescape")

    # -- helpers ---------------------------------------------------------------------------------

    def check_auth(request: Request) -> None:
        if not config.api_key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # compared in constant time; neither key is ever logged or echoed
        if not (scheme.lower() == "bearer"
                and hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), api_key)):
            raise P.APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                             code="invalid_api_key")

    async def read_body(request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            raise P.APIError(413, f"the request body is {int(length)} bytes; the limit is {config.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > config.max_body_bytes:
                raise P.APIError(413, f"the request body is over the limit of {config.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_json(request: Request):
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            raise P.APIError(415, f"Content-Type must be application/json, got {ctype or 'nothing'!r}")
        try:  # a client that sends its body slowly does not hold a connection for ever
            raw = await asyncio.wait_for(read_body(request), config.read_timeout)
        except asyncio.TimeoutError:
            raise P.APIError(408, f"the request body did not arrive within {config.read_timeout:g} s") from None
        if len(raw) > 1 << 16:  # a big body decodes in a worker thread, never holding up the event loop
            return await asyncio.to_thread(P.loads, raw)
        return P.loads(raw)

    def pick_model(name: str | None) -> ServedModel:
        if name is None and len(served) == 1:
            name = next(iter(served))
        sm = served.get(name) if name is not None else None
        if sm is None:
            raise P.APIError(404, f"model {name!r} is not served here; served models: {', '.join(served)}",
                             param="model", code="model_not_found")
        if sm.error:
            raise P.APIError(500, f"model {sm.name!r} failed to load: {sm.error}")
        if not sm.ready:
            raise P.APIError(503, f"model {sm.name!r} is still loading", headers={"Retry-After": "2"})
        return sm

    def submit(sm: ServedModel, prompt_ids, params, priority: int = 0, guide=None) -> tuple[str, asyncio.Queue]:
        stats = sm.llm.engine.stats()
        must_wait = stats["waiting"] > 0 or stats["running"] >= sm.llm.engine.scheduler.max_seqs
        if must_wait and stats["waiting"] >= config.max_queue:
            raise P.APIError(503, f"the server is busy: {stats['waiting']} requests are waiting; try again shortly",
                             headers={"Retry-After": "1"})
        queue: asyncio.Queue = asyncio.Queue()
        aloop = asyncio.get_running_loop()
        try:
            rid = sm.loop.submit(prompt_ids, params, lambda out: aloop.call_soon_threadsafe(queue.put_nowait, out),
                                 priority=priority, guide=guide)
        except ValueError as e:
            raise P.bad("prompt", str(e)) from None
        return rid, queue

    async def collect(request: Request, sm: ServedModel, rid: str, queue: asyncio.Queue, t0: float, labels):
        """Gather a whole generation, watching for a disconnect and the timeout."""
        deadline = t0 + config.request_timeout
        text, ids, lps, reason = [], [], [], None
        first = None
        try:
            while reason is None:
                if time.monotonic() >= deadline:  # checked on every output: a busy stream must time out too
                    raise P.APIError(504, f"the request took longer than {config.request_timeout:g} s")
                try:
                    out = await asyncio.wait_for(queue.get(), timeout=min(0.5, max(0.01, deadline - time.monotonic())))
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        raise ClientDisconnect() from None
                    continue
                if out.new_token_ids:
                    now = time.monotonic()
                    metrics.token(labels, now - (first or t0), first is None)
                    first = first or now
                text.append(out.delta_text)
                ids += out.new_token_ids
                lps += out.logprobs or []
                if out.finished:
                    reason = out.finish_reason
        except BaseException:
            sm.loop.abort(rid)
            raise
        if reason == "error":
            raise P.APIError(500, f"generation failed: {sm.loop.last_error}")
        return "".join(text), ids, lps, reason

    def stream(request: Request, sm: ServedModel, rid: str, queue: asyncio.Queue, t0: float, labels, make_chunks,
               usage_chunk, n_prompt: int):
        async def events():
            deadline = t0 + config.request_timeout
            n_out, first, done = 0, None, False
            try:
                for chunk in make_chunks(None, None, [], first_chunk=True):
                    yield f"data: {json.dumps(chunk)}\n\n"
                while not done:
                    try:
                        if time.monotonic() >= deadline:
                            raise asyncio.TimeoutError
                        out = await asyncio.wait_for(queue.get(), timeout=max(0.01, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        err = P.APIError(504, f"the request took longer than {config.request_timeout:g} s")
                        yield f"data: {json.dumps(err.body())}\n\n"
                        break
                    if out.new_token_ids:
                        now = time.monotonic()
                        metrics.token(labels, now - (first or t0), first is None)
                        first = first or now
                    n_out += len(out.new_token_ids)
                    done = out.finished
                    if out.finish_reason == "error":
                        err = P.APIError(500, f"generation failed: {sm.loop.last_error}")
                        yield f"data: {json.dumps(err.body())}\n\n"
                        break
                    if out.delta_text or out.logprobs or done:
                        for chunk in make_chunks(out.delta_text, out.finish_reason if done else None, out.logprobs or []):
                            yield f"data: {json.dumps(chunk)}\n\n"
                if done and usage_chunk is not None:
                    yield f"data: {json.dumps(usage_chunk(n_prompt, n_out))}\n\n"
                yield "data: [DONE]\n\n"
                metrics.finish(labels, "200", n_prompt, n_out)
            finally:
                if not done:  # the client went away, or the timeout: free the request's blocks now
                    sm.loop.abort(rid)
                    metrics.finish(labels, "499", n_prompt, n_out)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # -- endpoints -------------------------------------------------------------------------------

    async def chat_completions(request: Request):
        return await _generate(request, chat=True)

    async def completions(request: Request):
        return await _generate(request, chat=False)

    async def _generate(request: Request, chat: bool):
        endpoint = "chat" if chat else "completions"
        t0 = time.monotonic()
        labels = ("?", endpoint)
        try:
            check_auth(request)
            body = await read_json(request)
            req = P.parse_common(body, chat=chat)
            sm = pick_model(req.model)
            labels = (sm.name, endpoint)
            tok = sm.llm.tokenizer
            # the prompt through the chat template, the parameters, the compiled constraint: in a worker
            # thread, never on the event loop or the engine thread
            gen = await asyncio.to_thread(H.prepare_generation, sm.llm, sm.name, body, req, chat)
            tools, shown, prompt_ids = gen.tools, gen.shown, gen.prompt_ids
            rid, queue = submit(sm, prompt_ids, gen.params, req.priority, gen.guide)
        except P.APIError as e:
            metrics.finish(labels, str(e.status), 0, 0)
            return error_response(e)
        except ClientDisconnect:
            return Response(status_code=499)

        cid = P.new_id("chatcmpl" if chat else "cmpl")
        created = P.now()
        token_text = H.token_text(tok)
        n_prompt = len(prompt_ids)

        if req.stream:
            obj = "chat.completion.chunk" if chat else "text_completion"

            parser = StreamParser(tools) if shown else None
            n_calls = 0

            def chunk(choice):
                return {"id": cid, "object": obj, "created": created, "model": sm.name, "choices": [choice]}

            def make_chunks(delta, finish, lps, first_chunk=False):
                nonlocal n_calls
                lp_chat = P.chat_logprobs(lps, token_text) if req.logprobs and lps else None
                if not chat:
                    if first_chunk:
                        return []
                    return [chunk({"index": 0, "text": delta or "", "finish_reason": finish,
                                   "logprobs": P.completion_logprobs(lps, token_text) if req.logprobs and lps else None})]
                if first_chunk:
                    return [chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                                   "logprobs": None})]
                if parser is None:
                    return [chunk({"index": 0, "delta": {"content": delta} if delta else {}, "finish_reason": finish,
                                   "logprobs": lp_chat})]
                # tools: text goes out as content, each complete <tool_call> block as OpenAI's tool-call deltas
                deltas = []
                for kind, value in parser.feed(delta or "") + (parser.finish() if finish else []):
                    if kind == "text":
                        deltas.append({"content": value})
                    else:
                        f = value["function"]
                        deltas.append({"tool_calls": [{"index": n_calls, "id": value["id"], "type": "function",
                                                       "function": {"name": f["name"], "arguments": ""}}]})
                        deltas.append({"tool_calls": [{"index": n_calls, "function": {"arguments": f["arguments"]}}]})
                        n_calls += 1
                if lp_chat is not None and not deltas:
                    deltas.append({})
                out = [chunk({"index": 0, "delta": d, "finish_reason": None, "logprobs": lp_chat if k == 0 else None})
                       for k, d in enumerate(deltas)]
                if finish:
                    out.append(chunk({"index": 0, "delta": {}, "logprobs": None,
                                      "finish_reason": "tool_calls" if n_calls else finish}))
                return out

            def usage_chunk(n_p, n_o):
                return {"id": cid, "object": obj, "created": created, "model": sm.name, "choices": [],
                        "usage": P.usage(n_p, n_o)}

            return stream(request, sm, rid, queue, t0, labels, make_chunks,
                          usage_chunk if req.include_usage else None, n_prompt)

        try:
            text, ids, lps, reason = await collect(request, sm, rid, queue, t0, labels)
        except P.APIError as e:
            metrics.finish(labels, str(e.status), n_prompt, 0)
            return error_response(e)
        except ClientDisconnect:
            metrics.finish(labels, "499", n_prompt, 0)
            return Response(status_code=499)
        metrics.finish(labels, "200", n_prompt, len(ids))
        return JSONResponse(H.completion_body(gen, sm.name, tok, text, ids, lps, reason, cid, created))

    async def tokenize(request: Request):
        """llama.cpp's and vLLM's /tokenize: {"tokens": [...], "count": n}; load generators use it."""
        try:
            check_auth(request)
            body = await read_json(request)
            text, add_special = P.parse_tokenize(body)
            sm = pick_model(P.parse_model(body))
        except P.APIError as e:
            return error_response(e)
        ids = await asyncio.to_thread(sm.llm.tokenizer.encode, text, None if add_special else False, False)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": sm.llm.embed_context if sm.llm.is_encoder
                             else sm.llm.engine.max_context})

    async def embeddings(request: Request):
        """OpenAI's /v1/embeddings: one vector per input (an encoder's pooled output, or a generative
        model's mean-pooled final hidden state), normalised; `dimensions` keeps the first n, renormalised."""
        t0 = time.monotonic()
        labels = ("?", "embeddings")
        try:
            check_auth(request)
            body = await read_json(request)
            inputs, fmt, dims, truncate = P.parse_embeddings(body)
            sm = pick_model(P.parse_model(body))
            labels = (sm.name, "embeddings")
            llm = sm.llm
            seqs = await asyncio.to_thread(H.embedding_inputs, llm, sm.name, inputs, dims, truncate)
            try:
                vecs = await asyncio.wait_for(asyncio.to_thread(exclusive, llm.embed_ids, seqs, dimensions=dims),
                                              config.request_timeout)
            except asyncio.TimeoutError:
                raise P.APIError(504, f"the request took longer than {config.request_timeout:g} s") from None
        except P.APIError as e:
            metrics.finish(labels, str(e.status), 0, 0)
            return error_response(e)
        n = sum(len(s) for s in seqs)
        metrics.finish(labels, "200", n, 0)
        metrics.token(labels, time.monotonic() - t0, True)
        return JSONResponse(P.embeddings_response(sm.name, vecs, n, fmt))

    async def detokenize(request: Request):
        try:
            check_auth(request)
            body = await read_json(request)
            ids = P.parse_detokenize(body)
            sm = pick_model(P.parse_model(body))
            P.check_token_ids(ids, sm.llm.tokenizer.vocab_size, "tokens")
        except P.APIError as e:
            return error_response(e)
        text = sm.llm.tokenizer.decode(ids)
        return JSONResponse({"content": text, "prompt": text})  # llama.cpp's key and vLLM's

    async def list_models(request: Request):
        try:
            check_auth(request)
        except P.APIError as e:
            return error_response(e)
        return JSONResponse({"object": "list", "data": [
            {"id": sm.name, "object": "model", "created": sm.created, "owned_by": "edgeinfer"}
            for sm in served.values()]})

    async def health(request: Request):
        failed = {sm.name: sm.error for sm in served.values() if sm.error}
        if failed:
            return JSONResponse({"status": "error", "errors": failed}, status_code=500)
        loading = [sm.name for sm in served.values() if not sm.ready]
        if loading:
            return JSONResponse({"status": "loading", "loading": loading}, status_code=503)
        return JSONResponse({"status": "ok", "models": list(served)})

    async def openapi(request: Request):
        return JSONResponse(openapi_doc)

    async def metrics_endpoint(request: Request):
        data, ctype = metrics.render()
        return Response(data, media_type=ctype)

    async def not_found(request: Request, exc):
        return error_response(P.APIError(404, f"no route {request.method} {request.url.path}"))

    async def method_not_allowed(request: Request, exc):
        status = getattr(exc, "status_code", 405)
        return error_response(P.APIError(status, f"{request.method} is not allowed on {request.url.path}"))

    async def server_error(request: Request, exc):
        return error_response(P.APIError(500, f"internal error: {type(exc).__name__}"))

    def startup():
        def load_all():
            for sm in served.values():
                sm.load()
            if all(sm.ready for sm in served.values()):
                print(f"ready: serving {', '.join(served)}", file=sys.stderr, flush=True)

        threading.Thread(target=load_all, name="edgeinfer-load", daemon=True).start()

    def shutdown():
        for sm in served.values():
            if sm.loop is not None:
                sm.loop.stop(timeout=2.0)

    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"]))
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        startup()
        yield
        shutdown()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
        ],
        middleware=middleware,
        exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error},
        lifespan=lifespan,
    )
    openapi_doc = S.openapi(api_key=bool(config.api_key))
    app.state.served = served
    app.state.metrics = metrics
    return app


__all__ = ["ServerConfig", "create_app"]

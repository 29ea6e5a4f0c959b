"""What every route does around its own work, written once: the API key, the body's size limit and read
timeout, the model's lease, the metrics labels, the mapping of errors to responses, and a client that
went away; a model id that names a LoRA adapter (serve --lora NAME=FILE) names its base model with the
adapter chosen for the request. A route is `@route(endpoint)` over `async def handler(request, call)`; `call` (a Call) takes
the model (`await call.use(name)`) and counts the tokens; the scaffold answers an APIError with the
route's error body, a client gone with 499, releases the lease and records the request's metrics. A
streamed response takes over the lease and the metrics (`call.stream(response)`): its body releases
and records them when it ends, however it ends."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import hmac
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..openai import protocol as P

LEASES = "edgeinfer.leases"  # the scope key of a request's leases (app._ReleaseLeases releases what is left)

# the adapter a request chose by its model id ((name, 1.0),), for the generation it submits (streaming.submit)
CHOSEN: contextvars.ContextVar = contextvars.ContextVar("edgeinfer_adapter", default=None)


def resolve(state, name: str | None, adapters: bool = True) -> str | None:
    """The model a request's `model` names: an adapter's id names its base model, the adapter chosen for the
    request (CHOSEN; a 400 where the route takes no adapter); any other name as it is."""
    base = getattr(state.models, "adapters", {}).get(name) if name is not None else None
    if base is None:
        return name
    if not adapters:
        raise P.bad("model", f"{name!r} is a LoRA adapter of {base!r}: this route does not run adapters yet (name "
                             f"{base!r})")
    CHOSEN.set(((name, 1.0),))
    return base


def with_chosen(params):
    """params with the adapter the request's model id chose, unless the request chose its own ("lora")."""
    chosen = CHOSEN.get()
    return params if chosen is None or params.lora is not None else dataclasses.replace(params, lora=chosen)


def error_response(e: P.APIError) -> JSONResponse:
    """OpenAI's error body: {"error": {message, type, param, code}}."""
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def check_auth(request: Request) -> None:
    state = request.app.state.server
    if not state.config.api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":  # Anthropic's clients send the key as x-api-key
        token = request.headers.get("x-api-key", "")
    # compared in constant time; neither key is ever logged or echoed
    if not hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), state.api_key):
        raise P.APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                         code="invalid_api_key")


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


async def read_raw(request: Request) -> bytes:
    """The body's bytes, within --max-body bytes and the read timeout: a client that sends its body slowly
    does not hold a connection for ever."""
    config = request.app.state.server.config
    try:
        return await asyncio.wait_for(read_body(request, config.max_body_bytes), config.read_timeout)
    except asyncio.TimeoutError:
        raise P.APIError(408, f"the request body did not arrive within {config.read_timeout:g} s") from None


async def decode(raw: bytes):
    """Strict JSON (protocol.loads); a big body decodes in a worker thread, never holding up the event loop."""
    return await asyncio.to_thread(P.loads, raw) if len(raw) > 1 << 16 else P.loads(raw)


async def read_json(request: Request):
    """An OpenAI route's body: Content-Type application/json, read as read_raw, decoded strictly."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise P.APIError(415, f"Content-Type must be application/json, got {ctype or 'nothing'!r}")
    return await decode(await read_raw(request))


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
    state = request.app.state.server
    sm, release = await state.models.acquire(name, keep_alive, state.config.request_timeout)
    lease = Lease(sm, release)
    request.scope.setdefault(LEASES, []).append(lease)
    return lease


class Call:
    """One request as its route handler sees it: the server's state, when it arrived (t0), the model's
    lease once taken and the metrics labels (model, endpoint). n_prompt is set once a generation is
    submitted (from then on a client gone counts as a 499 request) and n_out counts its tokens so far:
    the request's metrics are recorded with them."""

    def __init__(self, request: Request, endpoint: str | None):
        self.request = request
        self.state = request.app.state.server
        self.t0 = time.monotonic()
        self.endpoint = endpoint
        self.labels = ("?", endpoint)
        self.lease: Lease | None = None
        self.n_prompt: int | None = None
        self.n_out = 0
        self.streaming = False

    async def use(self, name: str | None, keep_alive: float | None = None, adapters: bool = True):
        """The named model (use_model), held until the response is done; the labels name it from now on. An
        adapter's id names its base model, with that adapter chosen for the request (adapters.py)."""
        self.lease = await use_model(self.request, resolve(self.state, name, adapters), keep_alive)
        self.labels = (self.lease.sm.name, self.endpoint)
        return self.lease.sm

    def stream(self, response: Response) -> Response:
        """A streamed response, whose body now releases the lease and records the metrics itself."""
        self.streaming = True
        return response


def route(endpoint: str | None = None, error=error_response):
    """The scaffold of a route: check the API key, run `handler(request, call)`, answer an APIError with
    `error(e)` and a client gone with 499; then (unless the response streams) release the model's lease
    and, for a route with an endpoint label, record the request: its status, prompt and output tokens."""

    def wrap(handler):
        @functools.wraps(handler)
        async def run(request: Request):
            call = Call(request, endpoint)
            try:
                check_auth(request)
                response, status = await handler(request, call), "200"
            except P.APIError as e:
                response, status = error(e), str(e.status)
            except ClientDisconnect:  # before anything was submitted there is nothing to count
                response, status = Response(status_code=499), None if call.n_prompt is None else "499"
            finally:
                if call.lease is not None and not call.streaming:
                    call.lease.release()
            if endpoint is not None and status is not None and not call.streaming:
                call.state.metrics.finish(call.labels, status, call.n_prompt or 0, call.n_out)
            return response

        return run

    return wrap

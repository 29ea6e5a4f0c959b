"""OpenAI's Responses API routes: POST /v1/responses (a response, or its stream of events), GET and DELETE
/v1/responses/{id}, POST /v1/responses/input_tokens; run through the chat route's pipeline (openai.responses_api
translates both ways). Responses are kept for previous_response_id in a bounded store in memory (ResponseStore:
the last STORE_SIZE, for STORE_SECONDS; none survives a restart), unless the request says store: false."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..openai import handlers as H
from ..openai import protocol as P
from ..openai.ollama_create import with_created
from ..openai import responses as R
from ..openai import responses_api as RA
from .scaffold import Call, read_json, route
from .streaming import collect_choices, stream, submit_choices

STORE_SIZE = 256
STORE_SECONDS = 3600.0


class ResponseStore:
    """The last `size` responses for `seconds`: each one's conversation (as chat messages, its output included)
    and its response object."""

    def __init__(self, size: int = STORE_SIZE, seconds: float = STORE_SECONDS):
        self.size, self.seconds = size, seconds
        self._items: OrderedDict[str, tuple[float, list, dict]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, messages: list, response: dict) -> None:
        with self._lock:
            self._items[rid] = (time.monotonic(), messages, response)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[list, dict] | None:
        with self._lock:
            entry = self._items.get(rid)
            if entry is None or time.monotonic() - entry[0] > self.seconds:
                self._items.pop(rid, None)
                return None
            return entry[1], entry[2]

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._items.pop(rid, None) is not None


def _missing(rid: str, param: str | None = None) -> P.APIError:
    """A response not kept: 404 for a route that names it, 400 for previous_response_id (as OpenAI's)."""
    return P.APIError(404 if param is None else 400,
                      f"no stored response {rid!r}: responses are kept in memory for an hour (the last {STORE_SIZE}), "
                      "unless made with store: false", param=param,
                      code=None if param is None else "previous_response_not_found")


async def _chat(request: Request, call: Call, kind: str):
    body = await with_created(P.validate(kind, await read_json(request)), "responses", call.state)
    history = []
    if body.get("previous_response_id"):
        prev = call.state.responses.get(body["previous_response_id"])
        if prev is None:
            raise _missing(body["previous_response_id"], "previous_response_id")
        history = prev[0]
    chat = RA.chat_body(body, history)
    sm = await call.use(chat.get("model"))
    if sm.llm.is_encoder:
        raise P.bad("model", f"model {sm.name!r} is an embedding model: it cannot respond")
    effort = (body.get("reasoning") or {}).get("effort")
    if effort and "reasoning_effort" in (sm.llm.chat_template.source or ""):  # (a hint: ignored by other templates)
        chat["reasoning_effort"] = {"none": "low", "minimal": "low", "xhigh": "high"}.get(effort, effort)
    return body, chat, P.parse_common(chat, chat=True), sm


def _conversation(body: dict, chat: dict) -> list:
    """The messages a later previous_response_id continues from: this one's, without its instructions."""
    return chat["messages"][1:] if body.get("instructions") else list(chat["messages"])


@route("responses")
async def create(request: Request, call: Call):
    state = call.state
    body, chat, req, sm = await _chat(request, call, "responses")
    gen = await asyncio.to_thread(H.prepare_generation, sm.llm, sm.name, chat, req, True,
                                  state.config.reasoning_format)
    choices, queue = submit_choices(state, sm, gen)
    call.n_prompt = len(gen.prompt_ids)
    rid, tok, keep = R.new_id("resp"), sm.llm.tokenizer, body.get("store") is not False
    if req.stream:
        events = RA.Events(R.Chunks(gen, sm.name, tok, R.new_id("chatcmpl"), R.now()), rid, body, sm.name)

        def closed():
            call.lease.release()
            if keep and events.final is not None:  # (a stream that ran to its end)
                state.responses.put(rid, _conversation(body, chat) + [RA.assistant_message(events.items)],
                                    events.final)
        return call.stream(stream(state, sm, choices, queue, call.t0, call.labels, events, False, call.n_prompt,
                                  on_close=closed, done_event=False))
    outputs = await collect_choices(state, request, sm, choices, queue, call.t0, call.labels)
    call.n_out = sum(len(o.ids) for o in outputs)
    done = R.completion_response(gen, sm.name, tok, outputs)
    choice, u = done["choices"][0], done["usage"]
    items = RA.output_items(choice["message"])
    out = RA.response_object(rid, body, sm.name, items, choice["finish_reason"],
                             RA.usage(u["prompt_tokens"], u["completion_tokens"],
                                      u["prompt_tokens_details"]["cached_tokens"]), R.now())
    if keep:
        state.responses.put(rid, _conversation(body, chat) + [RA.assistant_message(items)], out)
    return JSONResponse(out)


@route()
async def retrieve(request: Request, call: Call):
    found = call.state.responses.get(request.path_params["rid"])
    if found is None:
        raise _missing(request.path_params["rid"])
    return JSONResponse(found[1])


@route()
async def delete(request: Request, call: Call):
    rid = request.path_params["rid"]
    if not call.state.responses.delete(rid):
        raise _missing(rid)
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


@route()
async def input_tokens(request: Request, call: Call):
    """The input's tokens as /v1/responses would compute them (instructions, a previous response, tools):
    {"object": "response.input_tokens", "input_tokens": n}; past the context too."""
    _, chat, req, sm = await _chat(request, call, "input_tokens")
    ids, *_ = await asyncio.to_thread(H.chat_prompt, sm.llm, sm.name, chat, req)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(ids)})

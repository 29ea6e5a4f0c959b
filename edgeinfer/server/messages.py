"""Anthropic's Messages API routes: POST /v1/messages (a message, or its stream of events) and
/v1/messages/count_tokens, run through the chat route's pipeline (openai.anthropic translates both ways), with
Anthropic's error shape. The API key may come as `x-api-key`, as Anthropic's clients send it."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..openai import anthropic as A
from ..openai import handlers as H
from ..openai import protocol as P
from ..openai.ollama_create import with_created
from ..openai import responses as R
from .scaffold import Call, read_json, route
from .streaming import collect_choices, stream, submit_choices


def anthropic_error(e: P.APIError) -> JSONResponse:
    return JSONResponse(A.error_body(e), status_code=e.status, headers=e.headers)


async def _chat(request: Request, call: Call, kind: str):
    """The body as the chat request it means, and the model it names (held for the request)."""
    body = await with_created(P.validate(kind, await read_json(request)), "messages", call.state)
    chat = A.chat_body(body)
    sm = await call.use(chat.get("model"))
    if sm.llm.is_encoder:
        raise P.bad("model", f"model {sm.name!r} is an embedding model: it cannot take messages")
    effort = (body.get("output_config") or {}).get("effort")
    if effort and "reasoning_effort" in (sm.llm.chat_template.source or ""):  # (a hint: ignored by other templates)
        chat["reasoning_effort"] = {"xhigh": "high", "max": "high"}.get(effort, effort)
    return chat, P.parse_common(chat, chat=True), sm


@route("messages", error=anthropic_error)
async def messages(request: Request, call: Call):
    state = call.state
    chat, req, sm = await _chat(request, call, "messages")
    gen = await asyncio.to_thread(H.prepare_generation, sm.llm, sm.name, chat, req, True,
                                  state.config.reasoning_format)
    choices, queue = submit_choices(state, sm, gen)
    call.n_prompt = len(gen.prompt_ids)
    tok = sm.llm.tokenizer
    if req.stream:
        events = A.Events(R.Chunks(gen, sm.name, tok, R.new_id("chatcmpl"), R.now()), sm.name, call.n_prompt)
        return call.stream(stream(state, sm, choices, queue, call.t0, call.labels, events, False, call.n_prompt,
                                  on_close=call.lease.release, done_event=False))
    outputs = await collect_choices(state, request, sm, choices, queue, call.t0, call.labels)
    call.n_out = sum(len(o.ids) for o in outputs)
    return JSONResponse(A.message(R.completion_response(gen, sm.name, tok, outputs), outputs[0]))


@route(error=anthropic_error)
async def count_tokens(request: Request, call: Call):
    """The prompt's tokens as /v1/messages would compute them (the chat template, tools included):
    {"input_tokens": n}. A prompt past the context is counted too."""
    chat, req, sm = await _chat(request, call, "count_tokens")
    ids, *_ = await asyncio.to_thread(H.chat_prompt, sm.llm, sm.name, chat, req)
    return JSONResponse({"input_tokens": len(ids)})

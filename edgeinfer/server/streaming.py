"""A generation between the engine and an HTTP response: submitted to the model's engine loop, its
outputs come back through its own asyncio queue, gathered whole (collect) or sent as server-sent
events (stream). Both watch the request timeout, and a client that goes away has its request aborted
and its KV blocks freed."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse

from ..openai import protocol as P


def submit(state, sm, prompt_ids, params, priority: int = 0, guide=None) -> tuple[str, asyncio.Queue]:
    """Queue a generation on a served model's engine loop: its request id and the queue its outputs come
    through. A 503 when more than --max-queue requests are already waiting."""
    stats = sm.llm.engine.stats()
    must_wait = stats["waiting"] > 0 or stats["running"] >= sm.llm.engine.scheduler.max_seqs
    if must_wait and stats["waiting"] >= state.config.max_queue:
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


def _timeout_error(state) -> P.APIError:
    return P.APIError(504, f"the request took longer than {state.config.request_timeout:g} s")


async def collect(state, request: Request, sm, rid: str, queue: asyncio.Queue, t0: float, labels):
    """Gather a whole generation, watching for a disconnect and the timeout: (text, ids, logprobs, reason)."""
    deadline = t0 + state.config.request_timeout
    text, ids, lps, reason = [], [], [], None
    first = None
    try:
        while reason is None:
            if time.monotonic() >= deadline:  # checked on every output: a busy stream must time out too
                raise _timeout_error(state)
            try:
                out = await asyncio.wait_for(queue.get(), timeout=min(0.5, max(0.01, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise ClientDisconnect() from None
                continue
            if out.new_token_ids:
                now = time.monotonic()
                state.metrics.token(labels, now - (first or t0), first is None)
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


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def stream(state, sm, rid: str, queue: asyncio.Queue, t0: float, labels, chunks, include_usage: bool,
           n_prompt: int, on_close=None) -> StreamingResponse:
    """The generation as server-sent events: `chunks` (an openai.responses.Chunks) builds each event's
    body; a last usage chunk when include_usage; then `data: [DONE]`. on_close() runs once the stream
    ends, however it ends (the model's lease is released there)."""

    async def events():
        deadline = t0 + state.config.request_timeout
        n_out, first, done = 0, None, False
        try:
            for chunk in chunks.first():
                yield _event(chunk)
            while not done:
                try:
                    if time.monotonic() >= deadline:
                        raise asyncio.TimeoutError
                    out = await asyncio.wait_for(queue.get(), timeout=max(0.01, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    yield _event(_timeout_error(state).body())
                    break
                if out.new_token_ids:
                    now = time.monotonic()
                    state.metrics.token(labels, now - (first or t0), first is None)
                    first = first or now
                n_out += len(out.new_token_ids)
                done = out.finished
                if out.finish_reason == "error":
                    yield _event(P.APIError(500, f"generation failed: {sm.loop.last_error}").body())
                    break
                if out.delta_text or out.logprobs or done:
                    for chunk in chunks(out.delta_text, out.finish_reason if done else None, out.logprobs or []):
                        yield _event(chunk)
            if done and include_usage:
                yield _event(chunks.usage(n_prompt, n_out))
            yield "data: [DONE]\n\n"
            state.metrics.finish(labels, "200", n_prompt, n_out)
        finally:
            if not done:  # the client went away, or the timeout: free the request's blocks now
                sm.loop.abort(rid)
                state.metrics.finish(labels, "499", n_prompt, n_out)
            if on_close is not None:
                on_close()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

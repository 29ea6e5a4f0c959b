"""A generation between the engine and an HTTP response: submitted to the model's engine loop, its
outputs come back through its own asyncio queue, gathered whole (collect) or sent as server-sent
events (stream). Both watch the request timeout, and a client that goes away has its request aborted
and its KV blocks freed. A request for n choices (submit_choices) is one engine request whose choices'
outputs come through one queue, each with its choice's index; a client gone aborts all n."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse

from ..engine.llm_engine import PromptTooLongError
from ..openai import handlers as H
from ..openai import protocol as P
from .scaffold import with_chosen


def _check_queue(state, sm) -> None:
    """A 503 when more than --max-queue requests are already waiting."""
    stats = sm.llm.engine.stats()
    must_wait = stats["waiting"] > 0 or stats["running"] >= sm.llm.engine.max_seqs
    if must_wait and stats["waiting"] >= state.config.max_queue:
        raise P.APIError(503, f"the server is busy: {stats['waiting']} requests are waiting; try again shortly",
                         headers={"Retry-After": "1"})


def submit(state, sm, prompt_ids, params, priority: int = 0, guide=None, n: int = 1,
           id_slot: int = -1) -> tuple[str, asyncio.Queue]:
    """Queue a generation (of n choices) on a served model's engine loop, in llama.cpp's slot id_slot (-1: any):
    its request id and the queue its outputs come through. A 503 when more than --max-queue requests are
    already waiting."""
    if id_slot != -1:
        try:
            sm.loop.slots.check(id_slot)
        except ValueError as e:
            raise P.bad("id_slot", str(e)) from None
    _check_queue(state, sm)
    params = with_chosen(params)  # the adapter a request chose by its model id
    queue: asyncio.Queue = asyncio.Queue()
    aloop = asyncio.get_running_loop()
    try:
        rid = sm.loop.submit(prompt_ids, params, lambda out: aloop.call_soon_threadsafe(queue.put_nowait, out),
                             priority=priority, guide=guide, n=n, slot=id_slot)
    except PromptTooLongError as e:
        raise P.too_long("prompt", str(e)) from None
    except ValueError as e:
        raise P.bad("lora" if str(e).startswith("lora") else "prompt", str(e)) from None
    return rid, queue


def submit_choices(state, sm, gen: H.Generation) -> tuple["Choices", asyncio.Queue]:
    """Queue a generation's n choices, one engine request (the engine queues the others once the
    prompt's blocks are cached): its Choices and the queue of its outputs. A 503 as submit's."""
    rid, queue = submit(state, sm, gen.prompt_ids, gen.params, gen.req.priority, gen.guide, gen.n, gen.req.id_slot)
    return Choices(sm, rid, gen.n), queue


class Choices:
    """A request's choices as the response sees them: how many, each output's index, abort all."""

    def __init__(self, sm, rid: str, n: int, indexed: bool = True):
        self._sm, self._rid, self.n = sm, rid, n
        self.indexed = indexed  # chunks name their choice (the OpenAI routes); submit's plain requests do not

    def abort(self) -> None:
        self._sm.loop.abort(self._rid)


def _as_choices(sm, rid):
    return rid if isinstance(rid, Choices) else Choices(sm, rid, 1, indexed=False)


async def _next(queue):
    """The next (index, output)."""
    out = await queue.get()
    return out.index, out


def _timeout_error(state) -> P.APIError:
    return P.APIError(504, f"the request took longer than {state.config.request_timeout:g} s")


async def collect_choices(state, request: Request, sm, choices, queue, t0: float, labels) -> list[H.Output]:
    """Gather every choice of a generation whole (choices: submit_choices' Choices, or submit's request
    id), watching for a disconnect and the timeout: each choice's handlers.Output, in index order."""
    choices = _as_choices(sm, choices)
    deadline = t0 + state.config.request_timeout
    outputs = [H.Output() for _ in range(choices.n)]
    left = choices.n
    first = None
    try:
        while left:
            if time.monotonic() >= deadline:  # checked on every output: a busy stream must time out too
                raise _timeout_error(state)
            try:
                i, out = await asyncio.wait_for(_next(queue),
                                                timeout=min(0.5, max(0.01, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise ClientDisconnect() from None
                continue
            if out.new_token_ids:
                now = time.monotonic()
                state.metrics.token(labels, now - (first or t0), first is None)
                first = first or now
            left -= outputs[i].add(out)
    except BaseException:
        choices.abort()
        raise
    if any(o.reason == "error" for o in outputs):
        raise P.APIError(500, f"generation failed: {sm.loop.last_error}")
    return outputs


async def collect(state, request: Request, sm, rid: str, queue: asyncio.Queue, t0: float, labels):
    """Gather a whole generation, watching for a disconnect and the timeout: (text, ids, logprobs, reason)."""
    (out,) = await collect_choices(state, request, sm, rid, queue, t0, labels)
    return out.text, out.ids, out.lps, out.reason


def _sse(obj: dict, named: bool = False) -> str:
    """A server-sent event; named: with an `event:` line of the object's type (Anthropic's streams)."""
    return (f"event: {obj['type']}\n" if named else "") + f"data: {json.dumps(obj)}\n\n"


def stream(state, sm, rid, queue: asyncio.Queue, t0: float, labels, chunks, include_usage: bool,
           n_prompt: int, on_close=None, done_event: bool = True) -> StreamingResponse:
    """The generation as server-sent events: `chunks` (an openai.responses.Chunks) builds each event's
    body, each choice's with its index (rid: submit's request id, or submit_choices' Choices); a last
    usage chunk when include_usage (every choice's tokens); then `data: [DONE]`, once every choice is
    done. on_close() runs once the stream ends, however it ends (the model's lease is released there).
    done_event False: no `data: [DONE]` (llama.cpp's own endpoints, /infill, end with their last chunk).
    A builder may also have: `named` (events go out with `event:` lines), `seen(out)` (each engine output,
    before its chunks), `end(n_prompt, n_out, cached)` (the events once every choice is done, in place of the
    usage chunk) and `error(APIError)` (an error event's body): Anthropic's (openai.anthropic.Events)."""
    choices = _as_choices(sm, rid)
    named = getattr(chunks, "named", False)
    seen = getattr(chunks, "seen", None)
    error = getattr(chunks, "error", lambda e: e.body())

    def _event(obj: dict) -> str:
        return _sse(obj, named)

    async def events():
        deadline = t0 + state.config.request_timeout
        n_out, first, left, cached = 0, None, choices.n, 0
        try:
            for chunk in chunks.first():
                yield _event(chunk)
            while left:
                try:
                    if time.monotonic() >= deadline:
                        raise asyncio.TimeoutError
                    i, out = await asyncio.wait_for(_next(queue),
                                                    timeout=max(0.01, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    yield _event(error(_timeout_error(state)))
                    break
                if out.new_token_ids:
                    now = time.monotonic()
                    state.metrics.token(labels, now - (first or t0), first is None)
                    first = first or now
                n_out += len(out.new_token_ids)
                if i == 0:  # (the request's: later choices share choice 0's blocks)
                    cached = max(cached, out.num_cached_tokens)
                left -= out.finished
                if out.finish_reason == "error":
                    yield _event(error(P.APIError(500, f"generation failed: {sm.loop.last_error}")))
                    break
                if seen is not None:
                    seen(out)
                if out.delta_text or out.logprobs or out.finished:
                    args = (out.delta_text, out.finish_reason if out.finished else None, out.logprobs or [])
                    for chunk in chunks(*args, index=i) if choices.indexed else chunks(*args):
                        yield _event(chunk)
            if not left and hasattr(chunks, "end"):
                for event in chunks.end(n_prompt, n_out, cached):
                    yield _event(event)
            elif not left and include_usage:
                yield _event(chunks.usage(n_prompt, n_out, cached))
            if done_event:
                yield "data: [DONE]\n\n"
            state.metrics.finish(labels, "200", n_prompt, n_out)
        finally:
            if left:  # the client went away, an error or the timeout: free every choice's blocks now
                choices.abort()
                state.metrics.finish(labels, "499", n_prompt, n_out)
            if on_close is not None:
                on_close()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

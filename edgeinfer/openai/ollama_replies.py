"""Ollama's response objects (docs/api.md of github.com/ollama/ollama), built from what the engine produced:
one small per-request builder (Replies) and pure functions; no HTTP (edgeinfer.server.ollama sends them)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from .. import harmony, reasoning
from . import handlers as H
from .ollama_requests import OllamaRequest
from .times import rfc3339


@dataclass
class Timings:
    """When a request reached each stage (time.monotonic()), for Ollama's durations in nanoseconds."""

    start: float  # the request arrived
    loaded: float  # its model was ready (load_duration: the wait for it)
    first: float | None = None  # the first generated token came back (the prompt was evaluated)
    end: float | None = None

    def stats(self, n_prompt: int, n_out: int) -> dict:
        end = self.end or time.monotonic()
        first = self.first or end
        ns = lambda s: max(0, int(s * 1e9))  # noqa: E731
        return {"total_duration": ns(end - self.start), "load_duration": ns(self.loaded - self.start),
                "prompt_eval_count": n_prompt, "prompt_eval_duration": ns(first - self.loaded),
                "eval_count": n_out, "eval_duration": ns(end - first)}


def _finite(lp: float) -> float:
    """A masked token's -inf, sent as -9999.0 (as OpenAI and vLLM do)."""
    return lp if math.isfinite(lp) else -9999.0


def _logprobs(entries: list[dict], token_text) -> list[dict]:
    return [{"token": token_text(e["token_id"]), "logprob": _finite(e["logprob"]),
             "top_logprobs": [{"token": token_text(j), "logprob": _finite(lp)} for j, lp in e["top"]]}
            for e in entries]


def _call(call: dict, index: int) -> dict:
    """A parsed tool call (edgeinfer.tools: arguments as JSON text) as Ollama sends it: arguments as an object."""
    f = call["function"]
    return {"function": {"index": index, "name": f["name"], "arguments": json.loads(f["arguments"])}}


class Replies:
    """The objects one /api/chat or /api/generate answer is made of: streamed deltas (done: false), the
    final object (done: true, done_reason and the timings) and the whole, unstreamed answer. A thinking
    model's reasoning goes to `thinking` (edgeinfer.reasoning); with tools shown, tool calls are parsed
    out of the answer (never out of the reasoning), their arguments as objects."""

    def __init__(self, gen: H.Generation, req: OllamaRequest, tokenizer):
        from .responses import token_text

        self.gen, self.req, self.name = gen, req, req.model
        self.token_text = token_text(tokenizer)
        self.reasoning = self.tools = None
        if req.stream:
            self.reasoning = harmony.parser_for(gen)
        if req.stream and gen.shown:
            from ..tools import StreamParser  # imported only with tools: it brings in the kernels (Numba)

            self.tools = StreamParser(gen.tools, gen.tool_format)
        self.n_calls = 0

    def _obj(self, content: str, calls: list | None = None, done: bool = False, thinking: str | None = None) -> dict:
        out = {"model": self.name, "created_at": rfc3339(timespec="microseconds")}
        if self.req.chat:
            msg = {"role": "assistant", "content": content}
            if thinking is not None:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            out["message"] = msg
        else:
            out["response"] = content
            if thinking is not None:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def _answer(self, text: str, finished: bool) -> list[dict]:
        if self.tools is None:
            return [self._obj(text)] if text else []
        out = []
        for kind, value in self.tools.feed(text) + (self.tools.finish() if finished else []):
            if kind == "text":
                out.append(self._obj(value))
            else:
                out.append(self._obj("", [_call(value, self.n_calls)]))
                self.n_calls += 1
        return out

    def deltas(self, text: str, lps: list[dict], finished: bool) -> list[dict]:
        """The streamed objects for one engine output (its new text and logprobs)."""
        if self.reasoning is None:
            out = self._answer(text, finished)
        else:
            out = []
            pieces = self.reasoning.feed(text) + (self.reasoning.finish() if finished else [])
            for kind, piece in pieces:
                out += [self._obj("", thinking=piece)] if kind == reasoning.REASONING else self._answer(piece, False)
            if finished:
                out += self._answer("", True)
        if self.req.parsed.logprobs and lps:
            if not out:
                out.append(self._obj(""))
            out[0]["logprobs"] = _logprobs(lps, self.token_text)
        return out

    def final(self, reason: str, stats: dict, context: list[int] | None = None) -> dict:
        """The last streamed object: no text, done, the reason and the timings."""
        return self._finish(self._obj("", done=True), reason, stats, context)

    def _finish(self, obj: dict, reason: str, stats: dict, context) -> dict:
        obj["done_reason"] = reason
        if context is not None and not self.req.chat and not self.req.raw:
            obj["context"] = context
        obj.update(stats)
        return obj

    def whole(self, text: str, lps: list[dict], reason: str, stats: dict, context: list[int] | None = None) -> dict:
        """The unstreamed answer: all the text, its reasoning apart, its tool calls parsed out."""
        thinking = calls = None
        if self.gen.reasoning or self.gen.harmony:
            thinking, text = harmony.split_for(self.gen, text)
        if self.req.chat and self.gen.shown:
            from ..tools import parse_reply

            content, parsed = parse_reply(text, self.gen.tools, self.gen.tool_format)
            if parsed:
                text, calls = content or "", [_call(c, i) for i, c in enumerate(parsed)]
        obj = self._obj(text, calls, done=True, thinking=thinking)
        if self.req.parsed.logprobs:
            obj["logprobs"] = _logprobs(lps, self.token_text)
        return self._finish(obj, reason, stats, context)


def load_reply(req: OllamaRequest, stats: dict) -> dict:
    """The answer to a load (or unload) call: done, done_reason "load" / "unload"."""
    out = {"model": req.model, "created_at": rfc3339(timespec="microseconds")}
    if req.chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason="unload" if req.unload else "load")
    if not req.unload:
        out.update({k: stats[k] for k in ("total_duration", "load_duration")})
    return out


def embed_reply(name: str, vecs, stats: dict) -> dict:
    return {"model": name, "embeddings": [[float(x) for x in v] for v in vecs],
            **{k: stats[k] for k in ("total_duration", "load_duration", "prompt_eval_count")}}


def pull_progress(entry, desc: str, completed: int, total: int | None) -> dict:
    out = {"status": f"downloading {desc}", "completed": completed}
    if entry.sha256:
        out["digest"] = f"sha256:{entry.sha256}"
    if total:
        out["total"] = total
    return out

"""OpenAI response bodies and streamed chunks, built from what the engine produced. Pure functions
(and one small per-request chunk builder): no HTTP, no model. The server sends them; batch jobs write
them."""

from __future__ import annotations

import math
import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict:
    """OpenAI's usage, with prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache (in
    memory, or on disk with --prompt-cache) held, whose prefill was skipped."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}


def _finite_lp(lp: float) -> float:
    """A log-probability JSON can carry: a token the grammar masked has -inf, sent as -9999.0 (as
    OpenAI and vLLM do)."""
    return lp if math.isfinite(lp) else -9999.0


def chat_logprobs(entries: list[dict], token_text) -> dict:
    def item(tid, lp):
        t = token_text(tid)
        return {"token": t, "logprob": _finite_lp(lp), "bytes": list(t.encode("utf-8"))}

    return {"content": [{**item(e["token_id"], e["logprob"]),
                         "top_logprobs": [item(j, lp) for j, lp in e["top"]]} for e in entries]}


def completion_logprobs(entries: list[dict], token_text, offset: int = 0) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        t = token_text(e["token_id"])
        offsets.append(offset)
        offset += len(t)
        tokens.append(t)
        lps.append(_finite_lp(e["logprob"]))
        tops.append({token_text(j): _finite_lp(lp) for j, lp in e["top"]})
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def now() -> int:
    return int(time.time())


def embeddings_response(model: str, vecs, n_tokens: int, encoding_format: str = "float") -> dict:
    """OpenAI's embeddings list (the server's reply and `edgeinfer embed`'s output): float lists, or
    base64 of little-endian float32."""
    import base64

    import numpy as np

    def encode(v):
        if encoding_format == "base64":
            return base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode()
        return [float(x) for x in v]

    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vecs)],
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def token_text(tokenizer):
    """A token id's text, for logprobs (bytes that are not whole UTF-8 become U+FFFD)."""
    return lambda t: tokenizer.token_bytes(t).decode("utf-8", errors="replace")


def chat_message(gen, text: str) -> tuple[dict, bool]:
    """A whole reply as a chat message: the reasoning apart (a model that thinks), then tool calls
    parsed out of the answer when tools were shown (never out of the reasoning); and whether it holds
    calls."""
    reasoning = None
    if gen.reasoning or gen.harmony:
        from ..harmony import split_for

        reasoning, text = split_for(gen, text)
    message, calls = {"role": "assistant", "content": text}, []
    if gen.shown:
        from ..tools import parse_reply

        content, calls = parse_reply(text, gen.tools, gen.tool_format)
        if calls:
            message["content"] = content
    if gen.reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message, bool(calls)


def completion_response(gen, name: str, tokenizer, outputs: list, cid: str | None = None,
                        created: int | None = None) -> dict:
    """The whole (not streamed) response of a generation's choices (handlers.Output, in index order): a
    chat.completion (each message through chat_message) or a text_completion; usage counts every
    choice's tokens, the prompt once."""
    chat, req = gen.chat, gen.req
    tt = token_text(tokenizer)
    choices = []
    for i, out in enumerate(outputs):
        reason = out.reason
        if chat:
            message, called = chat_message(gen, out.text)
            choice = {"index": i, "message": message, "finish_reason": "tool_calls" if called else reason,
                      "logprobs": chat_logprobs(out.lps, tt) if req.logprobs else None}
        else:
            choice = {"index": i, "text": out.text, "finish_reason": reason,
                      "logprobs": completion_logprobs(out.lps, tt) if req.logprobs else None}
        choices.append(choice)
    return {"id": cid or new_id("chatcmpl" if chat else "cmpl"),
            "object": "chat.completion" if chat else "text_completion", "created": created or now(),
            "model": name, "choices": choices,
            "usage": usage(len(gen.prompt_ids), sum(len(out.ids) for out in outputs), outputs[0].cached)}


class _ChoiceStream:
    """One choice's state in a stream: its reasoning splitter, its tool-call parser, its calls so far."""

    def __init__(self, gen):
        self.reasoning = None
        if gen.chat:
            from ..harmony import parser_for

            self.reasoning = parser_for(gen)
        self.tools = None
        if gen.chat and gen.shown:
            from ..tools import StreamParser  # imported only with tools: it brings in the kernels (Numba)

            self.tools = StreamParser(gen.tools, gen.tool_format)
        self.n_calls = 0


class Chunks:
    """The streamed chunks of one generation (a handlers.Generation) and its choices: chat.completion.chunk
    objects (the first one of each choice with the assistant's role; a thinking model's reasoning as
    reasoning_content deltas; with tools shown, text as content and each complete <tool_call> block
    as OpenAI's tool-call deltas) or text_completion ones. Each choice has its own state."""

    def __init__(self, gen, name: str, tokenizer, cid: str, created: int):
        self.chat, self.req, self.name, self.cid, self.created = gen.chat, gen.req, name, cid, created
        self.object = "chat.completion.chunk" if gen.chat else "text_completion"
        self.token_text = token_text(tokenizer)
        self.choices = [_ChoiceStream(gen) for _ in range(gen.n)]

    def _chunk(self, choice: dict) -> dict:
        return {"id": self.cid, "object": self.object, "created": self.created, "model": self.name,
                "choices": [choice]}

    def first(self) -> list[dict]:
        """What goes out before any token: each choice's assistant role (chat), nothing (completions)."""
        if not self.chat:
            return []
        return [self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                             "logprobs": None}) for i in range(len(self.choices))]

    def __call__(self, delta: str | None, finish: str | None, lps: list[dict], index: int = 0) -> list[dict]:
        """The chunks for one engine output of choice `index`: its new text, its finish reason (once
        done), its logprobs."""
        req, tt, st = self.req, self.token_text, self.choices[index]
        if not self.chat:
            return [self._chunk({"index": index, "text": delta or "", "finish_reason": finish,
                                 "logprobs": completion_logprobs(lps, tt) if req.logprobs and lps else None})]
        lp_chat = chat_logprobs(lps, tt) if req.logprobs and lps else None
        if st.tools is None and st.reasoning is None:
            return [self._chunk({"index": index, "delta": {"content": delta} if delta else {},
                                 "finish_reason": finish, "logprobs": lp_chat})]
        pieces = [("content", delta or "")]
        if st.reasoning is not None:
            pieces = st.reasoning.feed(delta or "") + (st.reasoning.finish() if finish else [])
        deltas = []
        for kind, text in pieces:
            if kind == "reasoning":
                deltas.append({"reasoning_content": text})
            elif st.tools is None:
                deltas.append({"content": text})
            else:
                deltas += self._tool_deltas(st, st.tools.feed(text))
        if st.tools is not None and finish:
            deltas += self._tool_deltas(st, st.tools.finish())
        if lp_chat is not None and not deltas:
            deltas.append({})
        out = [self._chunk({"index": index, "delta": d, "finish_reason": None,
                            "logprobs": lp_chat if k == 0 else None}) for k, d in enumerate(deltas)]
        if finish:
            out.append(self._chunk({"index": index, "delta": {}, "logprobs": None,
                                    "finish_reason": "tool_calls" if st.n_calls else finish}))
        return out

    @staticmethod
    def _tool_deltas(st: _ChoiceStream, events) -> list[dict]:
        deltas = []
        for kind, value in events:
            if kind == "text":
                deltas.append({"content": value})
            else:
                f = value["function"]
                deltas.append({"tool_calls": [{"index": st.n_calls, "id": value["id"], "type": "function",
                                               "function": {"name": f["name"], "arguments": ""}}]})
                deltas.append({"tool_calls": [{"index": st.n_calls, "function": {"arguments": f["arguments"]}}]})
                st.n_calls += 1
        return deltas

    def usage(self, n_prompt: int, n_out: int, cached: int = 0) -> dict:
        """The last chunk when stream_options.include_usage: no choices, the token counts (n_out: every
        choice's)."""
        return {"id": self.cid, "object": self.object, "created": self.created, "model": self.name, "choices": [],
                "usage": usage(n_prompt, n_out, cached)}

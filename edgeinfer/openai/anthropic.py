"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as a translation onto the chat route's
pipeline: a Messages body becomes the chat completion body it means (its system prompt, text, tool_use and
tool_result blocks, thinking blocks, tools and tool_choice, stop sequences, thinking switch), which the chat
route's code prepares and runs; the chat completion becomes Anthropic's message, and the chat chunks of a stream
Anthropic's events (message_start, content_block_start/delta/stop per block, message_delta, message_stop).
Pure data: no HTTP."""

from __future__ import annotations

import json

from . import protocol as P
from .responses import new_id

# the sampling fields a Messages body may carry as extra body fields, the chat route's names
_PASSED = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "min_p", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "repeat_penalty", "repeat_last_n", "ignore_eos", "priority",
           "id_slot", "lora", "stream")
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 409: "invalid_request_error",
                413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error", 501: "api_error",
                503: "overloaded_error", 504: "timeout_error", 507: "overloaded_error"}


def error_body(e: P.APIError) -> dict:
    """Anthropic's error shape for an APIError: {"type": "error", "error": {"type", "message"}}."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


def _unsupported(where: str, kind: str) -> P.APIError:
    return P.bad(where, f"'{where}' is a block of type {kind}: this server reads text, image, tool_use and tool_result "
                        "blocks (and thinking in assistant turns)")


def _text(content, where: str) -> str:
    """A string, or the text of an array of text blocks."""
    if isinstance(content, str):
        return content
    return "\n".join(_text_block(b, f"{where}[{j}]") for j, b in enumerate(content))


def _text_block(b, where: str) -> str:
    if not isinstance(b, dict):
        raise P.bad(where, f"'{where}' must be a content block ({{\"type\": \"text\", \"text\": ...}})")
    if b.get("type") != "text":
        raise _unsupported(where, repr(b.get("type")))
    if not isinstance(b.get("text"), str):
        raise P.bad(f"{where}.text", f"'{where}.text' must be a string")
    return b["text"]


def _turn(m: dict, where: str) -> list[dict]:
    """One Messages turn as chat messages: a user turn's tool_result blocks become tool messages (before its
    text), an assistant turn's tool_use blocks its tool_calls and its thinking blocks its reasoning_content."""
    role, content = m["role"], m["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts, calls, thinking, tools, parts = [], [], [], [], []
    for j, b in enumerate(content):
        at, kind = f"{where}.content[{j}]", b.get("type")
        if kind == "text":
            texts.append(_text_block(b, at))
            if parts and parts[-1]["type"] == "text":
                parts[-1] = {"type": "text", "text": parts[-1]["text"] + "\n" + texts[-1]}
            else:
                parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image" and role == "user":
            parts.append(_image_block(b, at))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise P.bad(at, f"'{at}' needs a string id and name")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise P.bad(at, f"'{at}' needs a string tool_use_id")
            result = b.get("content", "")
            result = _text(result, f"{at}.content") if isinstance(result, (str, list)) else json.dumps(result)
            tools.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                          "content": ("Error: " + result) if b.get("is_error") else result})
        elif kind == "thinking" and role == "assistant":
            thinking.append(str(b.get("thinking", "")))
        elif kind == "redacted_thinking" and role == "assistant":
            continue
        else:
            raise _unsupported(at, repr(kind) + (f" ({role} turn)" if kind in ("tool_use", "tool_result", "thinking")
                                                 else ""))
    if role == "user":
        if any(p["type"] == "image_url" for p in parts):  # OpenAI's parts, in the blocks' order
            return tools + [{"role": "user", "content": parts}]
        return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts or not tools else [])
    out = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    if thinking:
        out["reasoning_content"] = "\n".join(thinking)
    return [out]


def _image_block(b: dict, where: str) -> dict:
    """An image block ({"type": "image", "source": {"type": "base64", "media_type", "data"} or {"type": "url",
    "url"}}) as OpenAI's image_url part."""
    src = b.get("source")
    kind = src.get("type") if isinstance(src, dict) else None
    if kind == "base64" and isinstance(src.get("data"), str) and isinstance(src.get("media_type"), str):
        return {"type": "image_url", "image_url": {"url": f"data:{src['media_type']};base64,{src['data']}"}}
    if kind == "url" and isinstance(src.get("url"), str):
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    raise P.bad(f"{where}.source", f"'{where}.source' must be {{\"type\": \"base64\", \"media_type\": ..., "
                                   f"\"data\": ...}} or {{\"type\": \"url\", \"url\": ...}}")


def chat_body(body: dict) -> dict:
    """The chat completion body a Messages (or count_tokens) body means: the chat route's schema then checks it
    as it checks any."""
    messages = [{"role": "system", "content": _text(body["system"], "system")}] if body.get("system") else []
    for i, m in enumerate(body["messages"]):
        messages += _turn(m, f"messages[{i}]")
    out = {"messages": messages, **{k: body[k] for k in _PASSED if body.get(k) is not None}}
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    kwargs = dict(body.get("chat_template_kwargs") or {})
    thinking = (body.get("thinking") or {}).get("type")
    if thinking or "enable_thinking" not in kwargs:  # (no thinking field: no thinking, as Anthropic's API)
        kwargs["enable_thinking"] = thinking not in (None, "disabled")
    if kwargs:
        out["chat_template_kwargs"] = kwargs
    fmt = (body.get("output_config") or {}).get("format")
    if fmt:  # structured output, as response_format's json_schema
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        if "input_schema" not in t:
            raise P.bad(f"tools[{i}]", f"tool {t['name']!r} has no input_schema: server tools "
                                       f"({t.get('type', 'untyped')}) are not run here, only tools the client runs")
        tools.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                       "parameters": t["input_schema"]}})
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if choice:
        kind = choice["type"]
        if kind == "tool" and not isinstance(choice.get("name"), str):
            raise P.bad("tool_choice.name", "tool_choice of type 'tool' needs the tool's name")
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
            {"type": "function", "function": {"name": choice["name"]}}
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    return out


def usage(n_prompt: int, n_out: int, cached: int) -> dict:
    """Anthropic's usage: input_tokens are the prompt tokens computed, cache_read_input_tokens those the prefix
    cache held (their sum is the prompt, as count_tokens counts it)."""
    return {"input_tokens": n_prompt - cached, "output_tokens": n_out, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}


def stop_reason(finish: str | None, stop_sequence: str | None) -> str | None:
    if finish is None:
        return None
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence else "end_turn"


def _blocks(message: dict) -> list[dict]:
    out = []
    if message.get("reasoning_content"):
        out.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        out.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        f = call["function"]
        out.append({"type": "tool_use", "id": call["id"], "name": f["name"], "input": _input(f["arguments"])})
    return out


def _input(arguments) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def message(chat: dict, output) -> dict:
    """A chat.completion (its first choice) as Anthropic's message; output: that choice's handlers.Output."""
    choice = chat["choices"][0]
    u = chat["usage"]
    cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    stop = output.stop_sequence if choice["finish_reason"] == "stop" else None
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": chat["model"],
            "content": _blocks(choice["message"]), "stop_reason": stop_reason(choice["finish_reason"], stop),
            "stop_sequence": stop, "usage": usage(u["prompt_tokens"], u.get("completion_tokens", 0), cached)}


class Events:
    """A stream's Anthropic events, from the chat route's chunks (responses.Chunks, for choice 0): a block per
    run of one kind of delta (thinking, text, each tool call), opened when the kind changes and closed before the
    next, then message_delta (stop reason, output tokens) and message_stop. For streaming.stream: `seen` notes each
    engine output, `end` gives the closing events."""

    named = True  # each event goes out with its `event:` line, as Anthropic's clients read them

    def __init__(self, chunks, name: str, n_prompt: int):
        self.chunks, self.name, self.n_prompt = chunks, name, n_prompt
        self.index, self.open = -1, None  # the last block's index, the kind of the one open (None: none)
        self.stop_sequence, self.finish = None, None

    def seen(self, out) -> None:
        if out.finished and out.index == 0:
            self.stop_sequence = out.stop_sequence

    def first(self) -> list[dict]:
        return [{"type": "message_start", "message": {
            "id": new_id("msg"), "type": "message", "role": "assistant", "model": self.name, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage(self.n_prompt, 0, 0)}}, {"type": "ping"}]

    def _start(self, block: dict) -> list[dict]:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        return out + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _delta(self, delta: dict) -> list[dict]:
        return [{"type": "content_block_delta", "index": self.index, "delta": delta}]

    def __call__(self, delta: str | None, finish: str | None, lps: list[dict], index: int = 0) -> list[dict]:
        out = []
        for chunk in self.chunks(delta, finish, lps, index=index):
            choice = chunk["choices"][0]
            d = choice.get("delta") or {}
            if d.get("reasoning_content"):
                if self.open != "thinking":
                    out += self._start({"type": "thinking", "thinking": "", "signature": ""})
                out += self._delta({"type": "thinking_delta", "thinking": d["reasoning_content"]})
            if d.get("content"):
                if self.open != "text":
                    out += self._start({"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": d["content"]})
            for call in d.get("tool_calls") or []:
                f = call.get("function") or {}
                if call.get("id"):  # a new call
                    out += self._start({"type": "tool_use", "id": call["id"], "name": f.get("name", ""), "input": {}})
                elif f.get("arguments"):
                    out += self._delta({"type": "input_json_delta", "partial_json": f["arguments"]})
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def end(self, n_prompt: int, n_out: int, cached: int) -> list[dict]:
        stop = self.stop_sequence if self.finish == "stop" else None
        return self._close() + [
            {"type": "message_delta", "delta": {"stop_reason": stop_reason(self.finish, stop), "stop_sequence": stop},
             "usage": {"output_tokens": n_out, "input_tokens": n_prompt - cached,
                       "cache_read_input_tokens": cached}},
            {"type": "message_stop"}]

    def error(self, e: P.APIError) -> dict:
        return error_body(e)

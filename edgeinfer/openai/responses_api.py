"""OpenAI's Responses API (POST /v1/responses, /v1/responses/input_tokens) as a translation onto the chat route's
pipeline: instructions and input items (messages, function_call and function_call_output items, after a stored
previous response's) become the chat messages they mean, function tools and tool_choice the chat route's, and
text.format its response_format; the chat completion becomes a response object (reasoning, message and
function_call output items), and the chat chunks of a stream the Responses events (response.created ...
response.output_text.delta ... response.completed). Pure data: no HTTP."""

from __future__ import annotations

import copy
import json
import time

from . import protocol as P
from .responses import new_id

# the sampling fields a Responses body may carry as extra body fields, the chat route's names
_PASSED = ("model", "temperature", "top_p", "seed", "top_k", "min_p", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "repeat_penalty", "repeat_last_n", "ignore_eos", "priority", "id_slot", "lora",
           "stream", "parallel_tool_calls", "chat_template_kwargs")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise P.bad(where, f"'{where}' must be a string or an array of text parts")
    out = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise P.bad(f"{where}[{j}]", f"'{where}[{j}]' is a part of type {kind!r}: this server reads text parts "
                                         "(input_text, output_text)")
        out.append(part["text"])
    return "".join(out)


def input_messages(items, where: str = "input") -> list[dict]:
    """The chat messages an input (a string, or a list of items) means."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(items):
        at, kind = f"{where}[{i}]", item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
            if role is None:
                raise P.bad(f"{at}.role", f"'{at}.role' must be user, assistant, system or developer")
            out.append({"role": role, "content": _content(item.get("content", ""), f"{at}.content")})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise P.bad(at, f"'{at}' needs string call_id, name and arguments")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # calls of one turn go in one message
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise P.bad(at, f"'{at}' needs a string call_id")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _content(item.get("output", ""), f"{at}.output")})
        elif kind == "reasoning":
            continue  # (a reasoning item sent back: the templates drop earlier turns' reasoning)
        else:
            raise P.bad(f"{at}.type", f"'{at}' is an item of type {kind!r}: this server reads message, "
                                      "function_call, function_call_output and reasoning items")
    return out


def chat_body(body: dict, history: list[dict]) -> dict:
    """The chat completion body a Responses body means, after `history` (a previous response's messages)."""
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    messages += history + input_messages(body.get("input") if body.get("input") is not None else [])
    out = {"messages": messages, **{k: body[k] for k in _PASSED if body.get(k) is not None}}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        if t["type"] != "function" or not isinstance(t.get("name"), str):
            raise P.bad(f"tools[{i}]", f"'tools[{i}]' is a {t['type']!r} tool: this server runs none itself; "
                                       "function tools (with a name) are called by the client")
        tools.append({"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                                       "parameters": t.get("parameters") or {"type": "object"}}})
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice["type"] != "function" or not isinstance(choice.get("name"), str):
            raise P.bad("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", "
                                       "\"name\": ...}")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        out["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif fmt.get("type") == "json_schema":
        if "schema" not in fmt:
            raise P.bad("text.format.schema", "a json_schema format needs its schema")
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "output",
                                                                         "schema": fmt["schema"]}}
    return out


def output_items(message: dict) -> list[dict]:
    """A chat message as output items: its reasoning, its text, its calls."""
    out = []
    if message.get("reasoning_content"):
        out.append({"type": "reasoning", "id": new_id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
    if message.get("content"):
        out.append({"type": "message", "id": new_id("msg"), "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or []:
        f = call["function"]
        out.append({"type": "function_call", "id": new_id("fc"), "call_id": call["id"], "name": f["name"],
                    "arguments": f["arguments"] if isinstance(f["arguments"], str) else json.dumps(f["arguments"]),
                    "status": "completed"})
    return out


def usage(n_prompt: int, n_out: int, cached: int) -> dict:
    return {"input_tokens": n_prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_prompt + n_out}


def response_object(rid: str, body: dict, model: str, output: list[dict], finish: str | None, use: dict | None,
                    created: int) -> dict:
    """A response object: status completed, incomplete (max_output_tokens) or in_progress (finish None)."""
    status = "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"),
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice") or "auto",
            "text": body.get("text") or {"format": {"type": "text"}}, "reasoning": body.get("reasoning"),
            "metadata": body.get("metadata") or {}, "store": body.get("store") is not False, "usage": use}


class Events:
    """A stream's Responses events, from the chat route's chunks (responses.Chunks, choice 0): an output item per
    run of one kind of delta (reasoning, text, each function call), added when the kind changes and done before the
    next, between response.created/in_progress and response.completed (or response.incomplete). For
    streaming.stream (`named`, `end`, `error`); `items` are the finished output items."""

    named = True

    def __init__(self, chunks, rid: str, body: dict, model: str):
        self.chunks, self.rid, self.body, self.model = chunks, rid, body, model
        self.created = int(time.time())
        self.seq, self.items, self.open, self.finish = 0, [], None, None
        self.final: dict | None = None  # the response object, once end() made it

    def _e(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def _response(self, use: dict | None = None) -> dict:
        return response_object(self.rid, self.body, self.model, self.items, self.finish, use, self.created)

    def first(self) -> list[dict]:
        return [self._e("response.created", response=self._response()),
                self._e("response.in_progress", response=self._response())]

    def _start(self, item: dict) -> list[dict]:
        out = self._close()
        self.items.append(item)
        self.open = item
        added = copy.deepcopy(item)  # (as it starts: the live item grows as deltas come)
        if "content" in added:
            added["content"] = []
        out.append(self._e("response.output_item.added", output_index=len(self.items) - 1, item=added))
        if item["type"] == "message":
            out.append(self._e("response.content_part.added", item_id=item["id"], output_index=len(self.items) - 1,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        at, out = len(self.items) - 1, []
        item["status"] = "completed"
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out += [self._e("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                            text=text, logprobs=[]),
                    self._e("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                            part=item["content"][0])]
        elif item["type"] == "function_call":
            out.append(self._e("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                               name=item["name"], arguments=item["arguments"]))
        elif item["type"] == "reasoning":
            out.append(self._e("response.reasoning_text.done", item_id=item["id"], output_index=at, content_index=0,
                               text=item["content"][0]["text"]))
        return out + [self._e("response.output_item.done", output_index=at, item=item)]

    def __call__(self, delta: str | None, finish: str | None, lps: list[dict], index: int = 0) -> list[dict]:
        out = []
        for chunk in self.chunks(delta, finish, lps, index=index):
            choice = chunk["choices"][0]
            d = choice.get("delta") or {}
            at = len(self.items) - 1
            if d.get("reasoning_content"):
                if self.open is None or self.open["type"] != "reasoning":
                    out += self._start({"type": "reasoning", "id": new_id("rs"), "summary": [], "status": "in_progress",
                                        "content": [{"type": "reasoning_text", "text": ""}]})
                    at = len(self.items) - 1
                self.open["content"][0]["text"] += d["reasoning_content"]
                out.append(self._e("response.reasoning_text.delta", item_id=self.open["id"], output_index=at,
                                   content_index=0, delta=d["reasoning_content"]))
            if d.get("content"):
                if self.open is None or self.open["type"] != "message":
                    out += self._start({"type": "message", "id": new_id("msg"), "status": "in_progress",
                                        "role": "assistant",
                                        "content": [{"type": "output_text", "text": "", "annotations": []}]})
                    at = len(self.items) - 1
                self.open["content"][0]["text"] += d["content"]
                out.append(self._e("response.output_text.delta", item_id=self.open["id"], output_index=at,
                                   content_index=0, delta=d["content"], logprobs=[]))
            for call in d.get("tool_calls") or []:
                f = call.get("function") or {}
                if call.get("id"):
                    out += self._start({"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
                                        "name": f.get("name", ""), "arguments": "", "status": "in_progress"})
                elif f.get("arguments") and self.open is not None:
                    self.open["arguments"] += f["arguments"]
                    out.append(self._e("response.function_call_arguments.delta", item_id=self.open["id"],
                                       output_index=len(self.items) - 1, delta=f["arguments"]))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def end(self, n_prompt: int, n_out: int, cached: int) -> list[dict]:
        out = self._close()
        self.final = final = self._response(usage(n_prompt, n_out, cached))
        return out + [self._e("response.incomplete" if final["status"] == "incomplete" else "response.completed",
                              response=final)]

    def error(self, e: P.APIError) -> dict:
        return self._e("error", code=e.code, message=e.message, param=e.param)


def assistant_message(items: list[dict]) -> dict:
    """Output items as the chat message that continues a conversation (previous_response_id): text and calls."""
    text = "".join(p["text"] for it in items if it["type"] == "message" for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in items if it["type"] == "function_call"]
    out = {"role": "assistant", "content": text or None}
    if calls:
        out["tool_calls"] = calls
    return out

"""Tool calling (OpenAI's `tools` and `tool_choice`) on any chat model.

The tools reach the model through its chat template: a template that knows tools (it mentions
`tools`) renders them itself; for any other template the fallback below writes them into the system
message in the Hermes / Qwen 2.5 format, which small instruction-tuned models have seen most:

    # Tools
    ...
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
    </tools>
    ... return a json object with function name and arguments within <tool_call></tool_call> XML tags:
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

Earlier calls in the conversation (assistant messages with `tool_calls`) are written back in that
form, and tool results (`role: "tool"`) become user turns wrapped in <tool_response> tags.

The reply is read for every family's form of a call (edgeinfer.tool_formats: Hermes' <tool_call> blocks,
Llama 3's bare {"name": ..., "parameters": ...} objects and <|python_tag|>, Mistral's [TOOL_CALLS],
Qwen3-Coder's <function=...> XML, gpt-oss's harmony through edgeinfer.harmony, and Gemma 4's
`<|tool_call>call:NAME{key:<|"|>text<|"|>}<tool_call|>`, read by edgeinfer.tools_gemma4), whatever the
model; a block that is not a well-formed call of a given tool stays text, and so does a bare object that is
not one (streamed, a reply that starts with "{" is held back until it is complete). With tool_choice
"required" or a named function the reply is constrained by a grammar in the model's own form (Hermes' for
the families that have none), built from the tools' parameter schemas, so it is always a well-formed call
with arguments that match.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import EdgeInferError
from .structured import JSON_DEFAULTS, close_objects
from . import tool_formats
from .tool_formats import HERMES, ToolFormat
from .tools_gemma4 import G_OPEN, read_call as read_gemma4_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
OPENERS = (*tool_formats.OPENERS, G_OPEN)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

FALLBACK_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>"
)


class ToolError(EdgeInferError, ValueError):
    """Tools, a tool choice or tool messages that are malformed; the message names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of the arguments object

    def openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none" | "auto" | "required" | "function"
    name: str | None = None  # the function, for mode "function"


def parse_tools(tools, tool_choice=None) -> tuple[list[Tool], ToolChoice]:
    """Validate OpenAI's `tools` and `tool_choice`. No tools: an empty list and mode "none"."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise ToolError("tools", "'tools' must be an array of {type: function, function: {...}} objects")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise ToolError(where, f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ToolError(f"{where}.function.name",
                            f"{where}.function.name must be 1-64 letters, digits, '_', '-' or '.', got {name!r}")
        if any(x.name == name for x in out):
            raise ToolError(f"{where}.function.name", f"tool {name!r} is given twice")
        desc = f.get("description", "")
        if not isinstance(desc, str):
            raise ToolError(f"{where}.function.description", f"{where}.function.description must be a string")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"{where}.function.parameters", f"{where}.function.parameters must be a JSON schema object")
        out.append(Tool(name, desc, params))
    choice = _parse_choice(tool_choice, out)
    return out, choice


def _parse_choice(tc, tools: list[Tool]) -> ToolChoice:
    if tc is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            raise ToolError("tool_choice", f"'tool_choice' must be none, auto, required or a function, got {tc!r}")
        if tc != "none" and not tools:
            raise ToolError("tool_choice", f"'tool_choice' {tc!r} needs 'tools'")
        return ToolChoice(tc)
    if isinstance(tc, dict) and tc.get("type") == "function" and isinstance(tc.get("function"), dict):
        name = tc["function"].get("name")
        if not any(t.name == name for t in tools):
            raise ToolError("tool_choice", f"'tool_choice' names function {name!r}, which is not in 'tools'")
        return ToolChoice("function", name)
    raise ToolError("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                   "{\"type\": \"function\", \"function\": {\"name\": ...}}")


def call_grammar(tools: list[Tool], choice: ToolChoice, parallel: bool = True,
                 fmt: ToolFormat = HERMES) -> str | None:
    """A Lark grammar (llguidance's syntax) for a reply that is only tool calls in the model's form
    (edgeinfer.tool_formats), or None when the choice does not force a call."""
    if choice.mode not in ("required", "function"):
        return None
    chosen = [t for t in tools if choice.mode == "required" or t.name == choice.name]
    own = tool_formats.grammar(fmt or HERMES, chosen, parallel and choice.mode == "required")
    if own is not None:
        return own
    alts = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": close_objects(t.parameters)},
             "required": ["name", "arguments"], "additionalProperties": False} for t in chosen]
    schema = {"x-guidance": JSON_DEFAULTS, "anyOf": alts} if len(alts) > 1 else {"x-guidance": JSON_DEFAULTS, **alts[0]}
    start = 'start: call ("\\n" call)*' if parallel and choice.mode == "required" else "start: call"
    return (f"{start}\n"
            f'call: "{OPEN}\\n" body "\\n{CLOSE}"\n'
            f"body: %json {json.dumps(schema, ensure_ascii=False)}\n")


# -- the prompt -------------------------------------------------------------------------------


def prepare_messages(messages: list[dict], tools: list[Tool], native: bool) -> list[dict]:
    """The conversation as the template gets it. native: the template renders tools, tool calls and
    tool results itself (arguments as objects, as Hugging Face's templates expect); otherwise the
    fallback format of this module's docstring, in plain system / user / assistant turns."""
    out = []
    for i, m in enumerate(messages):
        calls = _check_calls(m, i)
        if native:
            if m.get("content") is None:
                m = {**m, "content": ""}
            if calls:
                m = {**m, "content": m.get("content") or "",
                     "tool_calls": [{**c, "function": {**c["function"], "arguments": _arguments_object(c)}}
                                    for c in calls]}
            out.append(m)
            continue
        if m["role"] == "tool":
            body = m.get("content") or ""
            text = f"<tool_response>\n{body}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool_responses"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text, "_tool_responses": True})
            continue
        if calls:
            blocks = [f"{OPEN}\n" + json.dumps({"name": c["function"]["name"], "arguments": _arguments_object(c)},
                                               ensure_ascii=False) + f"\n{CLOSE}" for c in calls]
            content = (m.get("content") or "").strip()
            m = {"role": "assistant", "content": "\n".join(([content] if content else []) + blocks)}
        else:
            m = {"role": m["role"], "content": m.get("content") or ""}
        out.append(m)
    out = [{k: v for k, v in m.items() if k != "_tool_responses"} for m in out]
    if tools and not native:
        text = FALLBACK_SYSTEM.format(tools="\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _check_calls(m, i: int) -> list[dict]:
    calls = m.get("tool_calls") if isinstance(m, dict) else None
    if calls is None:
        return []
    where = f"messages[{i}].tool_calls"
    if m.get("role") != "assistant" or not isinstance(calls, list):
        raise ToolError(where, f"{where} must be an array, on an assistant message")
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) \
                or not isinstance(f.get("arguments", "{}"), (str, dict)):
            raise ToolError(f"{where}[{j}]", f"{where}[{j}] must be {{\"type\": \"function\", \"function\": "
                                             f"{{\"name\": ..., \"arguments\": \"<JSON>\"}}}}")
    return calls


def _arguments_object(call: dict):
    args = call["function"].get("arguments", "{}")
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return args
    return args


# -- the reply --------------------------------------------------------------------------------


def new_call_id() -> str:
    return HERMES.call_id()


def _call(name: str, args: dict, cid: str | None = None, fmt: ToolFormat = HERMES) -> dict:
    if fmt.short_ids and not (cid and len(cid) == 9 and cid.isascii() and cid.isalnum()):
        cid = None  # the model's own id, unless Mistral's template would refuse it on the next turn
    return {"id": cid or fmt.call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def _blocks(buf: str, tools: dict, final: bool, fmt: ToolFormat = HERMES) -> tuple[list[tuple[str, object]], str]:
    """("text", str) and ("call", dict) events of text that may hold calls in any family's form
    (edgeinfer.tool_formats; Gemma 4's here), and what is held back: an opener's possible start, a call not
    yet complete (nothing when final: the text is all there is)."""
    events: list[tuple[str, object]] = []
    while buf:
        found = [(k, tag) for tag in OPENERS if (k := buf.find(tag)) >= 0]
        if not found:
            keep = 0 if final else max(_partial_suffix(buf, tag) for tag in OPENERS)
            if len(buf) > keep:
                events.append(("text", buf[:len(buf) - keep]))
                buf = buf[len(buf) - keep:]
            break
        k, tag = min(found)
        if k > 0:
            events.append(("text", buf[:k]))
            buf = buf[k:]
        if tag == G_OPEN:
            got = read_gemma4_call(buf, final)
            if got is None:
                break  # not yet known
            end, name, args = got
            calls = [(name, args, None)] if name in tools else None
        else:
            got = tool_formats.read_block(buf, tag, tools, final)
            if got is None:
                break  # inside a call: wait for its end
            end, calls = got
            end = max(end, 1)
        if calls is None:
            events.append(("text", buf[:end]))
        else:
            events += [("call", _call(name, args, cid, fmt)) for name, args, cid in calls]
        buf = buf[end:]
    return events, buf


def _bare_calls(text: str, tools: dict, fmt: ToolFormat) -> list[dict] | None:
    # a reply that is nothing but call objects (small models drop the tags; Llama 3's own form)
    calls = tool_formats.json_calls(text, tools) if text.strip().startswith("{") else None
    return [_call(name, args, cid, fmt) for name, args, cid in calls] if calls else None


def parse_reply(text: str, tools: list[Tool], fmt: ToolFormat = HERMES) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a whole reply. Blocks that are not a call of a given tool stay text.
    fmt: the model's format (edgeinfer.tool_formats; the form of new call ids)."""
    by_name, fmt = {t.name: t for t in tools}, fmt or HERMES
    calls, parts, pending = [], [], ""
    for kind, value in _blocks(text, by_name, True, fmt)[0]:
        if kind == "text":
            pending += value
            continue
        if not calls or pending.strip():  # whitespace between calls is a separator, not content
            parts.append(pending)
        pending = ""
        calls.append(value)
    if not calls or pending.strip():
        parts.append(pending)
    if not calls:  # a reply that is nothing but bare call objects (small models drop the tags; Llama 3)
        bare = _bare_calls(text, by_name, fmt)
        return (None, bare) if bare else (text, [])
    content = "".join(parts).strip()
    return content or None, calls


class StreamParser:
    """parse_reply for a stream: feed text deltas, get ("text", str) and ("call", dict) events.
    Text that may be the start of a <tool_call> or <|tool_call> tag is held back until it is clear,
    and so is a call until it is complete."""

    def __init__(self, tools: list[Tool], fmt: ToolFormat = HERMES):
        self.tools, self.fmt = {t.name: t for t in tools}, fmt or HERMES
        self.buf = ""
        self._ws_hold = ""
        self._after_call = False
        self._bare: bool | None = None  # does the reply start with "{"? (None: nothing but blanks yet)
        self._lead = ""

    def feed(self, delta: str) -> list[tuple[str, object]]:
        if self._bare is None:  # the first non-blank character decides: "{" may open a bare call
            self._lead += delta
            if not self._lead.strip():
                return []
            self._bare = self._lead.lstrip().startswith("{")
            delta, self._lead = self._lead, ""
        if self._bare:  # held whole until the end: a call only if all of it is one
            self.buf += delta
            return []
        return self._feed_tags(delta)

    def _feed_tags(self, delta: str, final: bool = False) -> list[tuple[str, object]]:
        events, self.buf = _blocks(self.buf + delta, self.tools, final, self.fmt)
        return self._drop_separators(events)

    def _drop_separators(self, events):
        # whitespace between and after calls is not content (parse_reply strips it too); held until
        # something else follows (once other text follows a call, its blanks are content)
        out = []
        for kind, value in events:
            if kind == "call":
                self._ws_hold, self._after_call = "", True
            else:
                value, self._ws_hold = self._ws_hold + value, ""
                if self._after_call and not value.strip():
                    self._ws_hold = value
                    continue
                self._after_call = False
            out.append((kind, value))
        return out

    def finish(self) -> list[tuple[str, object]]:
        if self._bare is None:  # a blank reply
            rest, self._lead = self._lead, ""
            return [("text", rest)] if rest else []
        events = []
        if self._bare:
            held, self.buf, self._bare = self.buf, "", False
            bare = _bare_calls(held, self.tools, self.fmt)
            if bare:
                return [("call", c) for c in bare]
            events = self._feed_tags(held)
        events += self._feed_tags("", final=True)
        self._ws_hold = ""
        return events


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0

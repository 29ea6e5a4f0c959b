"""Chat templates: the GGUF's `tokenizer.chat_template` rendered in a sandboxed jinja2 environment
the way Hugging Face transformers renders it; ChatML (or Gemma's turns) when the file has none.

As transformers' environment: trim_blocks and lstrip_blocks, the loop controls extension (`{% break %}`,
`{% continue %}`), `{% generation %}` blocks (rendered as their body), `raise_exception`, `strftime_now`
and a `tojson` that writes plain JSON and takes json.dumps' ensure_ascii, indent, separators and
sort_keys. Templates' own switches (Qwen3's `enable_thinking`, Llama 3's `date_string`, ...) are
`variables` of `render` (`LLM.render_chat(..., template_vars=...)` in the Python API; the server and
the CLI do not pass any yet).

Gemma 4's templates (they write `<|tool_call>call:`) get what llama.cpp's common/chat.cpp gives them:
an older template (without the "OpenAI Chat Completions" tool-message handling) gets each assistant
turn with tool calls, the `tool` messages after it and a final assistant answer merged into one
assistant message with `tool_responses`, as that template expects; and a prompt that ends a turn
(`<turn|>`) where a generation prompt was asked for gets `<|turn>model\n` added."""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from datetime import datetime

from .errors import EdgeInferError

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if role == 'system' %}{{ '<start_of_turn>user\n' + message['content'] + '\n\n' }}"
    "{% else %}{% if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'system' %}"
    "{{ '<start_of_turn>' + role + '\n' }}{% endif %}{{ message['content'] + '<end_of_turn>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# Gemma 4's turns, for a Gemma 4 vocabulary without a template (thinking off unless enable_thinking, as
# Gemma 4's own template)
GEMMA4 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\n' + message['content'] | trim + '<turn|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\n' }}"
    "{% if not enable_thinking | default(false) %}{{ '<|channel>thought\n<channel|>' }}{% endif %}{% endif %}"
)
GEMMA4_MARK = "'<|tool_call>call:'"  # how llama.cpp tells a Gemma 4 template
GEMMA4_TOOL_MESSAGES = "{#- OpenAI Chat Completions:"  # a template that renders `tool` messages itself
ROLES = ("system", "user", "assistant", "tool")
# the variables render() sets itself; `variables` may not replace them
RESERVED = frozenset(("messages", "add_generation_prompt", "bos_token", "eos_token", "tools",
                      "raise_exception", "strftime_now", "namespace", "range"))


class ChatTemplateError(EdgeInferError, ValueError):
    """A chat template that fails to render, or messages it cannot take."""


def _raise(message):
    raise ChatTemplateError(f"the chat template raised: {message}")


def default_template(tokenizer) -> str:
    special = getattr(tokenizer, "_special_text", {})
    if "<start_of_turn>" in special:
        return GEMMA
    if "<|turn>" in special and "<turn|>" in special:
        return GEMMA4
    return CHATML


def _json_or_text(text):
    def no_constant(name):
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=no_constant)  # (JSON proper: no NaN or Infinity)
    except (ValueError, RecursionError):
        return text


def gemma4_tool_responses(messages: list[dict]) -> list[dict]:
    """llama.cpp's workaround for older Gemma 4 templates (common/parsers/gemma4.cpp): an assistant
    message with tool calls, the `tool` messages after it and a following assistant message with content
    but no calls become one assistant message with tool_calls, tool_responses ({name, response}: the
    call's function name, else the tool_call_id; the content parsed as JSON where it is JSON), content
    and reasoning_content."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        calls = m.get("tool_calls")
        if m.get("role") != "assistant" or not isinstance(calls, list) or not calls:
            out.append(m)
            i += 1
            continue
        merged = {"role": "assistant", "tool_calls": list(calls)}
        responses = []
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            t = messages[i]
            k = len(responses)
            f = calls[k].get("function") if k < len(calls) and isinstance(calls[k], dict) else None
            name = f.get("name") if isinstance(f, dict) and isinstance(f.get("name"), str) else ""
            if not name:
                name = t.get("tool_call_id") if isinstance(t.get("tool_call_id"), str) else ""
            content = t.get("content")
            responses.append({"name": name, "response": _json_or_text(content) if isinstance(content, str) else content})
            i += 1
        if responses:
            merged["tool_responses"] = responses
        if i < len(messages) and messages[i].get("role") == "assistant" and not messages[i].get("tool_calls") \
                and messages[i].get("content"):
            merged["content"] = messages[i]["content"]
            i += 1
        if isinstance(m.get("reasoning_content"), str):
            merged["reasoning_content"] = m["reasoning_content"]
        out.append(merged)
    return out


def validate_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ChatTemplateError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            parts = []
            for j, p in enumerate(content):
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise ChatTemplateError(f"messages[{i}].content[{j}] must be a text part")
                parts.append(p["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}].content must be a string")
        out.append({**m, "role": role, "content": content})
    return out


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# Bounds on a template from a model file: it renders within RENDER_SECONDS, and no string, list or
# rendered prompt it makes grows past MAX_CHARS (a step that would is refused before it allocates).
RENDER_SECONDS = 2.0
MAX_CHARS = 1 << 21  # 2 Mi characters: about 500k tokens, far past any context
MAX_INT_ARG = 1 << 16  # widths and counts passed to filters and methods (center, ljust, indent, ...)


def _too_big(what: str):
    raise ChatTemplateError(f"the chat template builds {what} longer than {MAX_CHARS:,} characters; "
                            "it is not rendered")


def _sized(x) -> int:
    return len(x) if isinstance(x, (str, list, tuple)) else 0


def _check_args(name: str, args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
            raise ChatTemplateError(f"the chat template passes {a} to {name}; at most {MAX_INT_ARG} is allowed")
        if _sized(a) > MAX_CHARS:
            _too_big("a value")


def _join_size(args, kwargs) -> int:
    """The length `join` would give (its value and separator after any context argument)."""
    value, rest = (args[1], args[2:]) if len(args) > 1 and not isinstance(args[0], (list, tuple, str)) \
        else (args[0], args[1:])
    sep = kwargs.get("d", rest[0] if rest else "")
    if kwargs.get("attribute") is not None or not isinstance(value, (list, tuple)):
        return 0
    return sum(len(x) if isinstance(x, str) else 0 for x in value) + len(str(sep)) * max(0, len(value) - 1)


def _bounded(name: str, f):
    @functools.wraps(f)  # keeps jinja2's marker on filters that take the context or environment
    def g(*args, **kwargs):
        _check_args(name, args[1:], kwargs)
        if name == "join" and _join_size(args, kwargs) > MAX_CHARS:  # refused before it allocates
            _too_big("a string")
        out = f(*args, **kwargs)
        if _sized(out) > MAX_CHARS:
            _too_big("a value")
        return out

    return g


def _bounded_join(seq) -> str:
    out, n = [], 0
    for x in seq:
        x = str(x)
        n += len(x)
        if n > MAX_CHARS:
            _too_big("a string")
        out.append(x)
    return "".join(out)


def _generation_extension():
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens for
    training masks): here the body is rendered as it is, in a scope of its own as there."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    return Generation


def _environment():
    from jinja2.ext import loopcontrols
    from jinja2.runtime import Macro
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        """jinja2's immutable sandbox (no attribute access to internals, no mutation of the caller's data)
        that also refuses a step that would build a huge value: `*`, `**`, `+`, `%`, `~`, filters and
        method calls."""
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                n = right if isinstance(left, (str, list, tuple)) else left
                size = _sized(left) or _sized(right)
                if isinstance(n, int) and size and n * size > MAX_CHARS:
                    _too_big("a repeated value")
            elif operator == "**":
                if isinstance(right, (int, float)) and abs(right) > 64 and isinstance(left, (int, float)) \
                        and abs(left) > 1:
                    raise ChatTemplateError(f"the chat template raises a number to the power {right}; "
                                            "it is not rendered")
            elif operator == "+" and _sized(left) + _sized(right) > MAX_CHARS:
                _too_big("a value")
            elif operator == "%" and isinstance(left, str) and re.search(r"%[-+ #0]*\d{6,}", left):
                raise ChatTemplateError("the chat template formats with a width over 99,999; it is not rendered")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own signature)
            # range has the sandbox's own bound (MAX_RANGE); a template's own macro takes any value (Gemma 4's
            # format_argument gets each tool-call argument, a timestamp too), its body bounded as the rest
            if __obj is not __self.globals.get("range") and not isinstance(__obj, Macro):
                _check_args(getattr(__obj, "__name__", "a function"), args, kwargs)
            out = super().call(__context, __obj, *args, **kwargs)
            if _sized(out) > MAX_CHARS:
                _too_big("a value")
            return out

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _generation_extension()])
    env.filters = {name: _bounded(name, f) for name, f in env.filters.items()}
    return env


def _check_variables(variables) -> dict:
    if variables is None:
        return {}
    if not isinstance(variables, dict):
        raise ChatTemplateError(f"chat template variables must be an object of names to values, got "
                                f"{type(variables).__name__}")
    for name in variables:
        if not isinstance(name, str) or not name.isidentifier():
            raise ChatTemplateError(f"chat template variable name {name!r} is not an identifier")
        if name in RESERVED:
            raise ChatTemplateError(f"chat template variable {name!r} is set by edgeinfer itself; it cannot be "
                                    "passed as a variable")
        if _sized(variables[name]) > MAX_CHARS:
            raise ChatTemplateError(f"chat template variable {name!r} is longer than {MAX_CHARS:,} characters")
    return variables


class _Deadline:
    """A trace function that stops a template's own code (its frames are named "<template>") once it has
    run for `seconds`: loops of any kind end, with a clear error."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.lines = 0

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename == "<template>":
            return self.line
        return None

    def line(self, frame, event, arg):
        self.lines += 1
        if not self.lines & 255 and time.monotonic() > self.end:
            raise ChatTemplateError(f"the chat template ran for more than {self.seconds:g} s; it is not rendered")
        return self.line


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "", fallback: str = CHATML):
        from jinja2 import TemplateError

        self.source = source or fallback
        self.is_fallback = source is None
        if len(self.source) > MAX_CHARS:
            raise ChatTemplateError(f"the chat template is {len(self.source):,} characters long; at most "
                                    f"{MAX_CHARS:,} are allowed")
        env = _environment()
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _bounded("tojson", _tojson)  # as transformers: plain JSON, not HTML-escaped
        try:
            self._template = env.from_string(self.source)
        except (TemplateError, RecursionError, MemoryError) as e:
            raise ChatTemplateError(f"the chat template does not parse: {e}") from None
        namespace = self._template.root_render_func.__globals__  # the compiled template's module
        namespace["str_join"] = namespace["markup_join"] = _bounded_join  # the `~` operator
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.is_gemma4 = GEMMA4_MARK in self.source
        self._gemma4_merge_tools = self.is_gemma4 and GEMMA4_TOOL_MESSAGES not in self.source

    @property
    def knows_tools(self) -> bool:
        """The template renders `tools` itself (otherwise edgeinfer.tools writes them into the prompt)."""
        return not self.is_fallback and "tools" in self.source

    def render(self, messages, add_generation_prompt: bool = True, tools: list[dict] | None = None,
               variables: dict | None = None) -> str:
        """The prompt text. variables: more names for the template, e.g. {"enable_thinking": False}
        (Qwen3: an empty think block, no reasoning) or {"date_string": "26 Jul 2024"} (Llama 3)."""
        from jinja2 import TemplateError

        messages = validate_messages(messages)
        if self._gemma4_merge_tools:
            messages = gemma4_tool_responses(messages)
        extra = dict(_check_variables(variables))
        if tools:
            extra["tools"] = tools
        previous = sys.gettrace()
        sys.settrace(_Deadline(RENDER_SECONDS))
        try:
            text = _bounded_join(self._template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra))
            if self.is_gemma4 and add_generation_prompt and text.endswith("<turn|>\n"):
                text += "<|turn>model\n"  # (llama.cpp: a turn ended after tool results, the model's opened)
            return text
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateError("the chat template recursed too deeply; it is not rendered") from None
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
                MemoryError) as e:
            raise ChatTemplateError(f"the chat template failed to render: {e}") from None
        finally:
            sys.settrace(previous)

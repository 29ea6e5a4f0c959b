"""Chat templates: the GGUF's `tokenizer.chat_template` rendered in a sandboxed jinja2 environment
the way Hugging Face transformers renders it; ChatML (or Gemma's turns) when the file has none."""

from __future__ import annotations

import json
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
ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(EdgeInferError, ValueError):
    """A chat template that fails to render, or messages it cannot take."""


def _raise(message):
    raise ChatTemplateError(f"the chat template raised: {message}")


def default_template(tokenizer) -> str:
    if "<start_of_turn>" in getattr(tokenizer, "_special_text", {}):
        return GEMMA
    return CHATML


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


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "", fallback: str = CHATML):
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = source or fallback
        self.is_fallback = source is None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson  # as transformers: plain JSON, not jinja2's HTML-escaped kind
        try:
            self._template = env.from_string(self.source)
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template does not parse: {e}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    @property
    def knows_tools(self) -> bool:
        """The template renders `tools` itself (otherwise edgeinfer.tools writes them into the prompt)."""
        return not self.is_fallback and "tools" in self.source

    def render(self, messages, add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
        from jinja2 import TemplateError

        messages = validate_messages(messages)
        extra = {"tools": tools} if tools else {}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"the chat template failed to render: {e}") from None

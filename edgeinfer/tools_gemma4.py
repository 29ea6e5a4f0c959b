"""Gemma 4's tool calls, as its chat template writes them and the model writes them back:

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>

The arguments are Gemma 4's own object syntax (the template's `format_argument` macro, which this
reads back): keys bare, strings between `<|"|>` marks (no escapes: anything but the mark is text,
commas, braces, quotes and newlines included), objects `{k:v,...}`, arrays `[v,...]`, JSON numbers,
`true`, `false`, `null`. The grammar is llama.cpp's peg-gemma4 tool-call grammar (common/parsers/gemma4.cpp,
its AST to JSON in chat-peg-parser.cpp): a key is any run of characters but `:` and `}` (so its blanks
are kept), blanks may follow `{`, `[`, `,` and `:` and precede `}` and `]`. Read more leniently than
llama.cpp, because the template can write them: blanks before `,`; a key in `<|"|>` marks (the
template's escape_keys), its marks dropped; `None` for null (what Python's Jinja prints for a null).

`read_call` reads one call at the start of a text and says where it ends; edgeinfer.tools turns it into
an OpenAI call (or keeps the block as text) for both the whole reply and the stream.
"""

from __future__ import annotations

import json
import math
import re

G_OPEN, G_CLOSE, QUOTE, CALL = "<|tool_call>", "<tool_call|>", '<|"|>', "call:"
_BLANKS = " \t\n\r"
_NAME = re.compile(r"[A-Za-z0-9_.-]*")  # edgeinfer's tool names (tools._NAME_RE)
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = re.compile(r"[-+.eE0-9]*")
_LITERALS = {"true": True, "false": False, "null": None, "None": None}
MAX_DEPTH = 64  # nesting of objects and arrays (deeper is malformed: no recursion without bound)
MAX_NAME = 64


class _Need(Exception):
    """The text ends before the call does: more text may complete it."""


class _Bad(Exception):
    """The text cannot be a call, whatever follows."""


class _Reader:
    def __init__(self, text: str, pos: int):
        self.s, self.pos = text, pos

    def _at_end(self) -> bool:
        return self.pos >= len(self.s)

    def blanks(self) -> None:
        while self.pos < len(self.s) and self.s[self.pos] in _BLANKS:
            self.pos += 1

    def literal(self, lit: str) -> None:
        if self.s.startswith(lit, self.pos):
            self.pos += len(lit)
            return
        raise _Need if lit.startswith(self.s[self.pos:]) else _Bad

    def peek(self) -> str:
        if self._at_end():
            raise _Need
        return self.s[self.pos]

    def string(self) -> str:
        self.literal(QUOTE)
        end = self.s.find(QUOTE, self.pos)
        if end < 0:
            raise _Need
        out, self.pos = self.s[self.pos:end], end + len(QUOTE)
        return out

    def value(self, depth: int):
        c = self.peek()
        if c == "{":
            return self.obj(depth + 1)
        if c == "[":
            return self.array(depth + 1)
        if c == "<":
            return self.string()
        if c in "-0123456789":
            run = _NUMBER_CHARS.match(self.s, self.pos).group()
            if self.pos + len(run) >= len(self.s):
                raise _Need  # the number may go on
            if not _NUMBER.fullmatch(run):
                raise _Bad
            self.pos += len(run)
            v = json.loads(run)
            if isinstance(v, float) and not math.isfinite(v):
                raise _Bad  # (1e999: no JSON for it)
            return v
        for word, v in _LITERALS.items():
            if self.s.startswith(word, self.pos):
                self.pos += len(word)
                return v
            if word.startswith(self.s[self.pos:]):
                raise _Need
        raise _Bad

    def key(self) -> str:
        if self.s.startswith(QUOTE, self.pos):
            k = self.string()
            self.literal(":")
            return k
        start = self.pos
        while self.pos < len(self.s) and self.s[self.pos] not in ":}":
            self.pos += 1
        if self._at_end():
            raise _Need
        if self.pos == start or self.s[self.pos] != ":":
            raise _Bad
        self.pos += 1
        return self.s[start:self.pos - 1]

    def _items(self, close: str, depth: int, item) -> None:
        if depth > MAX_DEPTH:
            raise _Bad
        self.pos += 1  # the opening bracket
        self.blanks()
        if self.peek() == close:
            self.pos += 1
            return
        while True:
            item()
            self.blanks()
            c = self.peek()
            self.pos += 1
            if c == close:
                return
            if c != ",":
                raise _Bad
            self.blanks()

    def obj(self, depth: int) -> dict:
        out: dict = {}

        def member():
            k = self.key()
            self.blanks()
            out[k] = self.value(depth)

        self._items("}", depth, member)
        return out

    def array(self, depth: int) -> list:
        out: list = []
        self._items("]", depth, lambda: out.append(self.value(depth)))
        return out


def _parse(text: str) -> tuple[int, str, dict]:
    """(end, name, arguments) of the call that opens text; _Need or _Bad when there is none."""
    r = _Reader(text, 0)
    r.literal(G_OPEN)
    r.literal(CALL)
    name = _NAME.match(text, r.pos).group()
    r.pos += len(name)
    if len(name) > MAX_NAME:
        raise _Bad
    if r.peek() != "{" or not name:
        raise _Bad
    args = r.obj(1)
    r.literal(G_CLOSE)
    return r.pos, name, args


def read_call(text: str, final: bool) -> tuple[int, str | None, dict | None] | None:
    """The Gemma 4 call that opens `text` (it starts with G_OPEN): (end, name, arguments). Malformed:
    (end, None, None), the block to keep as text running to its `<tool_call|>` or up to the next
    `<|tool_call>`. None: more text is needed to tell (never when final: the text is all there is).
    What it returns for a text never changes once it returns something for a prefix of it, so a
    stream cut anywhere reads as the whole text does."""
    try:
        return _parse(text)
    except _Need:
        if not final:
            return None
    except _Bad:
        pass
    ends = [k + len(G_CLOSE) for k in [text.find(G_CLOSE, len(G_OPEN))] if k >= 0]
    ends += [k for k in [text.find(G_OPEN, len(G_OPEN))] if k >= 0]
    if ends:
        return min(ends), None, None
    return (len(text), None, None) if final else None

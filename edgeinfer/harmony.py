"""gpt-oss's output in OpenAI's "harmony" format, apart into its channels: the reasoning (channel `analysis`),
the answer (`final`, and `commentary` without a recipient: a preamble the user sees) and tool calls (a
`commentary` message to `functions.NAME`), as llama.cpp's gpt-oss chat parser and vLLM's harmony parser
give them. HTTP-free: the OpenAI chat endpoint and Ollama's /api/chat use it, through `parser_for`.

A reply is a run of messages, each a header, `<|message|>`, a body and a terminator:

    <|channel|>analysis<|message|>The user asks ...<|end|>
    <|start|>assistant<|channel|>final<|message|>It is 20 C in Paris.<|return|>
    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The header may also put the recipient first (`<|start|>assistant to=functions.get_weather<|channel|>
commentary json`). The text must keep the control tokens (the engine decodes them for a harmony request:
SamplingParams.special_text); `<|return|>` and `<|call|>` end the generation (tokenizer.stop_ids), so a
reply's last terminator is usually not in the text: `finish` settles the last message.

`HarmonyParser` has reasoning.ReasoningParser's interface (feed text deltas, get ("reasoning", str) and
("content", str) pieces; finish once): a tool call comes out as content in the Hermes form that
tools.StreamParser and tools.parse_reply read (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`),
so calls reach both APIs as every other model's do. Text outside any header (a model that skips the
format) is content, as it is.
"""

from __future__ import annotations

import json
import re

from .reasoning import CONTENT, REASONING, ReasoningParser, _partial_suffix, split_reasoning

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END_TAGS = ("<|end|>", "<|return|>", "<|call|>")
_RECIPIENT = re.compile(r"to=(\S+?)(?=\s|<\||$)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")


def is_harmony(template_source: str | None) -> bool:
    """Does a chat template write the harmony format (gpt-oss's)?"""
    return bool(template_source) and CHANNEL in template_source and MESSAGE in template_source


class HarmonyParser:
    """Harmony text deltas in, ("reasoning", str) and ("content", str) pieces out (see the module's
    docstring); reasoning=False: the analysis channel comes out as content too (--reasoning-format none)."""

    def __init__(self, reasoning: bool = True):
        self._reasoning = reasoning
        self._buf = ""
        self._kind: str | None = None  # the current message's: REASONING, CONTENT, a tool's name, or None: a header
        self._call = ""  # a tool call's arguments so far

    def _header(self, header: str) -> str:
        # the kind of the message this header opens
        to = _RECIPIENT.search(header)
        if to and to.group(1).startswith("functions."):
            return "tool:" + to.group(1)[len("functions."):]
        m = _CHANNEL.search(header)
        channel = m.group(1) if m else "final"
        return REASONING if channel == "analysis" and self._reasoning else CONTENT

    def _emit(self, text: str, out: list) -> None:
        if not text:
            return
        if self._kind.startswith("tool:"):
            self._call += text
        elif out and out[-1][0] == self._kind:
            out[-1] = (self._kind, out[-1][1] + text)
        else:
            out.append((self._kind, text))

    def _close(self, out: list) -> None:
        # the current message ends: a tool call's whole body becomes a <tool_call> block
        if self._kind is not None and self._kind.startswith("tool:"):
            try:
                args = json.loads(self._call) if self._call.strip() else {}
            except ValueError:
                args = self._call  # malformed: kept as text, so tools.parse_reply can report it, not lost
            call = json.dumps({"name": self._kind[5:], "arguments": args}, ensure_ascii=False)
            out.append((CONTENT, f"<tool_call>\n{call}\n</tool_call>"))
        self._kind, self._call = None, ""

    def feed(self, delta: str) -> list[tuple[str, str]]:
        self._buf += delta
        out: list[tuple[str, str]] = []
        while self._buf:
            if self._kind is None:  # a header, up to <|message|>
                s = self._buf.lstrip()
                if not s.startswith("<|") and not "<|".startswith(s) and MESSAGE not in s:
                    self._kind = CONTENT  # no header: plain text
                    continue
                k = self._buf.find(MESSAGE)
                if k < 0:
                    return out
                self._kind = self._header(self._buf[:k])
                self._buf = self._buf[k + len(MESSAGE):]
                continue
            ends = [(k, tag) for tag in END_TAGS if (k := self._buf.find(tag)) >= 0]
            if ends:
                k, tag = min(ends)
                self._emit(self._buf[:k], out)
                self._buf = self._buf[k + len(tag):]
                self._close(out)
                continue
            hold = max(_partial_suffix(self._buf, tag) for tag in END_TAGS)
            self._emit(self._buf[:len(self._buf) - hold], out)
            self._buf = self._buf[len(self._buf) - hold:]
            return out
        return out

    def finish(self) -> list[tuple[str, str]]:
        """What was held back, once the reply is complete: the last message ends with the reply."""
        out: list[tuple[str, str]] = []
        rest, self._buf = self._buf, ""
        if self._kind is None:  # a header that never reached <|message|>: nothing to show
            return out
        self._emit(rest, out)
        self._close(out)
        return out


def parser_for(gen):
    """The stream parser of a chat generation (handlers.Generation) that has one: harmony's for a harmony
    model, else reasoning.ReasoningParser; None where the reply goes out as it is."""
    if gen.harmony:
        return HarmonyParser(gen.reasoning)
    return ReasoningParser(gen.reasoning_open) if gen.reasoning else None


def split_for(gen, text: str) -> tuple[str | None, str]:
    """A whole reply as (reasoning or None, content) by parser_for's rules."""
    if gen.harmony:
        return split_harmony(text, gen.reasoning)
    return split_reasoning(text, gen.reasoning_open) if gen.reasoning else (None, text)


def split_harmony(text: str, reasoning: bool = True) -> tuple[str | None, str]:
    """A whole harmony reply as (reasoning or None, content with any tool calls as <tool_call> blocks)."""
    p = HarmonyParser(reasoning)
    parts = {REASONING: [], CONTENT: []}
    for kind, piece in p.feed(text) + p.finish():
        parts[kind].append(piece)
    return "".join(parts[REASONING]) or None, "".join(parts[CONTENT])

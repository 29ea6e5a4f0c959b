"""A thinking model's reasoning apart from its answer: the text inside `<think>`...`</think>` (Qwen3,
DeepSeek-R1 and its distills, QwQ), as llama.cpp's `--reasoning-format deepseek` and vLLM's reasoning
parsers give it. HTTP-free: the OpenAI chat endpoint (`reasoning_content`) and Ollama's /api/chat
(`message.thinking`) both use it.

The rules (llama.cpp's):

- A reply thinks only when it opens with `<think>` (blanks before it are fine); `<think>` later in a
  reply is plain text, and so is everything of a reply that does not open with it.
- A prompt that already ends inside an open `<think>` (templates that open the block for the model:
  DeepSeek-R1, Qwen3's thinking variants) starts in the block; a `<think>` the model writes again at
  the very start is dropped.
- The block ends at the first `</think>` (a `<think>` inside it is reasoning text); the reasoning is
  stripped of surrounding blanks, and so is the start of the answer after it.
- A block that never closes is all reasoning: the answer is empty.
- Empty reasoning (`<think></think>`, or only blanks) is no reasoning: None.

`ReasoningParser` does this for a stream of text deltas, holding back what could still be part of a
tag (`<thi`, `</th`) or trailing blanks of the reasoning until the next delta settles it, so a tag is
never split between reasoning and answer, and the pieces it gives join to exactly what
`split_reasoning` gives for the whole text.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
REASONING, CONTENT = "reasoning", "content"
FORMATS = ("auto", "none", "deepseek")  # the server's --reasoning-format


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """Text deltas in, ("reasoning", str) and ("content", str) pieces out: feed() each delta, finish()
    once at the end. in_reasoning: the prompt ends inside an open <think> (see prompt_opens_reasoning)."""

    def __init__(self, in_reasoning: bool = False):
        self._forced = in_reasoning
        self._state = "start"  # "start" (has the reply opened a block?), REASONING or CONTENT
        self._buf = ""  # text held back
        self._lead = True  # the current part's leading blanks are still being dropped

    def feed(self, delta: str) -> list[tuple[str, str]]:
        self._buf += delta
        out: list[tuple[str, str]] = []
        while True:
            if self._state == "start":
                s = self._buf.lstrip()
                if s.startswith(OPEN):
                    self._buf, self._state, self._lead = s[len(OPEN):], REASONING, True
                    continue
                if OPEN.startswith(s):  # blanks, or the start of "<think>": not settled yet
                    return out
                self._state = REASONING if self._forced else CONTENT
                self._lead = self._forced  # a reply that does not think is left exactly as it is
                continue
            if self._lead:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return out
                self._lead = False
            if self._state == CONTENT:
                if self._buf:
                    out.append((CONTENT, self._buf))
                self._buf = ""
                return out
            k = self._buf.find(CLOSE)
            if k >= 0:
                piece = self._buf[:k].rstrip()
                if piece:
                    out.append((REASONING, piece))
                self._buf, self._state, self._lead = self._buf[k + len(CLOSE):], CONTENT, True
                continue
            # hold a partial "</think" and the blanks before it: they may end the reasoning
            body = self._buf[:len(self._buf) - _partial_suffix(self._buf, CLOSE)]
            keep = len(body.rstrip())
            if keep:
                out.append((REASONING, self._buf[:keep]))
                self._buf = self._buf[keep:]
            return out

    def finish(self) -> list[tuple[str, str]]:
        """What was held back, once the reply is complete."""
        rest, self._buf = self._buf, ""
        if self._state == "start":  # only blanks or a partial "<think>": text as it is (or reasoning)
            if not self._forced:
                return [(CONTENT, rest)] if rest else []
            rest = rest.strip()
            return [(REASONING, rest)] if rest else []
        if self._lead:  # nothing of this part given yet
            rest = rest.strip()
        elif self._state == REASONING:  # a partial "</think" that never closed, and blanks before it
            rest = rest.rstrip()
        return [(self._state, rest)] if rest else []


def split_reasoning(text: str, in_reasoning: bool = False) -> tuple[str | None, str]:
    """A whole reply as (reasoning or None, answer), by the rules above."""
    p = ReasoningParser(in_reasoning)
    parts = {REASONING: [], CONTENT: []}
    for kind, piece in p.feed(text) + p.finish():
        parts[kind].append(piece)
    return "".join(parts[REASONING]) or None, "".join(parts[CONTENT])


def template_thinks(template_source: str | None) -> bool:
    """Does a chat template write <think> blocks (a model that reasons)? --reasoning-format auto asks."""
    return bool(template_source) and OPEN in template_source


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Does a rendered prompt end inside an open <think> (the template opened it for the model)?"""
    return prompt_text.rstrip().endswith(OPEN)


def splits(reasoning_format: str, template_source: str | None) -> bool:
    """Whether replies are split for a server's --reasoning-format: "deepseek" always, "none" never,
    "auto" when the model's template thinks."""
    if reasoning_format not in FORMATS:
        raise ValueError(f"reasoning_format must be one of {', '.join(FORMATS)}, got {reasoning_format!r}")
    return reasoning_format == "deepseek" or (reasoning_format == "auto" and template_thinks(template_source))

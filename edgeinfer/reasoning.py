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

Gemma 4 (format "gemma4") writes its reasoning as `<|channel>thought` ... `<channel|>` (two
user-defined tokens, so their text is in the reply); its rules are llama.cpp's peg-gemma4 parser's
(common/chat.cpp):

- a block may open anywhere in the reply, and every block is reasoning (their texts joined); extra
  `<|channel>` before `<|channel>thought` are dropped;
- the blanks after `thought` are dropped, nothing else: neither the reasoning's trailing blanks nor
  the answer's blanks around a block;
- a `<channel|>` outside a block, or a `<|channel>` not followed by `thought`, ends the reply: what
  follows is dropped; so is a partial tag at its very end (`<|chan`, `<|channel>th`, `<channel`);
- a block that never closes is all reasoning; whitespace-only reasoning is none.

prompt_opens_reasoning tells a Gemma 4 prompt (it has `<|turn>`, `<|channel>` or a tool token) by
what it returns: a `ReplyStart` whose `fmt` is "gemma4", false as a bool unless the prompt ends inside
an open block; ReasoningParser and split_reasoning take it as `in_reasoning` and follow its format
(so the server, which passes that answer on, reads Gemma 4 replies by Gemma 4's rules).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
REASONING, CONTENT = "reasoning", "content"
FORMATS = ("auto", "none", "deepseek")  # the server's --reasoning-format
THINK, GEMMA4 = "think", "gemma4"  # the reply formats ReasoningParser reads
CHANNEL, CHANNEL_END, THOUGHT = "<|channel>", "<channel|>", "thought"  # Gemma 4's block: <|channel>thought...<channel|>
# Gemma 4's control and user-defined tokens that end its prompts: one of them is in any prompt's last tokens
GEMMA4_MARKS = ("<|turn>", "<turn|>", CHANNEL, CHANNEL_END, "<|tool_response>", "<tool_response|>", "<tool_call|>")
_ASCII_BLANKS = " \t\n\v\f\r"  # what llama.cpp's parser skips after `thought` (isspace)


class ReplyStart:
    """How a rendered prompt leaves the reply, for formats other than <think>: `fmt` (GEMMA4) and
    whether the reply starts inside a reasoning block (its truth value, as prompt_opens_reasoning's bool)."""

    __slots__ = ("fmt", "inside")

    def __init__(self, fmt: str, inside: bool = False):
        self.fmt, self.inside = fmt, bool(inside)

    def __bool__(self) -> bool:
        return self.inside

    def __eq__(self, other) -> bool:
        if isinstance(other, ReplyStart):
            return (self.fmt, self.inside) == (other.fmt, other.inside)
        return isinstance(other, bool) and other == self.inside

    def __hash__(self) -> int:
        return hash((self.fmt, self.inside))

    def __repr__(self) -> str:
        return f"ReplyStart({self.fmt!r}, inside={self.inside})"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """Text deltas in, ("reasoning", str) and ("content", str) pieces out: feed() each delta, finish()
    once at the end. in_reasoning: the prompt ends inside an open block (see prompt_opens_reasoning;
    a ReplyStart also names the format). fmt: THINK or GEMMA4, over in_reasoning's."""

    def __init__(self, in_reasoning: bool | ReplyStart = False, fmt: str | None = None):
        self.fmt = fmt or getattr(in_reasoning, "fmt", THINK)
        if self.fmt not in (THINK, GEMMA4):
            raise ValueError(f"reasoning format must be {THINK!r} or {GEMMA4!r}, got {self.fmt!r}")
        self._forced = bool(in_reasoning)
        self._state = "start"  # "start" (has the reply opened a block?), REASONING or CONTENT
        self._buf = ""  # text held back
        self._lead = True  # the current part's leading blanks are still being dropped
        if self.fmt == GEMMA4:
            self._state = REASONING if self._forced else CONTENT

    def feed(self, delta: str) -> list[tuple[str, str]]:
        if self.fmt == GEMMA4:
            return self._feed_gemma4(delta)
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

    def _feed_gemma4(self, delta: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self._state == "end":
            return out
        buf = self._buf + delta
        while True:
            if self._state == CONTENT:
                k_open, k_end = buf.find(CHANNEL), buf.find(CHANNEL_END)
                if k_end >= 0 and (k_open < 0 or k_end < k_open):  # a close outside a block ends the reply
                    _put(out, CONTENT, buf[:k_end])
                    self._state, buf = "end", ""
                    break
                if k_open < 0:  # hold what may be the start of a tag
                    hold = max(_partial_suffix(buf, CHANNEL), _partial_suffix(buf, CHANNEL_END))
                    _put(out, CONTENT, buf[:len(buf) - hold])
                    buf = buf[len(buf) - hold:]
                    break
                _put(out, CONTENT, buf[:k_open])
                buf = buf[k_open:]
                j = 0
                while buf.startswith(CHANNEL, j):  # <|channel> not followed by `thought` is skipped
                    j += len(CHANNEL)
                rest = buf[j:]
                if rest.startswith(THOUGHT):
                    buf, self._state, self._lead = rest[len(THOUGHT):], REASONING, True
                    continue
                if THOUGHT.startswith(rest) or CHANNEL.startswith(rest):
                    break  # not settled yet
                self._state, buf = "end", ""  # another channel: llama.cpp's parser stops there
                break
            if self._lead:
                buf = buf.lstrip(_ASCII_BLANKS)
                if not buf:
                    break
                self._lead = False
            k = buf.find(CHANNEL_END)
            if k >= 0:
                _put(out, REASONING, buf[:k])
                buf, self._state = buf[k + len(CHANNEL_END):], CONTENT
                continue
            hold = _partial_suffix(buf, CHANNEL_END)
            _put(out, REASONING, buf[:len(buf) - hold])
            buf = buf[len(buf) - hold:]
            break
        self._buf = buf
        return out

    def finish(self) -> list[tuple[str, str]]:
        """What was held back, once the reply is complete."""
        if self.fmt == GEMMA4:  # only a partial tag, or the blanks after `thought`: dropped, as llama.cpp does
            self._buf = ""
            return []
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


def _put(out: list, kind: str, text: str) -> None:
    if text:
        out.append((kind, text))


def split_reasoning(text: str, in_reasoning: bool | ReplyStart = False, fmt: str | None = None) -> tuple[str | None, str]:
    """A whole reply as (reasoning or None, answer), by the rules above."""
    p = ReasoningParser(in_reasoning, fmt)
    parts = {REASONING: [], CONTENT: []}
    for kind, piece in p.feed(text) + p.finish():
        parts[kind].append(piece)
    return "".join(parts[REASONING]) or None, "".join(parts[CONTENT])


def template_thinks(template_source: str | None) -> bool:
    """Does a chat template write <think> blocks, or Gemma 4's thought channel (a model that reasons)?
    --reasoning-format auto asks."""
    return bool(template_source) and (OPEN in template_source or CHANNEL + THOUGHT in template_source)


def template_format(template_source: str | None) -> str:
    """The reply format of a chat template's model: GEMMA4 for Gemma 4's thought channel, else THINK."""
    return GEMMA4 if template_source and CHANNEL + THOUGHT in template_source else THINK


def prompt_opens_reasoning(prompt_text: str, fmt: str | None = None) -> bool | ReplyStart:
    """Does a rendered prompt end inside an open <think> (the template opened it for the model)? For a
    Gemma 4 prompt a ReplyStart of format GEMMA4, true when the prompt ends inside an open thought channel
    (a reply continued from its reasoning). fmt: the template's format (template_format), as the server
    passes it, so that another model's prompt quoting Gemma 4's tokens is not read as Gemma 4's; None: told
    by the prompt (one with Gemma 4's turn, channel or tool tokens)."""
    if fmt == GEMMA4 or (fmt is None and any(mark in prompt_text for mark in GEMMA4_MARKS)):
        k = prompt_text.rfind(CHANNEL + THOUGHT)
        return ReplyStart(GEMMA4, k >= 0 and CHANNEL_END not in prompt_text[k:])
    return prompt_text.rstrip().endswith(OPEN)


def splits(reasoning_format: str, template_source: str | None) -> bool:
    """Whether replies are split for a server's --reasoning-format: "deepseek" always, "none" never,
    "auto" when the model's template thinks."""
    if reasoning_format not in FORMATS:
        raise ValueError(f"reasoning_format must be one of {', '.join(FORMATS)}, got {reasoning_format!r}")
    return reasoning_format == "deepseek" or (reasoning_format == "auto" and template_thinks(template_source))

"""Over the layout's 450 lines, kept as one file for now: reading bodies and building replies are the two
halves it should be split into next (issue 35's closing note says so).

Ollama's API (docs/api.md of github.com/ollama/ollama) over the same machinery as the OpenAI routes:
its request bodies read into our request objects (protocol.ParsedRequest, handlers.Generation), and its
response objects built from what the engine produced. Pure functions and one small per-request builder:
no HTTP (edgeinfer.server.ollama sends them).

Where Ollama and this server differ, the difference is decided here, once:
- `options` carry Ollama's sampling names; Ollama's defaults apply when absent (temperature 0.8, top_k 40,
  top_p 0.9); runner options (num_ctx, num_gpu, ...) are accepted and ignored; an option that would change
  the answer in a way this server cannot (mirostat, typical_p, tfs_z away from their neutral values) and
  an unknown option key are 400s naming them.
- /api/generate renders the prompt (and `system`) through the model's chat template as one user turn, as
  Ollama does; `raw` sends it as it is; `context` (the token ids a previous reply returned) goes in front;
  `suffix` builds a fill-in-the-middle prompt when the model has FIM tokens. A custom `template` is refused.
- Unknown top-level fields are ignored (as Ollama does: clients of different versions send different ones).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .. import reasoning
from . import handlers as H
from . import protocol as P

# -- small readers --------------------------------------------------------------------------------


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt(body: dict, key: str, check, what: str, default=None):
    """body[key] when present and not null, checked by `check`; else default. A 400 naming the key."""
    v = body.get(key)
    if v is None:
        return default
    if not check(v):
        raise P.bad(key, f"'{key}' must be {what}, got {json.dumps(v)[:60]}")
    return v


def _bool(body: dict, key: str, default=None):
    return _opt(body, key, lambda v: isinstance(v, bool), "true or false", default)


def _str(body: dict, key: str, default=None):
    return _opt(body, key, lambda v: isinstance(v, str), "a string", default)


def parse_model(body, key: str = "model") -> str:
    """The model a body names, as this server calls it: Ollama's default tag ':latest' dropped
    ("smollm2:latest" is "smollm2"). Older clients send it as "name"."""
    if not isinstance(body, dict):
        raise P.APIError(400, "the request body must be a JSON object")
    name = body.get(key)
    if name is None and key == "model":
        name = body.get("name")
    if not isinstance(name, str) or not name:
        raise P.bad(key, f"'{key}' must be a model name, e.g. \"smollm2-135m-instruct\"")
    return name[:-len(":latest")] if name.endswith(":latest") else name


_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(body: dict) -> float | None:
    """keep_alive in seconds: a number of seconds, or a Go duration string ("5m", "1h30m", "0", "-1",
    also a plain number as a string); negative: keep the model loaded. None when absent."""
    v = body.get("keep_alive")
    if v is None:
        return None
    if _is_num(v) and math.isfinite(v):
        return -1.0 if v < 0 else float(v)
    if isinstance(v, str):
        s = v.strip()
        sign, s = (-1.0, s[1:]) if s.startswith("-") else (1.0, s.lstrip("+"))
        try:
            seconds = float(s)
        except ValueError:
            parts = _DURATION.findall(s)
            if not parts or "".join(n + u for n, u in parts) != s:
                seconds = None
            else:
                seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        if seconds is not None and math.isfinite(seconds):
            return -1.0 if sign < 0 and seconds > 0 else seconds
    raise P.bad("keep_alive", f"'keep_alive' must be seconds or a duration like \"5m\", \"1h\", \"0\" or \"-1\", "
                              f"got {json.dumps(v)[:40]}")


# -- options --------------------------------------------------------------------------------------

# Ollama's option -> SamplingParams' field, and whether it is an integer
_SAMPLING = {"temperature": ("temperature", False), "top_p": ("top_p", False), "top_k": ("top_k", True),
             "min_p": ("min_p", False), "seed": ("seed", True), "repeat_penalty": ("repetition_penalty", False),
             "repeat_last_n": ("repeat_last_n", True), "presence_penalty": ("presence_penalty", False),
             "frequency_penalty": ("frequency_penalty", False)}
# Ollama's defaults where they differ from SamplingParams'
_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# how the model is loaded and run: nothing here changes an answer, so they are accepted and ignored
_RUNNER = {"numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
           "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "penalize_newline",
           "draft_num_predict", "mirostat_tau", "mirostat_eta"}  # the last two matter only with mirostat
# samplers this server does not have: accepted only at the value that leaves them off
_NEUTRAL = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
_FIELD_TO_OPTION = {f: o for o, (f, _) in _SAMPLING.items()}


@dataclass
class Options:
    kwargs: dict  # SamplingParams keyword arguments
    num_predict: int | None  # None: to the context's end


def parse_options(body: dict) -> Options:
    """`options` as SamplingParams keyword arguments and num_predict. A 400 naming options.KEY for an
    unknown key, a value of the wrong type, or a sampler this server does not have."""
    opts = body.get("options")
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise P.bad("options", "'options' must be an object of Ollama's model parameters, e.g. {\"temperature\": 0}")
    kwargs = dict(_DEFAULTS)
    num_predict = None
    for key, v in opts.items():
        where = f"options.{key}"
        if v is None:
            continue
        if key in _SAMPLING:
            name, integer = _SAMPLING[key]
            if not (_is_int(v) if integer else _is_num(v) and math.isfinite(v)):
                what = "an integer" if integer else "a number"
                raise P.bad(where, f"'{where}' must be {what}, got {json.dumps(v)[:40]}")
            v = int(v) if integer else float(v)
            if key == "seed":
                v = None if v < 0 else v  # Ollama's -1: a random seed
            elif key == "top_k":
                v = max(0, v)  # 0 or negative: off
            kwargs[name] = v
        elif key == "num_predict":
            if not _is_int(v) or not (int(v) >= 1 or int(v) in (-1, -2)):
                raise P.bad(where, f"'{where}' must be a number of tokens >= 1, or -1 (to the context's end), "
                                   f"got {json.dumps(v)[:40]}")
            num_predict = int(v) if int(v) >= 1 else None
        elif key == "stop":
            stops = [v] if isinstance(v, str) else v
            if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
                raise P.bad(where, f"'{where}' must be a list of non-empty strings")
            kwargs["stop"] = tuple(stops)
        elif key in _NEUTRAL:
            if not _is_num(v) or float(v) != _NEUTRAL[key]:
                raise P.bad(where, f"'{where}' is {json.dumps(v)[:40]}: this server has no {key} sampler "
                                   f"(only {_NEUTRAL[key]!r}, off, is accepted)")
        elif key in _RUNNER:
            continue
        else:
            raise P.bad(where, f"unknown option '{key}'; the sampling options are "
                               f"{', '.join(sorted([*_SAMPLING, 'num_predict', 'stop']))}")
    return Options(kwargs, num_predict)


def parse_format(body: dict) -> tuple[dict, str | None]:
    """`format` as SamplingParams' constraint: "json" (any JSON object) or a JSON schema; "" or absent: none."""
    f = body.get("format")
    if f is None or f == "":
        return {}, None
    if f == "json":
        return {"json_schema": {"type": "object"}}, "format"
    if isinstance(f, dict):
        return {"json_schema": f}, "format"
    raise P.bad("format", "'format' must be \"json\" or a JSON schema object")


# -- generation requests --------------------------------------------------------------------------

THINK_LEVELS = ("low", "medium", "high", "max")


@dataclass
class OllamaRequest:
    """An /api/chat or /api/generate body, read."""

    model: str
    chat: bool
    stream: bool
    keep_alive: float | None
    parsed: P.ParsedRequest  # the sampling parameters and constraint; max_tokens left to num_predict
    num_predict: int | None
    load_only: bool  # no messages / empty prompt: Ollama's call that loads (or, keep_alive 0, unloads) a model
    messages: list = field(default_factory=list)  # chat: in OpenAI's shape, for handlers.prepare_generation
    tools: list | None = None
    prompt: str = ""
    system: str = ""
    suffix: str = ""
    raw: bool = False
    context: list = field(default_factory=list)
    think: bool | str | None = None  # false: a thinking model's reply is not split (levels are not applied)

    @property
    def unload(self) -> bool:
        return self.load_only and self.keep_alive == 0


def _common(body) -> tuple[str, dict]:
    """What /api/chat and /api/generate share: the model, stream, think, options, format, logprobs and
    keep_alive; the sampling parameters as a ParsedRequest (max_tokens is num_predict's, set later)."""
    model = parse_model(body)
    stream = _bool(body, "stream", True)  # Ollama streams unless told not to
    think = body.get("think")
    if think is not None and not isinstance(think, bool) and think not in THINK_LEVELS:
        raise P.bad("think", f"'think' must be true, false or one of {', '.join(THINK_LEVELS)}")
    opts = parse_options(body)
    constraint, constraint_param = parse_format(body)
    logprobs = _bool(body, "logprobs", False)
    top = _opt(body, "top_logprobs", lambda v: _is_int(v) and 0 <= v <= 20, "an integer from 0 to 20", 0)
    if top and not logprobs:
        raise P.bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    kwargs = {**opts.kwargs, **constraint, "logprobs": int(top) if logprobs else None}
    parsed = P.ParsedRequest(model=model, stream=stream, include_usage=False, max_tokens=None, params_kwargs=kwargs,
                             logprobs=logprobs, top_logprobs=int(top), constraint_param=constraint_param)
    return model, dict(stream=stream, keep_alive=parse_keep_alive(body), parsed=parsed, num_predict=opts.num_predict,
                       think=think)


def _images(v, where: str) -> None:
    if v is not None and v != []:
        raise P.bad(where, f"'{where}': this server has no vision models; images are not supported")


def _message(m, i: int) -> dict:
    """One Ollama chat message in the OpenAI shape protocol.parse_messages reads: tool calls with an id
    and their arguments object, a tool result's tool_name as its name."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise P.bad(where, f"{where} must be an object with 'role' and 'content'")
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise P.bad(f"{where}.role",
                    f"{where}.role must be system, user, assistant or tool, got {json.dumps(role)[:40]}")
    content = m.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise P.bad(f"{where}.content", f"{where}.content must be a string")
    _images(m.get("images"), f"{where}.images")
    out = {"role": role, "content": content}
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise P.bad(f"{where}.tool_calls", f"{where}.tool_calls must be an array, on an assistant message")
        conv = []
        for j, c in enumerate(calls):
            f = c.get("function") if isinstance(c, dict) else None
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) \
                    or not isinstance(f.get("arguments", {}), (dict, str)):
                raise P.bad(f"{where}.tool_calls[{j}]", f"{where}.tool_calls[{j}] must be "
                                                         "{\"function\": {\"name\": ..., \"arguments\": {...}}}")
            conv.append({"id": c.get("id") or f"call_{i}_{j}", "type": "function",
                         "function": {"name": f["name"], "arguments": f.get("arguments", {})}})
        out["tool_calls"] = conv
    name = m.get("tool_name")
    if name is not None:
        if not isinstance(name, str):
            raise P.bad(f"{where}.tool_name", f"{where}.tool_name must be a string")
        out["name"] = name
    return out


def parse_chat(body) -> OllamaRequest:
    """/api/chat: model, messages (none: a load call), tools, format, options, stream, keep_alive, think."""
    model, common = _common(body)
    msgs = body.get("messages")
    if msgs is None:
        msgs = []
    if not isinstance(msgs, list):
        raise P.bad("messages", "'messages' must be an array of {role, content} objects")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise P.bad("tools", "'tools' must be an array of {type: function, function: {...}} objects")
    return OllamaRequest(model, True, load_only=not msgs, messages=[_message(m, i) for i, m in enumerate(msgs)],
                         tools=tools or None, **common)


def parse_generate(body) -> OllamaRequest:
    """/api/generate: model, prompt (empty: a load call), system, suffix, raw, context, format, options,
    stream, keep_alive, think; a custom template and images are refused."""
    model, common = _common(body)
    prompt, system, suffix = _str(body, "prompt", ""), _str(body, "system", ""), _str(body, "suffix", "")
    if _str(body, "template", ""):
        raise P.bad("template", "a custom 'template' is not supported: the model's own chat template is used "
                                "(or send 'raw': true with a prompt formatted already)")
    _images(body.get("images"), "images")
    raw = _bool(body, "raw", False)
    context = _opt(body, "context", lambda v: isinstance(v, list) and all(_is_int(t) for t in v),
                   "an array of token ids (a previous reply's context)", [])
    if raw and (system or context or suffix):
        raise P.bad("raw", "'raw' sends the prompt as it is: it cannot be combined with 'system', 'context' or "
                           "'suffix'")
    if suffix and (system or context):
        raise P.bad("suffix", "a fill-in-the-middle ('suffix') cannot be combined with 'system' or 'context'")
    return OllamaRequest(model, False, load_only=not prompt, prompt=prompt, system=system, suffix=suffix, raw=raw,
                         context=[int(t) for t in context], **common)


def _generate_body(llm, req: OllamaRequest) -> dict:
    """What handlers.prepare_generation reads for a completion: the prompt's token ids (through the chat
    template unless raw, after the context), or the prompt and suffix of a fill-in-the-middle."""
    tok = llm.tokenizer
    if req.suffix:
        return {"prompt": req.prompt, "suffix": req.suffix}
    if req.raw:
        return {"prompt": req.prompt}
    msgs = [{"role": "system", "content": req.system}] if req.system else []
    msgs.append({"role": "user", "content": req.prompt})
    try:
        ids = llm.render_chat(msgs, True)
    except ValueError as e:
        raise P.bad("prompt", str(e)) from None
    if req.context:
        P.check_token_ids(req.context, tok.vocab_size, "context")
        if tok.bos_id is not None and ids and ids[0] == tok.bos_id:
            ids = ids[1:]  # the conversation's BOS is at the front of its context already
        ids = req.context + ids
    return {"prompt": ids}


def prepare(llm, name: str, req: OllamaRequest, reasoning_format: str = "auto") -> H.Generation:
    """The engine's request (handlers.Generation) for a chat or generate body: the prompt's token ids, the
    sampling parameters with max_tokens from num_predict (to the context's end when absent, and never
    past it), the compiled constraint, whether a thinking model's reply is split (reasoning_format: the
    server's --reasoning-format; "none" when the request says think: false). Synchronous: the server
    calls it in a worker thread."""
    if llm.is_encoder:
        raise P.bad("model", f"model {name!r} is an embedding model: it cannot generate; use /api/embed")
    try:
        if req.chat:
            body = {"messages": req.messages, **({"tools": req.tools} if req.tools else {})}
            gen = H.prepare_generation(llm, name, body, req.parsed, True, reasoning_format)
        else:
            gen = H.prepare_generation(llm, name, _generate_body(llm, req), req.parsed, False)
            if not req.raw and not req.suffix and reasoning.splits(reasoning_format, llm.chat_template.source):
                gen.reasoning = True  # the prompt went through the template: a thinking model's reply is split
                gen.reasoning_open = reasoning.prompt_opens_reasoning(
                    llm.tokenizer.decode(gen.prompt_ids[-16:], special=True))
    except P.APIError as e:  # SamplingParams names its field; the request named an option
        option = _FIELD_TO_OPTION.get(e.param or "")
        if option is None:
            raise
        raise P.bad(f"options.{option}", f"options.{option}: {e.message}") from None
    if req.num_predict is not None and req.num_predict < gen.params.max_tokens:
        gen.params = dataclasses.replace(gen.params, max_tokens=req.num_predict)
    return gen


# -- responses --------------------------------------------------------------------------------------


def timestamp(t: float | None = None) -> str:
    """An RFC 3339 time in UTC, as Ollama writes created_at and modified_at."""
    dt = datetime.fromtimestamp(time.time() if t is None else t, timezone.utc)
    return dt.isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class Timings:
    """When a request reached each stage (time.monotonic()), for Ollama's durations in nanoseconds."""

    start: float  # the request arrived
    loaded: float  # its model was ready (load_duration: the wait for it)
    first: float | None = None  # the first generated token came back (the prompt was evaluated)
    end: float | None = None

    def stats(self, n_prompt: int, n_out: int) -> dict:
        end = self.end or time.monotonic()
        first = self.first or end
        ns = lambda s: max(0, int(s * 1e9))  # noqa: E731
        return {"total_duration": ns(end - self.start), "load_duration": ns(self.loaded - self.start),
                "prompt_eval_count": n_prompt, "prompt_eval_duration": ns(first - self.loaded),
                "eval_count": n_out, "eval_duration": ns(end - first)}


def _finite(lp: float) -> float:
    """A masked token's -inf, sent as -9999.0 (as OpenAI and vLLM do)."""
    return lp if math.isfinite(lp) else -9999.0


def _logprobs(entries: list[dict], token_text) -> list[dict]:
    return [{"token": token_text(e["token_id"]), "logprob": _finite(e["logprob"]),
             "top_logprobs": [{"token": token_text(j), "logprob": _finite(lp)} for j, lp in e["top"]]}
            for e in entries]


def _call(call: dict, index: int) -> dict:
    """A parsed tool call (edgeinfer.tools: arguments as JSON text) as Ollama sends it: arguments as an object."""
    f = call["function"]
    return {"function": {"index": index, "name": f["name"], "arguments": json.loads(f["arguments"])}}


class Replies:
    """The objects one /api/chat or /api/generate answer is made of: streamed deltas (done: false), the
    final object (done: true, done_reason and the timings) and the whole, unstreamed answer. A thinking
    model's reasoning goes to `thinking` (edgeinfer.reasoning); with tools shown, tool calls are parsed
    out of the answer (never out of the reasoning), their arguments as objects."""

    def __init__(self, gen: H.Generation, req: OllamaRequest, tokenizer):
        from .responses import token_text

        self.gen, self.req, self.name = gen, req, req.model
        self.token_text = token_text(tokenizer)
        self.reasoning = self.tools = None
        if req.stream and gen.reasoning:
            self.reasoning = reasoning.ReasoningParser(gen.reasoning_open)
        if req.stream and gen.shown:
            from ..tools import StreamParser  # imported only with tools: it brings in the kernels (Numba)

            self.tools = StreamParser(gen.tools)
        self.n_calls = 0

    def _obj(self, content: str, calls: list | None = None, done: bool = False, thinking: str | None = None) -> dict:
        out = {"model": self.name, "created_at": timestamp()}
        if self.req.chat:
            msg = {"role": "assistant", "content": content}
            if thinking is not None:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            out["message"] = msg
        else:
            out["response"] = content
            if thinking is not None:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def _answer(self, text: str, finished: bool) -> list[dict]:
        if self.tools is None:
            return [self._obj(text)] if text else []
        out = []
        for kind, value in self.tools.feed(text) + (self.tools.finish() if finished else []):
            if kind == "text":
                out.append(self._obj(value))
            else:
                out.append(self._obj("", [_call(value, self.n_calls)]))
                self.n_calls += 1
        return out

    def deltas(self, text: str, lps: list[dict], finished: bool) -> list[dict]:
        """The streamed objects for one engine output (its new text and logprobs)."""
        if self.reasoning is None:
            out = self._answer(text, finished)
        else:
            out = []
            pieces = self.reasoning.feed(text) + (self.reasoning.finish() if finished else [])
            for kind, piece in pieces:
                out += [self._obj("", thinking=piece)] if kind == reasoning.REASONING else self._answer(piece, False)
            if finished:
                out += self._answer("", True)
        if self.req.parsed.logprobs and lps:
            if not out:
                out.append(self._obj(""))
            out[0]["logprobs"] = _logprobs(lps, self.token_text)
        return out

    def final(self, reason: str, stats: dict, context: list[int] | None = None) -> dict:
        """The last streamed object: no text, done, the reason and the timings."""
        return self._finish(self._obj("", done=True), reason, stats, context)

    def _finish(self, obj: dict, reason: str, stats: dict, context) -> dict:
        obj["done_reason"] = reason
        if context is not None and not self.req.chat and not self.req.raw:
            obj["context"] = context
        obj.update(stats)
        return obj

    def whole(self, text: str, lps: list[dict], reason: str, stats: dict, context: list[int] | None = None) -> dict:
        """The unstreamed answer: all the text, its reasoning apart, its tool calls parsed out."""
        thinking = calls = None
        if self.gen.reasoning:
            thinking, text = reasoning.split_reasoning(text, self.gen.reasoning_open)
        if self.req.chat and self.gen.shown:
            from ..tools import parse_reply

            content, parsed = parse_reply(text, self.gen.tools)
            if parsed:
                text, calls = content or "", [_call(c, i) for i, c in enumerate(parsed)]
        obj = self._obj(text, calls, done=True, thinking=thinking)
        if self.req.parsed.logprobs:
            obj["logprobs"] = _logprobs(lps, self.token_text)
        return self._finish(obj, reason, stats, context)


def load_reply(req: OllamaRequest, stats: dict) -> dict:
    """The answer to a load (or unload) call: done, done_reason "load" / "unload"."""
    out = {"model": req.model, "created_at": timestamp()}
    if req.chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason="unload" if req.unload else "load")
    if not req.unload:
        out.update({k: stats[k] for k in ("total_duration", "load_duration")})
    return out


# -- embeddings -------------------------------------------------------------------------------------


@dataclass
class EmbedRequest:
    model: str
    inputs: list[str]  # empty: a load call
    truncate: bool
    dimensions: int | None
    keep_alive: float | None


def parse_embed(body) -> EmbedRequest:
    """/api/embed: model, input (a string or a list of them), truncate (default true, as Ollama),
    dimensions, options (checked, then unused), keep_alive."""
    model = parse_model(body)
    parse_options(body)
    x = body.get("input")
    if x is None:
        x = []
    inputs = [x] if isinstance(x, str) else x
    if not isinstance(inputs, list) or not all(isinstance(s, str) for s in inputs):
        raise P.bad("input", "'input' must be a string or an array of strings")
    dims = _opt(body, "dimensions", lambda v: _is_int(v) and v >= 1, "a positive integer")
    return EmbedRequest(model, inputs, _bool(body, "truncate", True), int(dims) if dims is not None else None,
                        parse_keep_alive(body))


def parse_embeddings(body) -> EmbedRequest:
    """The older /api/embeddings: model, prompt (empty: a load call), options, keep_alive."""
    model = parse_model(body)
    parse_options(body)
    prompt = _str(body, "prompt", "")
    return EmbedRequest(model, [prompt] if prompt else [], True, None, parse_keep_alive(body))


def embed_reply(name: str, vecs, stats: dict) -> dict:
    return {"model": name, "embeddings": [[float(x) for x in v] for v in vecs],
            **{k: stats[k] for k in ("total_duration", "load_duration", "prompt_eval_count")}}


# -- models: /api/tags and /api/show ----------------------------------------------------------------

_BIG_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def human_count(n: int) -> str:
    """A parameter count as Ollama shows it: 135M, 1.5B."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def quantization_level(gf) -> str:
    """general.file_type's name (Q4_K_M, F16, ...), or else the type most of the matrices are stored in."""
    import gguf

    ft = gf.get("general.file_type")
    try:
        return gguf.LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        counts: dict[str, int] = {}
        for t in gf.tensors.values():
            if len(t.shape) >= 2:
                counts[t.type_name] = counts.get(t.type_name, 0) + t.n_elements
        return max(counts, key=counts.get) if counts else "unknown"


def _jsonable(v):
    import numpy as np

    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class _Vocab:
    """A vocabulary's token texts, all fim.fim_tokens reads of a tokenizer (no tokenizer is built)."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens


def _can_infill(gf, tokens: list[str]) -> bool:
    from .fim import fim_tokens

    return fim_tokens(_Vocab(tokens), gf).can_infill


def model_facts(gf) -> dict:
    """What /api/tags and /api/show tell about one GGUF file: details, model_info (its metadata, the big
    vocabulary arrays left empty as Ollama does unless verbose), the chat template, capabilities."""
    from ..info import parameters

    arch = gf.get("general.architecture", "unknown")
    n_params, _ = parameters(gf)
    info = {}
    for k, v in gf.metadata.items():
        if k == "tokenizer.chat_template":
            continue
        info[k] = [] if k in _BIG_ARRAYS else _jsonable(v)
    info["general.parameter_count"] = int(n_params)
    tokens = gf.get("tokenizer.ggml.tokens") or []
    from ..models import ENCODERS

    encoder = arch in ENCODERS
    template = gf.get("tokenizer.chat_template") or ""
    caps = ["embedding"] if encoder else ["completion", "tools"] + (["insert"] if _can_infill(gf, tokens) else []) \
        + (["thinking"] if reasoning.template_thinks(template) else [])
    ctx = gf.get(f"{arch}.context_length")
    details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
               "parameter_size": human_count(n_params), "quantization_level": quantization_level(gf)}
    return {"details": details, "model_info": info, "template": template,
            "capabilities": caps, "context_length": int(ctx) if _is_int(ctx) else None}


def tag_entry(name: str, size: int, mtime: float, digest: str, facts: dict) -> dict:
    """One model in /api/tags: Ollama's NAME:latest, its file's size and sha256, the details."""
    tag = f"{name}:latest"
    return {"name": tag, "model": tag, "modified_at": timestamp(mtime), "size": size, "digest": digest,
            "details": facts["details"]}


def show_reply(name: str, path: str, mtime: float, facts: dict) -> dict:
    """/api/show: a Modelfile as Ollama would write one, the parameters, template, details, model_info,
    capabilities."""
    ctx = facts["context_length"]
    params = f"{'num_ctx':<30} {ctx}" if ctx else ""
    modelfile = (f"# Modelfile of {name}, as edgeinfer serves it\nFROM {path}\n"
                 + (f'TEMPLATE """{facts["template"]}"""\n' if facts["template"] else "")
                 + (f"PARAMETER num_ctx {ctx}\n" if ctx else ""))
    return {"modelfile": modelfile, "parameters": params, "template": facts["template"], "details": facts["details"],
            "model_info": facts["model_info"], "capabilities": facts["capabilities"], "modified_at": timestamp(mtime)}


# -- pull ---------------------------------------------------------------------------------------------


def parse_pull(body):
    """/api/pull: (a catalog entry, stream). Only catalog names and aliases: a URL or a path is refused
    (400), an unknown name is a 404 listing the catalog."""
    from .. import registry

    name = parse_model(body)
    stream = _bool(body, "stream", True)
    _bool(body, "insecure", False)
    if "://" in name or name.startswith(("http:", "https:", "file:")):
        raise P.bad("model", f"'model' must be a catalog name: this route does not pull URLs ({name[:80]!r})")
    if any(c in name for c in "/\\") or name.startswith((".", "~")) or name.endswith(".gguf"):
        raise P.bad("model", f"'model' must be a catalog name, not a path ({name[:80]!r})")
    entry = registry.lookup(name)
    if entry is None:
        raise P.APIError(404, f"model {name!r} is not in the catalog; it has: {', '.join(sorted(registry.CATALOG))}")
    return entry, stream


def pull_progress(entry, desc: str, completed: int, total: int | None) -> dict:
    out = {"status": f"downloading {desc}", "digest": f"sha256:{entry.sha256}", "completed": completed}
    if total:
        out["total"] = total
    return out

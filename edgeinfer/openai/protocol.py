"""OpenAI requests: the error type, strict JSON bodies, validation against the schemas and readers of
what a schema cannot say. Pure functions: no HTTP, no model."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from ..chat_template import RESERVED
from ..sampling import CONSTRAINTS, SamplingParams
from . import validation


class APIError(Exception):
    """An error answered in OpenAI's JSON shape: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, type_: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                              413: "invalid_request_error", 415: "invalid_request_error",
                              503: "overloaded_error", 504: "timeout_error"}.get(status, "server_error")
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def too_long(param: str, message: str) -> APIError:
    """A request past the model's context: OpenAI's code, which agent harnesses look for to compact."""
    return APIError(400, message, param=param, code="context_length_exceeded")


MAX_DEPTH = 64  # arrays and objects nested deeper than this are refused


class _BadJSON(ValueError):
    pass


def _no_constant(name: str):
    raise _BadJSON(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _BadJSON(f"the number {text[:40]} is out of range")
    return v


def _unique_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _BadJSON(f"the key {dup[:40]!r} appears twice in one object")
    return out


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # a JSON string literal, escapes included
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _depth(raw: bytes) -> int:
    """How deep arrays and objects nest in JSON text, found at C speed before it is decoded: the
    brackets left once string literals are taken out, counted up and down."""
    import numpy as np

    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    a = np.frombuffer(brackets, np.uint8)
    return int(np.cumsum(np.where((a == ord("[")) | (a == ord("{")), 1, -1)).max())


def loads(raw: bytes) -> Any:
    """A request body as JSON, strictly: UTF-8, no NaN or Infinity (nor numbers that overflow to them),
    no key twice in one object, no unpaired UTF-16 surrogate escape, at most MAX_DEPTH levels of
    nesting. A 400 that says what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {e.start})") from None
    if _depth(raw) > MAX_DEPTH:
        raise APIError(400, f"the request body nests arrays or objects more than {MAX_DEPTH} deep")
    try:
        v = json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, _BadJSON) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # brackets the depth count could not see (malformed text)
        raise APIError(400, f"the request body nests arrays or objects more than {MAX_DEPTH} deep") from None
    if _SURROGATE_ESCAPE.search(raw):  # escapes of surrogates: fine in pairs, never alone
        try:
            json.dumps(v, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, "the request body is not valid JSON: a string holds an unpaired UTF-16 "
                                "surrogate escape") from None
    return v


def validate(kind: str, body: Any) -> dict:
    """The body, checked against its route's schema (edgeinfer.openai.schemas); a 400 naming the field."""
    try:
        validation.validate(kind, body)
    except validation.SchemaError as e:
        raise APIError(400, str(e), param=e.param) from None
    return body


# -- readers of bodies their route's schema has checked: types and bounds are the schema's, and
# -- what is left here is what a schema cannot say ----------------------------------------------


def _get(body: dict, key: str, default):
    """A field the route's schema has already checked, or `default` when it is absent or null."""
    v = body.get(key)
    return default if v is None else v


def _number(body: dict, key: str, default):
    return float(_get(body, key, default))


def _integer(body: dict, key: str, default):
    return _whole(_get(body, key, default))


def _stop(body: dict) -> tuple[str, ...]:
    v = _get(body, "stop", ())
    return (v,) if isinstance(v, str) else tuple(v)


def _repetition_penalty(body: dict) -> float:
    """vLLM's repetition_penalty or llama.cpp's repeat_penalty (the same penalty): one of them."""
    if body.get("repetition_penalty") is not None and body.get("repeat_penalty") is not None:
        raise bad("repeat_penalty", "give one of 'repetition_penalty' and 'repeat_penalty' (llama.cpp's name for it)")
    return _number(body, "repeat_penalty" if body.get("repeat_penalty") is not None else "repetition_penalty", 1.0)


@dataclass
class ParsedRequest:
    model: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    params_kwargs: dict
    logprobs: bool
    top_logprobs: int
    priority: int = 0
    constraint_param: str | None = None  # the request field a structured-output constraint came from
    n: int = 1  # choices for the one prompt
    template_vars: dict | None = None  # chat_template_kwargs: the chat template's own switches
    id_slot: int = -1  # llama.cpp's slot (engine/slots.py; -1: any)


def parse_model(body: dict) -> str | None:
    """The `model` of a body its route's schema has checked."""
    return body.get("model")


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad_ids = [t for t in ids if not 0 <= t < vocab_size]
    if bad_ids:
        raise bad(param, f"token id {bad_ids[0]} is outside the vocabulary of {vocab_size}")


def parse_common(body: Any, *, chat: bool) -> ParsedRequest:
    # types and bounds, unknown fields and the ones this server cannot apply (best_of is 1); then what
    # a schema cannot say
    validate("chat" if chat else "completions", body)
    model = parse_model(body)
    constraint, constraint_param = parse_constraint(body)
    stream = _get(body, "stream", False)
    include_usage = _get(_get(body, "stream_options", {}), "include_usage", False)
    max_tokens = _integer(body, "max_completion_tokens" if body.get("max_completion_tokens") is not None
                          else "max_tokens", None)
    if chat:
        logprobs = _get(body, "logprobs", False)
        top = _integer(body, "top_logprobs", None)
        if top is not None and not logprobs:
            raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        top = top or 0
    else:  # the completions API: logprobs is how many alternatives (0..5)
        lp = _integer(body, "logprobs", None)
        logprobs, top = lp is not None, lp or 0
    seed = _integer(body, "seed", None)
    kwargs = dict(
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        presence_penalty=_number(body, "presence_penalty", 0.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0),
        top_k=max(0, _integer(body, "top_k", 0)),  # vLLM's -1 and llama.cpp's 0 are both off
        min_p=_number(body, "min_p", 0.0),
        repetition_penalty=_repetition_penalty(body),
        repeat_last_n=_integer(body, "repeat_last_n", -1),
        stop=_stop(body),
        seed=seed,
        logprobs=top if logprobs else None,
        ignore_eos=_get(body, "ignore_eos", False),  # an extension (as vLLM): generate through EOS
        logit_bias=tuple((int(t), float(b)) for t, b in (_get(body, "logit_bias", None) or {}).items()),
        **constraint,
    )
    if body.get("lora") is not None:  # llama.cpp's [{"id", "scale"}]: this request's adapters
        kwargs["lora"] = tuple((a["id"], float(a["scale"])) for a in body["lora"])
    # an extension (as vLLM): lower values are scheduled first; waiting long enough lifts a request
    priority = _integer(body, "priority", 0)
    return ParsedRequest(model, stream, include_usage, max_tokens, kwargs, logprobs, top, priority, constraint_param,
                         _integer(body, "n", 1), _template_vars(body) if chat else None, _integer(body, "id_slot", -1))


def _template_vars(body: dict) -> dict | None:
    """chat_template_kwargs (names checked by the schema), less the names the template gets from the
    server itself."""
    v = body.get("chat_template_kwargs")
    taken = sorted(set(v or ()) & RESERVED)
    if taken:
        raise bad("chat_template_kwargs", f"'chat_template_kwargs' cannot set {taken[0]!r}: the server sets it itself")
    effort = body.get("reasoning_effort")
    if effort is not None:  # OpenAI's field, to the template's variable of that name (gpt-oss's)
        v = {**(v or {}), "reasoning_effort": effort}
    return v or None


# vLLM's structured-output fields: "structured_outputs": {json, regex, choice, grammar, json_object},
# and the older top-level guided_json / guided_regex / guided_choice / guided_grammar
_VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def parse_constraint(body: dict) -> tuple[dict, str | None]:
    """SamplingParams' constraint (json_schema / regex / choice / grammar) from OpenAI's
    response_format or vLLM's extras, and the request field it came from (for errors)."""
    found: list[tuple[str, dict]] = []
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise bad("response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                                         "or {\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}")
        if rf["type"] == "json_object":  # llama.cpp also takes a "schema" here
            schema = rf.get("schema", {"type": "object"})
            found.append(("response_format", {"json_schema": schema}))
        elif rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                raise bad("response_format", "'response_format.json_schema' must be an object with 'name' and 'schema'")
            name = js.get("name")
            if name is not None and not isinstance(name, str):
                raise bad("response_format", "'response_format.json_schema.name' must be a string")
            if js.get("strict") is not None and not isinstance(js.get("strict"), bool):
                raise bad("response_format", "'response_format.json_schema.strict' must be true or false")
            schema = js.get("schema", {})  # no schema: any JSON value, as OpenAI's own default
            if not isinstance(schema, (dict, bool)):
                raise bad("response_format", "'response_format.json_schema.schema' must be a JSON schema object")
            found.append(("response_format", {"json_schema": schema}))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("structured_outputs", "'structured_outputs' must be an object")
        for key, field in _VLLM_KEYS.items():
            if so.get(key) is not None:
                found.append((f"structured_outputs.{key}", {field: so[key]}))
        if so.get("json_object"):
            found.append(("structured_outputs.json_object", {"json_schema": {"type": "object"}}))
    for key, field in _VLLM_KEYS.items():
        if body.get(f"guided_{key}") is not None:
            found.append((f"guided_{key}", {field: body[f"guided_{key}"]}))
    if len(found) > 1:
        raise bad(found[1][0], f"give one constraint, got {' and '.join(k for k, _ in found)}")
    if not found:
        return {}, None
    param, kw = found[0]
    ((field, value),) = kw.items()
    if field == "json_schema" and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise bad(param, f"'{param}' is not valid JSON: {e}") from None
    return {field: value}, param


def parse_parallel_tool_calls(body: dict) -> bool:
    return _get(body, "parallel_tool_calls", True)


def parse_messages(body: dict) -> list[dict]:
    """The messages of a chat body its schema has checked (roles, content strings or text and image_url parts:
    a content with images stays a list of parts, for LLM.chat_prompt)."""
    out = []
    for i, m in enumerate(body["messages"]):
        role = "system" if m["role"] == "developer" else m["role"]
        content = m.get("content")
        if isinstance(content, list) and all(p["type"] == "text" for p in content):  # text parts
            content = "".join(p["text"] for p in content)
        if content is None and (role == "assistant" or m.get("tool_calls")):
            content = ""
        if content is None:  # the schema lets null through; only an assistant or a tool call may leave it out
            raise bad(f"messages[{i}].content",
                      f"messages[{i}].content must be a string or an array of text and image_url parts")
        msg = {"role": role, "content": content}
        for key in ("tool_calls", "tool_call_id", "name"):  # checked by edgeinfer.tools when rendered
            if m.get(key) is not None:
                msg[key] = m[key]
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):  # (templates that show it)
            msg["reasoning_content"] = m["reasoning_content"]
        out.append(msg)
    return out


def parse_prompt(body: dict):
    """A completion prompt: a string, or a list of token ids (a one-element batch of either is fine)."""
    p = _whole(body["prompt"])
    if isinstance(p, list) and isinstance(p[0], (str, list)):  # the schema allows a batch of one only
        p = p[0]
    return p


def _whole(x):
    """Token ids as ints: JSON Schema's integers include 3.0, which the schema let through."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, list):
        return [_whole(v) for v in x]
    return x


def parse_embeddings(body: Any) -> tuple[list, str, int | None, bool]:
    """/v1/embeddings: (inputs: strings or token-id lists, encoding_format, dimensions, truncate)."""
    body = validate("embeddings", body)  # the four forms of `input`, at most MAX_EMBED_INPUTS, none empty
    x = _whole(body["input"])
    one = isinstance(x, str) or isinstance(x[0], int)  # a string or one token-id list; else a list of them
    return [x] if one else x, _get(body, "encoding_format", "float"), _integer(body, "dimensions", None), \
        _get(body, "truncate", False)


def parse_tokenize(body: Any) -> tuple[str, bool, bool]:
    """/tokenize: llama.cpp's {"content", "add_special", "parse_special"} or vLLM's {"prompt",
    "add_special_tokens"}: the text, whether to add BOS, whether special tokens' text is read as them."""
    validate("tokenize", body)
    key = "content" if "content" in body else "prompt"
    text = body.get(key)
    if text is None:  # the schema wants one of the keys; it lets null through as an optional field's value
        raise bad(key, "'content' (or 'prompt') must be a string")
    return (text, _get(body, "add_special" if "add_special" in body else "add_special_tokens", False),
            _get(body, "parse_special", False))


def parse_detokenize(body: Any) -> list[int]:
    """/detokenize's token ids (checked against a vocabulary by the caller, once it knows the model)."""
    return _whole(validate("detokenize", body).get("tokens"))


def sampling_params(req: ParsedRequest, max_tokens: int, **extra) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=max_tokens, **{**req.params_kwargs, **extra})
    except ValueError as e:
        name = str(e).split(" ", 1)[0]
        if name in CONSTRAINTS and req.constraint_param:
            name = req.constraint_param
        raise bad(name, str(e)) from None


@dataclass
class InfillInput:
    """What /infill fills: the text around the cursor, other files' chunks, and the prompt text."""

    prefix: str
    suffix: str
    extra: list[dict]
    prompt: str
    return_tokens: bool


# /infill's own fields: what is left of a body once they are taken out is read as a completion's
_INFILL_ONLY = ("input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "return_tokens",
                "cache_prompt", "response_fields", "samplers", "t_max_prompt_ms", "t_max_predict_ms",
                "n_indent")


def parse_infill(body: Any) -> tuple[ParsedRequest, InfillInput]:
    """llama.cpp's /infill: the sampling fields as /v1/completions reads them (n_predict, llama.cpp's name
    for max_tokens, wins over it as in llama.cpp; -1 is to the end of the context) and the infill input."""
    validate("infill", body)
    rest = {k: v for k, v in body.items() if k not in _INFILL_ONLY}
    n_predict = _integer(body, "n_predict", None)
    if n_predict is not None:
        rest["max_tokens"] = None if n_predict == -1 else n_predict
        rest.pop("max_completion_tokens", None)
    req = parse_common({**rest, "prompt": "-"}, chat=False)  # the prompt is built from the input, not given
    extra = [{"filename": c.get("filename"), "text": c["text"]} for c in _get(body, "input_extra", [])]
    return req, InfillInput(body["input_prefix"], body["input_suffix"], extra, _get(body, "prompt", ""),
                            _get(body, "return_tokens", False))

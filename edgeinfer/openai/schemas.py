"""Over the layout's 450 lines, kept as one file for now: the OpenAPI document builder at its end should
move to openapi.py next.

The OpenAI API's request and response schemas (JSON Schema 2020-12), the one definition of what the
server and batch jobs accept: every request body is validated against them before it is read,
`protocol`'s readers take their bounds from them, and `/openapi.json` is built from them.

Every field named is applied, or accepted and ignored because it cannot change an answer (said in its
description), or refused unless empty (`refused`); a field not named is refused. An optional field may
also be `null` (OpenAI's clients send nulls for fields left unset). A schema may carry "x-error", the
message given when a value matches none of its alternatives.
"""

from __future__ import annotations

import functools
import json
from typing import Any

MAX_EMBED_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request
PRIORITY_LIMIT = 1_000_000
MAX_STOP = 4
MAX_LOGIT_BIAS = 1024  # token ids one request may bias (OpenAI allows 300)
MAX_N = 16  # choices one request may ask for (`n`); each is a sequence of its own in the engine
MAX_TEMPLATE_KWARGS = 64  # chat_template_kwargs' names


def _opt(schema: dict) -> dict:
    """The schema, or null."""
    t = schema.get("type")
    if isinstance(t, str) and "enum" not in schema and "const" not in schema:
        return {**schema, "type": [t, "null"]}
    return {"anyOf": [schema, {"type": "null"}], **({"x-error": schema["x-error"]} if "x-error" in schema else {})}


def number(lo: float, hi: float, doc: str) -> dict:
    return _opt({"type": "number", "minimum": lo, "maximum": hi, "description": doc})


def integer(lo: int, hi: int | None, doc: str) -> dict:
    s = {"type": "integer", "minimum": lo, "description": doc}
    if hi is not None:
        s["maximum"] = hi
    return _opt(s)


def boolean(doc: str) -> dict:
    return _opt({"type": "boolean", "description": doc})


def string(doc: str, **kw) -> dict:
    return _opt({"type": "string", "description": doc, **kw})


def refused(why: str, *empty) -> dict:
    """One of OpenAI's fields this server cannot apply: taken only as null (or a value that asks for
    nothing), otherwise a 400 naming it."""
    return {"anyOf": [{"type": "null"}, *({"const": e} for e in empty)],
            "description": f"refused unless null: not supported ({why})", "x-error": f"is not supported ({why})"}


def refused_as_before(note: str = "") -> dict:
    # the fields refused before the schema named every field, with the same empty values ([] and "none")
    # and the same message
    return {"anyOf": [{"type": "null"}, {"const": []}, {"const": "none"}],
            "description": "refused unless null, [] or \"none\": not supported by this server" + note,
            "x-error": "is not supported by this server" + note}


TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
ANY_SCHEMA = {"type": ["object", "boolean"], "description": "a JSON schema"}
CHOICES = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
           "description": "the output is exactly one of these"}
SCHEMA_OR_TEXT = {"type": ["object", "boolean", "string"], "description": "a JSON schema, or its JSON text"}

# -- sampling and output fields shared by /v1/completions and /v1/chat/completions ---------------

SAMPLING = {
    "model": string("a served model's name; may be left out when one model is served", maxLength=256),
    "stream": boolean("stream the output as server-sent events"),
    "stream_options": _opt({"type": "object", "additionalProperties": False, "properties": {
        "include_usage": boolean("a last chunk with token counts"),
        "include_obfuscation": boolean("accepted and ignored (no padding is added)")}}),
    "max_tokens": integer(1, None, "most tokens to generate (default: to the end of the context)"),
    "max_completion_tokens": integer(1, None, "the same as max_tokens, OpenAI's newer name"),
    "n": integer(1, MAX_N, f"choices for the one prompt, at most {MAX_N}: each sampled on its own (with a seed, "
                          "choice i from a seed made of (seed, i)); they share the prompt's cached KV blocks"),
    "best_of": integer(1, 1, "not supported beyond 1 (ask for n choices instead)"),
    "temperature": number(0.0, 2.0, "sampling temperature; 0 is greedy"),
    "top_p": _opt({"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0, "description": "nucleus sampling mass"}),
    "presence_penalty": number(-2.0, 2.0, "penalty on tokens already generated once"),
    "frequency_penalty": number(-2.0, 2.0, "penalty growing with each repeat of a token"),
    # the sampling fields of vLLM's and llama.cpp's servers
    "top_k": integer(-1, None, "sample from the k most likely tokens; 0 or -1 is off (vLLM's and llama.cpp's)"),
    "min_p": number(0.0, 1.0, "drop tokens less likely than min_p times the most likely one (vLLM's and llama.cpp's)"),
    "repetition_penalty": number(0.01, 10.0, "divide the logits of tokens already in the context (1 is off; "
                                             "vLLM's and llama.cpp's, CTRL's penalty)"),
    "repeat_penalty": number(0.01, 10.0, "llama.cpp's name for repetition_penalty"),
    "repeat_last_n": integer(-1, None, "how many last tokens of the context (prompt and output) "
                                       "repetition_penalty looks at: -1 all (the default), 0 none (llama.cpp's)"),
    "stop": _opt({"anyOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP}],
                  "x-error": f"must be a non-empty string or a list of at most {MAX_STOP} non-empty strings"}),
    "seed": integer(0, 2**63 - 1, "seed for sampling"),
    "ignore_eos": boolean("generate through the end-of-sequence token (an extension, as vLLM)"),
    "priority": integer(-PRIORITY_LIMIT, PRIORITY_LIMIT, "lower is scheduled first (an extension, as vLLM)"),
    # OpenAI's fields that cannot change an answer: accepted and ignored
    "user": string("the end user's id (accepted and ignored)"),
    "metadata": _opt({"type": "object", "description": "accepted and ignored: nothing is stored"}),
    "store": boolean("accepted and ignored: nothing is stored"),
    "service_tier": string("accepted and ignored"),
    "prompt_cache_key": string("accepted and ignored: shared prompt prefixes are always cached"),
    "safety_identifier": string("accepted and ignored"),
    "logit_bias": _opt({"type": "object", "maxProperties": MAX_LOGIT_BIAS,
                        "patternProperties": {"^[0-9]{1,10}$": {"type": "number", "minimum": -100, "maximum": 100}},
                        "additionalProperties": False,
                        "description": "token id (a string) -> a bias in [-100, 100] added to its logit",
                        "x-error": f"must map at most {MAX_LOGIT_BIAS} token ids (as strings) to numbers in "
                                   "[-100, 100]"}),
    # structured output: OpenAI's response_format, vLLM's structured_outputs and guided_* fields
    "response_format": _opt({"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "schema": ANY_SCHEMA,
        "json_schema": {"type": "object", "properties": {
            "name": string("the schema's name"),
            "description": string("what the schema is for"),
            "schema": ANY_SCHEMA,
            "strict": boolean("accepted: outputs always follow the schema")}}}}),
    "structured_outputs": _opt({"type": "object", "properties": {
        "json": _opt(SCHEMA_OR_TEXT), "regex": string("a regular expression the whole output matches", minLength=1),
        "choice": _opt(CHOICES),
        "grammar": string("a Lark or GBNF grammar"), "json_object": boolean("any JSON object")}}),
    "guided_json": _opt(SCHEMA_OR_TEXT),
    "guided_regex": string("a regular expression the whole output matches", minLength=1),
    "guided_choice": _opt(CHOICES),
    "guided_grammar": string("a Lark or GBNF grammar"),
}

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_TOOL_CALL = {"type": "object", "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "arguments": {"type": ["string", "object"]}}}}}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}],
                "x-error": "must be a string or an array of text parts"},
    "name": string("the author's name"),
    "tool_calls": _opt({"type": "array", "items": _TOOL_CALL}),
    "tool_call_id": string("the call a tool message answers"),
}}
TOOL = {"type": "object", "required": ["function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "description": {"type": "string"},
        "parameters": ANY_SCHEMA,
        "strict": {"type": ["boolean", "null"]}}}}}
TOOL_CHOICE = {"anyOf": [
    {"enum": ["none", "auto", "required"]},
    {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}},
    {"type": "null"}],
    "x-error": "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"}

CHAT = {"type": "object", "required": ["messages"], "properties": {
    "messages": {"type": "array", "items": MESSAGE, "minItems": 1, "description": "the conversation so far"},
    **SAMPLING,
    "logprobs": boolean("return each output token's log-probability"),
    "top_logprobs": integer(0, 20, "alternatives per token (needs logprobs)"),
    "tools": _opt({"type": "array", "items": TOOL}),
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": boolean("allow several calls in one reply"),
    "chat_template_kwargs": _opt({"type": "object", "maxProperties": MAX_TEMPLATE_KWARGS,
                                  "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
                                  "description": "the chat template's own switches, e.g. {\"enable_thinking\": false} "
                                                 "for Qwen3 (vLLM's and llama.cpp's)",
                                  "x-error": f"must be an object of at most {MAX_TEMPLATE_KWARGS} names (identifiers) "
                                             "to values"}),
    # OpenAI's chat fields this server cannot apply
    "functions": refused_as_before(),
    "function_call": refused_as_before(),
    "modalities": refused("text only: [\"text\"] is taken", ["text"]),
    "audio": refused("no audio output"),
    "prediction": refused("no predicted outputs"),
    "reasoning_effort": refused("no reasoning-effort control"),
    "verbosity": refused("no verbosity control"),
    "web_search_options": refused("no web search"),
}}

COMPLETION = {"type": "object", "required": ["prompt"], "properties": {
    "prompt": {"anyOf": [{"type": "string", "minLength": 1}, TOKEN_IDS,
                         {"type": "array", "items": {"anyOf": [{"type": "string", "minLength": 1}, TOKEN_IDS]},
                          "minItems": 1, "maxItems": 1}],
               "x-error": "must be a non-empty string or an array of token ids (one prompt per request)"},
    **SAMPLING,
    "logprobs": integer(0, 5, "alternatives per token; given, each token's log-probability is returned"),
    "echo": _opt({"const": False, "description": "not supported"}),
    "suffix": string("text that comes after the completion: the model fills in the middle between the prompt "
                     "and it (a model with fill-in-the-middle tokens; \"\" is a plain completion on others)"),
    "tools": refused_as_before(" (tools work on /v1/chat/completions)"),
    "tool_choice": refused_as_before(" (tools work on /v1/chat/completions)"),
}}

EMBEDDINGS = {"type": "object", "required": ["input"], "properties": {
    "input": {"anyOf": [{"type": "string", "minLength": 1}, TOKEN_IDS,
                        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
                         "maxItems": MAX_EMBED_INPUTS},
                        {"type": "array", "items": TOKEN_IDS, "minItems": 1, "maxItems": MAX_EMBED_INPUTS}],
              "x-error": "must be a non-empty string, a list of strings, a list of token ids, or a list of "
                         f"token-id lists (at most {MAX_EMBED_INPUTS} inputs)"},
    "model": SAMPLING["model"],
    "encoding_format": _opt({"enum": ["float", "base64"]}),
    "dimensions": integer(1, None, "keep the first n dimensions, renormalised"),
    "truncate": boolean("cut inputs longer than the context instead of refusing them"),
    "user": SAMPLING["user"],
}}

TOKENIZE = {"type": "object", "properties": {
    "content": string("text to tokenise (llama.cpp's name)"),
    "prompt": string("text to tokenise (vLLM's name)"),
    "add_special": boolean("add the model's BOS token (llama.cpp's name)"),
    "add_special_tokens": boolean("add the model's BOS token (vLLM's name)"),
    "model": SAMPLING["model"],
}, "anyOf": [{"required": ["content"]}, {"required": ["prompt"]}],
    "x-error": "must have 'content' (or 'prompt'): the text to tokenise"}

DETOKENIZE = {"type": "object", "required": ["tokens"], "properties": {
    "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "model": SAMPLING["model"],
}}

# llama.cpp's /infill: its fields, and ours for sampling (llama.cpp's names where it has its own)
_EXTRA_CHUNK = {"type": "object", "required": ["text"], "additionalProperties": False, "properties": {
    "text": {"type": "string", "description": "the chunk's text"},
    "filename": string("the file it comes from (default \"tmp\")"),
    "time": {"type": "number", "description": "accepted and ignored (llama.vim's and llama.vscode's chunk age)"}}}
INFILL = {"type": "object", "required": ["input_prefix", "input_suffix"], "properties": {
    "input_prefix": {"type": "string", "description": "the text before the cursor"},
    "input_suffix": {"type": "string", "description": "the text after the cursor"},
    "input_extra": _opt({"type": "array", "items": _EXTRA_CHUNK, "maxItems": 1024,
                         "description": "other files' text, put before the prefix as repository context",
                         "x-error": "must be an array of {\"filename\": string, \"text\": string}"}),
    "prompt": string("text put after the prefix, just before the suffix part (special tokens parsed)"),
    "n_predict": _opt({"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1}],
                       "description": "most tokens to generate; -1: to the end of the context (llama.cpp's name)",
                       "x-error": "must be -1 (to the end of the context) or an integer of at least 1"}),
    **{k: v for k, v in SAMPLING.items() if k not in ("stream_options", "n", "best_of")},
    "return_tokens": boolean("also return the generated token ids"),
    # llama.cpp's fields that editor clients (llama.vscode, llama.vim) send; accepted, not applied
    "cache_prompt": boolean("accepted and ignored: shared prompt prefixes are always cached"),
    "id_slot": integer(-1, None, "accepted and ignored: there are no slots to pick"),
    "response_fields": _opt({"type": "array", "items": {"type": "string"},
                             "description": "accepted and ignored: every field is returned"}),
    "samplers": _opt({"type": "array", "items": {"type": "string"},
                      "description": "accepted and ignored: the sampler order is fixed (penalties, top-k, top-p, "
                                     "min-p, temperature)"}),
    "t_max_prompt_ms": integer(-1, None, "accepted and ignored: no time limit on the prompt"),
    "t_max_predict_ms": integer(-1, None, "accepted and ignored: generation is bounded by n_predict and the "
                                          "server's request timeout"),
    "n_indent": integer(0, None, "accepted and ignored: generation is bounded by n_predict and stop"),
}}

REQUESTS = {"chat": CHAT, "completions": COMPLETION, "embeddings": EMBEDDINGS, "tokenize": TOKENIZE,
            "detokenize": DETOKENIZE, "infill": INFILL}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings",
         "tokenize": "/tokenize", "detokenize": "/detokenize", "infill": "/infill"}
for _schema in REQUESTS.values():  # a field no schema names is refused (a 400 naming it), as OpenAI's API does
    _schema["additionalProperties"] = False

# -- responses ----------------------------------------------------------------------------------

_NULLABLE_STR = {"type": ["string", "null"]}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": _NULLABLE_STR, "code": _NULLABLE_STR}}}}
USAGE = {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
    "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}}
_FINISH = {"enum": ["stop", "length", "tool_calls", None]}
_LOGPROBS = {"type": ["object", "null"]}


def _completion_object(obj: str, choice: dict) -> dict:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"], "properties": {
        "id": {"type": "string"}, "object": {"const": obj}, "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["index", "finish_reason"],
                                                              "properties": {"index": {"type": "integer"},
                                                                             "finish_reason": _FINISH,
                                                                             "logprobs": _LOGPROBS, **choice}}},
        "usage": USAGE}}


CHAT_RESPONSE = _completion_object("chat.completion", {"message": {
    "type": "object", "required": ["role", "content"], "properties": {
        "role": {"const": "assistant"}, "content": _NULLABLE_STR,
        "reasoning_content": {"type": ["string", "null"], "description": "a thinking model's reasoning (the text of "
                                                                         "its <think> block), apart from content"},
        "tool_calls": {"type": "array", "items": _TOOL_CALL}}}})
COMPLETION_RESPONSE = _completion_object("text_completion", {"text": {"type": "string"}})
EMBEDDINGS_RESPONSE = {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
    "object": {"const": "list"}, "model": {"type": "string"}, "usage": USAGE,
    "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"], "properties": {
        "object": {"const": "embedding"}, "index": {"type": "integer"},
        "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}}}}
TOKENIZE_RESPONSE = {"type": "object", "required": ["tokens", "count"], "properties": {
    "tokens": {"type": "array", "items": {"type": "integer"}}, "count": {"type": "integer"},
    "max_model_len": {"type": "integer"}}}
DETOKENIZE_RESPONSE = {"type": "object", "required": ["content"], "properties": {
    "content": {"type": "string"}, "prompt": {"type": "string"}}}
INFILL_RESPONSE = {"type": "object", "required": ["content", "stop"], "properties": {
    "content": {"type": "string"}, "stop": {"type": "boolean"}, "model": {"type": "string"},
    "tokens": {"type": "array", "items": {"type": "integer"}},
    "stop_type": {"enum": ["none", "eos", "limit", "word"]}, "tokens_predicted": {"type": "integer"},
    "tokens_evaluated": {"type": "integer"}, "timings": {"type": "object"}}}
MODELS_RESPONSE = {"type": "object", "required": ["object", "data"], "properties": {
    "object": {"const": "list"}, "data": {"type": "array", "items": {
        "type": "object", "required": ["id", "object"], "properties": {
            "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
            "owned_by": {"type": "string"}}}}}}
HEALTH_RESPONSE = {"type": "object", "required": ["status"], "properties": {
    "status": {"enum": ["ok", "loading", "error"]}, "models": {"type": "array", "items": {"type": "string"}},
    "loading": {"type": "array", "items": {"type": "string"}}, "errors": {"type": "object"}}}

# -- validation ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _validator(kind: str):
    import jsonschema_rs  # compiled (Rust): a million token ids validate in tens of milliseconds

    return jsonschema_rs.validator_for(REQUESTS[kind])


class SchemaError(ValueError):
    """A request body that breaks its schema: `param` names the field (a dotted path), the message says how."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param


def _param(path) -> str | None:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _message(keyword: str, s: dict, instance: Any, param: str | None) -> str:
    """A message for a value that breaks `keyword` of its schema `s`, naming the field."""
    name = f"'{param}'" if param else "the request body"
    if keyword == "required":
        where = f" in {name}" if param else ""
        return f"'{_missing(s, instance)}' is required{where}"
    if "x-error" in s and keyword in ("anyOf", "oneOf"):
        return f"{name} {s['x-error']}"
    if keyword == "type":
        want = s["type"] if isinstance(s["type"], str) else " or ".join(t for t in s["type"])
        return f"{name} must be {'an' if want[0] in 'aeiou' else 'a'} {want}, got {_json_type(instance)}"
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        lo = s.get("minimum", s.get("exclusiveMinimum"))
        hi = s.get("maximum", s.get("exclusiveMaximum"))
        if "exclusiveMinimum" in s:
            return f"{name} must be greater than {lo} and at most {hi}, got {_short(instance)}"
        if hi is None:
            return f"{name} must be at least {lo}, got {_short(instance)}"
        if lo == hi:
            return f"{name} must be {lo}, got {_short(instance)}"
        return f"{name} must be between {lo} and {hi}, got {_short(instance)}"
    if keyword in ("enum", "const"):
        allowed = s.get("enum", [s.get("const")])
        return f"{name} must be one of {', '.join(json.dumps(a) for a in allowed)}, got {_short(instance)}"
    if keyword == "minItems":
        return f"{name} must be a non-empty array" if s["minItems"] == 1 else \
            f"{name} needs at least {s['minItems']} items"
    if keyword == "maxItems":
        return f"{name} has {len(instance)} items; at most {s['maxItems']} are allowed"
    if keyword == "minLength":
        return f"{name} must not be empty"
    if keyword == "maxLength":
        return f"{name} is {len(instance):,} characters long; at most {s['maxLength']} are allowed"
    if keyword == "pattern":
        return f"{name} must match {s['pattern']}, got {_short(instance)}"
    return f"{name} has the wrong form: {_short(instance)}"


def _missing(s: dict, instance: Any) -> str:
    return next((k for k in s.get("required", ()) if not isinstance(instance, dict) or k not in instance), "?")


def validate(kind: str, body: Any) -> None:
    """Raise SchemaError for the first way `body` breaks the request schema of `kind`."""
    if not isinstance(body, dict):
        raise SchemaError(None, f"the request body must be a JSON object, got {_json_type(body)}")
    v = _validator(kind)
    if v.is_valid(body):
        return
    err = next(iter(v.iter_errors(body)))
    *where, keyword = list(err.schema_path)
    s = REQUESTS[kind]
    for step in where:  # the subschema holding the keyword that failed
        s = s[step]
    path = list(err.instance_path)
    if keyword == "additionalProperties":  # the field named is the first one the schema does not know
        obj = body
        for step in path:
            obj = obj[step]
        key = next(k for k in obj if k not in s.get("properties", {}))[:64]
        where = f"'{_param(path)}'" if path else PATHS[kind]
        raise SchemaError(_param(path + [key]), f"unknown field '{_param(path + [key])}': {where} has no such field "
                                                "(the fields it takes are in /openapi.json)")
    message = _message(keyword, s, err.instance, _param(path))
    if keyword == "required":  # the field named is the one missing
        path.append(_missing(s, err.instance))
    raise SchemaError(_param(path), message)


# -- the OpenAPI document -----------------------------------------------------------------------

STATUS_TEXT = {400: "the request breaks its schema, or names something that does not fit (a field named in "
                    "error.param)",
               401: "missing or wrong API key", 403: "the model is a path outside the server's --models-dir folders",
               404: "unknown model or route", 408: "the body arrived too slowly",
               409: "the model's name is taken by another loaded file",
               413: "the body is over the size limit", 415: "the body is not JSON",
               500: "the model failed to load", 503: "the server is busy or still loading (Retry-After)",
               504: "the request took longer than the request timeout",
               507: "the model does not fit the server's --memory-budget"}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": STATUS_TEXT[c], "content": {"application/json": {"schema": ERROR}}}
            for c in codes}


def _post(summary: str, kind: str, response: dict, stream: bool = False) -> dict:
    ok = {"application/json": {"schema": response}}
    if stream:
        # OpenAPI 3.1 has `schema` describe each event of a stream (3.2 names it itemSchema): each is a
        # `data:` line holding one chunk's JSON, and the last one's data is [DONE]
        ok["text/event-stream"] = {"schema": {
            "type": "object", "required": ["data"], "description": "one server-sent event",
            "properties": {"data": {"type": "string", "description": "a chunk's JSON; the last event's is [DONE]"},
                           "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}}}}
    return {"post": {
        "summary": summary, "operationId": kind,
        "requestBody": {"required": True, "content": {"application/json": {"schema": REQUESTS[kind]}}},
        "responses": {"200": {"description": "success", "content": ok},
                      **_errors(400, 401, 403, 404, 408, 409, 413, 415, 500, 503, 504, 507)}}}


def _infill_post() -> dict:
    """/infill's operation: its stream is llama.cpp's, whose last event is the final result, not [DONE]."""
    op = _post("fill in the middle (llama.cpp's /infill)", "infill", INFILL_RESPONSE, stream=True)
    data = op["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]["properties"]["data"]
    data["description"] = "a chunk's JSON ({content, stop: false}); the last one is the result, with stop: true"
    return op


def openapi(title: str = "edgeinfer", version: str = "0.1.0", api_key: bool = False) -> dict:
    """The OpenAPI 3.1 document of the server's routes, from the schemas above."""
    doc = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "OpenAI-compatible endpoints of an edgeinfer server"},
        "paths": {
            "/v1/chat/completions": _post("a chat reply", "chat", CHAT_RESPONSE, stream=True),
            "/v1/completions": _post("a text completion", "completions", COMPLETION_RESPONSE, stream=True),
            "/v1/embeddings": _post("embedding vectors", "embeddings", EMBEDDINGS_RESPONSE),
            "/tokenize": _post("text to token ids", "tokenize", TOKENIZE_RESPONSE),
            "/detokenize": _post("token ids to text", "detokenize", DETOKENIZE_RESPONSE),
            "/infill": _infill_post(),
            "/v1/models": {"get": {"summary": "the served models", "operationId": "models", "responses": {
                "200": {"description": "success", "content": {"application/json": {"schema": MODELS_RESPONSE}}},
                **_errors(401)}}},
            "/health": {"get": {"summary": "ready, loading or failed", "operationId": "health", "responses": {
                code: {"description": text, "content": {"application/json": {"schema": HEALTH_RESPONSE}}}
                for code, text in (("200", "every model is ready"), ("500", "a model failed to load"),
                                   ("503", "a model is still loading"))}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "operationId": "metrics", "responses": {
                "200": {"description": "Prometheus' text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        },
    }
    if api_key:  # every route but /health, /metrics and this document checks the key
        doc["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        for path, ops in doc["paths"].items():
            if path not in ("/health", "/metrics"):
                for op in ops.values():
                    op["security"] = [{"bearer": []}]
    return doc

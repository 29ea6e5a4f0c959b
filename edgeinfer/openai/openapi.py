"""The server's OpenAPI 3.1 document (/openapi.json): the request schemas (openai.schemas) with the
response schemas and the error statuses each route can answer. Pure data: no HTTP."""

from __future__ import annotations

from .schemas import OLLAMA_COPY, OLLAMA_CREATE, OLLAMA_DELETE, REQUESTS, TOOL_CALL

# -- responses ----------------------------------------------------------------------------------

_NULLABLE_STR = {"type": ["string", "null"]}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": _NULLABLE_STR, "code": _NULLABLE_STR}}}}
USAGE = {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
    "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"},
    "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}}}}
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
        "tool_calls": {"type": "array", "items": TOOL_CALL}}}})
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

ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"}}}}}
_ANTHROPIC_USAGE = {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
    k: {"type": "integer"} for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                     "cache_creation_input_tokens")}}
MESSAGE_RESPONSE = {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
                    "properties": {
    "id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": {"type": "string"},
    "content": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "tool_use", "thinking"]}}}},
    "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", None]},
    "stop_sequence": _NULLABLE_STR, "usage": _ANTHROPIC_USAGE}}
RESPONSE_OBJECT = {"type": "object", "required": ["id", "object", "created_at", "status", "model", "output"],
                   "properties": {
    "id": {"type": "string"}, "object": {"const": "response"}, "created_at": {"type": "integer"},
    "status": {"enum": ["completed", "incomplete", "in_progress"]}, "model": {"type": "string"},
    "output": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["message", "function_call", "reasoning"]}}}},
    "usage": {"type": ["object", "null"], "properties": {
        k: {"type": "integer"} for k in ("input_tokens", "output_tokens", "total_tokens")}}}}
INPUT_TOKENS_RESPONSE = {"type": "object", "required": ["object", "input_tokens"], "properties": {
    "object": {"const": "response.input_tokens"}, "input_tokens": {"type": "integer"}}}
COUNT_TOKENS_RESPONSE = {"type": "object", "required": ["input_tokens"],
                         "properties": {"input_tokens": {"type": "integer"}}}

# -- the document ---------------------------------------------------------------------------------------

STATUS_TEXT = {400: "the request breaks its schema, or names something that does not fit (a field named in "
                    "error.param)",
               401: "missing or wrong API key", 403: "the model is a path outside the server's --models-dir folders",
               404: "unknown model or route", 408: "the body arrived too slowly",
               409: "the model's name is taken by another loaded file",
               413: "the body is over the size limit", 415: "the body is not JSON",
               500: "the model failed to load, or a created model's manifest is damaged",
               501: "not on this server (the CUDA backend's slots)", 503: "the server is busy or still loading (Retry-After)",
               504: "the request took longer than the request timeout",
               507: "the model does not fit the server's --memory-budget"}


def _errors(*codes: int, shape: dict = ERROR) -> dict:
    return {str(c): {"description": STATUS_TEXT[c], "content": {"application/json": {"schema": shape}}}
            for c in codes}


def _post(summary: str, kind: str, response: dict, stream: bool = False, error: dict = ERROR) -> dict:
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
                      **_errors(400, 401, 403, 404, 408, 409, 413, 415, 500, 503, 504, 507, shape=error)}}}


def _infill_post() -> dict:
    """/infill's operation: its stream is llama.cpp's, whose last event is the final result, not [DONE]."""
    op = _post("fill in the middle (llama.cpp's /infill)", "infill", INFILL_RESPONSE, stream=True)
    data = op["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]["properties"]["data"]
    data["description"] = "a chunk's JSON ({content, stop: false}); the last one is the result, with stop: true"
    return op


def _named(op: dict, last: str) -> dict:
    """/v1/responses and /v1/messages: their streams' events are named (`event:` lines), with no [DONE]."""
    data = op["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]["properties"]["data"]
    data["description"] = f"an event's JSON (its type also in the event line); {last}"
    return op


OLLAMA_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_STATUS = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}


def _json_op(summary: str, op_id: str, request: dict | None, ok: dict | None, error: dict = ERROR,
             errors=(400, 401, 403, 404, 500), params: list | None = None, ndjson: bool = False) -> dict:
    """One operation of the routes beside the OpenAI ones: llama.cpp's and Ollama's."""
    done = {"description": "success"}
    if ok is not None:
        done["content"] = {"application/json": {"schema": ok}}
        if ndjson:  # Ollama's streamed answer: one JSON object a line
            done["content"]["application/x-ndjson"] = {"schema": {"type": "string"}}
    op = {"summary": summary, "operationId": op_id, "responses": {"200": done, **_errors(*errors, shape=error)}}
    if request is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
    if params:
        op["parameters"] = params
    return op


_MODEL_ERRORS = (400, 401, 403, 404, 408, 409, 413, 415, 500, 501, 503, 504, 507)  # a route that loads a model
_MANAGE_ERRORS = (400, 401, 403, 404, 408, 413, 415, 500, 501, 503)  # 403: a path outside --models-dir
_RID = [{"name": "rid", "in": "path", "required": True, "schema": {"type": "string"}}]
SLOTS_RESPONSE = {"type": "array", "items": {"type": "object", "required": ["id", "n_ctx", "is_processing"],
                  "properties": {"id": {"type": "integer"}, "n_ctx": {"type": "integer"},
                                 "is_processing": {"type": "boolean"}, "n_tokens": {"type": "integer"}}}}
LORA_ADAPTERS = {"type": "array", "items": {"type": "object", "required": ["id", "name", "path", "scale"],
                                            "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                                           "path": {"type": "string"}, "scale": {"type": "number"}}}}
LORA_SCALES = {"type": "array", "items": {"type": "object", "required": ["id", "scale"], "additionalProperties": False,
                                          "properties": {"id": {"type": "integer", "minimum": 0},
                                                         "scale": {"type": "number"}}}}
_MODEL_QUERY = [{"name": "model", "in": "query", "required": False, "schema": {"type": "string"}}]
RESPONSE_DELETED = {"type": "object", "required": ["id", "deleted"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string"}, "deleted": {"const": True}}}


def _more_paths() -> dict:
    """llama.cpp's /apply-template and /slots, the stored responses, and Ollama's model management."""
    chat = REQUESTS["chat"]
    return {
        "/apply-template": {"post": _json_op("the prompt a chat body makes (llama.cpp's)", "apply_template", chat,
                                             {"type": "object", "required": ["prompt"],
                                              "properties": {"prompt": {"type": "string"}}},
                                             errors=_MODEL_ERRORS)},
        "/slots": {"get": _json_op("the model's slots (llama.cpp's)", "slots", None, SLOTS_RESPONSE,
                                   errors=_MODEL_ERRORS, params=[
                                       {"name": "model", "in": "query", "required": False, "schema": {"type": "string"}}])},
        "/lora-adapters": {
            "get": _json_op("the model's LoRA adapters and their scales (llama.cpp's)", "lora_adapters", None,
                            LORA_ADAPTERS, errors=_MODEL_ERRORS, params=_MODEL_QUERY),
            "post": _json_op("set the scales of requests that choose no adapters (llama.cpp's; ?model=NAME: whose)",
                             "lora_adapters_set", LORA_SCALES, LORA_ADAPTERS, errors=_MODEL_ERRORS)},
        "/v1/responses/{rid}": {
            "get": _json_op("a stored response", "response_get", None, RESPONSE_OBJECT, errors=(401, 404),
                            params=_RID),
            "delete": _json_op("delete a stored response", "response_delete", None, RESPONSE_DELETED,
                               errors=(401, 404), params=_RID)},
        "/api/create": {"post": _json_op("create a model from one this server has (Ollama's)", "ollama_create",
                                         OLLAMA_CREATE, _STATUS, OLLAMA_ERROR, _MANAGE_ERRORS,
                                         ndjson=True)},
        "/api/copy": {"post": _json_op("copy a model (Ollama's)", "ollama_copy", OLLAMA_COPY, None, OLLAMA_ERROR,
                                       _MANAGE_ERRORS)},
        "/api/delete": {"delete": _json_op("delete a model (Ollama's)", "ollama_delete", OLLAMA_DELETE, None,
                                           OLLAMA_ERROR, _MANAGE_ERRORS)},
    }


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
            "/v1/responses": _named(_post("a response (OpenAI's Responses API)", "responses", RESPONSE_OBJECT,
                                          stream=True), "its last one is response.completed (or .incomplete)"),
            "/v1/responses/input_tokens": _post("a response's input tokens", "input_tokens", INPUT_TOKENS_RESPONSE),
            "/v1/messages": _named(_post("a message (Anthropic's Messages API)", "messages", MESSAGE_RESPONSE,
                                             stream=True, error=ANTHROPIC_ERROR), "the last one is message_stop"),
            "/v1/messages/count_tokens": _post("a message's input tokens (Anthropic's)", "count_tokens",
                                               COUNT_TOKENS_RESPONSE, error=ANTHROPIC_ERROR),
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
            **_more_paths(),
        },
    }
    if api_key:  # every route but /health, /metrics and this document checks the key
        doc["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        for path, ops in doc["paths"].items():
            if path not in ("/health", "/metrics"):
                for op in ops.values():
                    op["security"] = [{"bearer": []}]
    return doc

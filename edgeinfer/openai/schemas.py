"""The OpenAI API's request schemas (JSON Schema 2020-12), the one definition of what the server and batch
jobs accept: every request body is validated against them before it is read (openai.validation),
`protocol`'s readers take their bounds from them, and `/openapi.json` is built from them (openai.openapi,
which holds the response schemas).

Every field named is applied, or accepted and ignored because it cannot change an answer (said in its
description), or refused unless empty (`refused`); a field not named is refused. An optional field may
also be `null` (OpenAI's clients send nulls for fields left unset). A schema may carry "x-error", the
message given when a value matches none of its alternatives.
"""

from __future__ import annotations

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
    "id_slot": integer(-1, None, "llama.cpp's slot whose tokens the prompt and answer become (/slots; -1: any)"),
    "lora": _opt({"type": "array", "maxItems": 64, "items": {
        "type": "object", "required": ["id", "scale"], "additionalProperties": False,
        "properties": {"id": {"type": "integer", "minimum": 0}, "scale": {"type": "number"}}},
        "description": "llama.cpp's per-request LoRA adapters: [{id, scale}] (ids of GET /lora-adapters); an adapter "
                       "left out runs at 0",
        "x-error": "must be a list of {\"id\": adapter index, \"scale\": number} objects"}),
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
_IMAGE_PART = {"type": "object", "required": ["type", "image_url"], "properties": {
    "type": {"const": "image_url"},
    "image_url": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["url"], "properties": {
        "url": {"type": "string"}, "detail": {"enum": ["auto", "low", "high"]}}}]}}}
TOOL_CALL = {"type": "object", "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "arguments": {"type": ["string", "object"]}}}}}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [_TEXT_PART, _IMAGE_PART]}},
                          {"type": "null"}],
                "x-error": "must be a string or an array of text and image_url parts"},
    "name": string("the author's name"),
    "tool_calls": _opt({"type": "array", "items": TOOL_CALL}),
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
    "reasoning_effort": _opt({"enum": ["low", "medium", "high"],
                              "description": "how long a model whose chat template takes it reasons (gpt-oss)",
                              "x-error": "must be low, medium or high"}),
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
    "parse_special": boolean("read special tokens' text (<|im_start|>, ...) as those tokens (llama.cpp's)"),
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

# -- Anthropic's Messages API (openai/anthropic.py translates it onto the chat route's pipeline) --------------

_BLOCKS = {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string"}}}, "x-error": "must be a string or an array of content blocks ({\"type\": ...})"}
ANTHROPIC_TOOL = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
    "description": {"type": "string"}, "input_schema": ANY_SCHEMA, "type": {"type": "string"},
    "cache_control": {"type": "object"}}}
_CONVERSATION = {
    "model": string("a served model's name; may be left out when one model is served", maxLength=256),
    "messages": {"type": "array", "minItems": 1, "description": "the conversation so far", "items": {
        "type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
            "role": {"enum": ["user", "assistant"]}, "content": {"anyOf": [{"type": "string"}, _BLOCKS],
                                                                 "x-error": _BLOCKS["x-error"]}}}},
    "system": {"anyOf": [{"type": "string"}, _BLOCKS], "x-error": "must be a string or an array of text blocks"},
    "tools": _opt({"type": "array", "items": ANTHROPIC_TOOL}),
    "tool_choice": _opt({"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["auto", "any", "tool", "none"]}, "name": {"type": "string"},
        "disable_parallel_tool_use": {"type": "boolean"}}}),
    "thinking": _opt({"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["enabled", "disabled", "adaptive", "between_tools"]},
        "budget_tokens": {"type": "integer", "minimum": 0}, "display": {"type": ["string", "null"]}}}),
    "output_config": _opt({"type": "object", "additionalProperties": False, "properties": {
        "effort": _opt({"enum": ["low", "medium", "high", "xhigh", "max"]}),
        "format": _opt({"type": "object", "required": ["type", "schema"], "properties": {
            "type": {"const": "json_schema"}, "schema": ANY_SCHEMA}})}}),
}
MESSAGES = {"type": "object", "required": ["messages", "max_tokens"], "properties": {
    **_CONVERSATION,
    "max_tokens": integer(1, None, "most tokens to generate"),
    "stream": boolean("stream the message as server-sent events"),
    "stop_sequences": _opt({"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP,
                            "x-error": f"must be a list of at most {MAX_STOP} non-empty strings"}),
    "temperature": number(0.0, 1.0, "sampling temperature; 0 is greedy"),
    "top_p": SAMPLING["top_p"], "top_k": integer(0, None, "sample from the k most likely tokens (0: off)"),
    # Anthropic's fields that cannot change an answer here: accepted and ignored
    "metadata": SAMPLING["metadata"], "service_tier": SAMPLING["service_tier"],
    **{k: _opt({"description": "accepted and ignored"}) for k in ("cache_control", "diagnostics", "inference_geo",
                                                                    "speed", "user_profile_id", "workspace_id")},
    "container": refused("no code execution container: tools run in the client"),
    "context_management": _opt({"description": "accepted and ignored: a conversation past the context is a 400"}),
    "mcp_servers": _opt({"anyOf": [{"type": "null"}, {"const": []}],
                         "description": "refused unless empty: no MCP connector (tools run in the client)",
                         "x-error": "is not supported (no MCP connector: tools run in the client)"}),
    # sampling fields, Anthropic's (temperature, top_p, top_k) and the chat route's, sent as extra body fields
    **{k: SAMPLING[k] for k in ("seed", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                                "repeat_penalty", "repeat_last_n", "ignore_eos", "priority", "id_slot", "lora")},
    "chat_template_kwargs": CHAT["properties"]["chat_template_kwargs"],
}}
COUNT_TOKENS = {"type": "object", "required": ["messages"], "properties": {
    **_CONVERSATION, "chat_template_kwargs": CHAT["properties"]["chat_template_kwargs"],
    **{k: MESSAGES["properties"][k] for k in ("metadata", "cache_control", "diagnostics", "inference_geo", "speed",
                                              "user_profile_id", "workspace_id", "context_management",
                                              "mcp_servers")}}}

# -- OpenAI's Responses API (openai/responses_api.py translates it onto the chat route's pipeline) ----------

_ITEMS = {"type": "array", "items": {"type": "object"}, "x-error": "must be a string or an array of input items"}
_INPUT = {
    "model": SAMPLING["model"],
    "input": {"anyOf": [{"type": "string"}, _ITEMS], "x-error": _ITEMS["x-error"]},
    "instructions": _opt({"type": "string", "description": "a system message put first (not carried over by "
                                                           "previous_response_id)"}),
    "previous_response_id": string("a stored response whose input and output come before this input"),
    "tools": _opt({"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string"}, "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "description": {"type": ["string", "null"]}, "parameters": _opt(ANY_SCHEMA),
        "strict": {"type": ["boolean", "null"]}}}}),
    "tool_choice": _opt({"anyOf": [{"enum": ["none", "auto", "required"]}, {
        "type": "object", "required": ["type"],
        "properties": {"type": {"type": "string"}, "name": {"type": "string"}}}],
        "x-error": "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}"}),
    "parallel_tool_calls": boolean("allow several calls in one reply"),
    "reasoning": _opt({"type": "object", "properties": {
        "effort": _opt({"enum": ["none", "minimal", "low", "medium", "high", "xhigh"]}),
        "summary": _opt({"type": "string"}), "generate_summary": _opt({"type": "string"})}}),
    "text": _opt({"type": "object", "properties": {
        "format": _opt({"type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["text", "json_object", "json_schema"]}, "name": {"type": "string"},
            "schema": ANY_SCHEMA, "strict": {"type": ["boolean", "null"]}, "description": {"type": "string"}}}),
        "verbosity": _opt({"enum": ["low", "medium", "high"], "description": "accepted and ignored"})}}),
    "truncation": _opt({"enum": ["auto", "disabled"], "description": "accepted: a conversation past the context "
                                                                    "is a 400 (context_length_exceeded) either way"}),
    **{k: SAMPLING[k] for k in ("metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
                                "user")},
    "include": _opt({"type": "array", "items": {"type": "string"}, "description": "accepted and ignored"}),
    "conversation": refused("no stored conversations: use previous_response_id"),
    "background": _opt({"const": False, "description": "not supported: responses run in the foreground",
                        "x-error": "is not supported (responses run in the foreground)"}),
    "prompt": refused("no stored prompts"),
}
RESPONSES = {"type": "object", "properties": {
    **_INPUT,
    "stream": SAMPLING["stream"],
    "stream_options": _opt({"type": "object", "properties": {"include_obfuscation": {"type": "boolean"}}}),
    "max_output_tokens": integer(1, None, "most tokens to generate (default: to the end of the context)"),
    "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"],
    # the chat route's sampling fields, sent as extra body fields
    **{k: SAMPLING[k] for k in ("seed", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                                "repetition_penalty", "repeat_penalty", "repeat_last_n", "ignore_eos", "priority",
                                "id_slot", "lora")},
    "chat_template_kwargs": CHAT["properties"]["chat_template_kwargs"],
}}
INPUT_TOKENS = {"type": "object", "properties": {**_INPUT}}

# Ollama's model management (server.ollama_manage; read by openai.ollama_create, whose checks these state)
_OLLAMA_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}(:latest)?$",
                "description": "a model name: letters, digits, '.', '_', '-', '+' (Ollama's ':latest' tag dropped)"}
_QUANTS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K", "Q4_K_S",
           "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4_MOE", "F16", "BF16", "F32"]  # (mixes.TYPES)
_MODEL_OR_NAME = [{"required": ["model"]}, {"required": ["name"]}]  # (older clients send "name")
OLLAMA_CREATE = {"type": "object", "required": ["from"], "anyOf": _MODEL_OR_NAME, "additionalProperties": False,
                 "properties": {
    "model": {**_OLLAMA_NAME, "description": "the new model's name"}, "name": _OLLAMA_NAME,
    "from": {"type": "string", "minLength": 1, "description": "the model it is made from (one this server has)"},
    "system": {"type": "string"}, "template": {"type": "string", "description": "a Jinja chat template"},
    "parameters": {"type": "object", "description": "Ollama's parameters: the model's sampling defaults"},
    "messages": {"type": "array", "items": {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"enum": ["system", "user", "assistant"]}, "content": {"type": "string"}}}},
    "license": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "quantize": {"enum": _QUANTS + [q.lower() for q in _QUANTS], "description": "write its own file of this type"},
    "quantization": {"enum": _QUANTS + [q.lower() for q in _QUANTS], "description": "the same, an older name"},
    "stream": {"type": "boolean"}}}
OLLAMA_COPY = {"type": "object", "required": ["source", "destination"], "additionalProperties": False,
               "properties": {"source": {"type": "string", "minLength": 1}, "destination": _OLLAMA_NAME}}
OLLAMA_DELETE = {"type": "object", "anyOf": _MODEL_OR_NAME, "additionalProperties": False,
                 "properties": {"model": {"type": "string", "minLength": 1}, "name": {"type": "string", "minLength": 1}}}

REQUESTS = {"chat": CHAT, "completions": COMPLETION, "embeddings": EMBEDDINGS, "tokenize": TOKENIZE,
            "detokenize": DETOKENIZE, "infill": INFILL, "messages": MESSAGES, "count_tokens": COUNT_TOKENS,
            "responses": RESPONSES, "input_tokens": INPUT_TOKENS}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings",
         "tokenize": "/tokenize", "detokenize": "/detokenize", "infill": "/infill", "messages": "/v1/messages",
         "count_tokens": "/v1/messages/count_tokens", "responses": "/v1/responses",
         "input_tokens": "/v1/responses/input_tokens"}
for _schema in REQUESTS.values():  # a field no schema names is refused (a 400 naming it), as OpenAI's API does
    _schema["additionalProperties"] = False

"""Ollama's model management, HTTP-free: reading /api/create, /api/copy and /api/delete bodies, and putting
a created model's defaults (edgeinfer.registry.created) into a request before it is read, whichever API it
came by.

A created model's defaults, as Ollama applies a Modelfile's: its `system` message where the request has
none; its `messages` before the conversation; its `parameters` (Ollama's names) as the request's sampling
values where the request gives none; its `template` in place of the file's chat template (served.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from . import protocol as P
from .ollama_options import parse_model, parse_options

CREATE_FIELDS = {"model", "name", "from", "system", "template", "parameters", "messages", "license", "quantize",
                 "quantization", "stream", "files", "adapters", "modelfile", "path"}
ROLES = ("system", "user", "assistant")


@dataclass
class CreateRequest:
    name: str
    base: str
    system: str | None
    template: str | None
    parameters: dict
    messages: list
    license: list
    quantize: str | None
    stream: bool
    adapters: list  # blob digests of LoRA adapters (Ollama's ADAPTER)
    base_blob: str | None = None  # the digest of an uploaded GGUF model (`files`), in place of `from`


def _unknown(body: dict, known: set, route: str) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise P.bad(extra[0], f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} in {route}")


def parse_create(body: dict, quant_types) -> CreateRequest:
    """/api/create's body: `model` (the new name) and `from` (a model this server has), with any of system,
    template (Jinja), parameters, messages, license, quantize; a 400 naming the field otherwise."""
    from ..registry import check_name
    from ..registry.errors import InvalidNameError

    name = parse_model(body)
    try:
        check_name(name)
    except InvalidNameError as e:
        raise P.bad("model", str(e)) from None
    _unknown(body, CREATE_FIELDS, "/api/create")
    for key, why in (("modelfile", "the old 'modelfile' text is not read: send its parts as 'from', 'system', "
                                   "'template', 'parameters', 'messages' (the ollama client does)"),
                     ("path", "'path' (a Modelfile on the server) is not read: send 'from' and the other fields")):
        if body.get(key):
            raise P.bad(key, why)
    adapters, base_blob = _blob_map(body, "adapters"), _blob_map(body, "files")
    if len(base_blob) > 1 or any(not f.endswith(".gguf") for f in (body.get("files") or {})):
        raise P.bad("files", "'files' takes one GGUF model file ({\"model.gguf\": \"sha256:...\"}); safetensors are "
                             "not read: convert them to GGUF first")
    base = body.get("from")
    if base_blob and base:
        raise P.bad("from", "give 'from' or 'files', not both")
    if not base_blob and (not isinstance(base, str) or not base):
        raise P.bad("from", "'from' must name the model to create from, e.g. \"qwen2.5-coder-0.5b-instruct\"")
    base = base[:-len(":latest")] if base and base.endswith(":latest") else base
    system, template = body.get("system"), body.get("template")
    for key, v in (("system", system), ("template", template)):
        if v is not None and not isinstance(v, str):
            raise P.bad(key, f"'{key}' must be a string")
    if template:
        _check_template(template)
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise P.bad("parameters", "'parameters' must be an object of Ollama's parameters, e.g. {\"temperature\": 0.2}")
    try:
        parse_options({"options": params})
    except P.APIError as e:
        raise P.bad("parameters" + (e.param or "")[len("options"):], str(e).replace("options.", "parameters.")) from None
    _check_as_request(params)
    messages = body.get("messages") or []
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages):
        raise P.bad("messages", "'messages' must be a list of {\"role\": system|user|assistant, \"content\": text}")
    if system is None and any(m["role"] == "system" for m in messages):  # a system message: the model's system
        system = [m["content"] for m in messages if m["role"] == "system"][-1]
    lic = body.get("license") or []
    lic = [lic] if isinstance(lic, str) else lic
    if not isinstance(lic, list) or not all(isinstance(x, str) for x in lic):
        raise P.bad("license", "'license' must be a string or a list of strings")
    quant = body.get("quantize") or body.get("quantization")
    if quant is not None:
        if not isinstance(quant, str) or quant.upper() not in quant_types:
            raise P.bad("quantize", f"'quantize' must be one of {', '.join(quant_types)}, got {json.dumps(quant)[:40]}")
        quant = quant.upper()
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise P.bad("stream", "'stream' must be true or false")
    messages = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
    return CreateRequest(name, base or "", system, template or None, params, messages, lic, quant, stream, adapters,
                         base_blob[0] if base_blob else None)


def _blob_map(body: dict, key: str) -> list[str]:
    """`files` or `adapters`: {file name: "sha256:HEX"} (Ollama's, the digests of uploaded blobs) -> the digests."""
    from ..registry import blobs

    v = body.get(key) or {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(d, str) for k, d in v.items()):
        raise P.bad(key, f"'{key}' must be an object of file names to blob digests, e.g. "
                         '{"a.gguf": "sha256:..."}')
    for d in v.values():
        try:
            blobs.hex_of(d)
        except blobs.BlobError as e:
            raise P.bad(key, f"'{key}': {e}") from None
    return list(v.values())


def _check_as_request(params: dict) -> None:
    """The parameters as the defaults of an OpenAI request (the strictest of the APIs they reach): a value no
    request could carry (temperature 3, five stop strings) is refused now, not in every later request."""
    try:
        P.validate("chat", _fields(params, {"messages": [{"role": "user", "content": "x"}]}, _OPENAI))
    except P.APIError as e:
        back = {field: param for param, field in _OPENAI.items()}.get(e.param, e.param)
        raise P.bad(f"parameters.{back}", str(e).replace(f"'{e.param}'", f"'parameters.{back}'")) from None


def _check_template(template: str) -> None:
    from ..chat_template import ChatTemplate, ChatTemplateError

    if "{{ ." in template or "{{." in template or "{{- ." in template:
        raise P.bad("template", "'template' is an Ollama Go template, which edgeinfer does not run: give a Jinja "
                                "chat template (as a GGUF file's tokenizer.chat_template), or leave it out to keep "
                                "the model's")
    try:
        ChatTemplate(template)
    except ChatTemplateError as e:
        raise P.bad("template", f"'template': {e}") from None


def parse_copy(body: dict) -> tuple[str, str]:
    """/api/copy's body: (source, destination)."""
    from ..registry import check_name
    from ..registry.errors import InvalidNameError

    if not isinstance(body, dict):
        raise P.APIError(400, "the request body must be a JSON object")
    _unknown(body, {"source", "destination"}, "/api/copy")
    src, dst = parse_model(body, "source"), parse_model(body, "destination")
    try:
        check_name(dst)
    except InvalidNameError as e:
        raise P.bad("destination", str(e)) from None
    return src, dst


def parse_delete(body: dict) -> str:
    if not isinstance(body, dict):
        raise P.APIError(400, "the request body must be a JSON object")
    _unknown(body, {"model", "name"}, "/api/delete")
    return parse_model(body)


# -- a created model's defaults in a request --------------------------------------------------------

# Ollama's parameter -> the request field of each API that takes it
_OPENAI = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
           "stop": "stop", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
           "repeat_penalty": "repetition_penalty", "num_predict": "max_tokens"}
_ANTHROPIC = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "stop": "stop_sequences",
              "num_predict": "max_tokens"}
_RESPONSES = {"temperature": "temperature", "top_p": "top_p", "num_predict": "max_output_tokens"}


def _messages(created, messages, system_roles=("system", "developer")) -> list:
    messages = list(messages)
    lead = 0
    while lead < len(messages) and isinstance(messages[lead], dict) and messages[lead].get("role") in system_roles:
        lead += 1
    extra = [m for m in created.messages if m["role"] != "system"]
    system = [] if lead or not created.system else [{"role": "system", "content": created.system}]
    return system + messages[:lead] + extra + messages[lead:]


def _fields(parameters: dict, body: dict, names: dict) -> dict:
    out = dict(body)
    for param, field in names.items():
        v = parameters.get(param)
        if v is None or out.get(field) is not None or (field in ("max_tokens", "max_output_tokens") and v in (-1, -2)):
            continue
        if param == "seed" and v < 0:  # Ollama's -1: a random seed, which no seed is
            continue
        out[field] = [v] if field in ("stop", "stop_sequences") and isinstance(v, str) else v
    return out


def with_defaults(created, body: dict, api: str) -> dict:
    """The request body with a created model's defaults (see the module's docstring). api: "chat" and
    "completions" (OpenAI's), "ollama_chat", "ollama_generate", "messages" (Anthropic's), "responses"."""
    if created is None or not isinstance(body, dict):
        return body
    if api in ("chat", "completions"):
        out = _fields(created.parameters, body, _OPENAI)
        if api == "chat" and isinstance(body.get("messages"), list):
            out["messages"] = _messages(created, body["messages"])
        return out
    if api in ("ollama_chat", "ollama_generate"):
        out = dict(body)
        opts = body.get("options")
        if isinstance(opts, dict) or opts is None:
            out["options"] = {**created.parameters, **(opts or {})}
        if api == "ollama_chat" and isinstance(body.get("messages"), list):
            out["messages"] = _messages(created, body["messages"])
        elif api == "ollama_generate" and not body.get("system") and not body.get("raw") and created.system:
            out["system"] = created.system
        return out
    if api == "messages":
        out = _fields(created.parameters, body, _ANTHROPIC)
        if not body.get("system") and created.system:
            out["system"] = created.system
        if isinstance(body.get("messages"), list):
            out["messages"] = [m for m in created.messages if m["role"] != "system"] + body["messages"]
        return out
    if api == "responses":
        out = _fields(created.parameters, body, _RESPONSES)
        if not body.get("instructions") and created.system:
            out["instructions"] = created.system
        if created.messages and body.get("input") is not None and not body.get("previous_response_id"):
            given = body["input"]
            given = [{"role": "user", "content": given}] if isinstance(given, str) else given
            if isinstance(given, list):
                out["input"] = [m for m in created.messages if m["role"] != "system"] + given
        return out
    raise ValueError(api)


async def with_created(body, api: str, state=None):
    """A request body with the defaults of the created model it names, if it names one (edgeinfer.openai.
    ollama_create.with_defaults); any other body as it is (a damaged manifest is the model lookup's 500)."""
    name = body.get("model", body.get("name")) if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        return body
    name = name[:-len(":latest")] if name.endswith(":latest") else name
    from ..registry import created, lookup

    if lookup(name) is not None or name in getattr(getattr(state, "models", None), "command_line", ()):
        return body  # a catalog or command-line model by that name is what the request gets (Servables.find)

    try:
        if not created.manifest(name).is_file():  # one stat: most requests name no created model
            return body
        c = await asyncio.to_thread(created.load, name)
    except Exception:  # not a manifest's name, or a damaged one
        return body
    return with_defaults(c, body, api)


def modelfile(created, ctx: int | None) -> tuple[str, str]:
    """(the Modelfile, the parameters text) /api/show gives for a created model, as Ollama writes them."""
    params = []
    for k, v in created.parameters.items():
        for x in v if isinstance(v, list) else [v]:
            params.append(f"{k:<30} {json.dumps(x) if isinstance(x, str) else x}")
    if ctx and "num_ctx" not in created.parameters:
        params.append(f"{'num_ctx':<30} {ctx}")
    lines = [f"# Modelfile of {created.name}, created from {created.base}", f"FROM {created.file}"]
    lines += [f"ADAPTER {a}" for a in getattr(created, "adapters", ())]
    if created.template:
        lines.append(f'TEMPLATE """{created.template}"""')
    if created.system:
        lines.append(f'SYSTEM """{created.system}"""')
    lines += [f"PARAMETER {p.split(None, 1)[0]} {p.split(None, 1)[1]}" for p in params]
    lines += [f'MESSAGE {m["role"]} """{m["content"]}"""' for m in created.messages]
    lines += [f'LICENSE """{x}"""' for x in created.license]
    return "\n".join(lines) + "\n", "\n".join(params)

"""Ollama's generation, embedding and pull request bodies read into our request objects (protocol.ParsedRequest,
handlers.Generation): pure functions, no HTTP (edgeinfer.server.ollama sends the answers, built by
ollama_replies). The fields every route shares are ollama_options'.

- /api/generate renders the prompt (and `system`) through the model's chat template as one user turn, as
  Ollama does; `raw` sends it as it is; `context` (the token ids a previous reply returned) goes in front;
  `suffix` builds a fill-in-the-middle prompt when the model has FIM tokens. A custom `template` is refused.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ..errors import EdgeInferError
from ..vision import MediaPrompt
from . import handlers as H
from . import protocol as P
from .ollama_options import (FIELD_TO_OPTION, bool_field, is_int, keep_alive, opt_field, parse_format, parse_model,
                             parse_options, str_field)

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
    images: list = field(default_factory=list)  # generate: base64 images (read through the chat template)
    think: bool | str | None = None  # false: a thinking model's reply is not split (levels are not applied)

    @property
    def unload(self) -> bool:
        return self.load_only and self.keep_alive == 0


def _common(body) -> tuple[str, dict]:
    """What /api/chat and /api/generate share: the model, stream, think, options, format, logprobs and
    keep_alive; the sampling parameters as a ParsedRequest (max_tokens is num_predict's, set later)."""
    model = parse_model(body)
    stream = bool_field(body, "stream", True)  # Ollama streams unless told not to
    think = body.get("think")
    if think is not None and not isinstance(think, bool) and think not in THINK_LEVELS:
        raise P.bad("think", f"'think' must be true, false or one of {', '.join(THINK_LEVELS)}")
    opts = parse_options(body)
    constraint, constraint_param = parse_format(body)
    logprobs = bool_field(body, "logprobs", False)
    top = opt_field(body, "top_logprobs", lambda v: is_int(v) and 0 <= v <= 20, "an integer from 0 to 20", 0)
    if top and not logprobs:
        raise P.bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    kwargs = {**opts.kwargs, **constraint, "logprobs": int(top) if logprobs else None}
    parsed = P.ParsedRequest(model=model, stream=stream, include_usage=False, max_tokens=None, params_kwargs=kwargs,
                             logprobs=logprobs, top_logprobs=int(top), constraint_param=constraint_param)
    return model, dict(stream=stream, keep_alive=keep_alive(body), parsed=parsed, num_predict=opts.num_predict,
                       think=think)


def _images(v, where: str) -> list:
    """Ollama's images: base64 strings (their decoding is checked where the prompt is built)."""
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(b, str) for b in v):
        raise P.bad(where, f"'{where}' must be an array of base64-encoded images")
    return v


def _with_images(content: str, images: list) -> str | list:
    """A message's content with its images first, as OpenAI content parts (data: URLs of the base64)."""
    if not images:
        return content
    parts = [{"type": "image_url", "image_url": {"url": "data:;base64," + b}} for b in images]
    return parts + ([{"type": "text", "text": content}] if content else [])


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
    out = {"role": role, "content": _with_images(content, _images(m.get("images"), f"{where}.images"))}
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
    stream, keep_alive, think, images (read through the chat template: not with raw); a custom template is
    refused."""
    model, common = _common(body)
    prompt, system, suffix = (str_field(body, k, "") for k in ("prompt", "system", "suffix"))
    if str_field(body, "template", ""):
        raise P.bad("template", "a custom 'template' is not supported: the model's own chat template is used "
                                "(or send 'raw': true with a prompt formatted already)")
    images = _images(body.get("images"), "images")
    raw = bool_field(body, "raw", False)
    if images and (raw or suffix):
        raise P.bad("images", "'images' go through the model's chat template: not with 'raw' or 'suffix'")
    context = opt_field(body, "context", lambda v: isinstance(v, list) and all(is_int(t) for t in v),
                   "an array of token ids (a previous reply's context)", [])
    if raw and (system or context or suffix):
        raise P.bad("raw", "'raw' sends the prompt as it is: it cannot be combined with 'system', 'context' or "
                           "'suffix'")
    if suffix and (system or context):
        raise P.bad("suffix", "a fill-in-the-middle ('suffix') cannot be combined with 'system' or 'context'")
    return OllamaRequest(model, False, load_only=not prompt and not images, prompt=prompt, system=system,
                         suffix=suffix, raw=raw, context=[int(t) for t in context], images=images, **common)


def _generate_body(llm, req: OllamaRequest) -> dict:
    """What handlers.prepare_generation reads for a completion: the prompt's token ids (through the chat
    template unless raw, after the context), or the prompt and suffix of a fill-in-the-middle."""
    tok = llm.tokenizer
    if req.suffix:
        return {"prompt": req.prompt, "suffix": req.suffix}
    if req.raw:
        return {"prompt": req.prompt}
    msgs = [{"role": "system", "content": req.system}] if req.system else []
    msgs.append({"role": "user", "content": _with_images(req.prompt, req.images)})
    if req.images and llm.vision is None:
        raise P.bad("images", f"model {req.model!r} has no vision projector: it cannot read images (serve it with "
                              "--mmproj FILE)")
    try:
        ids = llm.chat_prompt(msgs, local_files=False) if req.images else llm.render_chat(msgs, True)
    except ValueError as e:  # the template's, or an image that cannot be read
        raise P.bad("images" if req.images else "prompt", str(e)) from None
    if req.context:
        P.check_token_ids(req.context, tok.vocab_size, "context")
        if llm.vision is not None and llm.vision.placeholder in req.context:  # its image rows are not in it
            raise P.bad("context", "a 'context' that held an image cannot be continued (the image's rows are not in "
                                   "it): send the conversation to /api/chat with its images")
        drop = int(tok.bos_id is not None and bool(ids) and ids[0] == tok.bos_id)  # the context has the BOS
        media = [dataclasses.replace(m, start=m.start - drop + len(req.context)) for m in getattr(ids, "media", ())]
        ids = MediaPrompt(req.context + list(ids)[drop:], media)
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
            if not req.raw and not req.suffix:  # the prompt went through the template
                H.read_reply_as_templated(gen, llm, reasoning_format)
    except P.APIError as e:  # SamplingParams names its field; the request named an option
        option = FIELD_TO_OPTION.get(e.param or "")
        if option is None:
            raise
        raise P.bad(f"options.{option}", f"options.{option}: {e.message}") from None
    if req.num_predict is not None and req.num_predict < gen.params.max_tokens:
        gen.params = dataclasses.replace(gen.params, max_tokens=req.num_predict)
    return gen


# -- embeddings and pull ---------------------------------------------------------------------------


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
    dims = opt_field(body, "dimensions", lambda v: is_int(v) and v >= 1, "a positive integer")
    return EmbedRequest(model, inputs, bool_field(body, "truncate", True), int(dims) if dims is not None else None,
                        keep_alive(body))


def parse_embeddings(body) -> EmbedRequest:
    """The older /api/embeddings: model, prompt (empty: a load call), options, keep_alive."""
    model = parse_model(body)
    parse_options(body)
    prompt = str_field(body, "prompt", "")
    return EmbedRequest(model, [prompt] if prompt else [], True, None, keep_alive(body))


@dataclass(frozen=True)
class PullTarget:
    """A Hugging Face reference /api/pull fetches: its name in the cache, the reference, no digest known
    ahead (the Hub's is checked by the pull)."""

    name: str
    source: str
    sha256: str = ""


def parse_pull(body):
    """/api/pull: (what to pull, stream). Catalog names and aliases (a catalog entry), and Hugging Face
    references, hf.co/ORG/REPO[:QUANT] (a PullTarget, as Ollama pulls them); a URL or a path is refused (400),
    an unknown name is a 404 listing the catalog."""
    from .. import registry

    name = parse_model(body)
    stream = bool_field(body, "stream", True)
    bool_field(body, "insecure", False)
    if name.startswith(("hf.co/", "huggingface.co/")):
        try:
            ref = registry.parse_ref(name)
        except EdgeInferError as e:
            raise P.bad("model", str(e)) from None
        if ref is not None:
            return PullTarget(ref.name, name), stream
    if "://" in name or name.startswith(("http:", "https:", "file:")):
        raise P.bad("model", f"'model' must be a catalog name: this route does not pull URLs ({name[:80]!r})")
    if any(c in name for c in "/\\") or name.startswith((".", "~")) or name.endswith(".gguf"):
        raise P.bad("model", f"'model' must be a catalog name, not a path ({name[:80]!r})")
    entry = registry.lookup(name)
    if entry is None:
        raise P.APIError(404, f"model {name!r} is not in the catalog; it has: {', '.join(sorted(registry.CATALOG))}")
    return entry, stream


"""What an OpenAI request body asks of a loaded model: the prompt's token ids, the sampling parameters,
the compiled constraint (generations), the inputs' token ids (embeddings).

Shared by the HTTP server (edgeinfer.server) and batch jobs (edgeinfer.batch), so a request line in a
batch file is read, refused and answered exactly as the same body sent to `edgeinfer serve`.
Synchronous and free of any HTTP stack: the server calls these in a worker thread."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .. import harmony, reasoning
from ..engine.llm_engine import PromptTooLongError, RequestOutput
from ..images import ImageError
from ..sampling import SamplingParams
from ..structured import GrammarError
from .. import tool_formats
from ..tools import ToolError, call_grammar, parse_tools
from ..vision import split_images
from . import protocol as P
from .fim import infill_prompt, llm_fim_tokens


@dataclass
class Generation:
    """A chat or completion request, ready for the engine."""

    req: P.ParsedRequest
    chat: bool
    prompt_ids: list[int]
    params: SamplingParams
    guide: object | None = None  # the compiled constraint, when params.constrained
    tools: list = field(default_factory=list)  # the request's tool specs
    shown: list = field(default_factory=list)  # the tools the model is shown (none for tool_choice "none")
    # the choices (req.n): one engine request of n, each choice with its own seed and grammar matcher
    # (edgeinfer.engine.choices), sharing the prompt's KV blocks
    n: int = 1
    reasoning: bool = False  # a chat reply split into reasoning_content and content (edgeinfer.reasoning)
    reasoning_open: bool = False  # the prompt ends inside an open <think>: the reply starts in reasoning
    harmony: bool = False  # a gpt-oss reply in the harmony format, parsed by channel (edgeinfer.harmony)
    tool_format: object = None  # the model's form of a tool call (edgeinfer.tool_formats), where tools are shown


def budget(llm, prompt_ids: list[int], req: P.ParsedRequest, param: str) -> int:
    """max_tokens for a prompt: the request's, checked against the context, or all the room left."""
    context = llm.engine.max_context
    if len(prompt_ids) >= context:
        raise P.too_long(param, f"the prompt has {len(prompt_ids)} tokens but the context holds {context}")
    room = context - len(prompt_ids)
    if req.max_tokens is None:
        return room
    if req.max_tokens > room:
        total = len(prompt_ids) + req.max_tokens
        raise P.too_long("max_tokens", f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({req.max_tokens}) "
                                       f"is {total} tokens, more than the context of {context}")
    return req.max_tokens


def chat_prompt(llm, name: str, body: dict, req: P.ParsedRequest, as_text: bool = False
                ) -> tuple[list[int] | str, list, list, object]:
    """A chat body's prompt token ids (as_text: its text), through the chat template with the tools it shows; its
    tools, the tools shown and the tool choice. An APIError (400) names what is wrong."""
    messages = P.parse_messages(body)
    try:
        tools, tool_choice = parse_tools(body.get("tools"), body.get("tool_choice"))
    except ToolError as e:
        raise P.bad(e.param, str(e)) from None
    shown = tools if tool_choice.mode != "none" else []
    if body.get("reasoning_effort") is not None and "reasoning_effort" not in (llm.chat_template.source or ""):
        raise P.bad("reasoning_effort", f"'reasoning_effort' is not supported by {name}: its chat template has no "
                                        "reasoning effort")
    images = any(isinstance(m["content"], list) for m in messages)  # parse_messages kept parts with images
    if images and llm.vision is None:
        raise P.bad("messages", f"model {name!r} has no vision projector: it cannot read images (serve it with "
                                "--mmproj FILE)")
    try:
        if images and not as_text:
            prompt = llm.chat_prompt(messages, shown, template_vars=req.template_vars, local_files=False)
        else:
            if images:  # the text only, each image as its marker
                messages = split_images(messages, local_files=False)[0]
            prompt = llm.render_chat(messages, True, shown, template_vars=req.template_vars, as_text=as_text)
    except ToolError as e:
        raise P.bad(e.param, str(e)) from None
    except ImageError as e:  # an image that cannot be read, or a URL that is not a data: URL
        raise P.bad("messages", str(e)) from None
    except ValueError as e:  # the template's own errors, or a variable it cannot take
        raise P.bad("chat_template_kwargs" if str(e).startswith("chat template variable") else "messages",
                    str(e)) from None
    return prompt, tools, shown, tool_choice


def prepare_generation(llm, name: str, body: dict, req: P.ParsedRequest, chat: bool,
                       reasoning_format: str = "auto") -> Generation:
    """The prompt's token ids (through the chat template for chat), the sampling parameters and the
    compiled constraint (one per choice) of a body P.parse_common has read. An APIError (400) names
    what is wrong. reasoning_format: the server's --reasoning-format (edgeinfer.reasoning.splits)."""
    if llm.is_encoder:
        raise P.bad("model", f"model {name!r} is an embedding model: it cannot generate; use /v1/embeddings")
    tok = llm.tokenizer
    tools, shown, extra = [], [], {}
    if chat:
        prompt_ids, tools, shown, tool_choice = chat_prompt(llm, name, body, req)
        fmt = tool_formats.for_model(llm) if tools else None
        grammar = call_grammar(tools, tool_choice, P.parse_parallel_tool_calls(body), fmt)
        if grammar is not None:
            if req.constraint_param:
                raise P.bad("tool_choice", f"tool_choice {tool_choice.mode!r} constrains the reply to tool calls; "
                                           f"it cannot be combined with '{req.constraint_param}'")
            extra["grammar"] = grammar
    else:
        prompt = body["prompt"] if getattr(body.get("prompt"), "media", None) is not None else P.parse_prompt(body)
        suffix = body.get("suffix")
        if suffix is not None and (suffix or llm_fim_tokens(llm).can_infill):  # fill in the middle
            prompt_ids, extra["stop_token_ids"] = completion_fim(llm, name, prompt, suffix, req)
        elif isinstance(prompt, str):
            prompt_ids = tok.encode(prompt, None, False)
        else:
            P.check_token_ids(prompt, tok.vocab_size, "prompt")
            prompt_ids = prompt
        if not prompt_ids:
            raise P.bad("prompt", "'prompt' is empty")
    params = P.sampling_params(req, budget(llm, prompt_ids, req, "messages" if chat else "prompt"), **extra)
    P.check_token_ids([t for t, _ in params.logit_bias], tok.vocab_size, "logit_bias")
    guide = None
    if params.constrained:
        try:  # compiled here, in the caller's thread; the engine's grammar cache serves the other choices
            guide = llm.engine.guide(params)
        except GrammarError as e:
            raise P.bad(req.constraint_param or "tools", str(e)) from None
    gen = Generation(req, chat, prompt_ids, params, guide, tools, shown, req.n)
    if chat and shown:
        gen.tool_format = fmt
        if fmt.special_text:  # its calls start with a control token ([TOOL_CALLS], <|python_tag|>)
            gen.params = dataclasses.replace(gen.params, special_text=True)
    if chat:
        read_reply_as_templated(gen, llm, reasoning_format)
    return gen


def read_reply_as_templated(gen: Generation, llm, reasoning_format: str) -> None:
    """How the reply to a prompt that went through the chat template is read: a harmony template's (gpt-oss)
    by channel, the control tokens' text kept for it, reasoning apart unless reasoning_format is "none"; a
    thinking model's split at its think tags where edgeinfer.reasoning.splits says so."""
    if harmony.is_harmony(llm.chat_template.source):
        gen.params = dataclasses.replace(gen.params, special_text=True)
        gen.harmony, gen.reasoning = True, reasoning_format != "none"
    elif reasoning.splits(reasoning_format, llm.chat_template.source):
        gen.reasoning = True
        gen.reasoning_open = reasoning.prompt_opens_reasoning(
            llm.tokenizer.decode(gen.prompt_ids[-16:], special=True), reasoning.template_format(llm.chat_template.source))


class Output:
    """One choice's output, gathered as the engine produces it."""

    __slots__ = ("parts", "ids", "lps", "reason", "cached", "stop_sequence")

    def __init__(self):
        self.parts, self.ids, self.lps, self.reason, self.cached = [], [], [], None, 0
        self.stop_sequence: str | None = None

    def add(self, out: RequestOutput) -> bool:
        """One step's output; True once the choice is finished."""
        self.cached = max(self.cached, out.num_cached_tokens)  # (choice 0's is the request's: later choices
        # share its blocks)
        self.parts.append(out.delta_text)
        self.ids += out.new_token_ids
        self.lps += out.logprobs or []
        if out.finished:
            self.reason, self.stop_sequence = out.finish_reason, out.stop_sequence
        return out.finished

    @property
    def text(self) -> str:
        return "".join(self.parts)


def embedding_inputs(llm, name: str, inputs: list, dims: int | None, truncate: bool) -> list[list[int]]:
    """The token ids of /v1/embeddings' inputs (P.parse_embeddings' output), checked against the
    model's width and context."""
    if dims is not None and dims > llm.config.dim:
        raise P.bad("dimensions", f"'dimensions' is {dims} but {name} gives vectors of {llm.config.dim}")
    try:
        return llm.embed_tokens(inputs, truncate)
    except PromptTooLongError as e:
        raise P.too_long("input", str(e)) from None
    except ValueError as e:  # empty, or a bad token id
        raise P.bad("input", str(e)) from None


# -- fill in the middle: a completion's suffix, and llama.cpp's /infill -------------------------------


def _fim(llm, name: str, param: str):
    fim = llm_fim_tokens(llm)
    if not fim.can_infill:
        raise P.bad(param, f"model {name!r} has no fill-in-the-middle tokens ({', '.join(fim.missing)} token "
                           "missing): it cannot fill in between a prefix and a suffix")
    return fim


def _fim_stops(llm, fim) -> tuple[int, ...]:
    # llama.cpp's end-of-generation set for infill: the tokenizer's stops plus FIM pad, repo and file separator
    return tuple(t for t in fim.stop_ids if t not in llm.tokenizer.stop_ids)


def completion_fim(llm, name: str, prompt, suffix: str, req: P.ParsedRequest) -> tuple[list[int], tuple[int, ...]]:
    """A completion with a suffix: the infill prompt of prefix `prompt` (text or token ids) and `suffix`,
    and the extra stop tokens. A 400 when the model has no FIM tokens."""
    fim = _fim(llm, name, "suffix")
    if not isinstance(prompt, str):
        P.check_token_ids(prompt, llm.tokenizer.vocab_size, "prompt")
    ids = infill_prompt(llm.tokenizer, fim, prompt, suffix, n_ctx=llm.engine.max_context,
                        n_predict=req.max_tokens or -1)
    return ids, _fim_stops(llm, fim)


def prepare_infill(llm, name: str, req: P.ParsedRequest, inp: P.InfillInput) -> Generation:
    """llama.cpp's /infill (a body P.parse_infill has read): the infill prompt, the sampling parameters
    with llama.cpp's end-of-generation tokens for infill, the compiled constraint."""
    if llm.is_encoder:
        raise P.bad("model", f"model {name!r} is an embedding model: it cannot generate; use /v1/embeddings")
    fim = _fim(llm, name, "model")
    prompt_ids = infill_prompt(llm.tokenizer, fim, inp.prefix, inp.suffix, inp.extra, inp.prompt,
                               n_ctx=llm.engine.max_context, n_predict=req.max_tokens or -1)
    params = P.sampling_params(req, budget(llm, prompt_ids, req, "input_prefix"), stop_token_ids=_fim_stops(llm, fim))
    P.check_token_ids([t for t, _ in params.logit_bias], llm.tokenizer.vocab_size, "logit_bias")
    guide = None
    if params.constrained:
        try:
            guide = llm.engine.guide(params)
        except GrammarError as e:
            raise P.bad(req.constraint_param, str(e)) from None
    return Generation(req, False, prompt_ids, params, guide)

"""What an OpenAI request body asks of a loaded model: the prompt's token ids, the sampling parameters,
the compiled constraint (generations), the inputs' token ids (embeddings).

Shared by the HTTP server (edgeinfer.server) and batch jobs (edgeinfer.batch), so a request line in a
batch file is read, refused and answered exactly as the same body sent to `edgeinfer serve`.
Synchronous and free of any HTTP stack: the server calls these in a worker thread."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sampling import SamplingParams
from ..structured import GrammarError
from ..tools import ToolError, call_grammar, parse_tools
from . import protocol as P


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


def budget(llm, prompt_ids: list[int], req: P.ParsedRequest, param: str) -> int:
    """max_tokens for a prompt: the request's, checked against the context, or all the room left."""
    context = llm.engine.max_context
    if len(prompt_ids) >= context:
        raise P.bad(param, f"the prompt has {len(prompt_ids)} tokens but the context holds {context}")
    room = context - len(prompt_ids)
    if req.max_tokens is None:
        return room
    if req.max_tokens > room:
        raise P.bad("max_tokens", f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({req.max_tokens}) "
                                  f"is {len(prompt_ids) + req.max_tokens} tokens, more than the context of {context}")
    return req.max_tokens


def prepare_generation(llm, name: str, body: dict, req: P.ParsedRequest, chat: bool) -> Generation:
    """The prompt's token ids (through the chat template for chat), the sampling parameters and the
    compiled constraint of a body P.parse_common has read. An APIError (400) names what is wrong."""
    if llm.is_encoder:
        raise P.bad("model", f"model {name!r} is an embedding model: it cannot generate; use /v1/embeddings")
    tok = llm.tokenizer
    tools, shown, extra = [], [], {}
    if chat:
        messages = P.parse_messages(body)
        try:
            tools, tool_choice = parse_tools(body.get("tools"), body.get("tool_choice"))
        except ToolError as e:
            raise P.bad(e.param, str(e)) from None
        shown = tools if tool_choice.mode != "none" else []
        grammar = call_grammar(tools, tool_choice, P.parse_parallel_tool_calls(body))
        if grammar is not None:
            if req.constraint_param:
                raise P.bad("tool_choice", f"tool_choice {tool_choice.mode!r} constrains the reply to tool calls; "
                                           f"it cannot be combined with '{req.constraint_param}'")
            extra["grammar"] = grammar
        try:
            prompt_ids = llm.render_chat(messages, True, shown)
        except ToolError as e:
            raise P.bad(e.param, str(e)) from None
        except ValueError as e:
            raise P.bad("messages", str(e)) from None
    else:
        prompt = P.parse_prompt(body)
        if isinstance(prompt, str):
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
        try:
            guide = llm.engine.grammars.guide(params)
        except GrammarError as e:
            raise P.bad(req.constraint_param or "tools", str(e)) from None
    return Generation(req, chat, prompt_ids, params, guide, tools, shown)


def embedding_inputs(llm, name: str, inputs: list, dims: int | None, truncate: bool) -> list[list[int]]:
    """The token ids of /v1/embeddings' inputs (P.parse_embeddings' output), checked against the
    model's width and context."""
    if dims is not None and dims > llm.config.dim:
        raise P.bad("dimensions", f"'dimensions' is {dims} but {name} gives vectors of {llm.config.dim}")
    try:
        return llm.embed_tokens(inputs, truncate)
    except ValueError as e:  # too long for the context (PromptTooLongError), empty, or a bad token id
        raise P.bad("input", str(e)) from None

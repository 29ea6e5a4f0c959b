"""What an OpenAI request body asks of a loaded model: the prompt's token ids, the sampling parameters,
the compiled constraint (generations), the inputs' token ids (embeddings).

Shared by the HTTP server (edgeinfer.server) and batch jobs (edgeinfer.batch), so a request line in a
batch file is read, refused and answered exactly as the same body sent to `edgeinfer serve`.
Synchronous and free of any HTTP stack: the server calls these in a worker thread."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field, replace

from .. import reasoning
from ..engine.llm_engine import RequestOutput
from ..sampling import SamplingParams
from ..structured import GrammarError
from ..tools import ToolError, call_grammar, parse_tools
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
    # the n choices (req.n): each one's parameters (its own seed) and its own guide (a matcher follows
    # one sequence); empty: the one choice of params and guide
    choice_params: list = field(default_factory=list)
    guides: list = field(default_factory=list)
    reasoning: bool = False  # a chat reply split into reasoning_content and content (edgeinfer.reasoning)
    reasoning_open: bool = False  # the prompt ends inside an open <think>: the reply starts in reasoning

    @property
    def n(self) -> int:
        return len(self.choice_params) or 1

    def choice(self, i: int) -> tuple[SamplingParams, object | None]:
        """Choice i's sampling parameters and guide."""
        if not self.choice_params:
            return self.params, self.guide
        return self.choice_params[i], self.guides[i]


def choice_seed(seed: int | None, i: int) -> int | None:
    """Choice i's seed: the request's own for choice 0 (n=1 answers as before), one made of (seed, i)
    for the others, so a seeded response is reproducible and its choices differ; None stays None
    (each choice draws its own entropy)."""
    if seed is None or i == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{i}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits, as the schema's seeds


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
            prompt_ids = llm.render_chat(messages, True, shown, template_vars=req.template_vars)
        except ToolError as e:
            raise P.bad(e.param, str(e)) from None
        except ValueError as e:  # the template's own errors, or a variable it cannot take
            raise P.bad("chat_template_kwargs" if str(e).startswith("chat template variable") else "messages",
                        str(e)) from None
    else:
        prompt = P.parse_prompt(body)
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
    choice_params = [replace(params, seed=choice_seed(params.seed, i)) for i in range(req.n)] if req.n > 1 else []
    guides = []
    if params.constrained:
        try:  # compiled once (the grammar cache); a fresh matcher for each choice
            guides = [llm.engine.grammars.guide(params) for _ in range(req.n)]
        except GrammarError as e:
            raise P.bad(req.constraint_param or "tools", str(e)) from None
    gen = Generation(req, chat, prompt_ids, params, guides[0] if guides else None, tools, shown)
    if req.n > 1:
        gen.choice_params, gen.guides = choice_params, guides or [None] * req.n
    if chat and reasoning.splits(reasoning_format, llm.chat_template.source):
        gen.reasoning = True
        gen.reasoning_open = reasoning.prompt_opens_reasoning(tok.decode(prompt_ids[-16:], special=True))
    return gen


class Output:
    """One choice's output, gathered as the engine produces it."""

    __slots__ = ("parts", "ids", "lps", "reason")

    def __init__(self):
        self.parts, self.ids, self.lps, self.reason = [], [], [], None

    def add(self, out: RequestOutput) -> bool:
        """One step's output; True once the choice is finished."""
        self.parts.append(out.delta_text)
        self.ids += out.new_token_ids
        self.lps += out.logprobs or []
        if out.finished:
            self.reason = out.finish_reason
        return out.finished

    @property
    def text(self) -> str:
        return "".join(self.parts)


class Choices:
    """The n choices of one generation in an engine, each a request of its own.

    They share the prompt's KV blocks through the prefix cache. Requests admitted in the same step
    would not: a block is registered for reuse only once its tokens are computed, so n requests
    submitted together would each prefill the whole prompt. So the first choice is submitted at once
    and the others when its first output comes, from the thread that steps the engine, right after the
    step that computed (and registered) the prompt's full blocks: they prefill only the last, partly
    filled block. A prompt shorter than one block has nothing to share, and all n go at once.

    submit(prompt_ids, params, guide, on_output) -> request id (a ValueError when the engine cannot
    take the prompt) and abort(request id) are the engine's (an EngineLoop's, or a Run's);
    on_output(index, RequestOutput) gets every choice's outputs."""

    def __init__(self, gen: Generation, engine, submit, abort, on_output):
        self.gen = gen
        self.n = gen.n
        self._submit, self._abort, self._on_output = submit, abort, on_output
        bm = engine.block_manager
        self._defer = self.n > 1 and bm.enable_prefix_caching and len(gen.prompt_ids) >= bm.block_size
        self._lock = threading.Lock()
        self._rids: list[str] = []
        self._waiting = self._defer  # the other choices wait for the first one's prompt
        self._aborted = False

    def start(self) -> None:
        """Submit the first choice (all of them when nothing is shared); ValueError from the engine."""
        with self._lock:
            for i in range(1 if self._defer else self.n):
                self._start(i)

    def _start(self, i: int) -> None:
        params, guide = self.gen.choice(i)
        self._rids.append(self._submit(self.gen.prompt_ids, params, guide, lambda out: self._output(i, out)))

    def _output(self, i: int, out: RequestOutput) -> None:
        if i == 0 and self._waiting:
            self._start_rest(out.finish_reason)
        self._on_output(i, out)

    def _start_rest(self, first_reason: str | None) -> None:
        with self._lock:
            self._waiting = False
            failed = first_reason in ("error", "abort") or self._aborted
            for j in range(1, self.n):
                if not failed:
                    try:
                        self._start(j)
                        continue
                    except ValueError:  # the engine took this prompt a step ago: not expected
                        first_reason = "error"
                self._on_output(j, RequestOutput("", "", [], True, first_reason or "abort"))

    def abort(self) -> None:
        """Stop every choice (a client gone, a timeout); those not submitted yet never will be."""
        with self._lock:
            self._aborted = True
            rids = list(self._rids)
        for rid in rids:
            self._abort(rid)


def embedding_inputs(llm, name: str, inputs: list, dims: int | None, truncate: bool) -> list[list[int]]:
    """The token ids of /v1/embeddings' inputs (P.parse_embeddings' output), checked against the
    model's width and context."""
    if dims is not None and dims > llm.config.dim:
        raise P.bad("dimensions", f"'dimensions' is {dims} but {name} gives vectors of {llm.config.dim}")
    try:
        return llm.embed_tokens(inputs, truncate)
    except ValueError as e:  # too long for the context (PromptTooLongError), empty, or a bad token id
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
            guide = llm.engine.grammars.guide(params)
        except GrammarError as e:
            raise P.bad(req.constraint_param, str(e)) from None
    return Generation(req, False, prompt_ids, params, guide)

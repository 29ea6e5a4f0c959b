"""The Python API: ``LLM(model).generate / stream / chat / perplexity / tokenize / detokenize``."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence as Seq

import numpy as np

from . import registry
from .config import EngineConfig, default_threads
from .errors import EdgeInferError
from .engine.llm_engine import LLMEngine, PromptTooLongError, RequestOutput
from .embeddings import Embeddings
from .engine.speculative import Speculation, SpeculationError, check_backend, check_same_vocab
from .gguf_file import GGUFFile
from .kernels import get_backend
from .models import load_model
from .models.common import has_experts, matrix_kinds, step_mixers
from .sampling import SamplingParams, log_softmax
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .chat_template import ChatTemplate


class NotAGeneratorError(EdgeInferError, ValueError):
    """Generation asked of an embedding (encoder) model."""


@dataclass
class Completion:
    """One finished generation."""

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    logprobs: list[dict] | None = None
    timings: dict = field(default_factory=dict)
    tool_calls: list[dict] = field(default_factory=list)  # LLM.chat with tools: OpenAI's tool_calls
    reasoning: str | None = None  # LLM.chat of a harmony model (gpt-oss): its analysis channel (text: the answer)


@dataclass
class StreamChunk:
    """One piece of a streamed generation."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)  # the prompt as the model saw it
    num_output_tokens: int = 0  # generated so far, this chunk's included


class LLM(Embeddings):
    """A loaded model with its tokenizer, chat template and engine.

    model: a catalog name (pulled on first use), a cached model name, or a path to a .gguf file.
    """

    def __init__(self, model: str = registry.DEFAULT_MODEL, *, threads: int = 0, backend: str = "cpu",
                 kv_type: str = "", max_context: int = 0, memory_budget_mb: float = 0.0,
                 engine_config: EngineConfig | None = None, progress: bool = True, draft: str | None = None,
                 speculate: str | None = None, draft_tokens: int = 0, prompt_cache: str = "",
                 prompt_cache_mb: float = 1024.0, compile_later: bool = False, mmproj: str | None = None,
                 lora: list | None = None):
        """draft: a draft model (catalog name or path) for speculative decoding; speculate: "lookup" for
        prompt-lookup speculation ("draft" is implied by draft=); draft_tokens: proposals per step at
        most (0: 4 for a draft, 8 for lookup). prompt_cache: a folder where computed prompt blocks are kept
        (at most prompt_cache_mb for this model) and found again by a later process (engine/prompt_store.py).
        compile_later: a first run answers per op while the compiled step compiles in the background.
        mmproj: the model's vision projector (a path to its mmproj GGUF): prompts may then hold images; None: the
        one pulled with the model, if any; "": none. lora: LoRA adapters (GGUF adapter files) applied to everything
        the model computes: each a path (scale 1) or (path, scale), as llama.cpp's --lora and --lora-scaled."""
        t0 = time.perf_counter()
        config = engine_config or EngineConfig(threads=threads, backend=backend, kv_dtype=kv_type,
                                               max_context=max_context, memory_budget_mb=memory_budget_mb,
                                               prompt_cache=str(prompt_cache or ""),
                                               prompt_cache_mb=prompt_cache_mb)
        self.path = registry.resolve(model, progress=progress)
        self.name = registry.model_name(model)  # what answers call it (the server's and batch jobs' "model")
        self.gguf = GGUFFile(self.path)
        # where loading goes, for `edgeinfer bench` (start-up breakdown), in seconds
        self.timings = {"open_s": time.perf_counter() - t0}
        # the context: as given; else the trained one, cut to the budget or to the memory available now
        self.context_note = "--max-context" if config.max_context else "the memory budget"
        from .file_estimate import context_for_memory, fit_budget_for

        if config.memory_budget_mb:
            config = fit_budget_for(self.gguf, config)
        elif not config.max_context:
            config, self.context_note = context_for_memory(self.gguf, config)
        lap = time.perf_counter()

        def mark(name):
            nonlocal lap
            now = time.perf_counter()
            self.timings[name] = now - lap
            lap = now

        if draft or speculate:
            check_backend(config.backend)  # before any backend starts
        try:
            self.kernels = get_backend(config.backend)
        except RuntimeError as e:  # e.g. the CUDA backend with no GPU: say what is missing
            raise EdgeInferError(str(e)) from None
        self.kernels.set_threads(config.threads or default_threads())
        mark("backend_s")
        self.tokenizer = Tokenizer(self.gguf)
        mark("tokenizer_s")
        if progress:  # a status line on stderr whenever kernels compile (a first run; later runs load them)
            self.kernels.show_compile_progress()
        # a first run's kernels compile in worker processes while the weights load (compile_later: the step after)
        self.kernels.precompile(matrix_kinds(self.gguf, self.kernels), config.kv_dtype,
                                stream=sys.stderr if progress else None, experts=has_experts(self.gguf),
                                mixers=step_mixers(self.gguf), later=compile_later)
        mark("precompile_s")
        try:
            self.model = load_model(self.gguf, self.kernels, n_ctx=config.max_context or None)
        except Exception:
            # a file that cannot load: let the compile started above finish (its units are cached for
            # the next model) rather than leave its worker processes behind (Ctrl-C does not wait)
            self.kernels.ready()
            raise
        self.config = self.model.cfg
        # an encoder (an embedding model such as nomic-bert) has no engine: it embeds, never generates
        self.is_encoder = bool(getattr(self.model, "is_encoder", False))
        mark("weights_s")
        if lora:  # (the model's LoraSet: self.model.lora)
            from .models.lora import attach

            try:
                attach(self.model, self.gguf, list(lora))
            except Exception:
                self.kernels.ready()  # as for a model that cannot load: the compile started above ends first
                raise
            mark("lora_s")
        self.vision = None
        if mmproj is None:  # a model pulled from a repo with a projector (registry.hf) loads with it
            mmproj = registry.projector_for(self.path)
        if mmproj:
            from .vision import Vision

            if self.is_encoder:
                raise EdgeInferError(f"{self.path.name} is an embedding model: it takes no projector")
            self.vision = Vision(mmproj, self.kernels, self.tokenizer, self.config.dim)
            mark("mmproj_s")
        self._chat_template = None
        self._template_source = self.gguf.get("tokenizer.chat_template")
        self.engine_config = config
        if self.is_encoder:
            if draft or speculate:
                raise SpeculationError(f"{self.path.name} is an embedding model: it does not generate, so it "
                                       "cannot speculate")
            self.engine = None
        else:
            speculation = self._speculation(draft, speculate, draft_tokens, config, progress)
            if speculation is not None:
                mark("draft_s")
            self.engine = LLMEngine(self.model, self.tokenizer, config, model_id=str(self.path),
                                    speculation=speculation)
        self.gguf.close()  # weights are repacked copies; drop the file mapping from memory
        mark("engine_s")
        self.load_seconds = time.perf_counter() - t0

    def _speculation(self, draft, speculate, draft_tokens, config: EngineConfig, progress: bool):
        """Load the draft model, if any, and check it speaks the target's vocabulary."""
        method = speculate or ("draft" if draft else None)
        if method is None:
            if draft_tokens:
                raise SpeculationError("draft_tokens needs speculation: give a draft model or speculate='lookup'")
            return None
        if method == "lookup" and draft:
            raise SpeculationError("give either a draft model or speculate='lookup', not both")
        if method == "draft" and not draft:
            raise SpeculationError("speculate='draft' needs a draft model")
        if method != "draft":
            return Speculation(method, draft_tokens)
        path = registry.resolve(draft, progress=progress)
        gf = GGUFFile(path)
        try:
            dtok = Tokenizer(gf)
            check_same_vocab(self.tokenizer, dtok)  # before the weights: a mismatch fails fast
            dmodel = load_model(gf, self.kernels)
        finally:
            gf.close()
        self.draft_path = path
        return Speculation("draft", draft_tokens, dmodel, dtok)

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's chat template, compiled on first use (jinja2 is imported only then)."""
        if self._chat_template is None:
            from .chat_template import ChatTemplate, default_template

            tok = self.tokenizer
            bos = tok.tokens[tok.bos_id] if tok.bos_id is not None else ""
            eos = tok.tokens[tok.eos_id] if tok.eos_id is not None else ""
            self._chat_template = ChatTemplate(self._template_source, bos, eos, fallback=default_template(tok))
        return self._chat_template

    @chat_template.setter
    def chat_template(self, source: str) -> None:  # a Jinja template in place of the file's (a created model's)
        self._template_source, self._chat_template = source, None

    # -- text <-> tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids: Seq[int]) -> str:
        return self.tokenizer.decode(ids)

    def _need_decoder(self) -> None:
        if self.is_encoder:
            raise NotAGeneratorError(f"{self.path.name} is an embedding model ({self.config.arch}): it cannot "
                                     "generate text; use embed()")

    def _prompt_ids(self, prompt, parse_special: bool = False, images=None) -> list[int]:
        self._need_decoder()
        if images:  # the prompt's text holds one vision.MARKER per image
            if not isinstance(prompt, str):
                raise TypeError("a prompt with images must be a str (with a <__media__> marker per image)")
            return self._vision().prompt(prompt, list(images), parse_special=parse_special)
        if getattr(prompt, "media", None) is not None:  # a vision.MediaPrompt, as built
            return prompt
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_bos=None, parse_special=parse_special)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                     for t in prompt):
            return [int(t) for t in prompt]
        raise TypeError("a prompt must be a str or a list of token ids")

    # -- generation ------------------------------------------------------------------------------

    def _vision(self):
        if self.vision is None:
            from .vision import NoVisionError

            raise NoVisionError(f"{self.name} was loaded without a vision projector: images need one "
                                "(LLM(..., mmproj=FILE), --mmproj FILE)")
        return self.vision

    def generate(self, prompts, params: SamplingParams | Seq[SamplingParams] | None = None, *,
                 parse_special: bool = False, images=None) -> list[Completion]:
        """Generate for one prompt or many; all run together as one continuous batch. params: one
        SamplingParams for every prompt, or a list of them, one per prompt. images: a prompt's images (a list:
        bytes, paths, images.Image), its text holding a <__media__> marker for each; for many prompts, a list of
        such lists (None for a prompt without)."""
        single = isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], (int, np.integer)))
        batch = [prompts] if single else list(prompts)
        if isinstance(params, (list, tuple)):
            if len(params) != len(batch):
                raise ValueError(f"got {len(params)} SamplingParams for {len(batch)} prompts")
            per_prompt = list(params)
        else:
            per_prompt = [params or SamplingParams()] * len(batch)
        per_images = [images] if single else list(images or [None] * len(batch))
        if len(per_images) != len(batch):
            raise ValueError(f"got {len(per_images)} image lists for {len(batch)} prompts")
        ids = [self._prompt_ids(p, parse_special, im) for p, im in zip(batch, per_images)]
        with self.engine.run() as run:
            rids = [run.submit(p, sp) for p, sp in zip(ids, per_prompt)]
            results = {rid: {"text": [], "ids": [], "lp": [], "reason": None} for rid in rids}
            t0 = time.perf_counter()
            first = None
            for out in run:
                r = results[out.request_id]
                first = first or time.perf_counter()
                r["text"].append(out.delta_text)
                r["ids"].extend(out.new_token_ids)
                if out.logprobs:
                    r["lp"].extend(out.logprobs)
                if out.finished:
                    r["reason"] = out.finish_reason
        elapsed = time.perf_counter() - t0
        comps = []
        for rid, p, sp in zip(rids, ids, per_prompt):
            r = results[rid]
            comps.append(Completion("".join(r["text"]), r["ids"], p, r["reason"],
                                    r["lp"] if sp.logprobs is not None else None,
                                    {"seconds": elapsed, "ttft_seconds": (first or t0) - t0}))
        return comps

    def stream(self, prompt, params: SamplingParams | None = None, *, parse_special: bool = False, images=None
               ) -> Iterator[StreamChunk]:
        """Yield text deltas (with their token ids) as they are generated (images: as generate's)."""
        self._need_decoder()
        params = params or SamplingParams()
        ids = self._prompt_ids(prompt, parse_special, images)
        with self.engine.run() as run:
            run.submit(ids, params)
            for out in run:  # leaving early (Ctrl-C, break) aborts the request and frees its blocks
                if out.delta_text or out.new_token_ids or out.finished:
                    yield StreamChunk(out.delta_text, out.new_token_ids, out.finish_reason, ids, out.num_output_tokens)

    def render_chat(self, messages, add_generation_prompt: bool = True, tools=None,
                    template_vars: dict | None = None, as_text: bool = False) -> list[int] | str:
        """Token ids (as_text: the text) of a conversation through the chat template; `tools`
        (edgeinfer.tools.Tool) go through the template's own tools support or the fallback format of
        edgeinfer.tools; template_vars: the template's own switches, e.g. {"enable_thinking": False} for Qwen3."""
        from .tools import prepare_messages

        tmpl = self.chat_template
        msgs = prepare_messages(list(messages), tools or [], tmpl.knows_tools) if isinstance(messages, (list, tuple)) \
            else messages
        text = tmpl.render(msgs, add_generation_prompt,
                           tools=[t.openai() for t in tools] if tools and tmpl.knows_tools else None,
                           variables=template_vars)
        if as_text:
            return text
        ids = self.tokenizer.encode(text, add_bos=None, parse_special=True)
        bos = self.tokenizer.bos_id
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]  # the template wrote the BOS text and the tokenizer added one too
        return ids

    def chat_prompt(self, messages, tools=None, template_vars: dict | None = None,
                    local_files: bool = True) -> list[int]:
        """render_chat's token ids, or, for messages with image parts (OpenAI's image_url with a data: URL, or
        {"type": "image", "image": bytes, path or images.Image}), a vision.MediaPrompt holding the images' rows."""
        from .vision import split_images

        fetch = self.vision is not None and self.vision.fetch_urls
        plain, found = split_images(messages, fetch, local_files) if isinstance(messages, (list, tuple)) \
            else (messages, [])
        if not found:
            return self.render_chat(messages, tools=tools, template_vars=template_vars)
        text = self.render_chat(plain, tools=tools, template_vars=template_vars, as_text=True)
        return self._vision().prompt(text, found)

    def chat(self, messages, params: SamplingParams | None = None, *, tools: list | None = None,
             tool_choice=None) -> Completion:
        """Answer a conversation ([{role, content}, ...]) through the model's chat template.

        tools / tool_choice: as OpenAI's (function definitions; "none", "auto", "required" or
        {"type": "function", "function": {"name": ...}}). The reply's calls are in
        Completion.tool_calls (finish_reason "tool_calls"); "required" and a named function constrain
        the reply to calls whose arguments match the tool's parameter schema."""
        from dataclasses import replace

        from .harmony import is_harmony, split_harmony
        from .tool_formats import for_model
        from .tools import call_grammar, parse_reply, parse_tools

        specs, choice = parse_tools(tools, tool_choice)
        shown = specs if choice.mode != "none" else []
        params = params or SamplingParams()
        fmt = for_model(self)
        grammar = call_grammar(specs, choice, fmt=fmt)
        if grammar is not None:
            if params.constrained:
                raise ValueError("tool_choice required or a named function cannot be combined with another constraint")
            params = replace(params, grammar=grammar)
        harmony = is_harmony(self.chat_template.source)
        if harmony or (shown and fmt.special_text):  # gpt-oss: the reply parsed by channel; [TOOL_CALLS] ...
            params = replace(params, special_text=True)
        comp = self.generate(self.chat_prompt(messages, tools=shown), params)[0]
        if harmony:
            comp.reasoning, comp.text = split_harmony(comp.text)
        if shown:
            content, calls = parse_reply(comp.text, specs, fmt)
            if calls:
                comp.text, comp.tool_calls, comp.finish_reason = content or "", calls, "tool_calls"
        return comp

    # -- evaluation ------------------------------------------------------------------------------

    def perplexity(self, text: str, n_ctx: int = 512, chunks: int | None = None, progress: bool = False) -> float:
        """llama-perplexity's method: chunks of n_ctx tokens (first replaced by BOS when the model
        adds one); the second half of each chunk is scored."""
        return self.perplexity_details(text, n_ctx, chunks, progress)["ppl"]

    def perplexity_details(self, text: str, n_ctx: int = 512, chunks: int | None = None,
                           progress: bool = False) -> dict:
        self._need_decoder()
        if n_ctx < 16:
            raise ValueError(f"n_ctx must be >= 16, got {n_ctx}")
        if n_ctx > self.engine.max_context:
            raise PromptTooLongError(f"n_ctx {n_ctx} is larger than the context {self.engine.max_context}")
        ids = self.tokenizer.encode(text, add_bos=False)
        available = len(ids) // n_ctx
        if available == 0:
            raise ValueError(f"the text has {len(ids)} tokens, fewer than one chunk of n_ctx = {n_ctx}")
        n_chunks = available if chunks is None else min(chunks, available)
        if n_chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}")
        runner = self.engine.scratch(n_ctx)
        first = n_ctx // 2
        nll, count, per_chunk = 0.0, 0, []
        from tqdm import tqdm
        bar = tqdm(total=n_chunks, desc="perplexity", disable=not progress, file=sys.stderr)
        forward_s = 0.0
        for c in range(n_chunks):
            chunk = list(ids[c * n_ctx:(c + 1) * n_ctx])
            if self.tokenizer.add_bos and self.tokenizer.bos_id is not None:
                chunk[0] = self.tokenizer.bos_id
            t0 = time.perf_counter()
            logits = runner.prefix(chunk, np.arange(first, n_ctx - 1))
            forward_s += time.perf_counter() - t0
            per_chunk.append(-sum(log_softmax(row)[chunk[first + j + 1]] for j, row in enumerate(logits)) / len(logits))
            nll, count = nll + per_chunk[-1] * len(logits), count + len(logits)
            bar.update(1)
            bar.set_postfix(ppl=f"{np.exp(nll / count):.4f}")
        bar.close()
        # chunk_nll: each chunk's mean negative log-likelihood; tok_s: prompt-processing speed (every token)
        return {"ppl": float(np.exp(nll / count)), "n_scored": count, "chunks": n_chunks, "n_ctx": n_ctx,
                "chunk_nll": per_chunk, "tok_s": round(n_chunks * n_ctx / forward_s, 1)}

    def stats(self) -> dict:
        return self.engine.stats() if self.engine is not None else {}


__all__ = ["LLM", "Completion", "StreamChunk", "SamplingParams", "RequestOutput"]

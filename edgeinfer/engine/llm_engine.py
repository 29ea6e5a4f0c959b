"""The engine: requests in, one scheduled forward pass per step, text deltas out."""

from __future__ import annotations

import threading
import time

import numpy as np

from .. import memory
from ..config import EngineConfig
from ..errors import EdgeInferError
from ..sampling import Sampler, SamplingParams, log_softmax
from ..structured import GrammarCache, Guide
from ..tokenizer import IncrementalDecoder, Tokenizer
from . import prompt_cache
from .block_manager import BlockManager
from .choices import Choices, follow
from .model_runner import ModelRunner
from .run import Run
from .scheduler import Scheduler
from .sequence import RequestOutput, Sequence, lora_of, media_of, pin_lora  # noqa: F401  (RequestOutput: its output)
from .speculative import DraftProposer, SpecState, Speculation, make_proposer, rollback_states, speculation_slots, verify


class PromptTooLongError(EdgeInferError, ValueError):
    """A prompt that does not fit the context (or the KV cache)."""


class _RequestState:
    __slots__ = ("seq", "sampler", "decoder", "text", "emitted", "stop_hold", "stopped_by")

    def __init__(self, seq: Sequence, tokenizer: Tokenizer):
        self.seq = seq
        self.sampler = Sampler(seq.params)
        self.decoder = IncrementalDecoder(tokenizer, special=seq.params.special_text)
        self.text = ""  # all output text decoded so far
        self.emitted = 0  # characters of it already handed to the caller
        self.stop_hold = max((len(s) for s in seq.params.stop), default=0)
        self.stopped_by: str | None = None  # the stop string that ended it, if one did


class LLMEngine:
    def __init__(self, model, tokenizer: Tokenizer, config: EngineConfig, model_id: str = "",
                 speculation: Speculation | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        cfg = model.cfg
        est = memory.estimate(0, cfg, config, model.kb.KV_FORMATS)  # the backend's KV row formats
        self.max_context = est.max_context
        n_blocks = config.num_kv_blocks or memory.default_blocks(est, config)
        # a hybrid model: a slot of recurrent state per running sequence, as many checkpoint slots of state for
        # prefix caching, and with speculation a slot per proposal to roll a verification back (block_manager.py)
        states = config.seqs_limit if cfg.recurrent else 0
        spec_slots = speculation_slots(speculation, cfg)
        # sliding-window layers: their KV in a window pool, a window and a step per running sequence
        n_window = memory.window_blocks(est, config, n_blocks)
        n_slots = max(2 * states + spec_slots, 1)
        self.runner = ModelRunner(model, n_blocks, config.block_size, config.kv_dtype, n_state_slots=n_slots,
                                  n_window_blocks=n_window)
        self.block_manager = BlockManager(n_blocks, config.block_size, model_id=model_id, num_state_slots=states,
                                          num_checkpoints=states, window=cfg.sliding_window,
                                          num_window_blocks=n_window, num_spec_slots=spec_slots)
        self.proposer = make_proposer(speculation, config, n_blocks, n_slots) if speculation is not None else None
        # the prompt cache on disk (prompt_cache.py), where config.prompt_cache names a folder
        self.disk = prompt_cache.for_engine(config, model, model_id, self.block_manager, self.caches())
        self.scheduler = Scheduler(self.block_manager, config.seqs_limit, config.max_num_batched_tokens,
                                   plan_spec=self._plan_spec if self.proposer is not None else None,
                                   warm=self.disk.warm if self.disk is not None else None)
        self.requests: dict[tuple[str, int], _RequestState] = {}  # by (request id, choice)
        # compiled constraints, shared by the requests that use them; masks applied by the backend's kernel
        self.grammars = GrammarCache(tokenizer, model.kb.mask_logits)
        self._lock = threading.Lock()
        self._pending: list[Sequence] = []
        self._aborts: list[str] = []
        self._next_id = 0
        self._choices: dict[str, Choices] = {}  # requests with n > 1 choices, while any is unfinished
        self._compiled = False  # the backend's compile started at load (a first run) is done
        self.guide_errors = 0  # constrained sequences whose matcher refused a sampled token
        self.spec_proposed = 0  # speculative decoding: tokens proposed and verified,
        self.spec_accepted = 0  # of them accepted by the target,
        self.spec_rounds = 0  # in this many verifications
        # speculation can be paused (bench measures with and without): a draft model then catches up on
        # the tokens it missed when it next runs
        self.speculate = self.proposer is not None

    # -- requests (thread-safe) ------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    priority: int = 0, guide: Guide | None = None, n: int = 1) -> str:
        """Queue a request. A constrained one (params.json_schema, regex, choice or grammar) has its
        constraint compiled here, in the caller's thread, unless `guide` (from self.guide, compiled
        ahead) is given; a constraint the library rejects raises GrammarError (a ValueError).
        n: choices sampled on their own from the prompt (each with its own seed: choices.choice_seed),
        their outputs told apart by RequestOutput.index; they share the prompt's KV blocks. A prompt with a
        `media` attribute (vision.MediaPrompt: a list of ids with images' rows) has those rows computed from
        their embeddings."""
        if not isinstance(params, SamplingParams):
            raise TypeError("params must be a SamplingParams")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        media = media_of(prompt_ids, len(prompt_ids), self.model.cfg.dim)
        params = pin_lora(self.model, params)  # its adapters' scales (ValueError for adapters the model lacks)
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        bad = [t for t in prompt_ids if not 0 <= t < self.tokenizer.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary of {self.tokenizer.vocab_size}")
        if len(prompt_ids) >= self.max_context:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {self.max_context}: "
                f"shorten it by at least {len(prompt_ids) - self.max_context + 1} tokens"
            )
        need = min(len(prompt_ids) + params.max_tokens, self.max_context)
        if not self.scheduler.can_ever_fit(need):
            raise PromptTooLongError(
                f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) needs "
                f"{self.block_manager.blocks_needed(need)} KV blocks but the cache has {self.block_manager.num_blocks}"
            )
        if params.constrained and guide is None:
            guide = self.grammars.guide(params)
        choices = None
        if n > 1:  # compiled once (the grammar cache); a fresh matcher for each choice
            guides = [guide] + [self.grammars.guide(params) for _ in range(n - 1)] if params.constrained else [None] * n
            bm = self.block_manager
            choices = Choices(n, params, guides, priority,
                              deferred=bm.enable_prefix_caching and len(prompt_ids) >= bm.block_size)
        with self._lock:
            if request_id is None:
                request_id = f"req-{self._next_id}"
                self._next_id += 1
            if request_id in self._choices or (request_id, 0) in self.requests \
                    or any(s.request_id == request_id for s in self._pending):
                raise ValueError(f"request id {request_id!r} is already in use")
            if choices is None:
                self._pending.append(self._sequence(prompt_ids, params, request_id, priority, guide, media=media))
            else:
                choices.media = media
                self._choices[request_id] = choices
                for i in range(1 if choices.deferred else n):
                    self._pending.append(self._choice(prompt_ids, request_id, choices, i))
        return request_id

    def _sequence(self, prompt_ids, params, request_id, priority, guide, choice: int = 0, media=()) -> Sequence:
        seq = Sequence(prompt_ids, params, request_id, priority, arrival=time.monotonic())
        seq.media, seq.lora = media, lora_of(self.model, params)
        seq.guide = guide
        seq.choice = choice
        if self.proposer is not None:
            seq.spec = SpecState(self.proposer.max_tokens, params, drafts=not self.proposer.cheap)
        return seq

    def _choice(self, prompt_ids, request_id: str, choices: Choices, i: int) -> Sequence:
        return self._sequence(prompt_ids, choices.params[i], request_id, choices.priority, choices.guides[i], i,
                              choices.media)

    # -- what callers read (the API layer, the bench, perplexity and embeddings) ------------------

    @property
    def max_seqs(self) -> int:
        """The most sequences that run at once (more wait in the queue)."""
        return self.scheduler.max_seqs

    @property
    def speculates(self) -> bool:
        """Whether this engine has a proposer (a draft model or prompt lookup); `speculate` pauses it."""
        return self.proposer is not None

    def guide(self, params: SamplingParams) -> Guide:
        """A fresh matcher for params' constraint, compiled once per constraint (the grammar cache): to
        compile ahead, in the caller's thread, and hand to add_request. GrammarError when rejected."""
        return self.grammars.guide(params)

    def scratch(self, n_tokens: int) -> ModelRunner:
        """A runner over a KV cache of its own for n_tokens at positions 0.. (perplexity, a generative
        model's embeddings, the importance matrix): the engine's blocks and requests stay untouched."""
        self._wait_compiled()
        return self.runner.scratch(n_tokens)

    def _wait_compiled(self) -> None:
        # the kernels the backend started compiling at load (a first run) are done before the first
        # forward pass; waiting here rather than at load lets the compile overlap what comes between
        if not self._compiled:
            self.model.kb.ready()
            self._compiled = True

    @property
    def cache(self):
        """The KV cache (the runner's)."""
        return self.runner.cache

    def run(self) -> Run:
        """A Run: this caller's requests, stepped and collected, aborted if the caller stops early."""
        return Run(self)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._pending) or self.scheduler.has_unfinished()

    # -- the loop --------------------------------------------------------------------------------

    def _drain_inbox(self) -> list[RequestOutput]:
        with self._lock:
            pending, self._pending = self._pending, []
            aborts, self._aborts = self._aborts, []
        for seq in pending:
            self.requests[(seq.request_id, seq.choice)] = _RequestState(seq, self.tokenizer)
            self.scheduler.add(seq)
        outs = []
        for rid in aborts:
            n = self._choices[rid].n if rid in self._choices else 1
            for i in range(n):  # every choice running or queued (one not queued yet is ended by _fan_out)
                st = self.requests.pop((rid, i), None)
                if st is not None:
                    self.scheduler.abort(st.seq)
                    st.seq.finish_reason = "abort"
                    outs.append(RequestOutput(rid, "", [], True, "abort", st.seq.prompt_ids, len(st.seq.output_ids),
                                              index=i))
        return outs

    def step(self) -> list[RequestOutput]:
        self._wait_compiled()
        outs = self._drain_inbox()
        sched = self.scheduler.schedule()
        if not sched:
            return self._fan_out(outs)
        if self.proposer is not None and self.speculate:
            self._propose(sched)
        bm = self.block_manager
        restores = bm.take_restores()  # hybrid models: prefix hits' states (a hybrid draft's too)
        for cache in self.caches():
            cache.copy_states(restores)
        logits, sampling = self.runner.run(sched)
        for seq, n, k in zip(sched.seqs, sched.num_tokens, sched.num_spec):
            if not k:  # a verifying sequence's count depends on how many proposals it accepts
                seq.num_computed_tokens += n
                self._commit(seq)
                bm.release_spec(seq)  # (a draft that proposed nothing)
        for i, row, n_rows in sampling:
            seq = sched.seqs[i]
            st = self.requests[(seq.request_id, seq.choice)]
            if sched.num_spec[i]:
                outs.append(self._verify(st, logits[row:row + n_rows]))
                continue
            if seq.guide is not None:  # the constraint's mask, before any sampling filter
                seq.guide.apply(logits[row])
            tid = st.sampler(logits[row], seq.prompt_ids, seq.output_ids)
            outs.append(self._push(st, [tid], [logits[row]]))
        return self._fan_out(outs)

    def _fan_out(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        # choice 0's first output queues the deferred choices of its request (choices.follow)
        if not self._choices:
            return outs
        return follow(outs, self._choices, self._fork)

    def _fork(self, prompt_ids: list[int], request_id: str, choices: Choices) -> None:
        with self._lock:  # for the next step, as a request added now would be
            self._pending.extend(self._choice(prompt_ids, request_id, choices, i) for i in range(1, choices.n))

    # -- speculative decoding ----------------------------------------------------------------------

    def _plan_spec(self, seq: Sequence, room: int) -> int:
        """How many tokens to propose for a decoding sequence (the scheduler asks): its k (a draft's adapts to
        its acceptance), within the step's room, its max_tokens (the target adds one of its own) and the
        context; the proposer may propose fewer (lookup: what its match vouches for)."""
        if not self.speculate:
            return 0
        k = min(seq.spec.k, room, seq.params.max_tokens - len(seq.output_ids) - 1, self.max_context - seq.num_tokens)
        return self.proposer.plan(seq, k) if k > 0 else 0

    def _propose(self, sched) -> None:
        for seq, k in zip(sched.seqs, sched.num_spec):
            if not k and seq.spec is not None:
                seq.spec.tokens, seq.spec.probs = [], []
        self.proposer.propose(sched)
        for i, seq in enumerate(sched.seqs):  # a draft may stop early (a stop token, a finished grammar)
            k = sched.num_spec[i]
            if k and len(seq.spec.tokens) < k:
                sched.num_tokens[i] -= k - len(seq.spec.tokens)
                sched.num_spec[i] = len(seq.spec.tokens)
                if not seq.spec.tokens:  # nothing to verify (no rollback trims them): the proposals' blocks back
                    self.block_manager.trim(seq, seq.num_computed_tokens + sched.num_tokens[i])

    def caches(self) -> list:
        """The KV caches (and recurrent state) the sequences' slots address: the target's, and a draft's."""
        draft = self.proposer.runner.cache if isinstance(self.proposer, DraftProposer) else None
        return [self.runner.cache] + ([draft] if draft is not None else [])

    def _commit(self, seq: Sequence) -> None:
        """After a step computed seq's tokens: its full blocks registered for prefix hits (with a draft model,
        once both caches hold their KV), a hybrid model's state checkpoint saved in the step registered, both
        offered to the disk cache, and the window blocks its next step no longer sees given back."""
        bm = self.block_manager
        bm.commit(seq, seq.spec.draft_computed if isinstance(self.proposer, DraftProposer) else None)
        bm.checkpoint(seq)
        if self.disk is not None:
            self.disk.saved(seq)
        bm.release_behind(seq)

    def _verify(self, st: _RequestState, rows: np.ndarray) -> RequestOutput:
        """Keep the proposals the target agrees with, plus its own next token; roll back the rest."""
        seq = st.seq
        spec = seq.spec
        k = len(spec.tokens)
        tokens, guide_steps = verify(seq, rows, st.sampler)
        accepted = len(tokens) - 1  # all but the last matched a proposal (verify stops at the first miss)
        # the KV of the last real token and of the accepted proposals stays; the rest is rolled back
        start = seq.num_computed_tokens
        seq.num_computed_tokens += 1 + accepted
        if isinstance(self.proposer, DraftProposer):  # the draft computed the proposals but the last
            spec.draft_computed = min(spec.draft_computed + min(accepted, k - 1), seq.num_computed_tokens)
        bm = self.block_manager
        rollback_states(seq, start, accepted, k, self.caches())  # a hybrid model's state, to the last kept token
        bm.trim(seq, seq.num_computed_tokens)
        self._commit(seq)
        bm.release_spec(seq)
        self.spec_proposed += k
        self.spec_accepted += accepted
        self.spec_rounds += 1
        spec.adapt(k, accepted, self.proposer.max_tokens, self.proposer.cheap)
        spec.tokens, spec.probs = [], []
        return self._push(st, tokens, list(rows[:len(tokens)]), guide_steps)

    # -- output ------------------------------------------------------------------------------------

    def _push(self, st: _RequestState, tids: list[int], rows: list[np.ndarray], guide_steps: list | None = None
              ) -> RequestOutput:
        """Append sampled tokens (one, or several after a verification) with the stop checks after each;
        the tokens after one that ends the request are dropped. guide_steps: the guide was already advanced
        over tids (verification): per token, (accepted, grammar complete)."""
        seq = st.seq
        delta, new, lps, reason = "", [], None, None
        if seq.params.logprobs is not None:
            lps = []
        for j, (tid, row) in enumerate(zip(tids, rows)):
            d, reason = self._append_token(st, tid, row, guide_steps[j] if guide_steps else None)
            delta += d
            new.append(tid)
            if lps is not None:
                lps.append(self._logprob(seq.params, tid, row))
            if reason is not None:
                break
        out = RequestOutput(seq.request_id, delta, new, reason is not None, reason, seq.prompt_ids,
                            len(seq.output_ids), lps, num_cached_tokens=seq.num_cached_tokens,
                            stop_sequence=st.stopped_by)
        out.index = seq.choice
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.finish(seq)
            del self.requests[(seq.request_id, seq.choice)]
        return out

    @staticmethod
    def _logprob(params: SamplingParams, tid: int, logits: np.ndarray) -> dict:
        ls = log_softmax(logits)
        top = np.argsort(-ls)[: params.logprobs] if params.logprobs else []
        return {"token_id": tid, "logprob": float(ls[tid]), "top": [(int(j), float(ls[j])) for j in top]}

    def _append_token(self, st: _RequestState, tid: int, logits: np.ndarray, guide_step: tuple | None
                      ) -> tuple[str, str | None]:
        """One token onto the sequence: its text (held back while a stop string may be forming) and the
        finish reason, if it ends the request."""
        seq, params, tok = st.seq, st.seq.params, self.tokenizer
        seq.token_ids.append(tid)
        reason = None
        stopped_by_string = False
        is_eos = tid in tok.stop_ids or tid in params.stop_token_ids
        complete = False  # a constraint that is complete: nothing but a stop token could follow
        if seq.guide is not None:
            guide_ok, complete = guide_step or (seq.guide.advance(tid), None)
            if not guide_ok:  # cannot happen with the mask applied; never hide it
                self.guide_errors += 1
                reason = "error"
            if complete is None:
                complete = seq.guide.done
        if reason is None and is_eos and not params.ignore_eos:
            reason = "stop"
        elif reason is None:
            st.text += st.decoder.push(tid)
        if reason is None and params.stop:
            for s in params.stop:
                # only the text that could contain a new match: the tail plus the held-back part
                k = st.text.find(s, max(0, st.emitted - len(s)))
                if k >= 0:
                    st.text = st.text[:k]
                    reason = "stop"
                    stopped_by_string = True
                    st.stopped_by = s
                    break
        if reason is None and complete:
            reason = "stop"
        if reason is None and len(seq.output_ids) >= params.max_tokens:
            reason = "length"
        if reason is None and seq.num_tokens >= self.max_context:
            reason = "length"
        if reason is not None:
            if not stopped_by_string:  # after a stop string the undecoded tail is dropped with it
                st.text += st.decoder.flush()
            end = len(st.text)
        else:
            end = max(st.emitted, len(st.text) - (st.stop_hold - 1 if st.stop_hold else 0))
        delta = st.text[st.emitted:end]
        st.emitted = end
        return delta, reason

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> dict:
        bm = self.block_manager
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting) + len(self._pending),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_used,
            "kv_blocks_free": bm.num_free,
            "kv_blocks_cached": bm.num_cached,
            "kv_bytes": self.runner.cache.nbytes,  # memory by layer kind: the attention layers' KV pools,
            "window_blocks_total": bm.num_window_blocks,  # of them the sliding-window layers' (0: none),
            "window_blocks_used": bm.num_window_used,
            "window_bytes": self.runner.cache.window_nbytes,
            "state_slots_total": bm.num_state_slots,  # a hybrid model's slots of recurrent state,
            "state_slots_used": bm.num_state_slots - len(bm.free_states),
            "state_bytes": self.runner.cache.state_nbytes,  # and their memory (0 for a model without)
            "prefix_cache_hit_rate": bm.hit_rate,
            "prefix_cache_queries": bm.prefix_queries,  # full prompt blocks looked up, and found: counters,
            "prefix_cache_hits": bm.prefix_hits,        # so a load test can take the hit rate of its own run
            "preemptions": self.scheduler.num_preemptions,
            "computed_tokens": self.runner.num_forward_tokens,
            "grammar_cache_hits": self.grammars.hits,
            "grammar_cache_misses": self.grammars.misses,
            "grammar_compile_seconds": self.grammars.compile_seconds,
            "guide_errors": self.guide_errors,
            "spec_method": self.proposer.kind if self.proposer is not None else None,
            "spec_proposed_tokens": self.spec_proposed,
            "spec_accepted_tokens": self.spec_accepted,
            "spec_acceptance_rate": self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0,
            "spec_rounds": self.spec_rounds,
            **(self.disk.stats() if self.disk is not None else {}),
        }

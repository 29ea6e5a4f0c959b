"""Speculative decoding: a proposer guesses a sequence's next tokens, the target model checks them all in
one forward pass, and the engine keeps the longest prefix the target agrees with plus one token of its own.

Two proposers:

- `LookupProposer` (prompt lookup, n-gram): the last n tokens are looked up earlier in the prompt and
  output; the tokens that followed there are the guess. No second model; it shines where the output
  copies its input (editing code, summarising with quotes).
- `DraftProposer`: a smaller model with the same vocabulary runs k single-token steps per round. Its KV
  cache has the target's block layout and shares the target's block tables, so one allocation, one
  prefix cache and one rollback serve both models. It processes every token the target processes (the
  prompt chunks too), so a block the prefix cache hands out holds valid KV in both caches.

Exactness. Greedy: the target's argmax at each drafted position decides, so the output is token for
token the output without speculation. Sampling: a drafted token d is kept with probability
min(1, p(d) / q(d)) (p the target's distribution after the request's filters, q the draft's; q is one-hot
for lookup); on a rejection the replacement is drawn from max(0, p - q), normalised. The emitted tokens
are then distributed exactly as the target's own samples (Leviathan et al. 2023, Chen et al. 2023).

KV rollback: verifying writes the target's KV for every drafted position; the positions after the last
accepted token are stale. The sequence's computed count stops at the accepted tokens and the blocks
past it are freed (BlockManager.trim), so block accounting stays exact.

State rollback (a hybrid model, whose recurrent layers keep one state per sequence, not one per token):
a verifying sequence holds a slot per proposal (BlockManager.take_spec), and the step's kernels copy its
state after each of its tokens but the last there (Piece.snaps); after verification the state after the
last kept token goes back to the sequence's slot (`rollback_states`). A hybrid draft model does the same in
its own cache, under the same slots: its state after the real tokens, then after each proposal it fed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import EdgeInferError
from ..sampling import Sampler, SamplingParams
from .model_runner import ModelRunner, Piece

METHODS = ("lookup", "draft")
DEFAULT_TOKENS = {"lookup": 8, "draft": 4}


class SpeculationError(EdgeInferError, ValueError):
    """A speculative-decoding setup that cannot work: a draft with another vocabulary, a bad method."""


def check_backend(backend: str) -> None:
    """Only the CPU backend speculates (the CUDA backend has no verification path yet)."""
    if backend != "cpu":
        raise SpeculationError(f"speculative decoding is not available on the {backend} backend yet")


@dataclass(frozen=True)
class Speculation:
    """How an engine speculates: method "lookup" (prompt lookup) or "draft" (draft_model, loaded, with
    its draft_tokenizer); num_tokens proposed at most per step (0: 8 for lookup, 4 for a draft)."""

    method: str
    num_tokens: int = 0
    draft_model: object = None
    draft_tokenizer: object = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise SpeculationError(f"speculation method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or not 0 <= self.num_tokens <= 32:
            raise SpeculationError(f"draft tokens must be an integer in [1, 32] (0: the default), got {self.num_tokens!r}")
        if (self.method == "draft") != (self.draft_model is not None):
            raise SpeculationError("a draft model is needed for method 'draft', and only for it")


class SpecState:
    """Per-sequence speculation state, on Sequence.spec."""

    __slots__ = ("k", "tokens", "probs", "draft_computed", "draft_sampler")

    def __init__(self, k: int, params: SamplingParams, drafts: bool = False):
        self.k = k  # the number of tokens to propose next round (a draft's adapts to the acceptance)
        self.tokens: list[int] = []  # proposed for this step
        self.probs: list[np.ndarray | None] = []  # the draft's distribution for each (None: one-hot)
        self.draft_computed = 0  # tokens with valid KV in the draft's cache
        # drafts: a draft model samples for this sequence, with a generator of its own
        self.draft_sampler = Sampler(_draft_params(params)) if drafts else None

    def adapt(self, proposed: int, accepted: int, k_max: int, cheap: bool) -> None:
        """A draft model's k (one pass per proposal): one up after a round accepted whole, one down after a
        round mostly rejected. A cheap proposer (lookup) keeps k_max: how far each match vouches for its
        guess is decided by the match itself (lookup's `cautious`), which measured better than carrying one
        round's outcome to the next match."""
        if proposed == 0 or cheap:
            return
        if accepted == proposed:
            self.k = min(k_max, self.k + 1)
        elif 2 * accepted < proposed:
            self.k = max(1, self.k - 1)


def _draft_params(params: SamplingParams) -> SamplingParams:
    # the draft samples with the request's filters, from a generator of its own: the request's seed
    # stays the target's, and a seeded request drafts reproducibly too
    if params.seed is None:
        return params
    return replace(params, seed=params.seed ^ 0x5EC0DE)


class LookupProposer:
    """Prompt lookup: propose what followed the latest earlier occurrence of the last n tokens
    (n from ngram_max down to ngram_min). A longer match is likelier to continue the same way: code
    repeats short token runs (`self.`, `    def`) everywhere, and a single-token match is mostly noise."""

    kind = "lookup"
    cheap = True

    def __init__(self, max_tokens: int = DEFAULT_TOKENS["lookup"], ngram_max: int = 6, ngram_min: int = 2):
        if not 1 <= ngram_min <= ngram_max:
            raise SpeculationError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min} and {ngram_max}")
        self.max_tokens = max_tokens
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min

    def plan(self, seq, k: int) -> int:
        seq.spec.tokens = lookup(seq.token_ids, k, self.ngram_max, self.ngram_min)
        seq.spec.probs = [None] * len(seq.spec.tokens)
        return len(seq.spec.tokens)

    def propose(self, sched) -> None:
        pass  # planned in plan(): nothing to run


# How many tokens a match of n tokens vouches for (a longer match: all k). On the built-in code prompts
# (edgeinfer/data/spec_prompts.json, Qwen2.5-Coder 1.5B's greedy outputs) the token after a 2-token match was
# right 44% of the time and 2.1 tokens in a row on average, after a 3-token match 60% and 4.1, after 4 to 6
# tokens 92-94% and 5.6-5.8 (of 8): a guess past what its match vouches for mostly costs a verification
# token (30-45% of a one-token pass each on a 2-core Zen 4) that is thrown away.
MATCH_TOKENS = {1: 1, 2: 1, 3: 3}


def lookup(token_ids, k: int, ngram_max: int = 6, ngram_min: int = 2, cautious: bool = True) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix. cautious:
    no more than the match's length vouches for (MATCH_TOKENS), and where the suffix occurred before that
    too, no further than the two occurrences' continuations agree (at least one token): code repeats a
    short run such as `self.` with a different word after it each time."""
    if k <= 0:
        return []
    toks = np.asarray(token_ids, np.int64)
    n_all = toks.shape[0]
    for n in range(min(ngram_max, n_all - 1), ngram_min - 1, -1):
        pat = toks[n_all - n:]
        # candidate starts i: toks[i:i+n] == pat with i + n < n_all (something follows, and not the suffix)
        cand = np.flatnonzero(toks[: n_all - n] == pat[0])
        for j in range(1, n):
            cand = cand[toks[cand + j] == pat[j]]
        if not cand.size:
            continue
        i = int(cand[-1]) + n
        if not cautious:
            return toks[i:i + k].tolist()
        guess = toks[i:i + min(k, MATCH_TOKENS.get(n, k))]
        if cand.size > 1:
            other = toks[int(cand[-2]) + n:][:guess.shape[0]]
            differ = np.flatnonzero(other != guess[:other.shape[0]])
            if differ.size:
                guess = guess[:max(int(differ[0]), 1)]
        return guess.tolist()
    return []


# A draft's output matrix is the largest part of what a small draft reads a token (Qwen2.5-Coder 0.5B: 145 of
# 392 MB, its 151,936-token vocabulary by 896), yet the tokens it guesses right are nearly all common ones.
# Byte-level BPE and SentencePiece vocabularies number their tokens roughly by frequency (the merges' or the
# scores' order; of the 1.5B's greedy output on the built-in code prompts 96.7% are among the first 32,768
# ids), so a draft computes the logits of the first HEAD_TOKENS ids and of its end-of-text tokens alone, as
# FR-Spec (Zhao et al. 2025) does with counted frequencies: a token past them is never guessed, only
# replaced by the target's own, so the output stays the target's. The 1.5B with the 0.5B draft (2-core Zen 4):
# a draft token 9.0 ms against 11.7, 87% of proposals accepted against 91%, decode 41.8 against 40.4 tok/s.
HEAD_TOKENS = 32768


def draft_head(model, stop_ids, n: int = HEAD_TOKENS) -> list | None:
    """The rows of a draft model's output matrix its logits are computed from: [(r0, r1, those rows)] for ids
    [0, n) and the groups of eight holding its end-of-text ids (None: the whole matrix, where n would not
    leave out at least half of it)."""
    w = model.output
    vocab = w.shape[0]
    if n <= 0 or 2 * n > vocab:
        return None
    n = min(vocab, -(-n // 8) * 8)
    spans = []
    for r0, r1 in sorted([(0, n)] + [(s // 8 * 8, min(vocab, s // 8 * 8 + 8)) for s in stop_ids if n <= s < vocab]):
        if spans and r0 <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(r1, spans[-1][1]))
        else:
            spans.append((r0, r1))
    return [(r0, r1, w[r0:r1] if isinstance(w, np.ndarray) else w.rows(r0, r1)) for r0, r1 in spans]


class DraftProposer:
    """A draft model proposing k tokens per round, over a KV cache laid out like the target's, its logits from
    the head of its vocabulary (draft_head)."""

    kind = "draft"
    cheap = False

    def __init__(self, model, tokenizer, n_blocks: int, block_size: int, kv_dtype: str,
                 max_tokens: int = DEFAULT_TOKENS["draft"], n_state_slots: int = 1):
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        # the draft's own KV cache (and a hybrid draft's state, in the target's slots)
        self.runner = ModelRunner(model, n_blocks, block_size, kv_dtype, n_state_slots=n_state_slots, media=False)
        self.head = draft_head(model, tokenizer.stop_ids, HEAD_TOKENS)

    def plan(self, seq, k: int) -> int:
        return k  # the tokens are drafted after the blocks are allocated (propose)

    def propose(self, sched) -> None:
        """Catch the draft up on every scheduled sequence's tokens (prompt chunks included), then run
        single-token steps for the sequences that speculate, filling seq.spec.tokens and .probs."""
        pieces = []
        for seq, n, k in zip(sched.seqs, sched.num_tokens, sched.num_spec):
            st = seq.spec
            end = seq.num_computed_tokens + n - k  # the real tokens the target computes this step
            st.tokens, st.probs = [], []
            if st.draft_computed < end:
                tokens = seq.token_ids[st.draft_computed:end]
                # a hybrid draft: its state after the real tokens, kept for the rollback (rollback_states)
                snaps = (-1,) * (len(tokens) - 1) + (seq.spec_slots[0],) if k and seq.spec_slots else ()
                pieces.append((Piece(seq, st.draft_computed, tokens, 1 if k else 0, snaps), k))
                st.draft_computed = end
        if not pieces:
            return
        logits = self._forward([p for p, _ in pieces])
        active, row = [], 0
        for p, k in pieces:
            if p.n_logits:
                if self._draft_one(p.seq, logits[row]) and len(p.seq.spec.tokens) < k:
                    active.append((p.seq, k))
                row += 1
        while active:  # each further step feeds the token drafted last, at the position after the last
            logits = self._forward([Piece(seq, seq.num_tokens + len(seq.spec.tokens) - 1, seq.spec.tokens[-1:], 1,
                                          tuple(seq.spec_slots[len(seq.spec.tokens):len(seq.spec.tokens) + 1]))
                                    for seq, _ in active])
            active = [(seq, k) for r, (seq, k) in enumerate(active)
                      if self._draft_one(seq, logits[r]) and len(seq.spec.tokens) < k]
        for seq in sched.seqs:  # the target's verification replays the guide from where it was
            if seq.guide is not None and seq.spec.tokens:
                seq.guide.rollback(len(seq.spec.tokens))

    def _forward(self, pieces) -> np.ndarray:
        if self.head is None:
            return self.runner.run_pieces(pieces)
        model = self.runner.model
        h = self.runner.run_pieces(pieces, hidden=True)
        logits = np.full((h.shape[0], model.output.shape[0]), -np.inf, np.float32)
        for r0, r1, rows in self.head:
            logits[:, r0:r1] = model.project(h, rows)
        return logits

    def _draft_one(self, seq, logits: np.ndarray) -> bool:
        """Draft one token from a logits row; False when the sequence should draft no further."""
        st = seq.spec
        hist = seq.output_ids + st.tokens
        sampler = st.draft_sampler
        if seq.guide is not None:
            seq.guide.apply(logits)
            if self.head is not None and logits.max() == -np.inf:
                return False  # the constraint allows no token of the draft's head
        if sampler.params.greedy:
            tid, q = sampler.greedy(logits, seq.prompt_ids, hist), None
        else:
            q = sampler.probs(logits, seq.prompt_ids, hist)
            tid = sampler.draw(q)
        if seq.guide is not None and not seq.guide.advance(tid):
            return False  # cannot happen with the mask applied; draft nothing past it
        st.tokens.append(tid)
        st.probs.append(q)
        if seq.guide is not None and seq.guide.done:
            return False
        return tid not in self.tokenizer.stop_ids


def speculation_slots(spec: Speculation | None, cfg) -> int:
    """The state slots a hybrid model's engine keeps for rolling verifications back: one per proposal of one
    sequence (a verifying sequence takes as many as it proposes; with none free, it decodes plainly)."""
    if spec is None or not cfg.recurrent:
        return 0
    return spec.num_tokens or DEFAULT_TOKENS[spec.method]


def make_proposer(spec: Speculation, config, n_blocks: int, n_state_slots: int):
    """The proposer for an engine: prompt lookup, or a draft model over a cache of n_blocks blocks (and, for a
    hybrid draft, the target's n_state_slots slots of state)."""
    check_backend(config.backend)
    k = spec.num_tokens or DEFAULT_TOKENS[spec.method]
    if spec.method == "lookup":
        return LookupProposer(k)
    if spec.draft_model.cfg.recurrent and n_state_slots <= 1:
        raise SpeculationError(f"the draft model ({spec.draft_model.cfg.arch}) has recurrent layers but the target "
                               "has none: a hybrid draft is supported for a hybrid target only")
    return DraftProposer(spec.draft_model, spec.draft_tokenizer, n_blocks, config.block_size, config.kv_dtype, k,
                         n_state_slots if spec.draft_model.cfg.recurrent else 1)


def rollback_states(seq, start: int, accepted: int, k: int, caches) -> None:
    """A hybrid model's verification from position `start` kept the first 1 + accepted of its k + 1 tokens:
    the state after the last kept one (saved in the step to seq.spec_slots, the state after each token but
    the last) goes back to the sequence's slot, in each cache (the target's, a hybrid draft's); a prefix-cache
    checkpoint planned on a kept token among them is copied from its slot too (the spec slot took its place)."""
    slots = seq.spec_slots[:k]
    if not slots:
        return
    copies = []
    if seq.snapshot is not None and seq.snapshot[1] - 1 - start < k:
        j = seq.snapshot[1] - 1 - start
        if j <= accepted:
            copies.append((slots[j], seq.snapshot[0]))
    if accepted < k:
        copies.append((slots[accepted], seq.state_slot))
    for cache in caches:
        cache.copy_states(copies)


def check_same_vocab(target_tok, draft_tok) -> None:
    """A draft must speak the target's vocabulary: the same tokens under the same ids (as llama.cpp, a
    few extra tokens at the end of one of them are allowed), and the same begin and end tokens."""
    if target_tok.model != draft_tok.model:
        raise SpeculationError(f"the draft model's tokenizer is {draft_tok.model!r} but the target's is "
                               f"{target_tok.model!r}: a draft must share the target's vocabulary")
    n = min(len(target_tok.tokens), len(draft_tok.tokens))
    if abs(len(target_tok.tokens) - len(draft_tok.tokens)) > 128:
        raise SpeculationError(f"the draft model's vocabulary has {len(draft_tok.tokens)} tokens but the "
                               f"target's has {len(target_tok.tokens)}: a draft must share the target's vocabulary")
    for i in range(n):
        if target_tok.tokens[i] != draft_tok.tokens[i]:
            raise SpeculationError(f"the draft model's token {i} is {draft_tok.tokens[i]!r} but the target's is "
                                   f"{target_tok.tokens[i]!r}: a draft must share the target's vocabulary")
    if target_tok.bos_id != draft_tok.bos_id or set(target_tok.stop_ids) != set(draft_tok.stop_ids):
        raise SpeculationError("the draft model's begin/end-of-text tokens differ from the target's")


def verify(seq, logits: np.ndarray, sampler: Sampler):
    """Check seq.spec.tokens against the target's logits rows (k + 1 of them: one per drafted position and
    one past the last). Returns (tokens to emit, guide steps): the accepted drafted tokens, then the
    target's own token (the replacement of the first rejected one, or the bonus after all were accepted).
    The guide, if any, is advanced over the emitted tokens; guide steps holds, per token, whether it
    accepted the token and whether the grammar was then complete (None without a guide)."""
    st = seq.spec
    drafts = st.tokens
    k = len(drafts)
    prompt, hist = seq.prompt_ids, seq.output_ids
    greedy = sampler.params.greedy
    out, steps = [], []
    guide = seq.guide
    for j in range(k + 1):
        row = logits[j]
        if guide is not None:
            guide.apply(row)
        if greedy:
            tid = sampler.greedy(row, prompt, hist)
        else:
            p = sampler.probs(row, prompt, hist)
            if j < k:
                d = drafts[j]
                q = st.probs[j]
                qd = 1.0 if q is None else q[d]
                pd = p[d] if d < p.shape[0] else 0.0
                if qd > 0 and sampler.rng.random() * qd < pd:
                    tid = d
                else:
                    res = p.copy()
                    if q is None:
                        res[d] = 0.0
                    else:
                        m = min(res.shape[0], q.shape[0])
                        res[:m] = np.maximum(res[:m] - q[:m], 0.0)
                    s = res.sum()
                    tid = sampler.draw(res / s if s > 0 else p)
            else:
                tid = sampler.draw(p)
        out.append(tid)
        hist = hist + [tid]
        if guide is not None:
            ok = guide.advance(tid)
            steps.append((ok, guide.done))
            if not ok:
                break
        if j == k or tid != drafts[j]:
            break
    return out, steps if guide is not None else None

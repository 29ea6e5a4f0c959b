"""Constrained decoding: JSON schemas, regular expressions, choices and grammars through llguidance.

llguidance (Rust, the library llama.cpp and vLLM use) turns a constraint into a token mask for the
next step. Here:

- ``llg_tokenizer(tok)`` builds its index of our vocabulary once per tokenizer (every token's bytes;
  control tokens are marked special, so they are never allowed except the stop tokens, which end a
  sequence where the grammar may end).
- ``constraint_grammar(params)`` turns SamplingParams' json_schema / regex / choice / grammar into
  llguidance's grammar text. JSON is compact by default: no free whitespace, separators ", " and
  ": " (a schema's own ``x-guidance`` options override this), so a small model cannot wander off
  into whitespace until max_tokens.
- ``GrammarCache`` compiles each distinct constraint once (least recently used out) into a template
  matcher; every sequence gets a copy. Compiling happens in the thread that adds the request (the
  server's worker threads), never in the engine thread's decode step.
- ``Guide`` is one sequence's matcher: it masks the logits row before sampling and advances with
  every accepted token. The mask is applied by the backend's ``mask_logits`` kernel, which the engine
  hands to its cache (from the model's backend), so this module imports no kernels and no Numba.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from .errors import EdgeInferError

if TYPE_CHECKING:
    from .sampling import SamplingParams
    from .tokenizer import Tokenizer

# llguidance's JSON options for every schema; x-guidance in a schema overrides them
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(EdgeInferError, ValueError):
    """A schema, regex or grammar the constraint library rejects."""


def _llg():
    try:
        import llguidance
    except ImportError as e:  # a core dependency; say what to do if it is missing anyway
        raise EdgeInferError(f"structured output needs llguidance: pip install llguidance ({e})") from None
    return llguidance


_TOKENIZER_LOCK = threading.Lock()


def llg_tokenizer(tok: Tokenizer):
    """llguidance's tokenizer for our vocabulary, built once per Tokenizer (about 0.1 s for 49k tokens,
    1-2 s for 262k) and kept on it."""
    cached = getattr(tok, "_llg_tokenizer", None)
    if cached is not None:
        return cached
    with _TOKENIZER_LOCK:
        cached = getattr(tok, "_llg_tokenizer", None)
        if cached is None:
            cached = _build_llg_tokenizer(tok)
            tok._llg_tokenizer = cached
    return cached


def _build_llg_tokenizer(tok: Tokenizer):
    from .tokenizer import CONTROL, UNKNOWN, UNUSED

    llg = _llg()
    types = tok.token_types
    special = np.isin(types, (CONTROL, UNKNOWN, UNUSED))
    tokens = []
    for i in range(tok.vocab_size):
        if special[i]:  # llguidance's mark for a special token: a leading 0xff byte
            tokens.append(b"\xff" + tok.tokens[i].encode("utf-8"))
        else:
            tokens.append(tok.token_bytes(i))

    class _Wrapper(llg.TokenizerWrapper):
        def __init__(self):  # the fields LLTokenizer reads; tokenizing goes through our own encoder
            self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.stop_ids, default=0)
            self.bos_token_id = tok.bos_id
            self.tokens = tokens
            self.special_token_ids = [int(i) for i in np.flatnonzero(special)]
            self.is_tokenizer_wrapper = True
            self._accepts_bytes = False
            self._gtokenizer = lambda text: tok.encode(text, add_bos=False)

    stops = sorted(tok.stop_ids) or ([tok.eos_id] if tok.eos_id is not None else [])
    return llg.LLTokenizer(_Wrapper(), n_vocab=tok.vocab_size, eos_token=stops or None)


def constraint_grammar(params: SamplingParams) -> str | None:
    """llguidance's grammar text for the params' constraint, or None when there is none."""
    llg = _llg()
    if params.json_schema is not None:
        schema = close_objects(json.loads(params.json_schema))
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
    if params.regex is not None:
        return llg.LLMatcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        return llg.grammar_from("choice", list(params.choice))
    if params.grammar is not None:
        try:  # Lark (llguidance's syntax), or llama.cpp's GBNF, which it converts
            return llg.grammar_from("grammar", params.grammar)
        except ValueError as e:
            raise GrammarError(f"grammar: {e}") from None
    return None


class GrammarCache:
    """Compiled constraints for one tokenizer: (kind, constraint) -> a template matcher, least recently used
    out past `capacity`. Thread-safe; compiling runs outside the lock (llguidance drops the GIL), so two
    threads compiling different schemas do not wait for each other."""

    def __init__(self, tokenizer: Tokenizer, mask_logits, capacity: int = 64):
        self.tokenizer = tokenizer
        self.mask_logits = mask_logits  # the backend's kernel: (logits row, mask words, vocab size), in place
        self.capacity = capacity
        self._items: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.compile_seconds = 0.0  # total time spent compiling (for bench and metrics)

    def __len__(self):
        return len(self._items)

    def template(self, params: SamplingParams):
        """The compiled template matcher for params (None when unconstrained); GrammarError if the
        library rejects it."""
        kind = params.constraint_kind
        if kind is None:
            return None
        key = (kind, getattr(params, kind))  # the constraint as given: a hit converts nothing
        with self._lock:
            m = self._items.get(key)
            if m is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return m
            self.misses += 1
        try:
            grammar = constraint_grammar(params)
        except GrammarError:
            raise
        except ValueError as e:
            raise GrammarError(f"{kind}: {e}") from None
        llg = _llg()
        lt = llg_tokenizer(self.tokenizer)  # built once per vocabulary; not counted as compiling
        t1 = time.perf_counter()
        m = llg.LLMatcher(lt, grammar, log_level=0)
        if m.is_error():
            raise GrammarError(f"{kind} is not valid: {m.get_error().strip()}")
        with self._lock:
            self.compile_seconds += time.perf_counter() - t1
            self._items[key] = m
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return m

    def guide(self, params: SamplingParams) -> Guide | None:
        """A fresh per-sequence matcher for params, or None when unconstrained."""
        t = self.template(params)
        return Guide(t.deep_copy(), self.tokenizer.vocab_size, self.mask_logits) if t is not None else None


class Guide:
    """One sequence's matcher: masks a logits row, then advances with the token sampled from it."""

    __slots__ = ("matcher", "vocab_size", "mask_logits", "_mask", "num_masks", "mask_seconds", "apply_seconds")

    def __init__(self, matcher, vocab_size: int, mask_logits):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.mask_logits = mask_logits
        self._mask = np.zeros((vocab_size + 31) // 32, np.int32)
        self.num_masks = 0
        self.mask_seconds = 0.0  # in the library, computing masks
        self.apply_seconds = 0.0  # unpacking them onto the logits

    def _compute(self) -> np.ndarray:
        m = self._mask
        t0 = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(m.ctypes.data, m.nbytes)
        self.mask_seconds += time.perf_counter() - t0
        self.num_masks += 1
        return m

    def allowed(self) -> np.ndarray:
        """A bool array over the vocabulary: the tokens the constraint allows next."""
        m = self._compute()
        return np.unpackbits(m.view(np.uint8), bitorder="little", count=self.vocab_size).view(bool)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """logits with every token the constraint forbids at -inf (in place; rows past the vocabulary too)."""
        m = self._compute()
        t0 = time.perf_counter()
        self.mask_logits(logits, m, np.int64(self.vocab_size))
        self.apply_seconds += time.perf_counter() - t0
        return logits

    def advance(self, tid: int) -> bool:
        """Consume the sampled token; False if the matcher refuses it (it is then in an error state)."""
        return self.matcher.consume_token(int(tid))

    def rollback(self, n: int) -> None:
        """Undo the last n advanced tokens (speculative decoding's rejected proposals)."""
        if n and not self.matcher.rollback(int(n)):
            raise RuntimeError(f"the grammar matcher could not roll back {n} tokens: {self.matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete: no token but a stop token could follow."""
        return self.matcher.is_stopped()


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def close_objects(schema):
    """The schema with `additionalProperties: false` on every object that lists its properties and says
    nothing about others: what OpenAI's strict mode and vLLM's default (xgrammar's strict mode) do.
    Without it a small model adds keys of its own until max_tokens runs out."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    for k in _SUBSCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: close_objects(sub) for name, sub in out[k].items()}
    for k in _SUBSCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [close_objects(sub) for sub in out[k]]
    for k in ("items", "additionalProperties", "not", "if", "then", "else", "contains"):
        if isinstance(out.get(k), dict):
            out[k] = close_objects(out[k])
    return out

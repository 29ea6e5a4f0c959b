"""Sampling parameters (validated on construction) and the sampler built from small filters."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

CONSTRAINTS = ("json_schema", "regex", "choice", "grammar")  # SamplingParams' structured-output fields


def canonical_schema(schema) -> str:
    """A JSON schema (dict or JSON text) as compact JSON text; ValueError naming the problem."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ValueError(f"json_schema must be a JSON object (a schema), got {type(schema).__name__}")
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. A bad value raises ValueError naming the field."""

    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # 1: off; on the last repeat_last_n tokens of prompt and output
    repeat_last_n: int = -1  # how many last tokens repetition_penalty looks at (llama.cpp's): -1 all, 0 none
    presence_penalty: float = 0.0  # on output tokens
    frequency_penalty: float = 0.0  # on output tokens
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # how many top log-probabilities to return per token
    # added to the logits of these token ids before any other step (OpenAI's logit_bias: -100 bans a
    # token, +100 all but forces it); a {token id: bias} dict or (id, bias) pairs, kept as sorted pairs
    logit_bias: tuple = field(default=())
    # structured output: at most one constraint (edgeinfer.structured; the llguidance library)
    json_schema: str | dict | None = None  # a JSON schema (stored as compact JSON text)
    regex: str | None = None  # the whole output matches this regular expression
    choice: tuple[str, ...] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # a Lark grammar (llguidance's syntax) or llama.cpp's GBNF
    special_text: bool = False  # the output text keeps control tokens' text (a harmony reply: edgeinfer.harmony)
    # the LoRA adapters this request runs with (the LLM's, by index or name) and their scales: a {id or name: scale}
    # dict or (id, scale) pairs, kept as pairs in the given order; an adapter left out runs at 0; () none (the base
    # model); None: the LLM's own scales (LLM(lora=...), the server's /lora-adapters)
    lora: tuple | None = None

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        def num(name, integer=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int,) if integer else (int, float)):
                bad(name, "must be an integer" if integer else "must be a number")
            if not integer and not math.isfinite(v):
                bad(name, "must be finite")
            return v

        if num("temperature") < 0:
            bad("temperature", "must be >= 0")
        if not 0 < num("top_p") <= 1:
            bad("top_p", "must be in (0, 1]")
        if num("top_k", True) < 0:
            bad("top_k", "must be >= 0 (0 disables it)")
        if not 0 <= num("min_p") <= 1:
            bad("min_p", "must be in [0, 1]")
        if num("repetition_penalty") <= 0:
            bad("repetition_penalty", "must be > 0")
        if num("repeat_last_n", True) < -1:
            bad("repeat_last_n", "must be >= -1 (-1: the whole context, 0: none)")
        if not -2 <= num("presence_penalty") <= 2:
            bad("presence_penalty", "must be in [-2, 2]")
        if not -2 <= num("frequency_penalty") <= 2:
            bad("frequency_penalty", "must be in [-2, 2]")
        if num("max_tokens", True) < 1:
            bad("max_tokens", "must be >= 1")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if not isinstance(self.stop, (tuple, list)) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "must be a list of non-empty strings")
        object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop_token_ids, (tuple, list)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be a list of token ids >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            bad("seed", "must be a non-negative integer or None")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= 20):
            bad("logprobs", "must be an integer in [0, 20] or None")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", "must be true or false")
        self._check_logit_bias(bad)
        self._check_lora(bad)
        self._check_constraint(bad)

    def _check_lora(self, bad):
        if self.lora is None:
            return
        try:
            pairs = [(k, v) for k, v in (self.lora.items() if isinstance(self.lora, dict) else self.lora)]
        except (TypeError, ValueError):
            bad("lora", "must map adapter ids or names to scales")
        for k, v in pairs:
            if isinstance(k, bool) or not (isinstance(k, int) and k >= 0 or isinstance(k, str) and k):
                bad("lora", f"has key {k!r}: keys must be adapter indices >= 0 or names")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                bad("lora", f"has scale {v!r} for adapter {k!r}: scales must be finite numbers")
        object.__setattr__(self, "lora", tuple((k, float(v)) for k, v in pairs))

    def _check_logit_bias(self, bad):
        lb = self.logit_bias
        pairs = list(lb.items()) if isinstance(lb, dict) else lb
        try:
            pairs = [(t, b) for t, b in pairs]
        except (TypeError, ValueError):
            bad("logit_bias", "must map token ids to biases")
        for t, b in pairs:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                bad("logit_bias", f"has key {t!r}: keys must be token ids >= 0")
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not -100 <= b <= 100:
                bad("logit_bias", f"has bias {b!r} for token {t}: biases must be numbers in [-100, 100]")
        object.__setattr__(self, "logit_bias", tuple(sorted((t, float(b)) for t, b in dict(pairs).items())))

    def _check_constraint(self, bad):
        given = [k for k in CONSTRAINTS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of json_schema, regex, choice and grammar, got {', '.join(given)}")
        if self.json_schema is not None:
            object.__setattr__(self, "json_schema", canonical_schema(self.json_schema))
        for k in ("regex", "grammar"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, str) or not v):
                bad(k, "must be a non-empty string")
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, (list, tuple)) or not self.choice \
                    or not all(isinstance(c, str) and c for c in self.choice):
                bad("choice", "must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def constraint_kind(self) -> str | None:
        """Which structured-output field is set (at most one is), or None."""
        return next((k for k in CONSTRAINTS if getattr(self, k) is not None), None)

    @property
    def constrained(self) -> bool:
        return self.constraint_kind is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# -- filters: each takes logits (V,) float64 and returns them with some entries at -inf ----------


def _last_tokens(prompt_ids, output_ids, n: int) -> list:
    """The last n tokens of the context (prompt then output); n = -1: all of them."""
    if n < 0:
        return list(prompt_ids) + list(output_ids)
    if n <= len(output_ids):
        return list(output_ids[len(output_ids) - n:])
    return list(prompt_ids[max(0, len(prompt_ids) - (n - len(output_ids))):]) + list(output_ids)


def apply_penalties(logits, params: SamplingParams, prompt_ids, output_ids):
    if params.logit_bias:
        ids = np.fromiter((t for t, _ in params.logit_bias), np.int64, len(params.logit_bias))
        logits[ids] += np.fromiter((b for _, b in params.logit_bias), np.float64, len(params.logit_bias))
    if params.repetition_penalty != 1.0 and params.repeat_last_n != 0:
        seen = np.unique(np.asarray(_last_tokens(prompt_ids, output_ids, params.repeat_last_n), np.int64))
        if seen.size:
            v = logits[seen]
            logits[seen] = np.where(v > 0, v / params.repetition_penalty, v * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and len(output_ids):
        ids, counts = np.unique(np.asarray(output_ids, np.int64), return_counts=True)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * counts
    return logits


def apply_top_k(logits, k: int):
    if 0 < k < logits.shape[0]:
        kth = np.partition(logits, -k)[-k]
        logits[logits < kth] = -np.inf
    return logits


def apply_top_p(logits, p: float):
    if p < 1.0:
        order = np.argsort(-logits)
        probs = _softmax(logits[order])
        keep = np.cumsum(probs) - probs < p  # keep the smallest prefix whose mass reaches p
        logits[order[~keep]] = -np.inf
    return logits


def apply_min_p(logits, p: float):
    if p > 0.0:
        probs = _softmax(logits)
        logits[probs < p * probs.max()] = -np.inf
    return logits


def _softmax(x):
    e = np.exp(x - np.max(x))
    return e / e.sum()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


class Sampler:
    """One per request: its params and its own seeded random generator."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, prompt_ids, output_ids) -> int:
        if self.params.greedy:
            return self.greedy(logits, prompt_ids, output_ids)
        return self.draw(self.probs(logits, prompt_ids, output_ids))

    def greedy(self, logits: np.ndarray, prompt_ids, output_ids) -> int:
        """The most likely token after the penalties."""
        return int(np.argmax(apply_penalties(logits.astype(np.float64), self.params, prompt_ids, output_ids)))

    def probs(self, logits: np.ndarray, prompt_ids, output_ids) -> np.ndarray:
        """The distribution a sampling (temperature > 0) request draws from: penalties, temperature, then
        top-k, top-p and min-p."""
        p = self.params
        x = apply_penalties(logits.astype(np.float64), p, prompt_ids, output_ids)
        # from the largest logit down: a tiny temperature (1e-300, say) sends the others to -inf (no
        # weight) instead of the largest to +inf (inf - inf: NaN probabilities, a failed request)
        with np.errstate(over="ignore"):
            x = (x - x.max()) / p.temperature
        return _softmax(apply_min_p(apply_top_p(apply_top_k(x, p.top_k), p.top_p), p.min_p))

    def draw(self, probs: np.ndarray) -> int:
        """One token from a distribution, with this request's generator."""
        return int(self.rng.choice(probs.shape[0], p=probs))

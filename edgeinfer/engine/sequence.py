"""A request's state as it moves through the scheduler."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

_ids = itertools.count()


@dataclass(frozen=True)
class MediaSpan:
    """Rows of a prompt that are given as embeddings (an image's, from its projector) instead of token ids:
    prompt positions start .. start + len(rows); their token ids are placeholders. non_causal: the rows attend to
    each other whatever their order (Gemma 3's images), so they are computed in one pass. digest names the
    content (the prefix cache's key for these positions)."""

    start: int
    rows: object  # (n, dim) float32
    digest: str
    non_causal: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.rows)


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """token_ids holds the prompt then the output; num_computed_tokens of them have KV in the cache."""

    def __init__(self, prompt_ids: list[int], params, request_id: str | None = None, priority: int = 0,
                 arrival: float = 0.0):
        self.seq_id = next(_ids)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.choice = 0  # which of its request's n choices (choices.py) this sequence is
        self.token_ids = list(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at the last admission
        self.block_table: list[int] = []
        self.window_table: list[int] = []  # its blocks in the window pool (sliding-window layers), -1: none
        self.state_slot = -1  # its slot of recurrent state while it has blocks (a hybrid model's), else -1
        self.decode_checkpoint = None  # the block hash of its latest state checkpoint past the prompt, if any
        self.snapshot = None  # (checkpoint slot, tokens): its state after that many tokens is saved this step
        self.spec_slots: list[int] = []  # verifying proposals: slots for its state after each token but the last
        self.status = SequenceStatus.WAITING
        self.params = params
        self.priority = priority  # lower value: served first (as vLLM)
        self.arrival = arrival
        self.waited_steps = 0
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.spec = None  # speculative.SpecState when the engine speculates
        self.guide = None  # structured.Guide of a constrained request: masks its logits, follows its tokens
        self.disk = None  # prompt_cache.DiskState: its blocks' chain digests and how many went to the disk cache
        self.media: tuple[MediaSpan, ...] = ()  # prompt rows given as embeddings (images), in order
        self._hash_ids: list[int] | None = None  # the ids as the prefix cache keys them (media: see hash_ids)
        self.lora: np.ndarray | None = None  # each LoRA adapter's scale for this sequence (lora_of), if the model has any

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def hash_ids(self) -> list[int]:
        """The token ids as the prefix cache keys them: token_ids, with each media row's placeholder replaced by a
        negative id hashed from its span's digest and its row (31 bits a row: a block of rows keys on hundreds),
        so that only the same content at the same place hits; with LoRA adapters at work (scales not all 0) the first
        id is replaced by one hashed from it and the scales, so that only the same adapters hit. Kept, and extended
        as tokens are appended (token_ids only grows)."""
        salted = self.lora is not None and self.lora.any()
        if not self.media and not salted:
            return self.token_ids
        if self._hash_ids is None:
            ids = list(self.token_ids[: self.num_prompt_tokens])
            for m in self.media:
                for i in range(m.start, m.end):
                    h = hashlib.blake2b(f"{m.digest}/{i - m.start}".encode(), digest_size=4).digest()
                    ids[i] = -1 - int.from_bytes(h, "little") % 0x7FFFFFF0
            if salted:  # after the media rows: an image at the start is salted too
                h = hashlib.blake2b(self.lora.astype("<f4").tobytes() + str(ids[0]).encode(), digest_size=4).digest()
                ids[0] = -1 - int.from_bytes(h, "little") % 0x7FFFFFF0
            self._hash_ids = ids
        ids = self._hash_ids
        ids.extend(self.token_ids[len(ids):])
        return ids

    def chunk_end(self, start: int, n: int) -> int:
        """How many tokens from start a forward pass may take when n are granted: a non-causal span is never cut
        (the chunk stops before it, or, when it starts there, runs to its end)."""
        end = start + n
        for m in self.media:
            if m.non_causal and m.start < end < m.end and start < m.end:
                return m.start - start if m.start > start else m.end - start
        return n

    def __repr__(self):
        return (f"Sequence({self.request_id}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")


@dataclass
class RequestOutput:
    """What one step produced for one request: the new text and tokens, and whether it is done."""

    request_id: str
    delta_text: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    prompt_token_ids: list[int] = field(default_factory=list)
    num_output_tokens: int = 0
    logprobs: list[dict] | None = None  # per new token: {"token_id", "logprob", "top": [(id, logprob)]}
    index: int = 0  # the choice (add_request's n): finished says this choice is done,
    done: bool | None = None  # done that every choice of the request is (None: as finished)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (memory or disk), not computed
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop"), if one did

    def __post_init__(self):
        if self.done is None:
            self.done = self.finished


def media_of(prompt, n: int, dim: int) -> tuple:
    """A prompt's media spans (vision.MediaPrompt's), checked: in order, inside the prompt, rows (k, dim)."""
    media = tuple(getattr(prompt, "media", ()))
    end = 0
    for m in media:
        rows = m.rows
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.shape[1] != dim or not len(rows):
            raise ValueError(f"media rows must be a (n, {dim}) array, not {getattr(rows, 'shape', type(rows))}")
        if m.start < end or m.end > n:
            raise ValueError(f"media rows at prompt positions {m.start}..{m.end} overlap or pass the prompt's {n}")
        end = m.end
    return media


def pin_lora(model, params):
    """params with the model's own adapter scales written in where they choose none (so that a request's n choices,
    and a request waiting, keep the scales it came with), ValueError for adapters the model lacks."""
    scales = lora_of(model, params)
    if scales is None or params.lora is not None:
        return params
    return dataclasses.replace(params, lora=tuple((i, float(s)) for i, s in enumerate(scales)))


def lora_of(model, params) -> np.ndarray | None:
    """The scale of each of the model's LoRA adapters for a request with these SamplingParams (params.lora, else the
    model's own scales), or None for a model without adapters; ValueError for adapters it does not have."""
    adapters = getattr(model, "lora", None)
    if adapters is None:
        if params.lora:
            raise ValueError("lora: this model has no LoRA adapters loaded")
        return None
    return adapters.scales_for(params.lora)

"""A request's state as it moves through the scheduler."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

_ids = itertools.count()


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

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

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

"""One scheduling rule for prefill and decode (as vLLM v1): every running sequence asks for
num_tokens - num_computed_tokens tokens, granted under a per-step token budget, so long prompts are
prefilled in chunks between other sequences' decode steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)  # tokens scheduled for each sequence
    num_spec: list[int] = field(default_factory=list)  # of them, proposed (speculative) tokens to verify
    preempted: list[Sequence] = field(default_factory=list)

    def __bool__(self):
        return bool(self.seqs)


class Scheduler:
    """Admits waiting requests by priority then arrival while blocks last; preempts by recompute."""

    def __init__(self, block_manager: BlockManager, max_seqs: int, token_budget: int, aging_steps: int = 64,
                 plan_spec=None, warm=None):
        self.bm = block_manager
        # warm(seq): before a waiting sequence is admitted, its prefix's blocks from the disk cache (prompt_cache)
        self.warm = warm
        # speculative decoding: plan_spec(seq, room) -> how many proposed tokens a decoding sequence
        # verifies this step (at most room); they count in the token budget and get KV slots
        self.plan_spec = plan_spec
        self.max_seqs = max_seqs
        self.token_budget = token_budget
        self.aging_steps = aging_steps  # a waiting request gains one priority level per this many steps
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _wait_key(self, seq: Sequence):
        # lower priority value first, then earlier arrival; waiting long enough lifts a request,
        # so a steady stream of urgent requests cannot starve it
        return (seq.priority - seq.waited_steps // self.aging_steps, seq.arrival, seq.seq_id)

    def _victim_key(self, seq: Sequence):
        return (seq.priority, seq.arrival, seq.seq_id)  # the largest is preempted first

    def preempt(self, seq: Sequence) -> None:
        """Recompute later: free the blocks, back to waiting with everything computed forgotten."""
        self.running.remove(seq)
        self.bm.free_seq(seq)
        seq.num_computed_tokens = 0
        if seq.spec is not None:
            seq.spec.draft_computed = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)

    def abort(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.bm.free_seq(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free_seq(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledBatch:
        out = ScheduledBatch()
        budget = self.token_budget
        # 1. running sequences, most important first, each catching up under the budget
        for seq in sorted(self.running, key=self._victim_key):
            if budget == 0:
                break
            if seq not in self.running:  # preempted below for an earlier one
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n <= 0:
                continue
            if seq.media:  # an image attended non-causally is computed in one pass (may pass the budget)
                n = seq.chunk_end(seq.num_computed_tokens, n)
            k = 0
            if self.plan_spec is not None and n == seq.num_tokens - seq.num_computed_tokens == 1 and budget > 1:
                room = budget - 1
                spec_room = self.bm.spec_room()  # a hybrid model: slots to roll its state back
                if spec_room is not None:
                    room = min(room, spec_room)
                k = self.plan_spec(seq, room) if room > 0 else 0
                if k and not self.bm.can_append(seq, n + k):
                    k = 0  # no room for the proposals: decode plainly rather than preempt for them
                n += k
            while not self.bm.can_append(seq, n):
                victim = max(self.running, key=self._victim_key)
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            self.bm.take_spec(seq, k)
            self.bm.append_slots(seq, n)
            self.bm.plan_checkpoint(seq, n)  # a hybrid model's state at a block boundary, saved in the step
            out.seqs.append(seq)
            out.num_tokens.append(n)
            out.num_spec.append(k)
            budget = max(budget - n, 0)
        # 2. admit waiting requests while there is room (not in a step that had to preempt)
        self.waiting.sort(key=self._wait_key)
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs and not out.preempted:
            seq = self.waiting[0]
            if self.warm is not None:
                self.warm(seq)
            # an image attended non-causally may run its chunk past the budget (Sequence.chunk_end): room for it
            room = budget + max((len(m.rows) for m in seq.media if m.non_causal), default=0)
            if not self.bm.can_allocate(seq, room):
                break
            self.waiting.pop(0)
            seq.num_computed_tokens = self.bm.allocate(seq)
            if seq.spec is not None:  # cached blocks hold the draft's KV too (see speculative.py)
                seq.spec.draft_computed = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if seq.media:
                n = seq.chunk_end(seq.num_computed_tokens, n)
            self.bm.append_slots(seq, n)  # its window blocks for this step (its other blocks came with it)
            self.bm.plan_checkpoint(seq, n)
            out.seqs.append(seq)
            out.num_tokens.append(n)
            out.num_spec.append(0)
            budget = max(budget - n, 0)
        for seq in self.waiting:
            seq.waited_steps += 1
        return out

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.bm.blocks_needed(num_tokens) <= self.bm.num_blocks

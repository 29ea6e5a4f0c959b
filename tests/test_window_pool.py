"""Sliding-window layers' KV in a pool of their own: a sequence holds only the blocks its window sees there,
the outputs are the bits the full pool gives, prefix hits find their window blocks or are cut back."""

import numpy as np
import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.engine.block_manager import BlockManager
from edgeinfer.engine.model_runner import Batch
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sequence import Sequence
from edgeinfer.sampling import log_softmax

P = SamplingParams(max_tokens=4)


def seq(tokens):
    return Sequence(list(tokens), P)


def run_steps(bm, s, chunk):
    """Compute s's tokens chunk by chunk as the scheduler would; after each step the window blocks it holds."""
    held = []
    while s.num_computed_tokens < s.num_tokens:
        n = min(chunk, s.num_tokens - s.num_computed_tokens)
        assert bm.can_append(s, n)
        bm.append_slots(s, n)
        s.num_computed_tokens += n
        bm.commit(s)
        held.append([b for b in s.window_table if b >= 0])
        bm.check_invariants([s])
    return held


def test_a_long_sequence_holds_its_window_and_one_step():
    bm = BlockManager(64, 4, window=8, num_window_blocks=64)
    s = seq(range(100))
    bm.allocate(s)
    held = run_steps(bm, s, 6)
    # a step over 6 tokens sees the 7 before its first: 13 positions, in at most 5 blocks of 4
    assert max(len(h) for h in held) <= 5
    assert len(s.block_table) == 25 and bm.num_window_used == len(held[-1]) <= 5
    # the released blocks are free again; the full pool holds every block
    assert bm.num_window_blocks - bm.num_window_used == bm.win.num_free
    first = max(0, 100 - 6 - 7) // 4
    assert all(b < 0 for b in s.window_table[:first])


def test_a_prefix_hit_shares_the_window_blocks_its_next_token_sees():
    bm = BlockManager(64, 4, window=8, num_window_blocks=64)
    a = seq(range(40))
    bm.allocate(a)
    run_steps(bm, a, 40)
    b = seq(list(range(40)) + [99, 98])
    assert bm.allocate(b) == 40
    # its next token (position 40) sees 33..40: blocks 8 and 9 of a's, shared; none before
    assert b.window_table[:8] == [-1] * 8 and b.window_table[8:] == a.window_table[8:10]
    assert bm.win.blocks[a.window_table[9]].ref_count == 2
    bm.append_slots(b, 2)
    bm.check_invariants([a, b])


def test_a_prefix_hit_is_cut_back_where_its_window_blocks_were_evicted():
    bm = BlockManager(64, 4, window=8, num_window_blocks=12)
    a = seq(range(40))
    bm.allocate(a)
    run_steps(bm, a, 8)
    bm.free_seq(a)
    c = seq(range(1000, 1044))  # other tokens take every window block: a's are evicted
    bm.allocate(c)
    run_steps(bm, c, 44)
    bm.free_seq(c)
    b = seq(range(40))
    # the full pool still has a's blocks, the window pool none: nothing reused, all recomputed
    assert bm.num_cached >= 10 and bm.allocate(b) == 0
    run_steps(bm, b, 40)
    bm.check_invariants([b])


def test_trim_gives_back_rejected_window_blocks():
    bm = BlockManager(16, 4, window=8, num_window_blocks=16)
    s = seq(range(10))
    bm.allocate(s)
    run_steps(bm, s, 10)
    bm.append_slots(s, 7)  # a step verifying proposals: positions 10..16
    assert len(s.window_table) == 5
    bm.trim(s, 12)
    assert len(s.window_table) == 3 and len(s.block_table) == 3
    bm.check_invariants([s])


def test_the_scheduler_admits_only_with_window_blocks_for_the_first_step():
    bm = BlockManager(64, 4, window=8, num_window_blocks=6)
    sched = Scheduler(bm, max_seqs=4, token_budget=16)
    a, b = seq(range(30)), seq(range(100, 130))
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    # a's first 16 tokens take 4 window blocks; b's would take 4 more of the 2 left
    assert out.seqs == [a] and out.num_tokens == [16]
    bm.check_invariants([a])


def test_a_window_pool_needs_a_window_and_no_recurrent_state():
    with pytest.raises(ValueError, match="window pool"):
        BlockManager(8, 4, window=0, num_window_blocks=8)
    with pytest.raises(ValueError, match="window pool"):
        BlockManager(8, 4, window=8, num_window_blocks=8, num_state_slots=2)


@pytest.fixture(scope="module")
def gemma(tiny_gemma3_path):
    # window 8, blocks of 4, steps of at most 8 tokens: a window pool of 5 blocks a sequence
    cfg = EngineConfig(max_seqs=2, block_size=4, max_num_batched_tokens=8, max_context=256)
    return LLM(str(tiny_gemma3_path), engine_config=cfg, progress=False)


def test_sliding_layers_get_a_window_pool_that_is_small(gemma):
    cache, bm = gemma.engine.cache, gemma.engine.block_manager
    n_window = len(gemma.engine.model.cfg.window_layers)
    assert n_window == 6 and cache.wk.shape[0] == 6 and cache.k.shape[0] == 1  # every sixth layer global
    assert bm.num_window_blocks == 2 * 5 < bm.num_blocks == 64
    assert cache.window_nbytes == 6 * 10 * 4 * 2 * 32 * 2  # layers, slots of 4, K and V rows of 32 f16


PROMPTS = [[(7 * i + 3) % 200 + 3 for i in range(45)], [(11 * i + 5) % 190 + 3 for i in range(23)],
           [(5 * i + 2) % 180 + 3 for i in range(31)]]


def assert_full_context_bits(llm, prompts, outs):
    for p, out in zip(prompts, outs):
        full = p + out.token_ids
        # one pass over the whole sequence in a scratch cache with no window pool (every block kept)
        ref = llm.engine.scratch(len(full)).prefix(full, np.arange(len(p) - 1, len(full) - 1))
        for j, tok in enumerate(out.token_ids):
            assert out.logprobs[j]["logprob"] == log_softmax(ref[j])[tok], j


@pytest.mark.parametrize("per_op", [False, True])
def test_outputs_past_the_window_are_the_full_context_forwards_bits(gemma, per_op):
    model = gemma.engine.model
    stack, model.stack = model.stack, (None if per_op else model.stack)
    try:
        outs = gemma.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0, logprobs=0))
        assert_full_context_bits(gemma, PROMPTS, outs)
    finally:
        model.stack = stack
    s = gemma.engine.stats()
    assert s["window_blocks_used"] == 0 and s["window_blocks_total"] == 10 and s["preemptions"] == 0


def test_preemption_and_speculation_keep_the_bits(tiny_gemma3_path):
    # a full pool of 16 blocks for three sequences of up to 57 tokens: preemptions, recomputed
    cfg = EngineConfig(max_seqs=3, block_size=4, max_num_batched_tokens=8, max_context=64, num_kv_blocks=16)
    llm = LLM(str(tiny_gemma3_path), engine_config=cfg, progress=False)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0, logprobs=0))
    assert llm.engine.stats()["preemptions"] > 0
    assert_full_context_bits(llm, PROMPTS, outs)
    # prompt lookup proposes the repeated pattern's continuation; rejected proposals are trimmed
    cfg = EngineConfig(max_seqs=2, block_size=4, max_num_batched_tokens=16, max_context=128)
    spec = LLM(str(tiny_gemma3_path), engine_config=cfg, progress=False, speculate="lookup")
    rep = [[3, 4, 5, 6, 7, 8, 9, 10] * 5, PROMPTS[0]]
    outs = spec.generate(rep, SamplingParams(max_tokens=16, temperature=0.0, logprobs=0))
    assert spec.engine.spec_proposed > 0 and spec.engine.block_manager.num_window_blocks > 0
    assert_full_context_bits(spec, rep, outs)


def test_a_repeated_prompt_reuses_its_window_blocks(gemma):
    ids = [(13 * i + 1) % 200 + 3 for i in range(37)]
    sp = SamplingParams(max_tokens=3, temperature=0.0, logprobs=0)
    first = gemma.generate(ids, sp)[0]
    before = gemma.engine.stats()["computed_tokens"]
    again = gemma.generate(ids, sp)[0]
    # 36 of 37 prompt tokens were cached, window blocks included: the last prompt token and two outputs
    assert gemma.engine.stats()["computed_tokens"] - before == 3
    assert again.token_ids == first.token_ids and again.logprobs == first.logprobs


def test_batch_defaults_address_the_window_pool_as_the_full_one():
    b = Batch([1, 2], [0, 1], [0, 0], [5, 6], [[1, 0]], [1])
    assert b.window_slots is b.slot_mapping and b.window_tables is b.block_tables

"""BlockManager and Scheduler with no model: exact block ids, ref counts and queue orders."""

import random

import pytest

from edgeinfer.engine.block_manager import BlockManager
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sequence import Sequence, SequenceStatus
from edgeinfer.sampling import SamplingParams

P = SamplingParams(max_tokens=4)


def seq(tokens, priority=0, arrival=0.0, rid=None):
    return Sequence(list(tokens), P, rid, priority, arrival)


def test_allocate_gives_lowest_free_blocks_in_order():
    bm = BlockManager(11, 16)
    s = seq(range(40))  # 3 blocks
    assert bm.allocate(s) == 0
    assert s.block_table == [0, 1, 2]
    assert [bm.blocks[i].ref_count for i in range(4)] == [1, 1, 1, 0]
    assert bm.num_free == 8


def test_prefix_hit_shares_blocks_and_skips_tokens():
    bm = BlockManager(11, 16)
    a = seq(range(40))
    bm.allocate(a)
    a.num_computed_tokens = 40
    bm.commit(a)
    assert bm.num_cached == 2  # only full blocks are hashed
    b = seq(list(range(32)) + [99, 98])
    assert bm.allocate(b) == 32
    assert b.block_table == [0, 1, 3]
    assert [bm.blocks[i].ref_count for i in range(4)] == [2, 2, 1, 1]
    assert bm.hit_rate == pytest.approx(2 / 4)  # a: 2 full blocks queried, 0 hits; b: 2 queried, 2 hits


def test_different_first_block_breaks_the_chain():
    bm = BlockManager(11, 16)
    a = seq(range(32))
    bm.allocate(a)
    a.num_computed_tokens = 32
    bm.commit(a)
    b = seq([7] + list(range(1, 32)))  # same second block, different first: no hit (chained hash)
    assert bm.allocate(b) == 0


def test_whole_prompt_cached_still_computes_the_last_token():
    bm = BlockManager(11, 16)
    a = seq(range(32))
    bm.allocate(a)
    a.num_computed_tokens = 32
    bm.commit(a)
    b = seq(range(32))
    assert bm.allocate(b) == 31
    assert b.block_table == [0, 1]


def test_freed_cached_blocks_are_reused_lru_and_evicted_last_used_first():
    bm = BlockManager(4, 4)
    a, b = seq(range(8)), seq(range(100, 108))
    for s in (a, b):
        bm.allocate(s)
        s.num_computed_tokens = 8
        bm.commit(s)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    bm.free_seq(a)
    bm.free_seq(b)
    assert list(bm.free) == [1, 0, 3, 2]  # tail blocks first within a sequence, sequences in free order
    # a's prefix comes back: its blocks leave the free list, the rest stay cached
    a2 = seq(range(8))
    assert bm.allocate(a2) == 7
    assert a2.block_table == [0, 1] and list(bm.free) == [3, 2]
    # a new prompt evicts b's blocks, least recently freed first (3, then 2)
    c = seq(range(200, 204))
    bm.allocate(c)
    assert c.block_table == [3] and bm.blocks[3].hash is None and bm.num_cached == 3


def test_scheduler_admits_by_priority_then_arrival():
    bm = BlockManager(11, 16)
    sch = Scheduler(bm, max_seqs=2, token_budget=100)
    s1, s2, s3 = seq(range(5), 1, 0.0, "a"), seq(range(5), 0, 1.0, "b"), seq(range(5), 0, 2.0, "c")
    for s in (s1, s2, s3):
        sch.add(s)
    out = sch.schedule()
    assert [s.request_id for s in out.seqs] == ["b", "c"]
    assert [s.request_id for s in sch.waiting] == ["a"]


def test_token_budget_chunks_a_long_prompt_between_decodes():
    bm = BlockManager(20, 16)
    sch = Scheduler(bm, max_seqs=4, token_budget=32)
    short, long = seq(range(4), rid="short"), seq(range(100), rid="long")
    sch.add(short)
    sch.add(long)
    out = sch.schedule()
    assert [(s.request_id, n) for s, n in zip(out.seqs, out.num_tokens)] == [("short", 4), ("long", 28)]
    for s, n in zip(out.seqs, out.num_tokens):
        s.num_computed_tokens += n
    short.token_ids.append(1)  # it sampled a token: one more to compute
    out = sch.schedule()
    assert [(s.request_id, n) for s, n in zip(out.seqs, out.num_tokens)] == [("short", 1), ("long", 31)]


def test_preemption_takes_the_lowest_priority_latest_request():
    bm = BlockManager(4, 4)
    sch = Scheduler(bm, max_seqs=4, token_budget=100)
    a, b = seq(range(8), 0, 0.0, "a"), seq(range(8), 0, 1.0, "b")
    for s in (a, b):
        sch.add(s)
    sch.schedule()
    for s in (a, b):
        s.num_computed_tokens = 8
        s.token_ids.append(5)  # each needs a third block now; none are free
    out = sch.schedule()
    assert [s.request_id for s in out.preempted] == ["b"]
    assert [s.request_id for s in out.seqs] == ["a"]
    assert b.status == SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert sch.num_preemptions == 1


def test_waiting_request_is_not_starved_by_a_stream_of_urgent_ones():
    bm = BlockManager(64, 16)
    sch = Scheduler(bm, max_seqs=1, token_budget=100, aging_steps=4)
    low = seq(range(3), priority=2, arrival=0.0, rid="low")
    sch.add(low)
    admitted = []
    for step in range(40):
        sch.add(seq(range(3), priority=0, arrival=1.0 + step, rid=f"u{step}"))
        out = sch.schedule()
        for s in out.seqs:
            admitted.append(s.request_id)
            sch.finish(s)
        if "low" in admitted:
            break
    assert "low" in admitted


def test_abort_frees_everything():
    bm = BlockManager(8, 4)
    sch = Scheduler(bm, max_seqs=4, token_budget=100)
    a = seq(range(10))
    sch.add(a)
    sch.schedule()
    assert bm.num_free == 5
    sch.abort(a)
    assert bm.num_free == 8 and not sch.has_unfinished()


def test_random_operations_keep_exact_accounting():
    rng = random.Random(0)
    bm = BlockManager(24, 4)
    sch = Scheduler(bm, max_seqs=6, token_budget=20)
    live: list[Sequence] = []
    prefixes = [list(range(i * 10, i * 10 + 12)) for i in range(3)]
    for op in range(1000):
        r = rng.random()
        if r < 0.35 or not live:
            toks = rng.choice(prefixes)[: rng.randint(1, 12)] + [rng.randint(0, 50) for _ in range(rng.randint(0, 9))]
            s = seq(toks, rng.randint(0, 2), float(op))
            sch.add(s)
            live.append(s)
        elif r < 0.5:
            s = rng.choice(live)
            sch.abort(s)
            live.remove(s)
        else:
            out = sch.schedule()
            for s, n in zip(out.seqs, out.num_tokens):
                s.num_computed_tokens += n
                bm.commit(s)
                if s.num_computed_tokens == s.num_tokens:
                    if len(s.output_ids) >= 3 or rng.random() < 0.2:
                        sch.finish(s)
                        live.remove(s)
                    else:
                        s.token_ids.append(rng.randint(0, 50))
        bm.check_invariants(sch.running)
        assert all(not s.block_table for s in sch.waiting)
        assert set(map(id, sch.running + sch.waiting)) == set(map(id, live))
    for s in list(live):
        sch.abort(s)
    assert bm.num_free == bm.num_blocks


def test_a_new_checkpoint_never_takes_a_slot_an_admission_is_still_to_be_restored_from():
    """The disk prompt cache writes a state into a checkpoint slot while the scheduler admits: the least recently
    used slot is not taken where a sequence admitted in the same pass is to be restored from it (its copy happens
    at the step's start)."""
    bm = BlockManager(16, 4, num_state_slots=2, num_checkpoints=2)
    a, b = bm.new_checkpoint(111), bm.new_checkpoint(222)
    bm.restores.append((a, 0))  # an admitted sequence restores from a, the least recently used
    c = bm.new_checkpoint(333)
    assert c == b and 111 in bm.checkpoints and 222 not in bm.checkpoints
    bm.restores.append((c, 1))
    assert bm.new_checkpoint(444) is None and set(bm.checkpoints) == {111, 333}

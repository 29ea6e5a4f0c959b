"""A request of n choices in the engine (engine/choices.py): submitted once, the choices after the first
queued once the prompt's blocks are registered, so they share them; each choice is sampled with its own
seed, exactly as a request of one with that seed."""

from dataclasses import replace

import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.engine.choices import choice_seed

BS = 4
PARAMS = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=5)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(str(tiny_llama_path), engine_config=EngineConfig(max_seqs=8, num_kv_blocks=64, block_size=BS),
               progress=False)


def gather(run, n: int) -> tuple[list[list[int]], list]:
    """Each choice's token ids, and every output in the order the engine gave them."""
    ids, seen = [[] for _ in range(n)], []
    for out in run:
        ids[out.index] += out.new_token_ids
        seen.append(out)
    return ids, seen


def test_n_choices_are_each_the_request_of_one_with_the_choice_seed(llm):
    prompt = llm.tokenize("the hen sat on the mat")
    with llm.engine.run() as run:
        rid = run.submit(prompt, PARAMS, n=3)
        ids, seen = gather(run, 3)
    assert {o.request_id for o in seen} == {rid}
    assert [o.index for o in seen if o.finished] and sorted(o.index for o in seen if o.finished) == [0, 1, 2]
    assert [o.done for o in seen] == [False] * (len(seen) - 1) + [True]  # done once, on the last output
    alone = [llm.generate(prompt, replace(PARAMS, seed=choice_seed(PARAMS.seed, i)))[0].token_ids for i in range(3)]
    assert ids == alone and len(set(map(tuple, ids))) > 1
    assert llm.stats()["kv_blocks_used"] == 0


def test_the_other_choices_wait_for_the_prompt_then_share_its_blocks(llm):
    eng = llm.engine
    prompt = llm.tokenize("a prompt of a few blocks, sent once")
    full = len(prompt) // BS
    assert full >= 2
    before = eng.stats()
    with eng.run() as run:
        rid = run.submit(prompt, replace(PARAMS, max_tokens=20), n=4)
        first = run.step()  # the prompt's prefill: only choice 0 runs
        assert [o.index for o in first] == [0] and eng.stats()["running"] == 1
        run.step()  # the other three are admitted, finding the prompt's full blocks cached
        tables = [eng.requests[(rid, i)].seq.block_table[:full] for i in range(4)]
        assert all(t == tables[0] for t in tables)
        for _ in run:
            pass
    after = eng.stats()
    assert after["prefix_cache_queries"] - before["prefix_cache_queries"] == 4 * full
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 3 * full


def test_a_prompt_shorter_than_a_block_queues_every_choice_at_once(llm):
    eng = llm.engine
    prompt = llm.tokenize("ab")[: BS - 1]
    with eng.run() as run:
        run.submit(prompt, PARAMS, n=3)
        assert sorted(o.index for o in run.step()) == [0, 1, 2]
        ids, _ = gather(run, 3)
    assert all(len(i) == PARAMS.max_tokens - 1 for i in ids)


def test_an_abort_before_the_fork_ends_every_choice(llm):
    eng = llm.engine
    prompt = llm.tokenize("the hen sat on the mat and the dog ran off")
    rid = eng.add_request(prompt, replace(PARAMS, max_tokens=50), n=3)
    eng.abort(rid)
    outs = eng.step()
    assert [(o.index, o.finish_reason, o.done) for o in outs] == [(1, "abort", False), (2, "abort", False),
                                                                  (0, "abort", True)]
    assert not eng.has_unfinished() and eng.stats()["kv_blocks_used"] == 0


def test_each_choice_gets_its_own_matcher(llm):
    params = SamplingParams(temperature=1.5, max_tokens=12, seed=9, regex="(yes|no|maybe)!")
    with llm.engine.run() as run:
        run.submit(llm.tokenize("answer me: is it so, or is it not?"), params, n=5)
        ids, seen = gather(run, 5)
    assert {llm.detokenize(i) for i in ids} <= {"yes!", "no!", "maybe!"}
    assert all(o.finish_reason == "stop" for o in seen if o.finished)


def test_n_must_be_a_positive_integer(llm):
    with pytest.raises(ValueError, match="n must be"):
        llm.engine.add_request(llm.tokenize("x"), PARAMS, n=0)

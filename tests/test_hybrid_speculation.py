"""Speculative decoding on hybrid models: a rejected proposal must not leave its update in the recurrent state.
The step copies a verifying sequence's state after each of its tokens but the last to slots of its own, and
the state after the last kept token goes back (a hybrid draft's in its cache too): greedy output, token for
token and log-probability for log-probability, is plain decoding's."""

import gguf
import numpy as np
import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.engine.block_manager import BlockManager
from edgeinfer.engine.speculative import SpeculationError

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=0)
CFG = dict(max_seqs=4, num_kv_blocks=64, block_size=4)
RNG = np.random.default_rng(0)
PROMPTS = [[int(t) for t in RNG.integers(8, 260, n)] for n in (23, 9, 31)]


def perturbed(src, dst, scale: float, seed: int = 1) -> str:
    """A copy of a model with noise on its norms' weights: a draft that mostly agrees with it, not always."""
    from arch_zoo import copy_fields

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8"))
    copy_fields(r, w)
    rng = np.random.default_rng(seed)
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.name.endswith("norm.weight") and t.tensor_type == gguf.GGMLQuantizationType.F32:
            data = (data * (1 + scale * rng.standard_normal(data.shape))).astype(np.float32)
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(dst)


def same(a, b):
    return a.token_ids == b.token_ids and [x["logprob"] for x in a.logprobs] == [x["logprob"] for x in b.logprobs]


@pytest.fixture(scope="module", params=["lfm2", "mamba2", "qwen35", "falcon-h1"])
def target(request, zoo, tmp_path_factory):
    path = str(zoo(request.param))
    plain = LLM(path, engine_config=EngineConfig(**CFG), progress=False)
    draft = perturbed(path, tmp_path_factory.mktemp("draft") / "draft.gguf", 0.1)
    return path, draft, plain.generate(PROMPTS, GREEDY)


def test_a_hybrid_draft_that_is_sometimes_wrong_gives_plain_decodings_output(target):
    path, draft, ref = target
    llm = LLM(path, engine_config=EngineConfig(**CFG), progress=False, draft=draft)
    out = llm.generate(PROMPTS, GREEDY)
    e = llm.engine
    # some rounds kept part of the proposals: the state was rolled back to a token inside them
    assert 0 < e.spec_accepted < e.spec_proposed, (e.spec_accepted, e.spec_proposed)
    assert all(same(a, b) for a, b in zip(ref, out))
    e.block_manager.check_invariants([])
    assert len(e.block_manager.free_spec) == e.block_manager.num_spec_slots == 4  # the draft's 4 tokens


def test_the_model_as_its_own_draft_is_accepted_whole(target):
    path, _, ref = target
    llm = LLM(path, engine_config=EngineConfig(**CFG), progress=False, draft=path)
    out = llm.generate(PROMPTS, GREEDY)
    assert llm.engine.spec_accepted == llm.engine.spec_proposed > 0
    assert all(same(a, b) for a, b in zip(ref, out))


def test_next_turns_start_from_checkpoints_saved_inside_verified_windows(target):
    path, draft, _ = target
    # blocks of 4: decoding crosses a block boundary every 4 tokens, mostly inside a verified window, where
    # the prefix-cache checkpoint of the state there is copied from the rollback slots; each next turn of the
    # conversation (its prompt, its answer, more) starts from the latest checkpoint
    llm = LLM(path, engine_config=EngineConfig(**CFG), progress=False, draft=draft)
    plain = LLM(path, engine_config=EngineConfig(**CFG), progress=False)
    turn, hits = list(PROMPTS[1]), 0
    for n in (9, 7, 10, 6, 11, 8):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=0)
        before = llm.engine.stats()["prefix_cache_hits"]
        got = llm.generate(turn, params)[0]
        hits += llm.engine.stats()["prefix_cache_hits"] - before
        assert same(got, plain.generate(turn, params)[0])
        turn = turn + got.token_ids + [17 + n, 40 + n]
    assert hits >= 20


def test_speculation_on_a_hybrid_model_is_refused_nowhere_but_a_hybrid_draft_needs_a_hybrid_target(zoo):
    with pytest.raises(SpeculationError, match="hybrid draft is supported for a hybrid target only"):
        LLM(str(zoo("qwen3")), progress=False, draft=str(zoo("qwen35")))


def test_rollback_slots_are_taken_per_proposal_and_given_back():
    from edgeinfer.engine.sequence import Sequence

    bm = BlockManager(16, 4, num_state_slots=2, num_checkpoints=2, num_spec_slots=3)
    s = Sequence(list(range(6)), GREEDY)
    bm.allocate(s)
    assert bm.spec_room() == 3
    bm.take_spec(s, 2)
    assert s.spec_slots == [4, 5] and bm.spec_room() == 1  # after the 2 sequence and 2 checkpoint slots
    bm.check_invariants([s])
    bm.free_seq(s)
    assert bm.spec_room() == 3 and s.spec_slots == []
    assert BlockManager(16, 4, num_spec_slots=3).spec_room() is None  # no state: no limit

"""Speculative decoding on tiny random models: greedy output is unchanged by either proposer, sampling keeps
the target's distribution, rejected tokens leave no KV blocks behind, and bad setups are refused."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.engine import speculative
from edgeinfer.engine.speculative import Speculation, SpeculationError, lookup, verify
from edgeinfer.sampling import Sampler
from tiny_models import write_tiny_llama

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
# repetitive prompts give prompt lookup something to find; the tiny models also fall into loops
PROMPTS = ["the hen the hen the hen the", "abc abc abc", "in a on then sat", "x", "there was a hen, there was a",
           "on then on then on then on then on", "on then in a sat on then in a"]
CFG = dict(max_seqs=8, num_kv_blocks=96, block_size=4)


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    """The tiny target's weights at a coarser type: a draft that mostly agrees with it, but not always."""
    p = tmp_path_factory.mktemp("models") / "tiny-llama-draft.gguf"
    write_tiny_llama(p, qtype=T.Q4_0)
    return p


@pytest.fixture(scope="module")
def plain(tiny_llama_path):
    return LLM(str(tiny_llama_path), engine_config=EngineConfig(**CFG), progress=False)


@pytest.fixture(scope="module")
def with_lookup(tiny_llama_path):
    return LLM(str(tiny_llama_path), engine_config=EngineConfig(**CFG), progress=False, speculate="lookup")


@pytest.fixture(scope="module")
def with_draft(tiny_llama_path, draft_path):
    return LLM(str(tiny_llama_path), engine_config=EngineConfig(**CFG), progress=False, draft=str(draft_path))


@pytest.fixture(scope="module")
def with_draft_head(tiny_llama_path, draft_path):
    """A draft whose logits come from the first 64 ids of the vocabulary and its end-of-text tokens alone (as a
    draft of a large vocabulary's: speculative.draft_head)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speculative, "HEAD_TOKENS", 64)
        return LLM(str(tiny_llama_path), engine_config=EngineConfig(**CFG), progress=False, draft=str(draft_path))


@pytest.fixture
def speculating(request, with_lookup, with_draft, with_draft_head):
    """The LLM of a test's `kind`: lookup, draft, draft-head."""
    return {"lookup": with_lookup, "draft": with_draft, "draft-head": with_draft_head}[request.node.callspec.params["kind"]]


def check_blocks(llm):
    """Block accounting after a step: ref counts match the tables, and no running sequence holds a block
    past what its computed tokens and the next step's need."""
    eng = llm.engine
    bm = eng.block_manager
    running = list(eng.scheduler.running)
    bm.check_invariants(running)
    for seq in running:
        assert len(seq.block_table) <= bm.blocks_needed(seq.num_tokens), seq


def run_checked(llm, prompts, params):
    """generate, stepping the engine by hand so block accounting is checked after every step."""
    eng = llm.engine
    rids = [eng.add_request(llm._prompt_ids(p), params) for p in prompts]
    toks = {r: [] for r in rids}
    done = set()
    while len(done) < len(rids):
        for o in eng.step():
            toks[o.request_id].extend(o.new_token_ids)
            if o.finished:
                done.add(o.request_id)
        check_blocks(llm)
    assert eng.block_manager.num_used == 0
    return [toks[r] for r in rids]


def test_lookup_finds_the_latest_longest_match():
    def raw(*a, **kw):
        return lookup(*a, cautious=False, **kw)

    assert raw([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 3) == [4, 5, 1]  # the latest [1, 2]
    assert raw([7, 1, 2, 3, 8, 2, 3], 2) == [8, 2]  # [2, 3] occurs before
    assert raw([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3], 2) == [7, 9]  # [1, 2, 3] beats the later [2, 3]
    assert raw([5, 6, 7, 8], 4) == []  # nothing repeats
    assert raw([3, 5, 6, 3], 2) == []  # one token alone is no match (ngram_min 2)
    assert raw([3, 5, 6, 3], 2, ngram_min=1) == [5, 6]
    assert raw([4, 4, 4], 3) == [4]  # only what exists after the match
    assert raw([1, 2, 1], 0) == []


def test_lookup_guesses_no_further_than_its_match_vouches_for():
    # a 2-token match vouches for one token, a 3-token match for three, a longer one for all k
    assert lookup([1, 2, 4, 5, 6, 7, 1, 2], 8) == [4]
    assert lookup([1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], 8) == [4, 5, 6]
    assert lookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], 8) == [5, 6, 7, 8, 9, 1, 2, 3]
    assert lookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], 2) == [5, 6]  # and never past k
    # the suffix occurred twice: only as far as the two continuations agree, and at least one token
    s = [1, 2, 3, 4, 5, 6, 7]
    assert lookup(s + [9, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4], 8) == [5, 6]  # ... 5 6 7 / ... 5 6 8
    assert lookup(s + [9, 1, 2, 3, 4, 0, 1, 2, 3, 4], 8) == [0]  # ... 5 / ... 0: the latest, one token
    assert lookup([1, 2, 3, 4, 5, 6, 0] * 3 + [1, 2, 3, 4, 5, 6], 3) == [0, 1, 2]  # two earlier, agreeing


KINDS = ["lookup", "draft", "draft-head"]


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_output_is_token_for_token_the_same(kind, plain, speculating):
    spec = speculating
    want = [c.token_ids for c in plain.generate(PROMPTS, GREEDY)]
    before = spec.stats()
    got = run_checked(spec, PROMPTS, GREEDY)
    assert got == want
    after = spec.stats()
    proposed = after["spec_proposed_tokens"] - before["spec_proposed_tokens"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert proposed > 0 and 0 < accepted < proposed  # it did speculate, and both outcomes happened
    assert after["spec_method"] == kind.split("-")[0]


@pytest.mark.parametrize("kind", KINDS)
def test_speculating_sequences_share_steps_with_prefill_and_penalties(kind, plain, speculating):
    """Requests arriving while others decode (prompt chunks beside verification), with a repetition
    penalty and stop strings: still the same output."""
    spec = speculating
    params = [SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=25, stop=["hen"], ignore_eos=True)]

    def staggered(llm):
        eng = llm.engine
        out, rids, i = {}, [], 0
        while i < len(PROMPTS) or eng.has_unfinished():
            if i < len(PROMPTS):  # one new request per step
                rids.append(eng.add_request(llm._prompt_ids(PROMPTS[i] * 3), params[i % 2]))
                i += 1
            for o in eng.step():
                t, txt = out.get(o.request_id, ([], ""))
                out[o.request_id] = (t + o.new_token_ids, txt + o.delta_text)
            if llm is spec:
                check_blocks(llm)
        return [out[r] for r in rids]

    assert staggered(spec) == staggered(plain)


def test_preemption_with_speculation(tiny_llama_path, draft_path, plain):
    """A pool too small for everyone: sequences are preempted and recomputed, proposals included."""
    small = EngineConfig(max_seqs=8, num_kv_blocks=24, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    want = [c.token_ids for c in plain.generate(PROMPTS, params)]
    for kw in (dict(speculate="lookup"), dict(draft=str(draft_path))):
        llm = LLM(str(tiny_llama_path), engine_config=small, progress=False, **kw)
        assert run_checked(llm, PROMPTS, params) == want
        assert llm.stats()["preemptions"] > 0


def test_prefix_cache_with_a_draft(with_draft, plain):
    """A cached prompt's blocks hold both models' KV: the second run skips the prefill and still matches."""
    prompt = list(range(40, 40 + 33))
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    want = plain.generate(prompt, params)[0].token_ids
    first = with_draft.generate(prompt, params)[0].token_ids
    before = with_draft.stats()["prefix_cache_hits"]
    second = with_draft.generate(prompt, params)[0].token_ids
    assert first == second == want
    assert with_draft.stats()["prefix_cache_hits"] - before == 8  # all 8 full prompt blocks came from the cache


@pytest.mark.parametrize("kind", KINDS)
def test_constrained_sequences_speculate_within_the_grammar(kind, plain, speculating):
    spec = speculating
    params = SamplingParams(temperature=0, max_tokens=40, regex=r"(the hen ){2,6}(sat|ran)\.")
    want = plain.generate(PROMPTS[:3], params)
    got = spec.generate(PROMPTS[:3], params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for c in got:
        assert c.finish_reason == "stop"
    assert spec.stats()["guide_errors"] == 0


def test_a_draft_whose_head_the_grammar_rules_out_keeps_no_blocks_for_it(with_draft_head, plain):
    """Where the grammar allows no token of the draft's head (the tiny vocabulary's letters are ids past 64),
    the draft proposes nothing: the blocks taken for its proposals go back in that step, and the output is
    plain decoding's."""
    params = SamplingParams(temperature=0, max_tokens=40, regex=r"(the hen ){2,6}(sat|ran)\.")
    want = [c.token_ids for c in plain.generate(PROMPTS[:3], params)]
    assert run_checked(with_draft_head, PROMPTS[:3], params) == want


def test_a_draft_computes_the_logits_of_its_head_alone(with_draft_head):
    """The head: ids [0, n) and the group of eight holding each end-of-text id past them (a group touching the
    first span joins it); its logits are the whole matrix's in those columns, bit for bit."""
    prop = with_draft_head.engine.proposer
    model = prop.runner.model
    vocab = model.output.shape[0]
    assert [(r0, r1) for r0, r1, _ in prop.head] == [(0, 64)]  # the tiny vocabulary's end-of-text ids are 0-2
    head = speculative.draft_head(model, {2, 70, 150, 151, vocab - 1}, 64)
    assert [(r0, r1) for r0, r1, _ in head] == [(0, 72), (144, 152), ((vocab - 1) // 8 * 8, vocab)]
    assert speculative.draft_head(model, {2}, vocab // 2 + 1) is None  # leaving out less than half: the whole
    runner = prop.runner.scratch(12)
    ids = with_draft_head.tokenize("the hen sat on", add_bos=None)
    full = runner.prefix(ids, np.arange(len(ids)))
    h = runner.prefix(ids, np.arange(len(ids)), hidden=True)
    for r0, r1, rows in head:
        np.testing.assert_array_equal(model.project(h, rows), full[:, r0:r1])


def test_logprobs_come_with_every_accepted_token(with_lookup, plain):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
    a = with_lookup.generate(PROMPTS[0], params)[0]
    b = plain.generate(PROMPTS[0], params)[0]
    assert a.token_ids == b.token_ids
    assert len(a.logprobs) == len(a.token_ids)
    assert [x["token_id"] for x in a.logprobs] == a.token_ids
    np.testing.assert_allclose([x["logprob"] for x in a.logprobs], [x["logprob"] for x in b.logprobs], atol=1e-5)


def test_max_tokens_and_context_end_are_exact(with_lookup, plain, tiny_llama_path):
    for n in (1, 2, 3, 7):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        got = with_lookup.generate(PROMPTS[0], params)[0]
        assert len(got.token_ids) == n and got.finish_reason == "length"
    short = EngineConfig(max_context=40, **CFG)
    spec = LLM(str(tiny_llama_path), engine_config=short, progress=False, speculate="lookup")
    ref = LLM(str(tiny_llama_path), engine_config=short, progress=False)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    a, b = spec.generate(PROMPTS[0], params)[0], ref.generate(PROMPTS[0], params)[0]
    assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason == "length"
    assert len(a.prompt_token_ids) + len(a.token_ids) == 40


def test_speculation_can_be_paused(with_draft, plain):
    eng = with_draft.engine
    want = [c.token_ids for c in plain.generate(PROMPTS[:3], GREEDY)]
    eng.speculate = False
    before = eng.stats()["spec_proposed_tokens"]
    assert [c.token_ids for c in with_draft.generate(PROMPTS[:3], GREEDY)] == want
    assert eng.stats()["spec_proposed_tokens"] == before
    eng.speculate = True  # the draft catches up on the tokens it missed
    assert [c.token_ids for c in with_draft.generate(PROMPTS[:3], GREEDY)] == want


# -- sampling: the output distribution stays the target's ------------------------------------------


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-squared statistic a df-degree test exceeds with probability 0.001 (z = 3.09), by Wilson and
    Hilferty's approximation (within a percent or so for df >= 3)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * np.sqrt(a)) ** 3


def _chi2_fits(observed: np.ndarray, probs: np.ndarray) -> bool:
    """Goodness of fit: observed counts against probabilities, rare categories pooled."""
    n = observed.sum()
    keep = probs * n >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(probs[keep] * n, probs[~keep].sum() * n)
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    return stat < _chi2_critical(len(obs) - 1)


def _homogeneous(table: np.ndarray) -> bool:
    """Two-sample chi-squared test of homogeneity over the columns of a 2 x C count table."""
    exp = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = ((table - exp) ** 2 / exp).sum()
    return stat < _chi2_critical(table.shape[1] - 1)


@pytest.mark.parametrize("draft_kind", ["model", "lookup"])
def test_rejection_sampling_keeps_the_target_distribution(draft_kind):
    """verify() against fixed target rows: the first emitted token follows p0, the second (when the first
    proposal was accepted) p1, whatever the draft's distribution q."""
    rng = np.random.default_rng(1)
    V, k, n = 12, 2, 20000
    p_logits = rng.standard_normal((k + 1, V)).astype(np.float32) * 1.5
    q = np.exp(rng.standard_normal((k, V)) * 1.5)
    q /= q.sum(1, keepdims=True)
    params = SamplingParams(temperature=1.0, max_tokens=100, seed=7)
    sampler = Sampler(params)
    draw = np.random.default_rng(2)

    class Seq:  # what verify reads
        prompt_ids, output_ids, guide = [1], [], None

    seq, first, second = Seq(), np.zeros(V), np.zeros(V)
    from edgeinfer.engine.speculative import SpecState

    for _ in range(n):
        seq.spec = SpecState(k, params)
        if draft_kind == "model":
            seq.spec.tokens = [int(draw.choice(V, p=q[j])) for j in range(k)]
            seq.spec.probs = [q[j] for j in range(k)]
        else:  # lookup: fixed proposals, one-hot q
            seq.spec.tokens, seq.spec.probs = [int(np.argmax(p_logits[0])), 5], [None, None]
        toks, guide_steps = verify(seq, p_logits.copy(), sampler)
        assert guide_steps is None and 1 <= len(toks) <= k + 1
        first[toks[0]] += 1
        if len(toks) > 1:
            second[toks[1]] += 1
    p = np.exp(p_logits.astype(np.float64))
    p /= p.sum(1, keepdims=True)
    assert _chi2_fits(first, p[0])
    assert second.sum() > 1000
    assert _chi2_fits(second, p[1])
    # the test has power: the draft's own distribution is rejected
    if draft_kind == "model":
        assert not _chi2_fits(first, q[0])


def test_sampled_output_distribution_matches_without_speculation(tiny_llama_path, draft_path):
    """End to end on the tiny model: the second and third output tokens (the first verified ones) over many
    seeds, with a draft whose distribution differs, against the same without speculation (a two-sample
    chi-squared test of homogeneity)."""
    cfg = EngineConfig(max_seqs=64, num_kv_blocks=512, block_size=4)
    prompt = "the hen sat"
    params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=s) for s in range(1500)]
    counts = []
    for kw in ({}, dict(draft=str(draft_path), draft_tokens=2)):
        llm = LLM(str(tiny_llama_path), engine_config=cfg, progress=False, **kw)
        outs = llm.generate([prompt] * len(params), params)
        counts.append([tuple(c.token_ids[:2]) for c in outs])
        if kw:
            assert llm.stats()["spec_accepted_tokens"] > 100
    for pos in (0, 1):
        cats = sorted({c[pos] for run in counts for c in run})
        table = np.array([[sum(1 for c in run if c[pos] == x) for x in cats] for run in counts])
        table = table[:, table.sum(0) >= 10]  # categories with enough mass to test
        assert table.shape[1] >= 4
        assert _homogeneous(table)


# -- bad setups --------------------------------------------------------------------------------------


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama_path, tiny_gemma3_path):
    with pytest.raises(SpeculationError, match="vocabulary"):
        LLM(str(tiny_llama_path), progress=False, draft=str(tiny_gemma3_path))


def test_bad_speculation_settings(tiny_llama_path, draft_path):
    with pytest.raises(SpeculationError, match="method"):
        Speculation("ngram")
    with pytest.raises(SpeculationError, match="draft tokens"):
        Speculation("lookup", num_tokens=99)
    with pytest.raises(SpeculationError, match="not both"):
        LLM(str(tiny_llama_path), progress=False, draft=str(draft_path), speculate="lookup")
    with pytest.raises(SpeculationError, match="needs a draft model"):
        LLM(str(tiny_llama_path), progress=False, speculate="draft")
    with pytest.raises(SpeculationError, match="draft_tokens needs"):
        LLM(str(tiny_llama_path), progress=False, draft_tokens=3)
    with pytest.raises(Exception, match="unknown model|not found|no such"):
        LLM(str(tiny_llama_path), progress=False, draft="no-such-model-xyz")

"""The engine and the Python API on tiny random models: batching, prefix caching, preemption, abort."""

import numpy as np
import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.engine.llm_engine import PromptTooLongError

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = ["the hen", "in a", "on then", "sat", "there was a", "hello", "abc def ghi", "x"]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def llm(request, tiny_llama_path, tiny_gemma3_path):
    path = tiny_llama_path if request.param == "llama" else tiny_gemma3_path
    return LLM(str(path), engine_config=EngineConfig(max_seqs=8, num_kv_blocks=64, block_size=4), progress=False)


def test_batch_equals_each_prompt_alone(llm):
    batched = llm.generate(PROMPTS, GREEDY)
    for prompt, got in zip(PROMPTS, batched):
        alone = llm.generate(prompt, GREEDY)[0]
        assert got.token_ids == alone.token_ids
        assert got.text == alone.text
    assert llm.stats()["kv_blocks_used"] == 0


def test_stream_concatenates_to_generate(llm):
    chunks = list(llm.stream("the hen", GREEDY))
    full = llm.generate("the hen", GREEDY)[0]
    assert "".join(c.text for c in chunks) == full.text
    assert sum((c.token_ids for c in chunks), []) == full.token_ids
    assert chunks[-1].finish_reason == "length"


def test_stream_chunks_carry_the_prompt_and_the_running_output_count(llm):
    chunks = list(llm.stream("the hen", GREEDY))
    assert all(c.prompt_token_ids == llm.tokenize("the hen", add_bos=None) for c in chunks)
    assert [c.num_output_tokens for c in chunks] == list(np.cumsum([len(c.token_ids) for c in chunks]))
    assert chunks[-1].num_output_tokens == GREEDY.max_tokens


def test_a_run_left_early_aborts_its_requests_and_frees_their_blocks(llm):
    eng = llm.engine
    with eng.run() as run:
        rids = [run.submit(llm.tokenize(p), GREEDY) for p in PROMPTS[:3]]
        assert run.pending == set(rids)
        first = next(iter(run))
        assert first.request_id in rids and eng.stats()["kv_blocks_used"] > 0
    assert not eng.has_unfinished() and eng.stats()["kv_blocks_used"] == 0 and run.pending == set()
    # another caller's request in the same engine is not this run's: it runs on, unseen by the run
    other = eng.add_request(llm.tokenize("sat"), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    with eng.run() as run:
        run.submit(llm.tokenize("x"), GREEDY)
        seen = {o.request_id for o in run}
    assert other not in seen and eng.has_unfinished()
    while eng.has_unfinished():
        eng.step()


def test_prefix_cache_hit_skips_prefill(llm):
    prompt = list(range(5, 5 + 33))  # 8 full blocks of 4 and one token
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    before = llm.engine.runner.num_forward_tokens
    first = llm.generate(prompt, params)[0]
    computed_first = llm.engine.runner.num_forward_tokens - before
    before = llm.engine.runner.num_forward_tokens
    second = llm.generate(prompt, params)[0]
    computed_second = llm.engine.runner.num_forward_tokens - before
    assert second.token_ids == first.token_ids
    assert computed_first == 33 + 2
    assert computed_second == 1 + 2  # 32 prompt tokens came from the cache


def test_preemption_under_a_tiny_pool_gives_identical_output(tiny_llama_path):
    roomy = LLM(str(tiny_llama_path), engine_config=EngineConfig(num_kv_blocks=64, block_size=4), progress=False)
    tight = LLM(str(tiny_llama_path), engine_config=EngineConfig(num_kv_blocks=10, block_size=4, max_seqs=8),
                progress=False)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = PROMPTS[:5]
    want = [c.token_ids for c in roomy.generate(prompts, params)]
    got = [c.token_ids for c in tight.generate(prompts, params)]
    assert got == want
    assert tight.stats()["preemptions"] > 0
    assert tight.stats()["kv_blocks_used"] == 0


def _cached_tokens(eng, requests) -> dict:
    """Step the engine through requests [(prompt ids, params, n)]: each (request, choice)'s num_cached_tokens,
    as the set of the values its outputs carried."""
    rids = [eng.add_request(p, params, n=n) for p, params, n in requests]
    seen: dict = {}
    while eng.has_unfinished():
        for o in eng.step():
            seen.setdefault((rids.index(o.request_id), o.index), set()).add(o.num_cached_tokens)
    return seen


def test_cached_tokens_are_the_first_choice_s_and_its_first_admission_s(tiny_llama_path):
    """num_cached_tokens (usage.prompt_tokens_details.cached_tokens): a request of n choices reports choice 0's
    hit (the others share its blocks once computed, a hit of their own), and a sequence preempted and admitted
    again keeps what its first admission found (its own blocks, found again, are not a cache's saving)."""
    llm = LLM(str(tiny_llama_path), engine_config=EngineConfig(max_seqs=8, num_kv_blocks=64, block_size=4),
              progress=False)
    prompt = list(range(5, 5 + 33))  # 8 full blocks of 4 and one token
    params = SamplingParams(temperature=0.8, max_tokens=4, ignore_eos=True, seed=1)
    first = _cached_tokens(llm.engine, [(prompt, params, 3)])
    assert first[(0, 0)] == {0} and first[(0, 1)] == first[(0, 2)] == {32}
    again = _cached_tokens(llm.engine, [(prompt, params, 3)])
    assert again[(0, 0)] == {32}

    tight = LLM(str(tiny_llama_path), engine_config=EngineConfig(num_kv_blocks=10, block_size=4, max_seqs=8),
                progress=False)
    prompts = [list(range(5 + 10 * i, 14 + 10 * i)) for i in range(5)]  # no block in common
    seen = _cached_tokens(tight.engine, [(p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), 1)
                                         for p in prompts])
    assert tight.stats()["preemptions"] > 0
    assert all(v == {0} for v in seen.values()) and len(seen) == 5


def test_abort_mid_generation_frees_every_block(llm):
    eng = llm.engine
    rid = eng.add_request(llm.tokenize("the hen"), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    other = eng.add_request(llm.tokenize("in a"), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(5):
        eng.step()
    assert eng.block_manager.num_used > 0
    eng.abort(rid)
    eng.abort(other)
    outs = eng.step()
    assert {o.request_id for o in outs if o.finish_reason == "abort"} == {rid, other}
    assert eng.block_manager.num_used == 0 and not eng.has_unfinished()


def test_breaking_out_of_a_stream_frees_the_request(llm):
    for i, _ in enumerate(llm.stream("the hen", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))):
        if i == 2:
            break
    assert llm.stats()["kv_blocks_used"] == 0 and not llm.engine.has_unfinished()


def test_stop_strings_are_not_emitted(llm):
    full = llm.generate("the hen", GREEDY)[0].text
    assert len(full) > 4
    stop = full[3:5]
    cut = llm.generate("the hen", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]
    streamed = "".join(c.text for c in llm.stream("the hen", SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, stop=[stop])))
    assert streamed == cut.text


def test_max_tokens_and_length_reason(llm):
    c = llm.generate("the", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert len(c.token_ids) == 5 and c.finish_reason == "length"


def test_same_seed_same_text(llm):
    p = SamplingParams(temperature=1.0, max_tokens=10, seed=7, ignore_eos=True)
    a, b = llm.generate(["the", "the"], p)
    assert a.token_ids == b.token_ids == llm.generate("the", p)[0].token_ids


def test_prompt_longer_than_context_states_both_lengths(tiny_llama_path):
    small = LLM(str(tiny_llama_path), engine_config=EngineConfig(max_context=32, num_kv_blocks=16, block_size=4),
                progress=False)
    with pytest.raises(PromptTooLongError, match="the prompt has 40 tokens but the context holds 32"):
        small.generate(list(range(3, 43)), GREEDY)
    assert small.stats()["kv_blocks_used"] == 0


def test_generation_stops_at_the_context_end(tiny_llama_path):
    small = LLM(str(tiny_llama_path), engine_config=EngineConfig(max_context=16, num_kv_blocks=16, block_size=4),
                progress=False)
    c = small.generate(list(range(3, 13)), SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert c.finish_reason == "length" and len(c.prompt_token_ids) + len(c.token_ids) == 16


def test_bad_prompts(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([10**9], GREEDY)
    with pytest.raises(TypeError):
        llm.generate(3.5, GREEDY)


def test_logprobs(llm):
    c = llm.generate("the", SamplingParams(temperature=0, max_tokens=3, logprobs=2, ignore_eos=True))[0]
    assert len(c.logprobs) == 3
    for tid, lp in zip(c.token_ids, c.logprobs):
        assert lp["token_id"] == tid and lp["top"][0][0] == tid  # greedy: the chosen token is the best
        assert lp["logprob"] <= 0 and len(lp["top"]) == 2


def test_chat_uses_the_template(llm):
    ids = llm.render_chat([{"role": "user", "content": "hi"}])
    text = llm.tokenizer.decode(ids, special=True)
    assert "hi" in text and ("<|im_start|>assistant" in text or "<start_of_turn>model" in text)
    c = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=4))
    assert c.prompt_token_ids == ids


def test_perplexity_is_exp_mean_nll(llm):
    text = " ".join(["the hen sat on the thin line"] * 40)
    r = llm.perplexity_details(text, n_ctx=64, chunks=2)
    assert r["n_scored"] == 2 * 31 and r["ppl"] > 1 and np.isfinite(r["ppl"])
    # each chunk's mean (the chunks score as many tokens each): the perplexity is the exponent of their mean
    assert len(r["chunk_nll"]) == 2 and r["chunk_nll"][0] != r["chunk_nll"][1]
    assert np.exp(np.mean(r["chunk_nll"])) == pytest.approx(r["ppl"], rel=1e-12)


def test_float32_and_float16_kv_caches(tiny_llama_path):
    outs = {}
    for dtype in ("f32", "f16"):
        llm = LLM(str(tiny_llama_path), engine_config=EngineConfig(num_kv_blocks=32, block_size=4, kv_dtype=dtype),
                  progress=False)
        assert llm.engine.cache.k.dtype == (np.float32 if dtype == "f32" else np.uint16)
        outs[dtype] = llm.generate("the hen", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len(outs["f16"].token_ids) == len(outs["f32"].token_ids) == 8


def test_engine_config_validation():
    for kwargs, fragment in [({"kv_dtype": "f8"}, "KV type 'f8' is not one of"), ({"block_size": 0}, "block_size"),
                             ({"threads": -1}, "threads"), ({"kv_cache_mb": -1}, "kv_cache_mb"),
                             ({"backend": "tpu"}, "backend")]:
        with pytest.raises(ValueError, match=fragment):
            EngineConfig(**kwargs)
    assert EngineConfig().seqs_limit >= 8


def test_engine_loop_serves_requests_from_several_threads(tiny_llama_path):
    import queue
    import threading

    from edgeinfer.engine.loop import EngineLoop

    llm = LLM(str(tiny_llama_path), engine_config=EngineConfig(num_kv_blocks=64, block_size=4), progress=False)
    want = {p: llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS[:4]}
    loop = EngineLoop(llm.engine).start()
    results = {}

    def client(prompt):
        q = queue.Queue()
        loop.submit(llm.tokenize(prompt), GREEDY, q.put)
        ids = []
        while True:
            out = q.get(timeout=30)
            ids += out.new_token_ids
            if out.finished:
                results[prompt] = ids
                return

    threads = [threading.Thread(target=client, args=(p,)) for p in PROMPTS[:4]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == want
    # abort from another thread frees the blocks within a step
    q = queue.Queue()
    rid = loop.submit(llm.tokenize("the hen"), SamplingParams(max_tokens=200, ignore_eos=True), q.put)
    q.get(timeout=30)
    loop.abort(rid)
    while not (out := q.get(timeout=30)).finished:
        pass
    assert out.finish_reason == "abort"
    assert llm.engine.block_manager.num_used == 0
    with pytest.raises(ValueError, match="empty"):
        loop.submit([], GREEDY, q.put)
    assert loop.num_active == 0
    loop.stop()

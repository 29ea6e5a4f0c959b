"""OpenAI's `n`: n choices for one prompt on /v1/completions and /v1/chat/completions, streamed and not,
and in batch files. Each choice is sampled on its own (with a seed: reproducibly, and differently from
the others), the n sequences share the prompt's KV blocks through the prefix cache, usage counts every
choice's tokens, a stream gives each choice its own finish chunk and ends once with [DONE].

The server runs in this process (Starlette's TestClient, driven by the openai client) on a tiny random
model, as tests/test_openai_fields.py does."""

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from test_openai_fields import serve  # noqa: E402

from edgeinfer.engine.choices import choice_seed  # noqa: E402
from edgeinfer.openai.schemas import MAX_N  # noqa: E402

# longer than two KV blocks (16 tokens) in the tiny model's byte-level vocabulary
PROMPT = "the hen sat on the mat and the dog ran off"
N = 8  # tokens per choice: ignore_eos makes every choice this long
MODES = [("completions", False), ("completions", True), ("chat", False), ("chat", True)]
# +100 on the letters (the tiny vocabulary: 3 specials, then the 256 bytes): sampled text is readable, so
# choices that differ in tokens differ in text (random bytes would all decode to U+FFFD)
LETTERS = {str(3 + ord(c)): 100 for c in "abcdefghijklmnopqrstuvwxyz"}


@pytest.fixture(scope="module")
def api(tiny_llama_path):
    yield from serve(str(tiny_llama_path), 120)


def create(client, endpoint: str, stream: bool, prompt: str = PROMPT, **kw):
    kw.setdefault("max_tokens", N)
    extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
    if endpoint == "chat":
        return client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": prompt}],
                                              stream=stream, extra_body=extra, **kw)
    return client.completions.create(model="tiny-llama", prompt=prompt, stream=stream, extra_body=extra, **kw)


def texts(client, endpoint: str, stream: bool, **kw) -> list[str]:
    """Each choice's text, in index order (a stream's deltas joined per index)."""
    r = create(client, endpoint, stream, **kw)
    if not stream:
        assert [c.index for c in r.choices] == list(range(len(r.choices)))
        return [c.message.content if endpoint == "chat" else c.text for c in r.choices]
    out: dict[int, str] = {}
    for ch in r:
        for c in ch.choices:
            piece = (c.delta.content or "") if endpoint == "chat" else c.text
            out[c.index] = out.get(c.index, "") + piece
    return [out[i] for i in sorted(out)]


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_n_gives_n_choices_reproducible_with_a_seed_and_different(api, endpoint, stream):
    kw = dict(temperature=2.0, max_tokens=16, extra_body={"logit_bias": LETTERS})
    a = texts(api, endpoint, stream, n=3, seed=11, **kw)
    assert len(a) == 3 and len(set(a)) == 3 and all(len(t) == 16 for t in a), a  # each sampled on its own
    assert texts(api, endpoint, stream, n=3, seed=11, **kw) == a  # the whole response again
    # choice 0 keeps the request's seed: the n=1 answer
    assert texts(api, endpoint, stream, n=1, seed=11, **kw) == a[:1]
    # without a seed: fresh entropy per choice (the tiny model is peaked, so two of 16 letters may agree
    # by chance now and then; all three, or the seeded triple, practically never)
    unseeded = texts(api, endpoint, stream, n=3, **kw)
    assert len(set(unseeded)) >= 2 and unseeded != a, unseeded


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_n_at_temperature_0_is_n_times_the_greedy_answer(api, endpoint, stream):
    greedy = texts(api, endpoint, stream, temperature=0)
    assert len(greedy) == 1 and greedy[0]
    assert texts(api, endpoint, stream, n=4, temperature=0) == greedy * 4


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streamed_choices_finish_each_and_usage_counts_them_all(api, endpoint):
    """Every chunk names its choice; each choice gets one finish_reason chunk; the usage chunk counts
    all choices' tokens; [DONE] comes once, last. Raw server-sent events, as a client sees them."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    body = {"model": "tiny-llama", "n": 3, "max_tokens": N, "ignore_eos": True, "temperature": 1.0, "seed": 2,
            "stream": True, "stream_options": {"include_usage": True}}
    body.update({"messages": [{"role": "user", "content": PROMPT}]} if endpoint == "chat" else {"prompt": PROMPT})
    with api.http.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3 * N
    finishes = [c["index"] for ch in chunks[:-1] for c in ch["choices"] if c["finish_reason"] is not None]
    assert sorted(finishes) == [0, 1, 2]
    assert {c["index"] for ch in chunks[:-1] for c in ch["choices"]} == {0, 1, 2}
    assert all(len(ch["choices"]) == 1 for ch in chunks[:-1])
    if endpoint == "chat":  # each choice's first chunk carries the role
        roles = [c["index"] for ch in chunks for c in ch["choices"] if c["delta"].get("role") == "assistant"]
        assert sorted(roles) == [0, 1, 2]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_usage_and_logprobs_per_choice(api, endpoint):
    lp = {"logprobs": True} if endpoint == "chat" else {"logprobs": 0}
    r = create(api, endpoint, False, n=3, temperature=1.0, seed=4, **lp)
    assert r.usage.completion_tokens == 3 * N and r.usage.total_tokens == r.usage.prompt_tokens + 3 * N
    one = create(api, endpoint, False, n=1, temperature=1.0, seed=4)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once
    for c in r.choices:
        assert c.finish_reason == "length"
        assert len(c.logprobs.content if endpoint == "chat" else c.logprobs.tokens) == N


def test_n_choices_share_the_prompts_kv_blocks(api, tiny_llama_path):
    """The first choice prefills the prompt; the others find its full blocks in the prefix cache."""
    engine = api.http.app.state.server.served["tiny-llama"].llm.engine
    prompt = "a fresh prompt, never sent before, of some forty tokens or so"  # 2 full blocks at least
    full_blocks = len(engine.tokenizer.encode(prompt, None, False)) // engine.block_manager.block_size
    assert full_blocks >= 2
    before = engine.stats()
    create(api, "completions", False, prompt=prompt, n=4, temperature=1.0, seed=1)
    after = engine.stats()
    assert after["prefix_cache_queries"] - before["prefix_cache_queries"] == 4 * full_blocks
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 3 * full_blocks
    metrics = api.http.get("/metrics").text  # and /metrics shows it
    assert f'edgeinfer_prefix_cache_hits_total{{model="tiny-llama"}} {float(after["prefix_cache_hits"])}' in metrics


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_each_choice_follows_its_own_constraint(api, endpoint, stream):
    """One grammar matcher per choice: each is constrained on its own (a shared one would be advanced by
    every choice's tokens and refuse them)."""
    out = texts(api, endpoint, stream, n=5, temperature=1.5, seed=9, max_tokens=12,
                extra_body={"ignore_eos": False, "guided_regex": "(yes|no|maybe)!"})
    assert len(out) == 5 and set(out) <= {"yes!", "no!", "maybe!"}, out


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_n_over_the_limit_is_a_400_naming_n(api, endpoint, stream):
    with pytest.raises(openai.BadRequestError) as e:
        create(api, endpoint, stream, n=MAX_N + 1)
    err = e.value.response.json()["error"]
    assert err["param"] == "n" and f"between 1 and {MAX_N}" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        create(api, endpoint, stream, n=2, extra_body={"best_of": 3})
    assert e.value.response.json()["error"]["param"] == "best_of"


def test_choice_seeds_are_the_request_seed_then_derived():
    assert choice_seed(None, 3) is None and choice_seed(7, 0) == 7
    seeds = [choice_seed(7, i) for i in range(MAX_N)]
    assert len(set(seeds)) == MAX_N and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [choice_seed(7, i) for i in range(MAX_N)] and choice_seed(8, 1) != seeds[1]


def test_a_batch_line_with_n_answers_n_choices(api, tiny_llama_path, tmp_path):
    """Batch jobs read n as the server does: the same choices for the same seed."""
    from edgeinfer import LLM
    from edgeinfer.batch import run_batch
    from edgeinfer.engine.loop import exclusive

    body = {"prompt": PROMPT, "n": 3, "max_tokens": N, "ignore_eos": True, "temperature": 1.0, "seed": 11}
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}) + "\n"
                   + json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions",
                                 "body": {**body, "n": MAX_N + 1}}) + "\n")
    summary = exclusive(run_batch, exclusive(LLM, str(tiny_llama_path), progress=False), src, out, progress=False)
    assert summary.succeeded == 1 and summary.failed == 1 and summary.completion_tokens == 3 * N
    lines = {rec["custom_id"]: rec for rec in map(json.loads, out.read_text().splitlines())}
    choices = lines["a"]["response"]["body"]["choices"]
    assert [c["text"] for c in choices] == texts(api, "completions", False, n=3, temperature=1.0, seed=11)
    assert lines["b"]["response"]["status_code"] == 400 and lines["b"]["error"]["message"].startswith("'n'")


def test_a_client_gone_aborts_every_choice(api):
    """A stream closed after its first chunk: all n choices are aborted and their KV blocks freed, the
    choices not yet submitted too."""
    import time

    engine = api.http.app.state.server.served["tiny-llama"].llm.engine
    body = {"model": "tiny-llama", "prompt": PROMPT, "n": 4, "max_tokens": 200, "ignore_eos": True, "stream": True}
    before = engine.stats()["computed_tokens"]
    with api.http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
    t0 = time.monotonic()
    while (engine.stats()["running"] or engine.stats()["kv_blocks_used"]) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_used"] == 0, stats
    assert stats["computed_tokens"] - before < 4 * 200 / 2  # stopped early, not run to the end

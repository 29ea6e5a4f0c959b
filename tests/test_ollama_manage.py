"""Ollama's model management on `edgeinfer serve`, through the official `ollama` client against a server
process with its own model cache: create (system, parameters, messages, template, quantize), copy, delete,
list and show, the manifests on disk (no weights copied), and `edgeinfer list`; what may not be created
over or deleted, and a damaged manifest."""

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

ollama = pytest.importorskip("ollama")

from test_server import Server  # noqa: E402

GREEDY = {"temperature": 0, "num_predict": 8}
CHATML_SYSTEM_FIRST = (  # a Jinja template that puts a marker first, so its use shows in the prompt
    "{{ 'MARK ' }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny_llama_path):
    """A model cache holding one downloaded model (tiny-base) and a --models-dir with one file (tiny-dir)."""
    root = tmp_path_factory.mktemp("manage")
    (root / "home" / "models").mkdir(parents=True)
    shutil.copy(tiny_llama_path, root / "home" / "models" / "tiny-base.gguf")
    (root / "dir").mkdir()
    shutil.copy(tiny_llama_path, root / "dir" / "tiny-dir.gguf")
    return root


@pytest.fixture(scope="module")
def server(home, tiny_llama_path):
    s = Server(tiny_llama_path, "--models-dir", home / "dir", env={"EDGEINFER_HOME": str(home / "home")}).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base)


def names(client):
    return {m.model.removesuffix(":latest") for m in client.list().models}


def chat(client, model, text="hello", **options):
    r = client.chat(model=model, messages=[{"role": "user", "content": text}], options={**GREEDY, **options})
    return r.message.content, r.prompt_eval_count, r.eval_count


def test_create_with_defaults_applies_them(client, home):
    """A created model answers as its base does with the same system message and options given by hand;
    its manifest is a small file over the base's weights."""
    events = list(client.create(model="helper", from_="tiny-base", system="You are terse.",
                                parameters={"temperature": 0, "num_predict": 5}, stream=True))
    assert events[-1].status == "success" and any(e.status == "writing manifest" for e in events)
    manifest = home / "home" / "models" / "created" / "helper.json"
    assert manifest.is_file() and manifest.stat().st_size < 4096
    assert json.loads(manifest.read_text())["file"].endswith("tiny-base.gguf")
    assert not (home / "home" / "models" / "created" / "helper.gguf").exists()  # no weights copied
    assert "helper" in names(client)
    mine = client.chat(model="helper", messages=[{"role": "user", "content": "hello"}])
    theirs = client.chat(model="tiny-base", messages=[{"role": "system", "content": "You are terse."},
                                                      {"role": "user", "content": "hello"}],
                         options={"temperature": 0, "num_predict": 5})
    assert mine.message.content == theirs.message.content and mine.eval_count == 5
    assert mine.prompt_eval_count == theirs.prompt_eval_count
    # a request's own values win over the model's
    assert client.generate(model="helper", prompt="x", options={"num_predict": 2}).eval_count == 2
    # the OpenAI route applies them too
    r = httpx.post(f"{client._client.base_url}/v1/chat/completions", timeout=60,
                   json={"model": "helper", "messages": [{"role": "user", "content": "hello"}]}).json()
    assert r["choices"][0]["message"]["content"] == theirs.message.content
    # and Anthropic's and the Responses API
    base = str(client._client.base_url)
    msg = httpx.post(base + "/v1/messages", timeout=60, json={"model": "helper", "max_tokens": 5,
                     "messages": [{"role": "user", "content": "hello"}]}).json()
    assert msg["content"][0]["text"] == theirs.message.content  # (max_tokens is required here: its own)
    resp = httpx.post(base + "/v1/responses", timeout=60, json={"model": "helper", "input": "hello"}).json()
    assert resp["output"][0]["content"][0]["text"] == theirs.message.content
    show = client.show("helper")
    assert 'SYSTEM """You are terse."""' in show.modelfile and "temperature" in show.parameters
    assert httpx.post(f"{client._client.base_url}/api/show", json={"model": "helper"}).json()["system"] == "You are terse."
    assert show.details.parent_model == "tiny-base"


def test_create_messages_and_template(client):
    client.create(model="primed", from_="tiny-base", messages=[{"role": "user", "content": "hi"},
                                                                {"role": "assistant", "content": "hello"}],
                  template=CHATML_SYSTEM_FIRST)
    _, n_primed, _ = chat(client, "primed", "x")
    _, n_base, _ = chat(client, "tiny-base", "x")
    assert n_primed > n_base  # the messages and the marker went into the prompt
    assert client.show("primed").template == CHATML_SYSTEM_FIRST
    # a created model made from a created model inherits its defaults
    client.create(model="primed2", from_="primed", system="sys")
    _, n2, _ = chat(client, "primed2", "x")
    assert n2 > n_primed


def test_copy_then_delete(client, server, home):
    client.copy("helper", "helper-copy")
    assert {"helper", "helper-copy"} <= names(client)
    a, _, _ = chat(client, "helper-copy")
    b, _, _ = chat(client, "helper")
    assert a == b
    client.delete("helper-copy")
    assert "helper-copy" not in names(client)
    assert not (home / "home" / "models" / "created" / "helper-copy.json").exists()
    assert (home / "home" / "models" / "tiny-base.gguf").is_file()  # the base stays
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("helper-copy")
    assert e.value.status_code == 404


def test_quantize_writes_its_own_file(client, home):
    events = list(client.create(model="small", from_="tiny-base", quantize="q4_0", stream=True))
    assert events[-1].status == "success" and any("quantizing" in e.status for e in events)
    own = home / "home" / "models" / "created" / "small.gguf"
    assert own.is_file() and own.stat().st_size < (home / "home" / "models" / "tiny-base.gguf").stat().st_size
    assert client.show("small").details.quantization_level == "Q4_0"
    assert chat(client, "small")[2] >= 1
    client.delete("small")
    assert not own.exists()


def test_what_may_not_be_created_over_or_deleted(server, client, home):
    bad = [("/api/create", {"model": "tiny-llama", "from": "tiny-base"}, 400, "model"),
           ("/api/create", {"model": "tiny-base", "from": "tiny-base"}, 400, "model"),
           ("/api/create", {"model": "x", "from": "no-such-model"}, 404, None),
           ("/api/create", {"model": "x"}, 400, "from"),
           ("/api/create", {"model": "../x", "from": "tiny-base"}, 400, "model"),
           ("/api/create", {"model": "x", "from": "tiny-base", "parameters": {"temprature": 1}}, 400, "temprature"),
           ("/api/create", {"model": "x", "from": "tiny-base", "template": "{{ .Prompt }}"}, 400, "Go template"),
           ("/api/create", {"model": "x", "from": "tiny-base", "template": "{% if %}"}, 400, "template"),
           ("/api/create", {"model": "x", "from": "tiny-base", "quantize": "q9_9"}, 400, "quantize"),
           ("/api/create", {"model": "x", "from": "tiny-base", "adapters": {"a": "sha256:00"}}, 400, "adapters"),
           ("/api/create", {"model": "x", "from": "tiny-base", "surprise": 1}, 400, "surprise"),
           ("/api/copy", {"source": "tiny-base", "destination": "tiny-llama"}, 400, "model"),
           ("/api/copy", {"source": "nope", "destination": "y"}, 404, None)]
    for route, body, status, word in bad:
        r = httpx.post(server.base + route, json=body, timeout=30)
        assert r.status_code == status and list(r.json()) == ["error"], (route, body, r.text)
        assert word is None or word in r.json()["error"], (body, r.text)
    assert not (home / "home" / "models" / "created" / "x.json").exists()
    for name, status in [("tiny-llama", 400), ("tiny-dir", 403), ("nope", 404)]:
        r = httpx.request("DELETE", server.base + "/api/delete", json={"model": name}, timeout=30)
        assert r.status_code == status, (name, r.text)
    assert (home / "dir" / "tiny-dir.gguf").is_file()
    # a base with created models over it is not deleted from under them
    client.create(model="over-base", from_="tiny-base")
    r = httpx.request("DELETE", server.base + "/api/delete", json={"model": "tiny-base"}, timeout=30)
    assert r.status_code == 400 and "over-base" in r.json()["error"]
    client.delete("over-base")


def test_a_damaged_manifest_is_named_and_can_be_deleted(server, client, home):
    path = home / "home" / "models" / "created" / "broken.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"name": "broken", "base": ')
    r = httpx.post(server.base + "/api/chat", json={"model": "broken", "messages": []}, timeout=30)
    assert r.status_code == 500 and "broken.json" in r.json()["error"] and "not JSON" in r.json()["error"]
    assert "broken" not in names(client)  # /api/tags leaves it out, and answers
    client.delete("broken")
    assert not path.exists()


def test_keep_alive_zero_then_ps(client):
    chat(client, "tiny-base")
    assert "tiny-base" in {m.model.removesuffix(":latest") for m in client.ps().models}
    client.generate(model="tiny-base", prompt="", keep_alive=0)
    for _ in range(50):
        if "tiny-base" not in {m.model.removesuffix(":latest") for m in client.ps().models}:
            break
        import time
        time.sleep(0.1)
    assert "tiny-base" not in {m.model.removesuffix(":latest") for m in client.ps().models}


def test_edgeinfer_list_shows_created_models(client, home):
    client.create(model="listed", from_="tiny-base", system="s")
    env = {**os.environ, "EDGEINFER_HOME": str(home / "home")}
    out = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "list", "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["created"]}
    assert rows["listed"]["from"] == "tiny-base" and rows["listed"]["path"].endswith("tiny-base.gguf")
    text = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "list"], capture_output=True, text=True,
                          env=env, timeout=120).stdout
    assert "listed" in text and "tiny-base" in text


def test_the_documented_quantize_types_are_quantize_models():
    from edgeinfer.openai import schemas
    from edgeinfer.quant import mixes

    assert set(schemas._QUANTS) == set(mixes.TYPES)


def test_review_findings_on_created_models(server, client, home):
    """Parameters no request could carry are refused at create; Ollama's seed -1 is no seed; system messages
    become the model's system; a quantized model can be quantized again from itself; a model over another's
    quantized file keeps that file from going; a created model whose base file is gone is still deleted."""
    for params, field in [({"temperature": 3}, "parameters.temperature"), ({"stop": list("abcde")}, "parameters.stop"),
                          ({"top_p": 1.5}, "parameters.top_p")]:
        r = httpx.post(server.base + "/api/create", json={"model": "x", "from": "tiny-base", "parameters": params})
        assert r.status_code == 400 and field in r.json()["error"], r.text
    client.create(model="seeded", from_="tiny-base", parameters={"seed": -1, "num_predict": 3},
                  messages=[{"role": "system", "content": "Be brief."}])
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60,
                   json={"model": "seeded", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert httpx.post(server.base + "/api/show", json={"model": "seeded"}).json()["system"] == "Be brief."
    created_dir = home / "home" / "models" / "created"
    client.create(model="q", from_="tiny-base", quantize="q8_0")
    client.create(model="q", from_="q", quantize="q4_0")  # from itself: its file replaced, not a 500
    assert client.show("q").details.quantization_level == "Q4_0"
    client.copy("q", "q-copy")  # over q's own file
    r = httpx.request("DELETE", server.base + "/api/delete", json={"model": "q"})
    assert r.status_code == 400 and "q-copy" in r.json()["error"]
    r = httpx.post(server.base + "/api/create", json={"model": "q", "from": "tiny-base", "stream": False})
    assert r.status_code == 400 and "q-copy" in r.json()["error"]
    client.delete("q-copy")
    client.create(model="q", from_="tiny-base")  # no longer quantized: its old file goes
    assert not (created_dir / "q.gguf").exists()
    client.delete("q")
    # a base that went away: the created model over it can still be deleted
    shutil.copy(home / "home" / "models" / "tiny-base.gguf", home / "dir" / "gone.gguf")
    client.create(model="orphan", from_="gone")
    (home / "dir" / "gone.gguf").unlink()
    r = httpx.post(server.base + "/api/chat", json={"model": "orphan", "messages": []})
    assert r.status_code == 404 and "is gone" in r.json()["error"]
    client.delete("orphan")
    assert not (created_dir / "orphan.json").exists()


def test_defaults_reach_a_continued_response_once():
    from edgeinfer.openai.ollama_create import with_defaults
    from edgeinfer.registry.created import Created

    c = Created("m", "b", "/x.gguf", system="S", messages=[{"role": "user", "content": "hi"},
                                                            {"role": "assistant", "content": "hello"}])
    first = with_defaults(c, {"model": "m", "input": "q"}, "responses")
    assert first["instructions"] == "S" and len(first["input"]) == 3
    later = with_defaults(c, {"model": "m", "input": "q2", "previous_response_id": "resp_1"}, "responses")
    assert later["input"] == "q2"  # the stored conversation holds them already


def test_create_with_an_uploaded_adapter_and_from_an_uploaded_model(client, server, home, tiny_llama_path, tmp_path):
    """Blobs as the ollama client uploads them (HEAD, then POST /api/blobs/sha256:HEX), named by a create: a LoRA
    adapter over a model this server has (the created model answers with it: not as its base), and a GGUF model
    in `files`. An upload whose bytes are not its digest, a blob not uploaded and an adapter that does not fit
    are 400s naming the problem, and keep nothing."""
    from gguf.constants import GGMLQuantizationType as T
    from lora_zoo import write_random_adapter

    ad = tmp_path / "style.gguf"
    write_random_adapter(str(tiny_llama_path), str(ad), 4, 8.0, T.F16, ("attn_q", "attn_v", "ffn_down"), 7, 2.0)
    base = server.base
    digest = client.create_blob(ad)
    blob = home / "home" / "models" / "blobs" / digest.replace(":", "-")
    assert blob.read_bytes() == ad.read_bytes()
    assert httpx.head(f"{base}/api/blobs/{digest}").status_code == 200
    events = list(client.create(model="styled", from_="tiny-base", adapters={"style.gguf": digest}, stream=True))
    assert events[-1].status == "success"
    manifest = json.loads((home / "home" / "models" / "created" / "styled.json").read_text())
    assert manifest["adapters"] == [str(blob)]
    assert f"ADAPTER {blob}" in client.show("styled").modelfile
    styled, plain = chat(client, "styled")[0], chat(client, "tiny-base")[0]
    assert styled != plain and chat(client, "styled")[0] == styled

    model_digest = client.create_blob(tiny_llama_path)
    events = list(client.create(model="uploaded", files={"tiny.gguf": model_digest}, stream=True))
    assert events[-1].status == "success" and chat(client, "uploaded")[0] == plain
    # an adapter its parent has, named again, is not loaded twice
    events = list(client.create(model="styled2", from_="styled", adapters={"again.gguf": digest}, stream=True))
    assert events[-1].status == "success" and chat(client, "styled2")[0] == styled

    wrong = "sha256:" + "0" * 64
    r = httpx.post(f"{base}/api/blobs/{wrong}", content=b"not those bytes")
    assert r.status_code == 400 and "nothing was kept" in r.json()["error"]
    assert httpx.head(f"{base}/api/blobs/{wrong}").status_code == 404
    assert not list((home / "home" / "models" / "blobs").glob(".*partial"))
    r = httpx.post(f"{base}/api/blobs/sha256:xyz", content=b"x")
    assert r.status_code == 400 and "not a blob digest" in r.json()["error"]
    r = httpx.post(f"{base}/api/create", json={"model": "nope", "from": "tiny-base", "adapters": {"a.gguf": wrong}})
    assert r.status_code == 400 and f"upload it first (POST /api/blobs/{wrong})" in r.json()["error"]
    r = httpx.post(f"{base}/api/create", json={"model": "nope", "from": "tiny-base",
                                              "adapters": {"a.gguf": model_digest}})
    assert r.status_code == 400 and "is not an adapter" in r.json()["error"], r.json()
    r = httpx.post(f"{base}/api/create", json={"model": "nope", "files": {"a.gguf": digest}})
    assert r.status_code == 400 and "is a LoRA adapter" in r.json()["error"]
    (tmp_path / "junk.gguf").write_bytes(b"GGUF but not a GGUF file")
    junk = client.create_blob(tmp_path / "junk.gguf")
    for body in ({"files": {"a.gguf": junk}}, {"from": "tiny-base", "adapters": {"a.gguf": junk}}):
        r = httpx.post(f"{base}/api/create", json={"model": "nope", **body})
        assert r.status_code == 400, r.text
    assert not (home / "home" / "models" / "created" / "nope.json").exists()

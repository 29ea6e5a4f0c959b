"""LoRA adapters on the surfaces: `serve --lora NAME=FILE` (an adapter as a model id of its own, llama.cpp's
per-request "lora" field, GET/POST /lora-adapters, /v1/models), `generate --lora`, and the one-line errors of an
adapter that does not fit, on the arch zoo's llama3 with tests/lora_zoo.py's adapters."""

import json

import httpx
import pytest
from click.testing import CliRunner
from test_server import Server

from edgeinfer import LLM, SamplingParams
from edgeinfer.cli.main import main
from lora_zoo import write_adapter

PROMPT = list(range(20, 52))
N = 8


@pytest.fixture(scope="module")
def files(zoo, tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_api")
    base = zoo("llama3")
    out = {"base": str(base)}
    for name, to in (("llama3_all", "all"), ("llama3_f16", "f16"), ("phi3_fused", "phi3")):
        out[to] = str(d / f"{to}.gguf")
        write_adapter(name, zoo("phi3") if to == "phi3" else base, out[to])
    return out


@pytest.fixture(scope="module")
def server(files):
    s = Server(files["base"], "--lora", f"tuned={files['all']}", "--lora-scaled", files["f16"], "0").wait_ready(180)
    yield s
    s.stop()


def _ids(files, lora):
    llm = LLM(files["base"], progress=False, lora=lora)
    return llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))[0].text


def _complete(server, model, **kw):
    body = {"model": model, "prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True, **kw}
    return httpx.post(server.base + "/v1/completions", json=body, timeout=120)


def test_an_adapter_is_a_model_id_and_requests_choose_their_own(server, files):
    models = httpx.get(server.base + "/v1/models", timeout=10).json()["data"]
    assert {"id": "tuned", "parent": "llama3"}.items() <= next(m for m in models if m["id"] == "tuned").items()
    base, tuned = _complete(server, "llama3"), _complete(server, "tuned")
    assert base.status_code == tuned.status_code == 200, (base.text, tuned.text)
    assert base.json()["choices"][0]["text"] == _ids(files, None)
    assert tuned.json()["choices"][0]["text"] == _ids(files, [files["all"]]) != base.json()["choices"][0]["text"]
    stacked = _complete(server, "llama3", lora=[{"id": 0, "scale": 0.5}, {"id": 1, "scale": 1.5}])
    assert stacked.json()["choices"][0]["text"] == _ids(files, [(files["all"], 0.5), (files["f16"], 1.5)])
    bad = _complete(server, "llama3", lora=[{"id": 7, "scale": 1}])
    assert bad.status_code == 400 and "no adapter 7" in bad.json()["error"]["message"]
    emb = httpx.post(server.base + "/v1/embeddings", json={"model": "tuned", "input": "hi"}, timeout=60)
    assert emb.status_code == 400 and "is a LoRA adapter of 'llama3'" in emb.json()["error"]["message"]
    bad = _complete(server, "llama3", lora=[{"id": 0}])
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("lora")


def test_lora_adapters_lists_and_sets_the_default_scales(server, files):
    got = httpx.get(server.base + "/lora-adapters", timeout=10).json()
    assert [(a["id"], a["name"], a["scale"]) for a in got] == [(0, "tuned", 0.0), (1, "f16", 0.0)]
    r = httpx.post(server.base + "/lora-adapters", json=[{"id": 1, "scale": 0.7}], timeout=10)
    assert r.status_code == 200 and [a["scale"] for a in r.json()] == [0.0, 0.7]
    try:
        assert _complete(server, "llama3").json()["choices"][0]["text"] == _ids(files, [(files["f16"], 0.7)])
    finally:
        httpx.post(server.base + "/lora-adapters", json=[], timeout=10)
    assert _complete(server, "llama3").json()["choices"][0]["text"] == _ids(files, None)
    r = httpx.post(server.base + "/lora-adapters", json=[{"id": 3, "scale": 1}], timeout=10)
    assert r.status_code == 400 and "no adapter 3" in r.json()["error"]["message"]
    r = httpx.post(server.base + "/lora-adapters", json={"id": 0}, timeout=10)
    assert r.status_code == 400


def test_serve_refuses_an_adapter_for_another_model_before_listening(files):
    r = CliRunner().invoke(main, ["serve", files["base"], "--lora", files["phi3"], "--port", "1"])
    assert r.exit_code != 0 and "is an adapter for 'phi3' models, not for this 'llama' model" in r.output
    assert "Traceback" not in r.output


def test_generate_with_lora_is_the_python_apis_answer(files):
    r = CliRunner().invoke(main, ["generate", files["base"], "Once upon", "--max-tokens", "6", "--temperature", "0",
                                  "--lora-scaled", files["all"], "0.5", "--json"])
    assert r.exit_code == 0, r.output
    llm = LLM(files["base"], progress=False, lora=[(files["all"], 0.5)])
    want = llm.generate("Once upon", SamplingParams(temperature=0, max_tokens=6))[0].text
    assert json.loads(r.output.strip().splitlines()[-1])["text"] == want


def test_a_batch_line_names_an_adapter_by_model_id(files, tmp_path):
    lines = [{"custom_id": m, "method": "POST", "url": "/v1/completions",
              "body": {"model": m, "prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True}}
             for m in ("llama3", "tuned", "other")]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = CliRunner().invoke(main, ["batch", files["base"], str(src), str(out), "--lora", f"tuned={files['all']}",
                                  "--quiet"])
    assert r.exit_code == 0, r.output
    got = {x["custom_id"]: x["response"] for x in map(json.loads, out.read_text().splitlines())}
    assert got["llama3"]["body"]["choices"][0]["text"] == _ids(files, None)
    assert got["tuned"]["body"]["choices"][0]["text"] == _ids(files, [files["all"]])
    assert got["other"]["status_code"] == 404

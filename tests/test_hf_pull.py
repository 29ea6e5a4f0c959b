"""`edgeinfer pull hf.co/ORG/REPO[:QUANT]` and `hf://ORG/REPO/FILE.gguf`, against a local fake of the
Hub's API (tests/fake_hub.py) serving a tiny GGUF: which file a quant picks, the default choice, the
errors that list a repo's files, re-pulls that need no network, resumed downloads, sha256 checks, the
token, and a pulled model that lists, loads and generates."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from edgeinfer import registry
from edgeinfer.registry import PullError, hf

pytest.importorskip("huggingface_hub")
from fake_hub import FakeHub  # noqa: E402
from tiny_models import write_tiny_llama  # noqa: E402

REPO = "org/Tiny-GGUF"
FILES = ["tiny-Q4_K_M.gguf", "tiny.Q8_0.gguf", "tiny-q5_k_m-imat.gguf", "README.md"]  # projectors: their own tests


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    p = tmp_path_factory.mktemp("hf") / "tiny.gguf"
    write_tiny_llama(p)
    return p.read_bytes()


@pytest.fixture(scope="module")
def hub(gguf):
    h = FakeHub()
    yield h
    h.stop()


@pytest.fixture
def env(hub, gguf, tmp_path, monkeypatch):
    """A fresh model cache, huggingface_hub pointed at the fake hub, no token; the fake's repos reset."""
    monkeypatch.setenv("EDGEINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token file of the machine's
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub.repos.clear()
    hub.requests.clear()
    hub.truncate_once.clear()
    hub.fail_after_truncate.clear()
    hub.redirect = False
    hub.add(REPO, {name: (b"# Tiny\n" if name.endswith(".md") else gguf) for name in FILES})
    return tmp_path


def cache_entries():
    d = registry.models_dir()
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


# -- which file ----------------------------------------------------------------------------------------


def test_a_quant_picks_its_file_case_insensitively(env, hub, gguf):
    path = registry.pull(f"hf.co/{REPO}:q8_0", progress=False)
    assert path.name == "org--Tiny-GGUF--Q8_0.gguf" and path.read_bytes() == gguf
    assert hub.file_gets("/tiny.Q8_0.gguf") == [None]
    path = registry.pull(f"huggingface.co/{REPO}:Q5_K_M", progress=False)
    assert path.name == "org--Tiny-GGUF--Q5_K_M.gguf" and hub.file_gets("/tiny-q5_k_m-imat.gguf") == [None]
    # the listing was asked for the revision with the files' metadata, the file at the listed commit
    assert ("GET", f"/api/models/{REPO}/revision/main", None, None) in hub.requests
    assert any(p == f"/{REPO}/resolve/{hub.repos[REPO].sha}/tiny.Q8_0.gguf" for _, p, _, _ in hub.requests)
    path = registry.pull(f"hf://{REPO}/tiny-Q4_K_M.gguf", progress=False)
    assert path.name == "org--Tiny-GGUF--tiny-Q4_K_M.gguf" and hub.file_gets("/tiny-Q4_K_M.gguf") == [None]


def test_the_default_is_q4_k_m_then_q8_0_then_the_first_model_file(env, hub, gguf):
    assert registry.pull(f"hf.co/{REPO}", progress=False).name == "org--Tiny-GGUF.gguf"
    assert hub.file_gets("/tiny-Q4_K_M.gguf") == [None]
    assert registry.pull(f"hf.co/{REPO}:latest", progress=False).name == "org--Tiny-GGUF.gguf"  # the same model
    assert len(hub.file_gets(".gguf")) == 1
    hub.add("org/b", {"b-Q6_K.gguf": gguf, "b-Q8_0.gguf": gguf, "mmproj-b-Q8_0.gguf": gguf})
    registry.pull("hf.co/org/b", progress=False)
    assert hub.file_gets("/b-Q8_0.gguf") == [None]
    hub.add("org/c", {"mmproj-c-f16.gguf": gguf, "c-Q6_K.gguf": gguf, "c-F16.gguf": gguf})
    registry.pull("hf.co/org/c", progress=False)
    assert hub.file_gets("/c-F16.gguf") == [None] and hub.file_gets("/c-Q6_K.gguf") == []


def test_no_match_several_matches_and_split_files_are_one_line_errors(env, hub, gguf):
    with pytest.raises(PullError) as e:
        registry.pull(f"hf.co/{REPO}:Q2_K", progress=False)
    assert str(e.value) == (f"{REPO} has no GGUF file for quant Q2_K; its GGUF files: "
                            "tiny-Q4_K_M.gguf, tiny-q5_k_m-imat.gguf, tiny.Q8_0.gguf")
    hub.add("org/two", {"a-Q4_K_M.gguf": gguf, "b/a-Q4_K_M.gguf": gguf})
    with pytest.raises(PullError, match=r"Q4_K_M matches several GGUF files in org/two: a-Q4_K_M.gguf, "
                                        r"b/a-Q4_K_M.gguf; pull one with hf://org/two/FILE.gguf"):
        registry.pull("hf.co/org/two:Q4_K_M", progress=False)
    hub.add("org/split", {f"s-Q4_K_M-0000{i}-of-00003.gguf": gguf for i in (1, 2, 3)})
    for ref in ("hf.co/org/split", "hf://org/split/s-Q4_K_M-00002-of-00003.gguf"):
        with pytest.raises(PullError, match="is one of 3 split parts .*llama-gguf-split --merge"):
            registry.pull(ref, progress=False)
    hub.add("org/none", {"model.safetensors": b"x"})
    with pytest.raises(PullError, match="org/none has no GGUF model file .its GGUF files: none."):
        registry.pull("hf.co/org/none", progress=False)
    with pytest.raises(PullError, match=f"{REPO} has no file nope.gguf; its GGUF files: tiny-Q4_K_M.gguf"):
        registry.pull(f"hf://{REPO}/nope.gguf", progress=False)
    with pytest.raises(PullError, match="no model repository org/missing on http://127.0.0.1"):
        registry.pull("hf.co/org/missing", progress=False)
    with pytest.raises(PullError, match="not a Hugging Face model reference"):
        registry.pull("hf.co/just-an-org", progress=False)
    assert not hub.file_gets(".gguf") and cache_entries() == []


def test_the_file_picker_follows_llama_cpps_tag_rule():
    files = ["m-Q4_K_S.gguf", "m-Q4_K_M.gguf", "m.iq4_xs.gguf", "Q3_K_L/m-Q3_K_L.gguf", "m-imatrix-Q8_0.gguf"]
    assert hf.choose_file("o/r", files, "IQ4_XS") == "m.iq4_xs.gguf"
    assert hf.choose_file("o/r", files, "Q4_K_S") == "m-Q4_K_S.gguf"  # not Q4_K_M: the tag ends at '.' or '-'
    assert hf.choose_file("o/r", files, "Q3_K_L") == "Q3_K_L/m-Q3_K_L.gguf"
    with pytest.raises(PullError, match="no GGUF file for quant Q4_K;"):
        hf.choose_file("o/r", files, "Q4_K")
    with pytest.raises(PullError, match="no GGUF file for quant Q8_0"):  # an importance matrix is no model
        hf.choose_file("o/r", files, "Q8_0")


def test_references_and_their_names():
    cases = {"hf.co/bartowski/SmolLM2-GGUF:q4_k_m": ("bartowski/SmolLM2-GGUF", "Q4_K_M", None),
             "huggingface.co/o/r": ("o/r", None, None), "hf.co/o/r:Latest": ("o/r", None, None),
             "https://huggingface.co/o/r": ("o/r", None, None),
             "hf://o/r/sub/x-Q8_0.gguf": ("o/r", None, "sub/x-Q8_0.gguf"),
             "https://huggingface.co/o/r/blob/main/x.gguf": ("o/r", None, "x.gguf")}
    for text, want in cases.items():
        ref = registry.parse_ref(text)
        assert (ref.repo, ref.quant, ref.filename) == want, text
    assert registry.parse_ref("hf://o/r/sub/x-Q8_0.gguf").name == "o--r--sub--x-Q8_0"
    assert registry.model_name("hf.co/o/r:q8_0") == "o--r--Q8_0"
    for other in ("smollm2", "x.gguf", "https://example.com/x.gguf", "https://huggingface.co/o/r/resolve/main/x.gguf"):
        assert registry.parse_ref(other) is None, other  # a /resolve/ URL stays an ordinary URL pull
    for bad in ("hf.co/o", "hf.co/o/r/x", "hf.co/o--x/r", "hf://o/../x.gguf", "hf.co/o/r:Q4 K"):
        with pytest.raises(PullError, match="not a Hugging Face"):
            registry.parse_ref(bad)


# -- the download ----------------------------------------------------------------------------------------


def test_a_re_pull_and_resolve_need_no_network(env, hub, gguf, monkeypatch):
    path = registry.pull(f"hf.co/{REPO}:Q8_0", progress=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: any request would fail
    hub.requests.clear()
    assert registry.pull(f"hf.co/{REPO}:q8_0", progress=False) == path
    assert registry.resolve(f"hf.co/{REPO}:Q8_0") == path == registry.resolve("org--Tiny-GGUF--Q8_0")
    assert hub.requests == [] and cache_entries() == ["org--Tiny-GGUF--Q8_0.gguf"]
    with pytest.raises(PullError, match="cannot list org/Tiny-GGUF on http://127.0.0.1:9"):
        registry.pull(f"hf.co/{REPO}:Q8_0", progress=False, force=True)
    with pytest.raises(registry.ModelNotFoundError, match=r"not downloaded yet: run `edgeinfer pull hf.co/o/r`"):
        registry.resolve("hf.co/o/r", pull_missing=False)


def test_resolve_pulls_on_first_use(env, hub, gguf):
    path = registry.resolve(f"hf.co/{REPO}:Q8_0", progress=False)
    assert path.read_bytes() == gguf and hub.file_gets("/tiny.Q8_0.gguf") == [None]


def test_an_interrupted_download_resumes_where_it_stopped(env, hub, gguf):
    name = "tiny-Q4_K_M.gguf"
    hub.truncate_once.add(name)
    hub.fail_after_truncate.add(name)
    with pytest.raises(PullError, match="run the same pull again to resume"):
        registry.pull(f"hf.co/{REPO}:Q4_K_M", progress=False)
    partials = [p for p in cache_entries() if p.endswith(".partial")]
    assert len(partials) == 1 and partials[0].startswith(".org--Tiny-GGUF--Q4_K_M.")
    half = (registry.models_dir() / partials[0]).stat().st_size
    assert 0 < half < len(gguf) and registry.list_local() == []
    hub.fail_after_truncate.clear()
    path = registry.pull(f"hf.co/{REPO}:Q4_K_M", progress=False)
    assert hub.file_gets("/" + name)[-1] == f"bytes={half}-"
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf).digest()
    assert cache_entries() == ["org--Tiny-GGUF--Q4_K_M.gguf"]


def test_a_sha256_mismatch_is_refused_and_leaves_nothing(env, hub, gguf):
    hub.repos[REPO].wrong_sha.add("tiny.Q8_0.gguf")
    with pytest.raises(PullError) as e:
        registry.pull(f"hf.co/{REPO}:Q8_0", progress=False)
    msg = str(e.value)
    assert msg.startswith(f"sha256 mismatch for tiny.Q8_0.gguf from {REPO}: got {hashlib.sha256(gguf).hexdigest()}")
    assert msg.endswith("; nothing was saved") and cache_entries() == []


def test_the_token_goes_to_the_hub_and_a_gated_repo_says_so(env, hub, gguf, monkeypatch):
    hub.add("org/gated", {"g-Q4_K_M.gguf": gguf}, gated=True)
    with pytest.raises(PullError, match="org/gated is gated: accept its terms on the Hub, then set HF_TOKEN"):
        registry.pull("hf.co/org/gated", progress=False)
    monkeypatch.setenv("HF_TOKEN", "hf_testtoken")
    hub.requests.clear()
    registry.pull("hf.co/org/gated", progress=False)
    auths = {(method, path.split("/")[1]): auth for method, path, _, auth in hub.requests}
    assert auths == {("GET", "api"): "Bearer hf_testtoken", ("GET", "org"): "Bearer hf_testtoken"}
    # a file the Hub redirects to its storage: the token is not sent there
    hub.redirect, hub.repos["org/gated"].gated = True, False
    hub.requests.clear()
    try:
        path = registry.pull("hf.co/org/gated", progress=False, force=True)
    finally:
        hub.redirect = False
    assert path.read_bytes() == gguf
    assert [(p.split("/")[1], auth) for m, p, _, auth in hub.requests if m == "GET"] == [
        ("api", "Bearer hf_testtoken"), ("org", "Bearer hf_testtoken"), ("cdn", None)]


def test_without_huggingface_hub_the_error_names_the_extra(env, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(PullError, match=r"needs huggingface_hub: pip install 'edgeinfer\[hf\]'"):
        registry.pull(f"hf.co/{REPO}", progress=False)


# -- through the CLI: pull, list, generate ------------------------------------------------------------


def test_cli_pull_list_and_generate(env, hub, gguf):
    run_env = dict(os.environ, EDGEINFER_THREADS="1")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", *args], capture_output=True, text=True,
                              env=run_env, timeout=600, cwd=str(env))

    p = cli("pull", f"hf.co/{REPO}:Q4_K_M")
    assert p.returncode == 0, p.stderr
    path = registry.models_dir() / "org--Tiny-GGUF--Q4_K_M.gguf"
    assert p.stdout.strip() == str(path) and path.read_bytes() == gguf
    assert "tiny-Q4_K_M.gguf" in p.stderr  # the progress bar names the file
    p = cli("list", "--json")
    assert [m["name"] for m in json.loads(p.stdout)["models"]] == ["org--Tiny-GGUF--Q4_K_M"]
    p = cli("generate", f"hf.co/{REPO}:Q4_K_M", "hello", "-n", "4", "--temperature", "0", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["completion_tokens"] == 4 and out["finish_reason"] == "length"
    # the same text as the file the pull came from, by its cache name too
    p2 = cli("generate", "org--Tiny-GGUF--Q4_K_M", "hello", "-n", "4", "--temperature", "0", "--json")
    assert p2.returncode == 0, p2.stderr
    assert json.loads(p2.stdout)["text"] == out["text"]
    p = cli("rm", f"hf.co/{REPO}:q4_k_m")
    assert p.returncode == 0 and not path.exists(), p.stderr
    p = cli("pull", "hf.co/org/missing:Q4_K_M")
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"error: no model repository org/missing on {hub.url} (a private one needs HF_TOKEN)"]


def test_ollama_pull_of_an_hf_reference(env, gguf):
    """Ollama's POST /api/pull with an hf.co reference (serve --allow-pull): progress streamed, the file in the
    cache under the reference's cache name, then served by the reference and listed by /api/tags."""
    from starlette.testclient import TestClient

    from edgeinfer.server.app import ServerConfig, create_app

    with TestClient(create_app(ServerConfig(models=[], allow_pull=True))) as c:
        with c.stream("POST", "/api/pull", json={"model": f"hf.co/{REPO}:Q8_0"}) as r:
            assert r.status_code == 200
            events = [json.loads(line) for line in r.iter_lines() if line]
        assert events[0] == {"status": "pulling manifest"} and events[-1] == {"status": "success"}, events
        assert any(e["status"].startswith("downloading") for e in events)
        assert "org--Tiny-GGUF--Q8_0.gguf" in cache_entries()
        assert registry.cached_path("org--Tiny-GGUF--Q8_0").read_bytes() == gguf
        r = c.post("/api/show", json={"model": f"hf.co/{REPO}:Q8_0"})
        assert r.status_code == 200, r.text
        assert "org--Tiny-GGUF--Q8_0" in {m["model"].removesuffix(":latest") for m in c.get("/api/tags").json()["models"]}
        r = c.post("/api/pull", json={"model": "hf.co/not a ref"})
        assert r.status_code == 400 and list(r.json()) == ["error"], r.text


def test_a_repo_with_a_projector_gives_it_and_the_model_loads_with_it(env, hub, tmp_path):
    # as llama.cpp's -hf: the projector nearest the model's quant comes too, kept beside it; `list` shows the model
    # alone, the model loads with its projector (images work), `rm` removes both
    import vision_zoo

    from edgeinfer import LLM

    text, proj = vision_zoo.write_pair("idefics3", tmp_path)
    t, p = open(text, "rb").read(), open(proj, "rb").read()
    hub.add("org/vlm", {"vlm-Q8_0.gguf": t, "mmproj-vlm-f16.gguf": b"not this one", "mmproj-vlm-Q8_0.gguf": p})
    hub.repos["org/vlm"].wrong_sha.add("vlm-Q8_0.gguf")  # a bad model: neither file is kept
    with pytest.raises(PullError, match="sha256 mismatch for vlm-Q8_0.gguf"):
        registry.pull("hf.co/org/vlm", progress=False)
    assert cache_entries() == []
    hub.repos["org/vlm"].wrong_sha.clear()
    path = registry.pull("hf.co/org/vlm", progress=False)
    assert hub.file_gets("/mmproj-vlm-Q8_0.gguf") == [None, None] and hub.file_gets("/mmproj-vlm-f16.gguf") == []
    assert registry.projector_for(path).read_bytes() == p
    assert [m.name for m in registry.list_local()] == ["org--vlm"]
    llm = LLM("hf.co/org/vlm", progress=False)
    assert llm.vision is not None and llm.vision.family == "idefics3"
    assert LLM("hf.co/org/vlm", progress=False, mmproj="").vision is None
    registry.remove("hf.co/org/vlm")
    assert cache_entries() == []


def test_choose_projector_follows_llama_cpp():
    files = ["a/m-Q4_K_M.gguf", "a/mmproj-m-f16.gguf", "a/mmproj-m-Q8_0.gguf", "mmproj-top-f16.gguf", "b/mmproj-x.gguf"]
    assert hf.choose_projector(files, "a/m-Q4_K_M.gguf") == "a/mmproj-m-Q8_0.gguf"  # its folder, the nearest bits
    assert hf.choose_projector(files, "m-Q8_0.gguf") == "mmproj-top-f16.gguf"  # not a folder below the model's
    assert hf.choose_projector(["x-F16.gguf", "mmproj-x-bf16.gguf", "mmproj-x-q8_0.gguf"], "x-F16.gguf") == \
        "mmproj-x-bf16.gguf"
    assert hf.choose_projector(["x-Q4_K_M.gguf"], "x-Q4_K_M.gguf") is None

"""Models loaded on demand: keep-alive, eviction under a memory budget, /api/ps and `edgeinfer ps`.

Real server processes (test_server.Server) over tiny random models written into a --models-dir, and the
app in-process (Starlette's TestClient) where a test calls scaffold.use_model itself."""

import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import httpx
import pytest
from click.testing import CliRunner
from test_server import Server, free_port
from tiny_models import write_tiny_llama

from edgeinfer import memory
from edgeinfer.config import EngineConfig
from edgeinfer.openai.times import parse_keep_alive
from edgeinfer.server.servable import estimated_bytes


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """a and b: two small models (a context of 4,096 tokens: room for long streams); long: a slower one
    (about 1 ms a token); big: one whose KV pool alone is far over the budget that fits a or b."""
    d = tmp_path_factory.mktemp("served")
    write_tiny_llama(d / "a.gguf", seed=1, n_ctx=4096)
    write_tiny_llama(d / "b.gguf", seed=2, n_ctx=4096)
    write_tiny_llama(d / "long.gguf", n_ctx=4096, dim=256, n_head=4, n_kv=2, ffn=1024, n_layer=8)
    write_tiny_llama(d / "big.gguf", n_ctx=4096, dim=256, n_head=4, n_kv=4, ffn=512, n_layer=8)
    return d


def ps(server) -> dict:
    """name -> /api/ps entry."""
    return {m["name"]: m for m in httpx.get(server.base + "/api/ps").json()["models"]}


def complete(server, model, **kw):
    return httpx.post(server.base + "/v1/completions", timeout=60,
                      json={"model": model, "prompt": "the hen", "max_tokens": 3, **kw})


def wait_until(cond, seconds: float) -> bool:
    t0 = time.time()
    while time.time() - t0 < seconds:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def models_loaded(server) -> float:
    """The edgeinfer_models_loaded gauge (it has no labels)."""
    return float(re.search(r"^edgeinfer_models_loaded (\S+)$", httpx.get(server.base + "/metrics").text, re.M).group(1))


def output(server) -> str:
    """What the server printed (once stopped)."""
    server.stop()
    return server.proc.stdout.read()


@pytest.fixture(scope="module")
def lazy(models_dir):
    """A server started with no model, keeping idle models for the default five minutes."""
    s = Server("--models-dir", models_dir).wait_ready()
    yield s
    s.stop()


def test_starts_with_no_model_and_loads_on_the_first_request(lazy, models_dir):
    assert httpx.get(lazy.base + "/health").json() == {"status": "ok", "models": []}
    assert ps(lazy) == {}
    r = complete(lazy, "a")
    assert r.status_code == 200 and r.json()["model"] == "a" and r.json()["usage"]["completion_tokens"] >= 1
    loaded = ps(lazy)
    assert list(loaded) == ["a"]
    a = loaded["a"]
    assert a["model"] == "a" and a["size_vram"] == 0 and a["details"]["family"] == "llama"
    assert a["size"] == estimated_bytes(str(models_dir / "a.gguf"), EngineConfig())
    expires = datetime.fromisoformat(a["expires_at"].replace("Z", "+00:00"))
    assert 200 < (expires - datetime.now(timezone.utc)).total_seconds() <= 301  # the default five minutes
    models = httpx.get(lazy.base + "/v1/models").json()["data"]
    assert models[0]["id"] == "a" and models[0]["status"] == "loaded" and models[0]["memory_bytes"] == a["size"]
    assert {"b", "long", "big"} <= {m["id"] for m in models if m["status"] == "available"}
    assert models_loaded(lazy) == len(ps(lazy))
    assert lazy.metric('edgeinfer_model_memory_bytes{model="a"') == a["size"]
    assert httpx.get(lazy.base + "/health").json()["status"] == "ok"  # on-demand models never make it 503


def at_once(n: int, request) -> list:
    """request() from n threads at once: their answers, in the order they came."""
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(request())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


def test_two_concurrent_requests_load_a_model_once(models_dir):
    s = Server("--models-dir", models_dir).wait_ready()
    try:
        answers = at_once(2, lambda: complete(s, "b"))
        assert [r.status_code for r in answers] == [200, 200]
        assert list(ps(s)) == ["b"]
    finally:
        log = output(s)
    assert log.count("loaded b (") == 1, log
    assert "context 4096 tokens: the model's trained context)" in log  # what it chose, and why


def test_unknown_and_refused_models(lazy, models_dir, tmp_path):
    r = complete(lazy, "no-such-model")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    msg = r.json()["error"]["message"]
    assert "'no-such-model'" in msg and all(n in msg for n in ("long", "big"))  # names what can be served
    outside = tmp_path / "outside.gguf"
    write_tiny_llama(outside)
    r = complete(lazy, str(outside))
    assert r.status_code == 403 and "outside the allowed folders" in r.json()["error"]["message"]
    r = complete(lazy, f"{models_dir}/../{tmp_path.name}/outside.gguf")
    assert r.status_code == 403 and "'..'" in r.json()["error"]["message"]
    link = models_dir / "sneaky.gguf"
    link.symlink_to(outside)
    try:
        r = complete(lazy, str(link))
        assert r.status_code == 403 and "outside" in r.json()["error"]["message"]
        r = complete(lazy, "sneaky")  # not served by name either
        assert r.status_code == 404
        assert "sneaky" not in {m["id"] for m in httpx.get(lazy.base + "/v1/models").json()["data"]}
    finally:
        link.unlink()
    r = complete(lazy, str(models_dir / "a.gguf"))  # a path inside the folder serves that model
    assert r.status_code == 200 and r.json()["model"] == "a"
    assert "outside" not in ps(lazy)


def test_catalog_model_not_downloaded_is_a_404_saying_to_pull(models_dir, tmp_path):
    """With no model on the command line, a request naming none gets the catalog's default model: here
    (an empty cache) a 404 that says to pull it, never a download."""
    s = Server("--models-dir", models_dir, env={"EDGEINFER_HOME": str(tmp_path)}).wait_ready()
    try:
        for body in ({"prompt": "x"}, {"prompt": "x", "model": "smollm2"}):
            r = httpx.post(s.base + "/v1/completions", json=body, timeout=30)
            assert r.status_code == 404, r.text
            assert "edgeinfer pull smollm2-135m-instruct" in r.json()["error"]["message"]
        assert not list((tmp_path / "models").glob("*.gguf")) if (tmp_path / "models").exists() else True
    finally:
        s.stop()


def test_a_failed_load_answers_every_waiter_and_leaves_nothing(models_dir, tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    s = Server("--models-dir", d).wait_ready()
    try:
        answers = at_once(2, lambda: complete(s, "bad"))
        assert [r.status_code for r in answers] == [500, 500]
        assert all("failed to load" in r.json()["error"]["message"] for r in answers)
        assert ps(s) == {} and httpx.get(s.base + "/health").status_code == 200
        assert complete(s, "bad").status_code == 500  # tried again, not remembered
    finally:
        s.stop()


def test_keep_alive_zero_unloads_after_the_request_but_not_mid_stream(models_dir):
    s = Server("--models-dir", models_dir, "--keep-alive", "0").wait_ready()
    try:
        assert complete(s, "a").status_code == 200
        assert ps(s) == {}  # unloaded as soon as its last request ended
        body = {"model": "long", "prompt": "the", "max_tokens": 200, "stream": True, "temperature": 0,
                "ignore_eos": True}
        events = []
        with httpx.Client(timeout=60) as h, h.stream("POST", s.base + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                if len(events) == 3:
                    assert list(ps(s)) == ["long"]  # held by the stream
        assert events[-1] == "data: [DONE]" and '"finish_reason": "length"' in events[-2]  # the whole stream came
        assert wait_until(lambda: ps(s) == {}, 2.0)
        assert wait_until(lambda: models_loaded(s) == 0, 2.0)
    finally:
        log = output(s)
    assert log.count("unloaded long") == 1 and log.count("loaded long (") == 1


def test_short_keep_alive_unloads_when_idle_and_negative_keeps(models_dir):
    s = Server("--models-dir", models_dir, "--keep-alive", "600ms").wait_ready()
    forever = Server("--models-dir", models_dir, "--keep-alive", "-1").wait_ready()
    try:
        assert complete(s, "a").status_code == 200
        t0 = time.time()
        assert "a" in ps(s)
        assert wait_until(lambda: ps(s) == {}, 5.0)
        assert time.time() - t0 >= 0.5
        assert complete(forever, "a").status_code == 200
        assert ps(forever)["a"]["expires_at"].startswith("9999-")
        time.sleep(0.5)
        assert list(ps(forever)) == ["a"]
        r = CliRunner().invoke(_main(), ["ps", "--port", str(forever.port)])
        assert r.exit_code == 0 and re.search(r"^a\s+[0-9a-f]{12}\s+\S+ [KMG]?B\s+100% CPU\s+Forever$", r.output, re.M), \
            r.output
    finally:
        s.stop()
        forever.stop()


def _main():
    from edgeinfer.cli.main import main

    return main


def test_memory_budget_evicts_the_least_recently_used_idle_model(models_dir):
    base = EngineConfig()
    size = {n: estimated_bytes(str(models_dir / f"{n}.gguf"), base) for n in ("a", "b", "big")}
    assert size["a"] == size["b"] and size["big"] > 4 * size["a"]
    budget = (memory.RUNTIME_BYTES + size["a"] * 1.5) / memory.MB  # one of a and b, not both
    s = Server("--models-dir", models_dir, "--memory-budget", f"{budget:.3f}").wait_ready()
    try:
        assert complete(s, "a").status_code == 200 and list(ps(s)) == ["a"]
        assert complete(s, "b").status_code == 200
        assert list(ps(s)) == ["b"]  # a was evicted to make room
        r = complete(s, "big")
        assert r.status_code == 507, r.text
        msg = r.json()["error"]["message"]
        assert f"memory budget of {float(f'{budget:.3f}'):g} MB" in msg and f"{size['big'] / memory.MB:.1f} MB" in msg
        assert list(ps(s)) == ["b"]  # nothing evicted for a model that can never fit
        body = {"model": "b", "prompt": "the", "max_tokens": 4000, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=60) as h, h.stream("POST", s.base + "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            while not next(lines).startswith("data: {"):
                pass
            busy = complete(s, "a")  # b is busy streaming: waiting would help
            assert busy.status_code == 503 and busy.headers["retry-after"] and "in use" in busy.text, busy.text
        assert wait_until(lambda: complete(s, "a").status_code == 200, 10.0)
        assert list(ps(s)) == ["a"]
    finally:
        log = output(s)
    assert "evicting a (idle)" in log


def test_command_line_models_stay_loaded_unless_keep_alive_is_given(models_dir):
    pinned = Server(models_dir / "a.gguf").wait_ready()
    # a keep-alive of seconds, not less: on a loaded machine the first look must come before it expires
    s = Server(models_dir / "a.gguf", "--keep-alive", "3s").wait_ready()
    try:
        assert ps(s)["a"]["expires_at"] < "9999" and ps(pinned)["a"]["expires_at"].startswith("9999-")
        assert wait_until(lambda: ps(s) == {}, 20.0)  # idle past --keep-alive: unloaded like any model
        assert httpx.get(s.base + "/health").json() == {"status": "ok", "models": []}  # still healthy
        r = httpx.post(s.base + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "a"  # no model named: the command-line one, reloaded
        assert list(ps(pinned)) == ["a"]
        # a request's keep_alive 0 (`ollama stop`) unloads even a command-line model once it is idle; the next
        # request loads it again, and it stays again
        r = httpx.post(pinned.base + "/api/generate", json={"model": "a", "prompt": "", "keep_alive": 0}, timeout=60)
        assert r.status_code == 200 and wait_until(lambda: ps(pinned) == {}, 20.0), r.text
        r = httpx.post(pinned.base + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and ps(pinned)["a"]["expires_at"].startswith("9999-")
    finally:
        s.stop()
        pinned.stop()


def test_memory_budget_with_a_command_line_model_sizes_its_kv_and_keeps_it(models_dir):
    """As before: the command-line model's KV pool takes what the budget leaves; it stays loaded, so a
    second model cannot fit (507) rather than evicting it."""
    size = estimated_bytes(str(models_dir / "a.gguf"), EngineConfig())
    budget = (memory.RUNTIME_BYTES + size * 1.5) / memory.MB
    s = Server(models_dir / "a.gguf", "--models-dir", models_dir, "--memory-budget", f"{budget:.3f}").wait_ready()
    try:
        held = ps(s)["a"]["size"]
        assert size < held <= budget * memory.MB - memory.RUNTIME_BYTES  # the pool grew into the budget
        r = complete(s, "b")
        assert r.status_code == 507 and "models that stay loaded: a" in r.json()["error"]["message"], r.text
        assert list(ps(s)) == ["a"]
    finally:
        s.stop()


def _rss(pid: int) -> int:
    """A process's resident memory in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads resident memory from /proc")
def test_unloading_gives_the_memory_back(tmp_path):
    """The weights (24 MB here) leave the process: resident memory goes down by most of them."""
    write_tiny_llama(tmp_path / "fat.gguf", dim=512, n_head=8, n_kv=4, ffn=2048, n_layer=6)
    weights = (tmp_path / "fat.gguf").stat().st_size
    s = Server("--models-dir", tmp_path, "--keep-alive", "300ms").wait_ready()
    try:
        assert complete(s, "fat").status_code == 200
        loaded = _rss(s.proc.pid)
        assert wait_until(lambda: ps(s) == {}, 5.0)
        assert wait_until(lambda: _rss(s.proc.pid) < loaded - weights * 0.7, 5.0), (loaded, _rss(s.proc.pid), weights)
    finally:
        s.stop()


def test_edgeinfer_ps_against_a_live_server_and_a_dead_port(lazy):
    assert complete(lazy, "a").status_code == 200
    r = CliRunner().invoke(_main(), ["ps", "--url", lazy.base])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"]
    row = next(line for line in lines[1:] if line.startswith("a "))
    assert "100% CPU" in row and re.search(r"\d+ minutes from now$", row), row
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "ps", "--port", str(port)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and f"no edgeinfer server at http://127.0.0.1:{port}" in r.stderr


def test_edgeinfer_ps_sends_the_api_key(models_dir):
    s = Server("--models-dir", models_dir, env={"EDGEINFER_API_KEY": "sekret"}).wait_ready()
    try:
        r = CliRunner(env={"EDGEINFER_API_KEY": None}).invoke(_main(), ["ps", "--url", s.base])
        assert r.exit_code == 1 and "401" in r.output and "API key" in r.output
        r = CliRunner().invoke(_main(), ["ps", "--url", s.base, "--api-key", "sekret"])
        assert r.exit_code == 0 and r.output.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"]
    finally:
        s.stop()


def test_bad_keep_alive_is_a_cli_error():
    r = CliRunner().invoke(_main(), ["serve", "--keep-alive", "soon"])
    assert r.exit_code == 2 and "--keep-alive" in r.output and "'soon' is not a duration" in r.output


@pytest.mark.parametrize("value, seconds", [("300", 300), (30, 30), ("30s", 30), ("5m", 300), ("1h", 3600),
                                            ("1h30m", 5400), ("500ms", 0.5), ("0", 0), ("-1", -1), ("-1m", -60)])
def test_keep_alive_forms(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["", "soon", "5x", "m", "inf", True, None, [5]])
def test_bad_keep_alive_values(value):
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(value)


# -- use_model's keep_alive and the lease guard, in-process ---------------------------------------


@pytest.fixture
def in_process(models_dir):
    """The app in this process, its default keep-alive 0.3 s, with a route that takes a model through
    scaffold.use_model as the Ollama routes do: ?keep_alive=, and ?hold=1 to leave the lease to the guard."""
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from edgeinfer.server import app as server_app
    from edgeinfer.server import scaffold

    async def use(request):
        q = request.query_params
        ka = float(q["keep_alive"]) if "keep_alive" in q else None
        lease = await scaffold.use_model(request, q["model"], ka)
        out = {"model": lease.sm.name}
        if q.get("again"):  # released with keep_alive 0 (an unload starts), then asked for at once
            first = lease.sm
            lease.release()
            second = await scaffold.use_model(request, q["model"])
            out.update(reloaded=second.sm is not first, ready=second.sm.ready, first_dropped=first.llm is None)
            second.release()
        elif not q.get("hold"):
            lease.release()
        return JSONResponse(out)

    app = server_app.create_app(server_app.ServerConfig(models_dirs=[str(models_dir)], keep_alive=0.3))
    app.router.routes.append(Route("/test/use", use, methods=["GET"]))
    with TestClient(app) as client:
        yield client


def _ps(client) -> dict:
    return {m["name"]: m for m in client.get("/api/ps").json()["models"]}


def test_use_model_keep_alive_per_request(in_process):
    c = in_process
    assert c.get("/test/use", params={"model": "a", "keep_alive": 0}).json() == {"model": "a"}
    assert _ps(c) == {}  # 0: unloaded as the lease went
    c.get("/test/use", params={"model": "a", "keep_alive": -1})
    c.get("/test/use", params={"model": "b"})  # None: the server's default, 0.3 s
    assert set(_ps(c)) == {"a", "b"}
    assert wait_until(lambda: set(_ps(c)) == {"a"}, 3.0)
    time.sleep(0.4)
    assert _ps(c)["a"]["expires_at"].startswith("9999-")  # negative: kept


def test_a_lease_left_by_a_route_is_released_when_the_response_ends(in_process):
    """A stream Starlette never starts never runs its own release: the app's guard releases it."""
    assert in_process.get("/test/use", params={"model": "a", "keep_alive": 0, "hold": 1}).status_code == 200
    assert wait_until(lambda: _ps(in_process) == {}, 2.0)


def test_a_request_arriving_while_its_model_unloads_waits_and_reloads_it(in_process):
    r = in_process.get("/test/use", params={"model": "b", "keep_alive": 0, "again": 1}).json()
    assert r == {"model": "b", "reloaded": True, "ready": True, "first_dropped": True}

"""`edgeinfer serve`: a real server process on a free port, driven by the openai client and raw HTTP."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args, env=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "edgeinfer.cli.main", "serve", *map(str, args),
                                      "--port", str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})})

    def wait_ready(self, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("server did not become ready")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @contextlib.contextmanager
    def long_stream(self):
        """A 4,000-token stream, open once its first chunk came: it holds a slot until the block ends."""
        body = {"prompt": "the", "max_tokens": 4000, "stream": True, "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=60) as h, h.stream("POST", self.base + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            while not next(lines).startswith("data: {"):
                pass
            yield

    def client(self, **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def wait_blocks_freed(self, seconds: float) -> bool:
        """True once no KV block is in use, polling for at most `seconds`."""
        t0 = time.time()
        while time.time() - t0 < seconds and self.metric("edgeinfer_kv_blocks_used") != 0:
            time.sleep(0.05)
        return self.metric("edgeinfer_kv_blocks_used") == 0

    def metric(self, name: str) -> float:
        """A metric's value; `name` may be a full series up to its closing brace. 0 when absent."""
        text = httpx.get(self.base + "/metrics").text
        pattern = rf"^{re.escape(name)}\}} (\S+)$" if "{" in name else rf"^{name}\{{[^}}]*\}} (\S+)$"
        m = re.search(pattern, text, re.M)
        return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def tiny_llama_path(tmp_path_factory):
    """A small random model with a long context: slow enough (about 1 ms a token) that a long stream is
    still running when a test looks at it."""
    from tiny_models import write_tiny_llama

    p = tmp_path_factory.mktemp("server") / "tiny-llama.gguf"
    write_tiny_llama(p, n_ctx=4096, dim=256, n_head=4, n_kv=2, ffn=1024, n_layer=8)
    return p


@pytest.fixture(scope="module")
def server(tiny_llama_path):
    s = Server(tiny_llama_path, "--max-queue", "64").wait_ready()
    yield s
    s.stop()


GREEDY = dict(temperature=0, max_tokens=12, seed=1)


def test_models_and_health(server):
    data = server.client().models.list().data
    assert data[0].id == "tiny-llama" and data[0].status == "loaded"  # the models in memory come first
    assert [m.id for m in data if m.status != "available"] == ["tiny-llama"]  # the rest load on demand
    assert httpx.get(server.base + "/health").json() == {"status": "ok", "models": ["tiny-llama"]}


def test_chat_completion_and_stream_agree(server):
    c = server.client()
    msgs = [{"role": "user", "content": "the hen"}]
    full = c.chat.completions.create(model="tiny-llama", messages=msgs, **GREEDY)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    assert full.usage.completion_tokens == len(
        c.chat.completions.create(model="tiny-llama", messages=msgs, logprobs=True, **GREEDY).choices[0].logprobs.content)
    chunks = list(c.chat.completions.create(model="tiny-llama", messages=msgs, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens and chunks[-1].choices == []
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == full.choices[0].finish_reason


def test_completion_and_stream_agree(server):
    c = server.client()
    full = c.completions.create(model="tiny-llama", prompt="in a", **GREEDY)
    assert full.object == "text_completion" and full.usage.prompt_tokens > 0
    text = "".join(ch.choices[0].text for ch in c.completions.create(model="tiny-llama", prompt="in a", stream=True,
                                                                       **GREEDY))
    assert text == full.choices[0].text
    lp = c.completions.create(model="tiny-llama", prompt="in a", logprobs=2, **GREEDY).choices[0].logprobs
    assert len(lp.tokens) == full.usage.completion_tokens and all(len(t) <= 2 for t in lp.top_logprobs)


def test_stop_and_max_completion_tokens(server):
    c = server.client()
    r = c.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}], temperature=0,
                                  max_completion_tokens=3)
    assert r.usage.completion_tokens <= 3


def test_sixteen_concurrent_requests(server):
    c = server.client()
    results, errors = [], []

    def one(i):
        try:
            r = c.completions.create(model="tiny-llama", prompt=f"the hen {i}", temperature=0.7, max_tokens=16, seed=i)
            results.append(r.usage.completion_tokens)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 16


def test_disconnect_mid_stream_frees_blocks(server):
    body = {"model": "tiny-llama", "prompt": "the hen sat", "max_tokens": 4000, "stream": True, "temperature": 0,
            "ignore_eos": True}
    label = 'edgeinfer_requests_total{endpoint="completions",model="tiny-llama",status="499"'
    aborted = server.metric(label)
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", server.base + "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # kept alive: breaking out of it would close the response
            while not next(lines).startswith("data: {"):
                pass
            assert server.metric("edgeinfer_running_sequences") == 1
            assert server.metric("edgeinfer_kv_blocks_used") >= 1
        # leaving the block closes the connection mid-stream
    assert server.wait_blocks_freed(1.0), "blocks not freed within a second"
    assert server.metric("edgeinfer_running_sequences") == 0
    assert server.metric(label) == aborted + 1  # counted as aborted by the client


BAD = [
    ("malformed json", b"{bad json", "application/json", 400, None),
    ("not an object", b"[1, 2]", "application/json", 400, None),
    ("wrong type", json.dumps({"prompt": "x", "temperature": "hot"}).encode(), "application/json", 400, "temperature"),
    ("out of range", json.dumps({"prompt": "x", "top_p": 1.5}).encode(), "application/json", 400, "top_p"),
    ("max_tokens type", json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), "application/json", 400, "max_tokens"),
    ("negative penalty", json.dumps({"prompt": "x", "presence_penalty": -3}).encode(), "application/json", 400,
     "presence_penalty"),
    ("n over the limit", json.dumps({"prompt": "x", "n": 17}).encode(), "application/json", 400, "n"),
    ("bad prompt", json.dumps({"prompt": {"a": 1}}).encode(), "application/json", 400, "prompt"),
    ("too long", json.dumps({"prompt": "x", "max_tokens": 10_000}).encode(), "application/json", 400, "max_tokens"),
    ("prompt over context", json.dumps({"prompt": [5] * 4195}).encode(), "application/json", 400, "prompt"),
    ("wrong content type", b"prompt=x", "application/x-www-form-urlencoded", 415, None),
    ("unknown model", json.dumps({"model": "gpt-9", "prompt": "x"}).encode(), "application/json", 404, "model"),
    ("body too large", json.dumps({"prompt": "x" * (5 * 1024 * 1024)}).encode(), "application/json", 413, None),
    ("priority type", json.dumps({"prompt": "x", "priority": "high"}).encode(), "application/json", 400, "priority"),
    ("priority range", json.dumps({"prompt": "x", "priority": 10**7}).encode(), "application/json", 400, "priority"),
]


@pytest.mark.parametrize("name,body,ctype,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_completion_requests(server, name, body, ctype, status, param):
    r = httpx.post(server.base + "/v1/completions", content=body, headers={"Content-Type": ctype}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param:
        assert err["param"] == param and param.split(".")[0] in err["message"]
    if name == "unknown model":
        assert "tiny-llama" in err["message"]
    if name == "too long":
        assert "10000" in err["message"] and "4096" in err["message"]
    if name == "prompt over context":
        assert "4195" in err["message"] and "4096" in err["message"]
    # OpenAI's code for a request past the context (agent harnesses compact the conversation on it)
    assert (err["code"] == "context_length_exceeded") == (name in ("too long", "prompt over context"))


def test_apply_template_gives_the_prompt_text_the_chat_route_tokenizes(server):
    """llama.cpp's /apply-template: the chat template's text for a conversation, which /tokenize turns into the
    prompt /v1/chat/completions counts."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r = httpx.post(server.base + "/apply-template", json={"messages": msgs}, timeout=30)
    text = r.json()["prompt"]
    assert r.status_code == 200 and "Be brief." in text and text.rstrip().endswith(("assistant", "assistant\n"))
    ids = httpx.post(server.base + "/tokenize", json={"content": text, "parse_special": True}, timeout=30).json()
    usage = server.client().chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=1).usage
    assert ids["count"] == usage.prompt_tokens
    r = httpx.post(server.base + "/apply-template", json={"messages": "hi"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_a_chat_past_the_context_is_context_length_exceeded(server):
    """OpenAI's answer to a conversation longer than the context: 400, code context_length_exceeded, the counts
    named (agent harnesses compact the conversation when they see it)."""
    r = httpx.post(server.base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x " * 5000}]},
                   timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "4096" in err["message"] and "tokens" in err["message"]


@pytest.mark.parametrize("messages,param", [
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([], "messages"),
    ("hello", "messages"),
])
def test_bad_chat_requests(server, messages, param):
    r = httpx.post(server.base + "/v1/chat/completions", json={"messages": messages}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_server_keeps_serving_after_bad_input(server):
    for _name, body, ctype, _, _ in BAD:
        httpx.post(server.base + "/v1/completions", content=body, headers={"Content-Type": ctype}, timeout=30)
    r = server.client().completions.create(model="tiny-llama", prompt="ok", max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_unknown_route_is_json_404(server):
    r = httpx.get(server.base + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_metrics_exposition(server):
    server.client().completions.create(model="tiny-llama", prompt="m", max_tokens=2)
    text = httpx.get(server.base + "/metrics").text
    for name in ("edgeinfer_requests_total", "edgeinfer_prompt_tokens_total", "edgeinfer_completion_tokens_total",
                 "edgeinfer_time_to_first_token_seconds_bucket", "edgeinfer_time_per_output_token_seconds_bucket",
                 "edgeinfer_running_sequences", "edgeinfer_waiting_sequences", "edgeinfer_kv_blocks_used",
                 "edgeinfer_prefix_cache_hit_rate", "edgeinfer_preemptions_total",
                 "edgeinfer_prefix_cache_queries_total", "edgeinfer_prefix_cache_hits_total"):
        assert name in text, name


def test_prefix_cache_counters_count_a_repeated_prompt(server):
    """Counters, not only the lifetime hit rate: a load test takes the hit rate of its own run from them."""
    prompt = [7 + (i % 50) for i in range(40)]  # two full blocks of 16 and a partial one
    q0, h0 = server.metric("edgeinfer_prefix_cache_queries_total"), server.metric("edgeinfer_prefix_cache_hits_total")
    for _ in range(2):
        server.client().completions.create(model="tiny-llama", prompt=prompt, max_tokens=1)
    q1, h1 = server.metric("edgeinfer_prefix_cache_queries_total"), server.metric("edgeinfer_prefix_cache_hits_total")
    assert q1 - q0 == 4 and h1 - h0 == 2  # the second request finds both full blocks


def test_api_key(tiny_llama_path):
    s = Server(tiny_llama_path, env={"EDGEINFER_API_KEY": "sekret"}).wait_ready()
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        assert httpx.get(s.base + "/v1/models").status_code == 401
        assert [m.id for m in s.client(api_key="sekret").models.list().data if m.status == "loaded"] == ["tiny-llama"]
        assert httpx.get(s.base + "/health").status_code == 200  # health needs no key
    finally:
        s.stop()


def test_queue_limit_answers_503_with_retry_after(tiny_llama_path):
    s = Server(tiny_llama_path, "--max-queue", "0", "--max-seqs", "1").wait_ready()
    try:
        with s.long_stream():
            r2 = None
            for _ in range(20):  # the second request waits behind the first: with no queue room, 503
                r2 = httpx.post(s.base + "/v1/completions", json={"prompt": "x", "max_tokens": 50}, timeout=30)
                if r2.status_code == 503:
                    break
            assert r2.status_code == 503 and r2.headers["retry-after"] == "1"
    finally:
        s.stop()


def test_priority_field_orders_waiting_requests(tiny_llama_path):
    """One slot: while a long stream holds it, a normal request then an urgent one wait; when the slot
    frees, the urgent one (lower priority value) runs first, though it came second."""
    s = Server(tiny_llama_path, "--max-seqs", "1").wait_ready()
    first_token = {}

    def request(name, priority):
        body = {"prompt": "the hen", "max_tokens": 40, "stream": True, "temperature": 0, "ignore_eos": True}
        if priority is not None:
            body["priority"] = priority
        with httpx.Client(timeout=60) as h, h.stream("POST", s.base + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {") and name not in first_token:
                    first_token[name] = time.perf_counter()

    try:
        with s.long_stream():
            threads = [threading.Thread(target=request, args=("normal", None))]
            threads[0].start()
            while s.metric("edgeinfer_waiting_sequences") < 1:
                time.sleep(0.01)
            threads.append(threading.Thread(target=request, args=("urgent", -5)))
            threads[1].start()
            while s.metric("edgeinfer_waiting_sequences") < 2:
                time.sleep(0.01)
        # the long stream is closed: its slot goes to the urgent request
        for t in threads:
            t.join(60)
        assert first_token["urgent"] < first_token["normal"]
    finally:
        s.stop()


def test_tokenize_and_detokenize(server):
    r = httpx.post(server.base + "/tokenize", json={"content": "the hen"})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert ids and r.json()["count"] == len(ids)
    vllm_style = httpx.post(server.base + "/tokenize", json={"model": "tiny-llama", "prompt": "the hen",
                                                               "add_special_tokens": False}).json()
    assert vllm_style["tokens"] == ids
    with_bos = httpx.post(server.base + "/tokenize", json={"content": "the hen", "add_special": True}).json()["tokens"]
    assert with_bos == ids  # the tiny model's GGUF says add_bos_token false: as the file says
    back = httpx.post(server.base + "/detokenize", json={"tokens": ids}).json()
    assert back["content"] == back["prompt"] == "the hen"
    assert httpx.post(server.base + "/tokenize", json={"content": 5}).status_code == 400
    wrong_model = httpx.post(server.base + "/tokenize", json={"content": "x", "model": 5})
    assert wrong_model.status_code == 400 and wrong_model.json()["error"]["param"] == "model"
    assert httpx.post(server.base + "/detokenize", json=[1, 2]).status_code == 400  # not an object
    bad = httpx.post(server.base + "/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_graceful_shutdown_finishes_in_flight_and_exits_zero(tiny_llama_path):
    # time enough for the 300 tokens on a loaded 2-core CI machine (the default 10 s cut one short there: a 500)
    s = Server(tiny_llama_path, "--shutdown-timeout", "60").wait_ready()
    result = {}

    def long_request():
        r = httpx.post(s.base + "/v1/completions", json={"prompt": "the", "max_tokens": 300, "temperature": 0, "ignore_eos": True},
                       timeout=60)
        result["status"] = r.status_code

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(90) == 0
    t.join(30)
    assert result.get("status") == 200


def test_host_warning_and_unknown_model(tmp_path):
    env = {**os.environ, "EDGEINFER_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "serve", "no-such-model"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 1 and "Known names" in r.stderr and "Traceback" not in r.stderr


def test_health_is_503_while_loading(tiny_llama_path, monkeypatch):
    from starlette.testclient import TestClient

    from edgeinfer.server import app as server_app

    release = threading.Event()
    original = server_app.ServedModel.load

    def slow_load(self):
        release.wait(30)
        original(self)

    monkeypatch.setattr(server_app.ServedModel, "load", slow_load)
    app = server_app.create_app(server_app.ServerConfig(models=[str(tiny_llama_path)]))
    with TestClient(app) as client:
        assert client.get("/health").status_code == 503
        # a request for the model while it loads waits for it, then is answered
        answer = {}
        waiting = threading.Thread(target=lambda: answer.setdefault("r", client.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 2})))
        waiting.start()
        time.sleep(0.3)
        assert "r" not in answer and client.get("/health").status_code == 503
        release.set()
        waiting.join(60)
        assert answer["r"].status_code == 200, answer["r"].text
        assert client.get("/health").status_code == 200


def test_several_models_routed_by_name(tiny_llama_path, tiny_gemma3_path):
    s = Server(tiny_llama_path, tiny_gemma3_path).wait_ready()
    try:
        c = s.client()
        assert sorted(m.id for m in c.models.list().data if m.status == "loaded") == ["tiny-gemma3", "tiny-llama"]
        for name in ("tiny-llama", "tiny-gemma3"):
            r = c.completions.create(model=name, prompt="the", max_tokens=3, temperature=0)
            assert r.model == name and r.usage.completion_tokens >= 1
        r = httpx.post(s.base + "/v1/completions", json={"model": "other", "prompt": "x"})
        assert r.status_code == 404 and "tiny-llama" in r.text and "tiny-gemma3" in r.text
    finally:
        s.stop()


def test_cors_only_when_asked(server, tiny_llama_path):
    headers = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in httpx.options(server.base + "/v1/completions", headers=headers).headers
    s = Server(tiny_llama_path, "--cors-origin", "http://app.example").wait_ready()
    try:
        r = httpx.options(s.base + "/v1/completions", headers=headers)
        assert r.headers.get("access-control-allow-origin") == "http://app.example"
    finally:
        s.stop()


def test_request_timeout_answers_504_and_frees_blocks(tiny_llama_path):
    s = Server(tiny_llama_path, "--request-timeout", "0.5").wait_ready()
    try:
        r = httpx.post(s.base + "/v1/completions", timeout=30,
                       json={"prompt": "the", "max_tokens": 4000, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 504 and "longer than 0.5 s" in r.json()["error"]["message"]
        assert s.wait_blocks_freed(2.0)
    finally:
        s.stop()


def test_binding_every_address_warns(tiny_llama_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer.cli.main", "serve", str(tiny_llama_path), "--host",
                             "0.0.0.0", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("warning: binding 0.0.0.0") and "no API key" in first
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_streamed_request_times_out_too(tiny_llama_path):
    s = Server(tiny_llama_path, "--request-timeout", "0.5").wait_ready()
    try:
        body = {"prompt": "the", "max_tokens": 4000, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=30) as h, h.stream("POST", s.base + "/v1/completions", json=body) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert '"timeout_error"' in events[-2] and events[-1] == "data: [DONE]"  # an error event, then the end
        assert s.wait_blocks_freed(2.0)
    finally:
        s.stop()


# -- structured output and tools -----------------------------------------------------------------

CITY = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 10},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}
WEATHER_TOOLS = [{"type": "function", "function": {"name": "forecast", "description": "Weather forecast",
                                                   "parameters": CITY}},
                 {"type": "function", "function": {"name": "noop", "description": "Does nothing"}}]


def test_response_format_json_schema_streamed_and_not(server):
    import jsonschema

    c = server.client()
    kw = dict(model="tiny-llama", messages=[{"role": "user", "content": "forecast?"}], temperature=1.0, seed=7,
              max_tokens=80, response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": CITY}})
    r = c.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**kw, stream=True)
                       if ch.choices)
    assert streamed == r.choices[0].message.content
    r = c.chat.completions.create(**{**kw, "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_vllm_structured_output_fields(server):
    c = server.client()
    r = c.completions.create(model="tiny-llama", prompt="n:", max_tokens=20, temperature=1.0, seed=1,
                             extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    compiles = server.metric("edgeinfer_grammar_compiles_total")
    for seed in (2, 3):  # the same constraint twice: compiled once
        r = c.completions.create(model="tiny-llama", prompt="pick:", max_tokens=20, temperature=1.0, seed=seed,
                                 extra_body={"guided_choice": ["alpha", "beta"]})
        assert r.choices[0].text in ("alpha", "beta")
    assert server.metric("edgeinfer_grammar_compiles_total") == compiles + 1
    chunks = c.completions.create(model="tiny-llama", prompt="g:", max_tokens=20, stream=True,
                                  extra_body={"guided_grammar": 'root ::= "ok" [0-9]'})
    assert re.fullmatch("ok[0-9]", "".join(ch.choices[0].text for ch in chunks if ch.choices))


def _accumulate_tool_deltas(chunks):
    """What OpenAI's clients do with streamed tool calls: join each index's argument fragments."""
    calls, reason = {}, None
    for ch in chunks:
        if not ch.choices:
            continue
        reason = ch.choices[0].finish_reason or reason
        for d in ch.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = d.id or call["id"]
            if d.function is not None:
                call["name"] = d.function.name or call["name"]
                call["arguments"] += d.function.arguments or ""
    return [calls[i] for i in sorted(calls)], reason


def test_tool_call_round_trip_streamed_and_not(server):
    import jsonschema

    c = server.client()
    msgs = [{"role": "user", "content": "weather in Oslo for 3 days?"}]
    kw = dict(model="tiny-llama", messages=msgs, tools=WEATHER_TOOLS, temperature=1.0, seed=5, max_tokens=120,
              tool_choice={"type": "function", "function": {"name": "forecast"}})
    r = c.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "forecast" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), CITY)
    streamed, reason = _accumulate_tool_deltas(c.chat.completions.create(**kw, stream=True))
    assert reason == "tool_calls"
    assert [(s["name"], s["arguments"]) for s in streamed] == [("forecast", call.function.arguments)]
    assert streamed[0]["id"].startswith("call_")
    # the result goes back as a tool message, and the conversation goes on
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 4}'}]
    r2 = c.chat.completions.create(model="tiny-llama", messages=follow, tools=WEATHER_TOOLS, max_tokens=8,
                                   temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens
    r3 = c.chat.completions.create(**{**kw, "tool_choice": "required"})
    assert r3.choices[0].finish_reason == "tool_calls"
    for tc in r3.choices[0].message.tool_calls:
        assert tc.function.name in ("forecast", "noop") and isinstance(json.loads(tc.function.arguments), dict)


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, "tools[0].function.name"),
    ({"tools": WEATHER_TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"tools": WEATHER_TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": "x"}]}, "messages[0].tool_calls"),
])
def test_bad_structured_requests_are_400_naming_the_field(server, body, param):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **body}
    r = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert server.wait_blocks_freed(5)


def test_speculative_decoding_through_the_server(tiny_llama_path, tiny_gemma3_path, tmp_path):
    """A draft model for one served model (TARGET=DRAFT) and prompt lookup for the other: greedy replies,
    streamed and not, are those of the model alone, and /metrics counts proposed and accepted tokens."""
    from gguf.constants import GGMLQuantizationType as T
    from tiny_models import write_tiny_llama

    from edgeinfer import LLM, SamplingParams

    draft = tmp_path / "tiny-draft.gguf"
    write_tiny_llama(draft, qtype=T.Q4_0, n_ctx=4096, dim=256, n_head=4, n_kv=2, ffn=1024, n_layer=8)
    prompt = "the hen the hen the hen the"
    want = {p.stem: LLM(str(p), progress=False).generate(prompt, SamplingParams(temperature=0, max_tokens=24,
                                                                                ignore_eos=True))[0].text
            for p in (tiny_llama_path, tiny_gemma3_path)}
    s = Server(tiny_llama_path, tiny_gemma3_path, "--draft-model", f"tiny-llama={draft}", "--speculate", "lookup"
               ).wait_ready()
    try:
        c = s.client()
        for name in ("tiny-llama", "tiny-gemma3"):
            kw = dict(model=name, prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
            assert c.completions.create(**kw).choices[0].text == want[name]
            streamed = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **kw))
            assert streamed == want[name]
            assert s.metric(f'edgeinfer_spec_proposed_tokens_total{{model="{name}"') > 0
            assert s.metric(f'edgeinfer_spec_accepted_tokens_total{{model="{name}"') > 0
        assert s.wait_blocks_freed(5)
    finally:
        s.stop()


@pytest.mark.parametrize("args, message", [
    (["--draft-model", "nobody=x.gguf"], "not one of the served models"),
    (["--draft-tokens", "3"], "--draft-tokens needs"),
    (["--draft-model", "no-such-draft-model"], "no-such-draft-model"),
])
def test_bad_speculation_options_fail_before_serving(tiny_llama_path, args, message):
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "serve", str(tiny_llama_path), *args,
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr


def test_embeddings_route(tiny_nomic_path, tiny_llama_path):
    """/v1/embeddings through the openai client: an encoder (tiny nomic-bert) and a generative model side by
    side; float and base64, dimensions, usage; and the 400s: generation from the encoder, bad input."""
    import base64

    import numpy as np

    from edgeinfer import LLM

    enc_path = tiny_nomic_path
    texts = ["search_query: the hen sat", "the dog ran on the mat."]
    want = LLM(str(enc_path), progress=False).embed(texts)
    s = Server(enc_path, tiny_llama_path).wait_ready()
    try:
        c = s.client()
        r = c.embeddings.create(model="tiny-nomic", input=texts)
        got = np.array([d.embedding for d in r.data], np.float32)
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens == r.usage.total_tokens > 0
        r = httpx.post(s.base + "/v1/embeddings", json={"model": "tiny-nomic", "input": texts[0],
                                                        "encoding_format": "base64", "dimensions": 16})
        assert r.status_code == 200, r.text
        v = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
        cut = want[0][:16] / np.linalg.norm(want[0][:16])
        np.testing.assert_allclose(v, cut, atol=1e-5)
        ids = LLM(str(enc_path), progress=False).tokenize(texts[1], add_bos=None)
        r = c.embeddings.create(model="tiny-nomic", input=[ids])  # token ids
        np.testing.assert_allclose(r.data[0].embedding, want[1], atol=1e-5)
        r = c.embeddings.create(model="tiny-llama", input="the hen")  # a generative model's hidden state
        assert len(r.data[0].embedding) == 256 and abs(np.linalg.norm(r.data[0].embedding) - 1) < 1e-5
        assert c.completions.create(model="tiny-llama", prompt="the", max_tokens=3).usage.completion_tokens >= 1
        for body, param in [({"model": "tiny-nomic"}, "input"), ({"model": "tiny-nomic", "input": []}, "input"),
                            ({"model": "tiny-nomic", "input": [""]}, "input"),
                            ({"model": "tiny-nomic", "input": "x", "encoding_format": "hex"}, "encoding_format"),
                            ({"model": "tiny-nomic", "input": "x", "dimensions": 4096}, "dimensions"),
                            ({"model": "tiny-nomic", "input": [[10**7]]}, "input"),
                            ({"model": "tiny-nomic", "input": " ".join(["hen"] * 300)}, "input")]:
            r = httpx.post(s.base + "/v1/embeddings", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        r = httpx.post(s.base + "/v1/completions", json={"model": "tiny-nomic", "prompt": "the"})
        assert r.status_code == 400 and "embedding model" in r.text and r.json()["error"]["param"] == "model"
        r = httpx.post(s.base + "/v1/embeddings", json={"model": "tiny-nomic", "input": " ".join(["hen"] * 300),
                                                        "truncate": True})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 128
        text = httpx.get(s.base + "/metrics").text
        assert re.search(r'^edgeinfer_requests_total\{[^}]*endpoint="embeddings"[^}]*model="tiny-nomic"[^}]*status="200"'
                         r'\} [3-9]', text, re.M) or print(text[-3000:])
        assert httpx.get(s.base + "/health").status_code == 200
    finally:
        s.stop()

"""`edgeinfer bench-serve`: the load generator against a fake OpenAI server with deterministic timing,
its arrival process and arithmetic checked by hand, and its prompts against the real tokenizers."""

import asyncio
import json
import math
import socket
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from edgeinfer.bench import serve as bs

uvicorn = pytest.importorskip("uvicorn")
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

TTFT = 0.05  # the fake server's time to the first token, then one token every STEP seconds
STEP = 0.01


class FakeServer:
    """An OpenAI-style streaming server: words are tokens; the model name picks a behaviour:
    'ok', 'fail500' (HTTP 500), 'drop' (the stream stops after two tokens, no [DONE]), 'hang' (never
    answers). It records every body and the most requests it had in flight at once. /health answers
    from the queue `health` of (status, body), one a call, and 404 (no /health) once it is empty."""

    def __init__(self):
        self.bodies = []
        self.health = []
        self.health_calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.served = 0
        app = Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"]),
                                Route("/v1/chat/completions", self.completions, methods=["POST"]),
                                Route("/v1/models", self.models), Route("/tokenize", self.tokenize, methods=["POST"]),
                                Route("/detokenize", self.detokenize, methods=["POST"]),
                                Route("/metrics", self.metrics), Route("/health", self.health_route)])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            assert time.time() - t0 < 10
            time.sleep(0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(5)

    async def health_route(self, request):
        self.health_calls += 1
        if not self.health:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        status, body = self.health.pop(0)
        return JSONResponse(body, status_code=status)

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [{"id": "ok", "object": "model"}]})

    async def tokenize(self, request):
        body = await request.json()
        return JSONResponse({"tokens": list(range(len(body["content"].split())))})

    async def detokenize(self, request):
        body = await request.json()
        words = FakeServer.words
        return JSONResponse({"content": " ".join(words[i % len(words)] for i in body["tokens"])})

    words = None

    async def metrics(self, request):
        return PlainTextResponse("# HELP fake_prefix_hits Prefix hits\n# TYPE fake_prefix_hits counter\n"
                                 f"fake_prefix_hits_total {self.served}\n"
                                 "# HELP fake_kv_used KV in use\n# TYPE fake_kv_used gauge\n"
                                 f"fake_kv_used {self.in_flight}\n"
                                 "# HELP other_thing ignored\n# TYPE other_thing gauge\nother_thing 1\n")

    async def completions(self, request: Request):
        body = await request.json()
        self.bodies.append(body)
        mode = body.get("model", "ok")
        if mode == "fail500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        n = body["max_tokens"]
        chat = "messages" in body

        async def events():
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if mode == "hang":
                    await asyncio.sleep(3600)
                if chat:
                    yield 'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
                await asyncio.sleep(TTFT)
                for i in range(n):
                    if i:
                        await asyncio.sleep(STEP)
                    if mode == "drop" and i == 2:
                        raise RuntimeError("dropped")  # uvicorn closes the connection mid-stream
                    piece = {"delta": {"content": f" w{i}"}} if chat else {"text": f" w{i}"}
                    finish = "length" if i == n - 1 else None
                    yield "data: " + json.dumps({"choices": [{"index": 0, **piece, "finish_reason": finish}]}) + "\n\n"
                yield "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}) + "\n\n"
                yield "data: [DONE]\n\n"
                self.served += 1
            finally:
                self.in_flight -= 1

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def fake():
    FakeServer.words = bs.bundled_text().split()
    s = FakeServer()
    yield s
    s.stop()


def run(cfg, rates):
    return asyncio.run(bs.bench_serve(cfg, rates))


# -- arrivals --------------------------------------------------------------------------------------


def test_poisson_arrivals_have_the_asked_rate_and_spread():
    t = bs.arrival_offsets(4000, rate=4.0, burstiness=1.0, seed=3)
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert abs(len(gaps) / t[-1] - 4.0) < 4.0 * 0.05  # mean rate within 5%
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.08  # exponential gaps: coefficient of variation 1
    np.testing.assert_array_equal(t, bs.arrival_offsets(4000, 4.0, 1.0, seed=3))  # seeded
    assert not np.array_equal(t, bs.arrival_offsets(4000, 4.0, 1.0, seed=4))


def test_bursty_arrivals_keep_the_rate_and_cluster():
    gaps = np.diff(bs.arrival_offsets(4000, rate=2.0, burstiness=0.25, seed=0))
    assert abs(1 / gaps.mean() - 2.0) < 2.0 * 0.1
    assert abs(gaps.std() / gaps.mean() - 2.0) < 0.25  # gamma with shape k: CV = 1/sqrt(k) = 2
    steady = np.diff(bs.arrival_offsets(4000, rate=2.0, burstiness=4.0, seed=0))
    assert abs(steady.std() / steady.mean() - 0.5) < 0.06


def test_infinite_rate_sends_everything_at_once_and_bad_rates_are_refused():
    assert np.array_equal(bs.arrival_offsets(5, math.inf), np.zeros(5))
    assert bs.parse_rates("0.5, 1,inf") == [0.5, 1.0, math.inf]
    for bad in ("fast", "0", "-1", "", "nan"):
        with pytest.raises(bs.BenchServeError, match="rate"):
            bs.parse_rates(bad)


# -- arithmetic ------------------------------------------------------------------------------------


def _r(label, ttft, e2e, out, itl, ok=True, error=None):
    return bs.RequestResult(label=label, input_len=10, start=0.0, ok=ok, error=error, ttft=ttft, e2e=e2e,
                            output_tokens=out, itl=itl)


def test_summary_arithmetic_by_hand():
    rs = [_r("a", 0.1, 0.5, 5, [0.1, 0.1, 0.1, 0.1]),      # TPOT (0.5-0.1)/4 = 0.1
          _r("a", 0.3, 1.3, 11, [0.05, 0.15] * 5),           # TPOT (1.3-0.3)/10 = 0.1
          _r("b", 0.2, 0.2, 1, []),                          # one token: no TPOT
          _r("b", None, None, 0, [], ok=False, error="http_500"),
          _r("b", None, None, 0, [], ok=False, error="timeout")]
    s = bs.summarize(rs, duration=2.0, slo_ttft_ms=250, slo_tpot_ms=120)
    assert (s["num_requests"], s["completed"], s["errors"]) == (5, 3, 2)
    assert s["errors_by_kind"] == {"http_500": 1, "timeout": 1}
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["total_output_tokens"] == 17 and s["output_tok_s"] == pytest.approx(8.5)
    assert s["total_input_tokens"] == 30 and s["total_tok_s"] == pytest.approx(23.5)
    # TTFT 100, 200, 300 ms: mean 200, linear percentiles: p50 200, p90 280, p99 298
    assert s["ttft_ms_mean"] == pytest.approx(200)
    assert (s["ttft_ms_p50"], s["ttft_ms_p90"], s["ttft_ms_p99"]) == pytest.approx((200, 280, 298))
    assert s["tpot_ms_mean"] == pytest.approx(100) and s["tpot_ms_p99"] == pytest.approx(100)
    itl = [100] * 4 + [50, 150] * 5
    assert s["itl_ms_mean"] == pytest.approx(np.mean(itl)) and s["itl_ms_p50"] == pytest.approx(100)
    assert s["itl_ms_p99"] == pytest.approx(np.percentile(itl, 99)) and s["itl_ms_p99"] == pytest.approx(150)
    assert (s["e2e_ms_p50"], s["e2e_ms_mean"]) == pytest.approx((500, 2000 / 3))
    # SLOs: TTFT <= 250 ms keeps the first and third (the third has no TPOT to break); failures never count
    assert s["good_requests"] == 2 and s["goodput"] == pytest.approx(1.0)
    assert s["by_label"]["a"]["completed"] == 2 and s["by_label"]["b"]["requests"] == 3
    assert s["by_label"]["b"]["ttft_ms_mean"] == pytest.approx(200)
    assert bs.summarize(rs, 2.0, slo_tpot_ms=90)["good_requests"] == 1  # only the one-token request
    assert bs.summarize(rs, 2.0)["goodput"] == pytest.approx(1.5)  # no SLO: every completed request
    empty = bs.summarize([_r("a", None, None, 0, [], ok=False, error="connect")], 1.0)
    assert empty["completed"] == 0 and empty["ttft_ms_p99"] is None and empty["goodput"] == 0
    json.dumps(empty)  # JSON-clean: no NaN


def test_goodput_knee_is_the_highest_rate_within_both_limits():
    def run(rate, ttft, tpot, errors=0):
        return {"request_rate": rate, "errors": errors, "completed": 10, "ttft_ms_p99": ttft, "tpot_ms_p99": tpot}

    runs = [run(0.5, 300, 40), run(1, 900, 60), run(2, 1900, 99), run(3, 2500, 80), run(4, 1000, 150)]
    assert bs.goodput_knee(runs) == 2
    assert bs.goodput_knee(runs, slo_ttft_ms=1000) == 1
    assert bs.goodput_knee([run(1, 100, 10, errors=1)]) is None
    assert bs.goodput_knee(runs + [run("inf", 1500, 90)]) == math.inf  # summaries write the infinite rate "inf"


def test_prometheus_deltas_and_peaks():
    w = bs.MetricsWatcher(None, "http://x")
    w.first = bs.parse_metrics("# TYPE a_kv_hits counter\na_kv_hits_total 5\n# TYPE kv_used gauge\nkv_used 1\n")
    for used in (7, 3):
        w.last = bs.parse_metrics(f"# TYPE a_kv_hits counter\na_kv_hits_total 12\n# TYPE kv_used gauge\nkv_used {used}\n")
        for k, (_, v) in w.last.items():
            w.peaks[k] = max(v, w.peaks.get(k, v))
    assert w.report() == {"a_kv_hits_total": {"delta": 7.0}, "kv_used": {"peak": 7.0, "last": 3.0}}
    assert bs.parse_metrics("not { prometheus") == {}


# -- against the fake server -----------------------------------------------------------------------


def test_closed_loop_timing_against_a_server_with_known_timing(fake):
    fake.max_in_flight = 0
    cfg = bs.BenchConfig(base_url=fake.base + "/v1", num_prompts=8, concurrency=2, input_len=12, output_len=6,
                         warmup=1, progress=False)
    runs, info = run(cfg, [math.inf])
    s = runs[0]
    assert s["completed"] == 8 and s["errors"] == 0 and fake.max_in_flight == 2
    assert info["tokenizer"] == "server /tokenize" and cfg.model == "ok"  # the first of /v1/models
    assert s["total_output_tokens"] == 48 and s["total_input_tokens"] == 8 * 12
    assert TTFT <= s["ttft_ms_p50"] / 1000 < TTFT + 0.04
    assert STEP <= s["tpot_ms_p50"] / 1000 < STEP + 0.01
    assert STEP * 0.8 <= s["itl_ms_p50"] / 1000 < STEP + 0.01
    e2e = TTFT + 5 * STEP
    assert e2e <= s["e2e_ms_p50"] / 1000 < e2e + 0.05
    # closed loop of 2: four rounds of one request's time
    assert 4 * e2e <= s["duration_s"] < 4 * e2e + 0.5
    assert s["server_metrics"]["fake_prefix_hits_total"]["delta"] == 8  # warm-up excluded
    assert s["server_metrics"]["fake_kv_used"]["last"] == 0 and "other_thing" not in s["server_metrics"]
    body = fake.bodies[-1]
    assert body["stream"] and body["max_tokens"] == 6 and body["ignore_eos"] and "priority" not in body
    assert len(body["prompt"].split()) == 12  # the fake tokenizer's words: exactly input-len tokens


def test_poisson_run_paces_requests(fake):
    cfg = bs.BenchConfig(base_url=fake.base, model="ok", num_prompts=12, input_len=4, output_len=2, warmup=0,
                         seed=5, progress=False)
    t0 = time.perf_counter()
    s = run(cfg, [20.0])[0][0]
    wall = time.perf_counter() - t0
    last = bs.arrival_offsets(12, 20.0, 1.0, 5)[-1]
    assert s["completed"] == 12 and s["duration_s"] >= last and wall >= last


@pytest.mark.parametrize("mode,kind", [("fail500", "http_500"), ("drop", "disconnected"), ("hang", "timeout")])
def test_failures_are_counted_by_kind(fake, mode, kind):
    cfg = bs.BenchConfig(base_url=fake.base, model=mode, num_prompts=3, input_len=4, output_len=5, warmup=0,
                         timeout=0.5, progress=False)
    t0 = time.perf_counter()
    s = run(cfg, [math.inf])[0][0]
    assert s["completed"] == 0 and s["errors"] == 3 and s["errors_by_kind"] == {kind: 3}
    assert s["goodput"] == 0 and time.perf_counter() - t0 < 5


def test_warmup_failure_and_unreachable_server_are_clear_errors(fake):
    with pytest.raises(bs.BenchServeError, match="warm-up request failed .http_500"):
        run(bs.BenchConfig(base_url=fake.base, model="fail500", num_prompts=1, input_len=4, output_len=2,
                           progress=False), [1.0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(bs.BenchServeError, match="cannot reach"):
        run(bs.BenchConfig(base_url=f"http://127.0.0.1:{port}", num_prompts=1, progress=False), [1.0])


# -- a server still loading its model ---------------------------------------------------------------

LOADING = (503, {"status": "loading", "loading": ["tiny-llama"]})


def test_a_loading_server_is_waited_for_and_named_once(fake):
    fake.health, fake.health_calls = [LOADING] * 3 + [(200, {"status": "ok", "models": ["ok"]})], 0
    notes = []

    async def go():
        import httpx

        async with httpx.AsyncClient() as client:
            return await bs.wait_until_ready(client, fake.base, wait=10, notify=notes.append, interval=0.05)

    t0 = time.perf_counter()
    body = asyncio.run(go())
    assert body == {"status": "ok", "models": ["ok"]} and fake.health_calls == 4
    assert len(notes) == 1 and "still loading model tiny-llama" in notes[0] and fake.base in notes[0]
    assert "10 s" in notes[0] and time.perf_counter() - t0 < 5


def test_cli_runs_once_the_server_has_loaded(fake):
    from edgeinfer.cli.main import main

    fake.health = [LOADING] * 2 + [(200, {"status": "ok", "models": ["ok"]})]
    res = CliRunner().invoke(main, ["bench-serve", "--base-url", fake.base, "--num-prompts", "2", "--input-len", "4",
                                    "--output-len", "2", "--warmup", "0", "--quiet", "--json", "--wait", "20"])
    assert res.exit_code == 0, res.output
    assert res.output.count("still loading model tiny-llama") == 1
    assert json.loads(res.output.strip().splitlines()[-1])["completed"] == 2 and not fake.health


def test_a_server_that_never_loads_fails_after_the_wait(fake):
    fake.health = [LOADING] * 1000
    t0 = time.perf_counter()
    with pytest.raises(bs.BenchServeError) as e:
        run(bs.BenchConfig(base_url=fake.base, num_prompts=1, wait=0.6, progress=False), [1.0])
    took = time.perf_counter() - t0
    msg = str(e.value)
    assert f"the server at {fake.base} is not ready after 0.6 s (--wait)" in msg and "tiny-llama" in msg
    assert 0.6 <= took < 4 and "\n" not in msg
    fake.health = []


def test_a_failed_load_and_a_dead_port_fail_at_once(fake):
    from edgeinfer.cli.main import main

    fake.health = [(500, {"status": "error", "errors": {"tiny-llama": "not a GGUF file: bad magic"}})]
    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["bench-serve", "--base-url", fake.base, "--quiet", "--wait", "60"])
    assert res.exit_code == 1 and time.perf_counter() - t0 < 5
    assert f"error: the server at {fake.base} failed to load: tiny-llama: not a GGUF file: bad magic" in res.output
    assert "Traceback" not in res.output and not fake.health

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["bench-serve", "--base-url", f"http://127.0.0.1:{port}/v1", "--quiet"])
    assert res.exit_code == 1 and time.perf_counter() - t0 < 5  # the default --wait is 300 s: not waited
    assert f"cannot reach http://127.0.0.1:{port}: nothing listens there" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_our_server_is_waited_for_while_it_loads(tiny_llama_path, monkeypatch):
    """Against the real server app: its /health says loading (a load held back) until the model is in."""
    import httpx

    from edgeinfer.server import app as server_app

    release = threading.Event()
    original = server_app.ServedModel.load

    def slow_load(self):
        release.wait(30)
        original(self)

    monkeypatch.setattr(server_app.ServedModel, "load", slow_load)
    app = server_app.create_app(server_app.ServerConfig(models=[str(tiny_llama_path)]))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    notes = []

    def notify(line):
        notes.append(line)
        release.set()  # the load may finish once the wait has seen it loading

    async def go():
        async with httpx.AsyncClient() as client:
            return await bs.wait_until_ready(client, f"http://127.0.0.1:{port}", wait=60, notify=notify,
                                             interval=0.05)

    try:
        t0 = time.time()
        while not server.started:
            assert time.time() - t0 < 10
            time.sleep(0.01)
        body = asyncio.run(go())
    finally:
        release.set()
        server.should_exit = True
        thread.join(10)
    assert body["status"] == "ok" and body["models"] == ["tiny-llama"]
    assert len(notes) == 1 and "still loading model tiny-llama" in notes[0]


def test_wait_must_not_be_negative():
    with pytest.raises(bs.BenchServeError, match="wait"):
        bs.BenchConfig(base_url="http://x", wait=-1)


def test_workloads_shape_the_requests(fake):
    fake.bodies.clear()
    cfg = bs.BenchConfig(base_url=fake.base, endpoint="chat", workload="priority", num_prompts=40, input_len=8,
                         output_len=2, warmup=0, priority_fraction=0.25, high_priority=-7, seed=1, progress=False)
    s = run(cfg, [math.inf])[0][0]
    prios = [b.get("priority") for b in fake.bodies]
    assert set(prios) == {None, -7} and 4 <= prios.count(-7) <= 18
    assert s["by_label"]["high"]["requests"] == prios.count(-7) and s["by_label"]["normal"]["completed"] > 0
    assert all(b["messages"][-1]["role"] == "user" for b in fake.bodies)

    fake.bodies.clear()
    cfg = bs.BenchConfig(base_url=fake.base, workload="shared-prefix", num_prompts=5, input_len=6, prefix_len=50,
                         output_len=2, warmup=0, progress=False)
    run(cfg, [math.inf])
    prefixes = {b["prompt"].split("\n\n")[0] for b in fake.bodies}
    questions = {b["prompt"].split("\n\n")[1] for b in fake.bodies}
    assert len(prefixes) == 1 and len(next(iter(prefixes)).split()) == 50 and len(questions) == 5

    fake.bodies.clear()
    cfg = bs.BenchConfig(base_url=fake.base, workload="mixed", num_prompts=60, input_len=20, output_len=10,
                         long_fraction=0.3, warmup=0, progress=False)
    s = run(cfg, [math.inf])[0][0]
    lens = [len(b["prompt"].split()) for b in fake.bodies]
    assert min(lens) >= 10 and max(lens) <= 80 and any(n >= 40 for n in lens) and any(n <= 20 for n in lens)
    assert set(s["by_label"]) == {"short", "long"}


def test_cli_sweep_writes_json_and_chart(fake, tmp_path):
    from edgeinfer.cli.main import main

    res = CliRunner().invoke(main, ["bench-serve", "--base-url", fake.base, "--num-prompts", "4", "--input-len", "5",
                                    "--output-len", "3", "--sweep", "50,inf", "--out", str(tmp_path), "--json",
                                    "--quiet", "--slo-ttft-ms", "1000"])
    assert res.exit_code == 0, res.output
    last = json.loads(res.output.strip().splitlines()[-1])
    for key in ("completed", "errors", "request_throughput", "output_tok_s", "ttft_ms_p50", "ttft_ms_p99",
                "tpot_ms_p50", "tpot_ms_p99", "itl_ms_p99", "e2e_ms_p99", "goodput"):
        assert key in last
    assert last["request_rate"] == "inf" and last["completed"] == 4
    pngs, jsons = list(tmp_path.glob("*.png")), list(tmp_path.glob("*.json"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 10_000 and pngs[0].read_bytes()[:4] == b"\x89PNG"
    record = json.loads(jsons[0].read_text())
    assert [r["request_rate"] for r in record["runs"]] == [50.0, "inf"] and "api_key" not in record["config"]
    assert "TTFT p99" in res.output


def test_cli_bad_values_are_one_line_errors(fake):
    from edgeinfer.cli.main import main

    res = CliRunner().invoke(main, ["bench-serve", "--base-url", fake.base, "--sweep", "1,fast"])
    assert res.exit_code == 1 and "request rate must be a number" in res.output
    res = CliRunner().invoke(main, ["bench-serve", "--base-url", fake.base, "--input-len", "100000", "--quiet"])
    assert res.exit_code == 1 and "longer than the bundled text" in res.output


# -- prompts cut to exact lengths with the real tokenizers -----------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gemma3-270m"])
def test_prompts_have_exact_token_lengths(model):
    from edgeinfer import registry

    try:
        registry.resolve(model, pull_missing=False)
    except Exception:
        pytest.fail(f"{model} is not pulled: run `edgeinfer pull {model}`")
    tok = bs.LocalTokenizer(model)
    cutter = bs.PromptCutter(tok)
    asyncio.run(cutter.prepare())
    rng = np.random.default_rng(0)
    for n in (1, 7, 32, 128, 300, 1000):
        for _ in range(5):
            text, got = asyncio.run(cutter.cut(n, rng))
            assert got == n and len(tok.tok.encode(text, add_bos=False)) == n

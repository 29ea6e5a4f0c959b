"""Fuzzing the HTTP API: schemathesis sends requests generated from the server's own /openapi.json
(valid ones, and ones that break the schema) to a real server; then hostile bodies and connections by hand.

Fails on any 5xx, a response that breaks the documented schema or status codes, an invalid request
accepted, a hang past the timeout, or a crash. Everything goes to 127.0.0.1.
"""

import json
import os
import socket
import time
import traceback
from pathlib import Path

import httpx
import pytest

from test_server import Server

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

EXAMPLES = 120  # per operation and mode: 20 operations x 2 modes (the GETs take no body, so fewer distinct)
# operations a generated request cannot get a 200 from: they name a model or a stored response that must exist
NAMED = ("/api/create", "/api/copy", "/api/delete", "/v1/responses/{rid}")


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    from tiny_models import QWEN_FIM_SPECIALS, write_tiny_llama

    p = tmp_path_factory.mktemp("fuzz") / "tiny-fuzz.gguf"
    # with FIM tokens, so that /infill and a completion's suffix are answered too
    write_tiny_llama(p, n_ctx=96, dim=64, n_head=2, n_kv=1, ffn=128, n_layer=2, extra_specials=QWEN_FIM_SPECIALS)
    # the request timeout is generous for the warm-up's compiles; the fuzzing holds each request to 25 s
    # its own model cache (the fuzzing creates and deletes models), the kernels compiled where they are
    home = tmp_path_factory.mktemp("fuzz-home")
    kernels = os.environ.get("NUMBA_CACHE_DIR") or str(Path(os.environ.get("EDGEINFER_HOME") or
                                                             Path.home() / ".cache" / "edgeinfer") / "kernels")
    s = Server(p, "--request-timeout", "600", "--read-timeout", "2",
               env={"EDGEINFER_HOME": str(home), "NUMBA_CACHE_DIR": kernels}).wait_ready()
    warm_up(s)
    yield s
    s.stop()
    out = s.proc.stdout.read()
    assert "Traceback" not in out, out


def warm_up(s) -> None:
    """One request down each compiled path (prefill, decode, logprobs, penalties, a grammar mask,
    embeddings), so that on a fresh clone Numba's first compiles do not count against the fuzzing's
    25 s per request."""
    for path, body in [
        ("/v1/completions", {"prompt": "hello", "max_tokens": 4, "logprobs": 2, "presence_penalty": 0.5}),
        ("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0.7, "seed": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                  "response_format": {"type": "json_object"}, "logprobs": True, "top_logprobs": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}),
        ("/v1/embeddings", {"input": ["hello", "world"]}),
    ]:
        r = httpx.post(s.base + path, json=body, timeout=900)
        assert r.status_code == 200, r.text


def test_openapi_document_is_the_validating_schema(fuzz_server):
    from edgeinfer.openai import schemas

    doc = httpx.get(fuzz_server.base + "/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == json.loads(json.dumps(schemas.CHAT))  # the very definition the server validates with
    assert body["properties"]["temperature"]["maximum"] == 2.0
    # a bound the document states is the bound the server enforces
    r = httpx.post(fuzz_server.base + "/v1/completions", json={"prompt": "x", "temperature": 2.0001})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert "2.0" in r.json()["error"]["message"]


def test_streamed_events_are_what_the_document_says_each_event_is(fuzz_server):
    # OpenAPI 3.1 has a text/event-stream `schema` describe one event ({data, event, id, retry}), as
    # schemathesis reads it: every event of a real stream must fit it, on both streaming routes
    import jsonschema

    doc = httpx.get(fuzz_server.base + "/openapi.json").json()
    for path, body in [("/v1/completions", {"prompt": "hello", "max_tokens": 3, "stream": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                                 "stream": True})]:
        event = doc["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
        r = httpx.post(fuzz_server.base + path, json=body, timeout=60)
        events = [{"data": line[len("data: "):]} for line in r.text.splitlines() if line.startswith("data: ")]
        assert len(events) >= 2 and events[-1] == {"data": "[DONE]"}
        for e in events:
            jsonschema.validate(e, event)


def fuzz(schema, base: str, examples: int, only: str | None = None) -> dict:
    """Send `examples` generated requests per operation and mode; {operation mode: {status: count}}."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                                   response_schema_conformance, status_code_conformance)

    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
              negative_data_rejection]
    seen: dict = {}
    for result in schema.get_all_operations():
        op = result.ok()
        if only and op.path != only:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if mode is GenerationMode.NEGATIVE and (op.method.upper() == "GET" or not len(op.body)):
                continue  # a GET, or a route with no body, takes nothing that could break its schema
            statuses = seen.setdefault(f"{op.method.upper()} {op.path} {mode.value}", {})

            @settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                t0 = time.monotonic()
                r = case.call_and_validate(base_url=base, checks=checks, timeout=30)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                assert time.monotonic() - t0 < 25, "a request hung past the request timeout"

            run()
    return seen


def test_schemathesis_finds_no_5xx_or_schema_violation(fuzz_server):
    doc = httpx.get(fuzz_server.base + "/openapi.json").json()
    seen = fuzz(schemathesis.openapi.from_dict(doc), fuzz_server.base, EXAMPLES)
    total = sum(sum(v.values()) for v in seen.values())
    print(f"schemathesis sent {total} requests; statuses by operation: {seen}")
    assert total >= 2000, seen
    for key, statuses in seen.items():  # valid requests got through to the model, invalid ones were refused
        if key.endswith("positive") and key.split()[1] in NAMED:  # refused or not found, never a 5xx
            assert set(statuses) <= {400, 403, 404}, (key, statuses)
        elif key.endswith("positive"):
            assert statuses.get(200, 0) > 0, (key, statuses)
        else:
            assert set(statuses) <= {400, 404, 413, 415}, (key, statuses)
    assert fuzz_server.proc.poll() is None, "the server died"
    assert fuzz_server.wait_blocks_freed(10), "KV blocks still in use after the fuzzing"


def test_the_fuzz_checks_catch_a_schema_violation(fuzz_server):
    """The same run against a document that promises a field the server never sends must fail."""
    doc = httpx.get(fuzz_server.base + "/openapi.json").json()
    ok = doc["paths"]["/v1/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    ok["required"] = ok["required"] + ["promised_but_missing"]
    with pytest.raises(BaseException) as e:  # schemathesis' FailureGroup is a BaseExceptionGroup
        fuzz(schemathesis.openapi.from_dict(doc), fuzz_server.base, 5, only="/v1/models")
    report = "".join(traceback.format_exception(e.value))
    assert "Response violates schema" in report and "promised_but_missing" in report


def test_logprobs_of_a_constrained_reply_are_json_numbers(fuzz_server):
    """A token the grammar masked has logprob -inf, which JSON cannot carry (it was a 500): -9999.0."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "logprobs": True, "top_logprobs": 20,
            "response_format": {"type": "json_object"}}
    r = httpx.post(fuzz_server.base + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    tops = [t["logprob"] for c in r.json()["choices"][0]["logprobs"]["content"] for t in c["top_logprobs"]]
    assert tops and -9999.0 in tops and all(-9999.0 <= lp <= 0 for lp in tops)


def raw(server, data: bytes, read_timeout: float = 10) -> bytes:
    """Send bytes on a fresh connection; what came back before the server closed it or went quiet."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def post(server, body: bytes, path="/v1/completions"):
    return httpx.post(server.base + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)


@pytest.mark.parametrize("name,body,needle", [
    ("deep nesting", b'{"prompt": "x", "stop": ' + b"[" * 5000 + b"]" * 5000 + b"}", "deep"),
    ("deeper than the decoder", b"[" * 200_000 + b"]" * 200_000, "deep"),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe"}', "UTF-8"),
    ("NaN", b'{"prompt": "x", "temperature": NaN}', "NaN"),
    ("Infinity", b'{"prompt": "x", "top_p": Infinity}', "Infinity"),
    ("overflowing number", b'{"prompt": "x", "temperature": 1e999}', "out of range"),
    ("duplicate keys", b'{"prompt": "x", "prompt": "y"}', "twice"),
    ("huge model name", json.dumps({"prompt": "x", "model": "m" * 3_000_000}).encode(), "at most 256"),
    ("lone surrogate", b'{"prompt": "a\\ud800b"}', "surrogate"),
    ("lone surrogate in a key", b'{"prompt": "x", "\\udfff": 1}', "surrogate"),
])
def test_hostile_bodies_get_a_clear_400(fuzz_server, name, body, needle):
    r = post(fuzz_server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and len(err["message"]) < 500, err


def test_headers_too_large_and_garbage_requests(fuzz_server):
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    out = raw(fuzz_server, big)  # over h11's 16 KiB limit on a request head
    assert out.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in out, out[:200]
    out = raw(fuzz_server, b"\x16\x03\x01\x02\x00garbage that is not HTTP\r\n\r\n")  # a TLS hello, say
    assert out.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in out, out[:200]
    assert httpx.get(fuzz_server.base + "/health").status_code == 200


def test_a_body_sent_slowly_is_cut_off(fuzz_server):
    """The body must arrive within --read-timeout (2 s here): a trickle gets a 408, not a held connection."""
    with socket.create_connection(("127.0.0.1", fuzz_server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        t0 = time.monotonic()
        out = b""
        while time.monotonic() - t0 < 8 and b"\r\n\r\n" not in out:
            try:
                s.sendall(b" ")
                s.settimeout(0.5)
                out += s.recv(4096)
            except socket.timeout:
                pass
            except (BrokenPipeError, ConnectionResetError):
                break
        assert out.startswith(b"HTTP/1.1 408"), out[:200]
        assert time.monotonic() - t0 < 6


def test_five_hundred_idle_connections_do_not_block_service(fuzz_server):
    socks = []
    try:
        for _ in range(500):
            socks.append(socket.create_connection(("127.0.0.1", fuzz_server.port), timeout=10))
        socks[0].sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 5\r\n\r\n{\"pro")  # and one half-sent body among them
        t0 = time.monotonic()
        r = httpx.post(fuzz_server.base + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert time.monotonic() - t0 < 10
    finally:
        for s in socks:
            s.close()
    assert httpx.get(fuzz_server.base + "/health").status_code == 200


def test_wrong_api_key_is_refused_and_never_logged(tmp_path):
    from tiny_models import write_tiny_llama

    p = tmp_path / "tiny.gguf"
    write_tiny_llama(p, n_ctx=64, dim=32, n_head=2, n_kv=1, ffn=64, n_layer=1)
    key, wrong = "s3cret-key-123456", "guess-key-987654"
    s = Server(p, "--api-key", key).wait_ready()
    try:
        for auth in (f"Bearer {wrong}", f"Bearer {key[:-1]}", "Bearer", f"Basic {key}", "Bearer \udcff"):
            r = httpx.post(s.base + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                           headers={"Authorization": auth.encode("utf-8", "surrogateescape")})
            assert r.status_code == 401 and wrong not in r.text and key not in r.text
        r = httpx.post(s.base + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                       headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        doc = httpx.get(s.base + "/openapi.json").json()
        assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
        assert "security" not in doc["paths"]["/health"]["get"]
    finally:
        s.stop()
    log = s.proc.stdout.read()
    assert wrong not in log and key not in log

"""Anthropic's Messages API (server/messages.py, openai/anthropic.py) through the official anthropic client, in this
process (Starlette's TestClient), on a tiny random model: messages.create, messages.stream (text and a forced tool
call), messages.count_tokens equal to the usage, tool_result turns, stop sequences, structured output, the error
shape, x-api-key. The same prompt through the chat route gives the same text."""

import json
import time

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

from edgeinfer.server.app import ServerConfig, create_app  # noqa: E402

CITY = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"name": "forecast", "description": "Weather forecast", "input_schema": CITY},
         {"name": "noop", "description": "Does nothing", "input_schema": {"type": "object"}}]
GREEDY = {"temperature": 0, "ignore_eos": True}
ASK = [{"role": "user", "content": "weather in Oslo for 3 days?"}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tiny_models import write_tiny_llama

    p = tmp_path_factory.mktemp("anthropic") / "tiny-llama.gguf"
    write_tiny_llama(p, n_ctx=4096)
    return p


def _serve(path, **kw):
    http = TestClient(create_app(ServerConfig(models=[str(path)], **kw)))
    http.__enter__()
    t0 = time.monotonic()
    while http.get("/health").status_code != 200 and time.monotonic() - t0 < 120:
        time.sleep(0.1)
    return http


@pytest.fixture(scope="module")
def http(model_path):
    h = _serve(model_path)
    yield h
    h.__exit__(None, None, None)


@pytest.fixture(scope="module")
def client(http):
    return anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0)


def test_a_message_its_stream_and_its_token_count_agree_with_the_chat_route(client, http):
    kw = dict(model="tiny-llama", max_tokens=12, system="Be brief.", messages=[{"role": "user", "content": "hi"}])
    m = client.messages.create(**kw, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == "tiny-llama"
    assert [b.type for b in m.content] == ["text"] and m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 12
    counted = client.messages.count_tokens(model="tiny-llama", system="Be brief.", messages=kw["messages"])
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens > 0
    chat = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    same = chat.chat.completions.create(model="tiny-llama", max_tokens=12, extra_body={"ignore_eos": True},
                                        temperature=0, messages=[{"role": "system", "content": "Be brief."},
                                                                 *kw["messages"]])
    assert same.choices[0].message.content == m.content[0].text and same.usage.prompt_tokens == counted.input_tokens
    with client.messages.stream(**kw, extra_body=GREEDY) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and "content_block_start" in events
    assert final.content[0].text == m.content[0].text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12


def test_a_forced_tool_call_streamed_and_not_and_its_result_sent_back(client):
    import jsonschema

    kw = dict(model="tiny-llama", max_tokens=200, messages=ASK, tools=TOOLS,
              tool_choice={"type": "tool", "name": "forecast"}, extra_body={"temperature": 1.0, "seed": 5})
    m = client.messages.create(**kw)
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and call.name == "forecast" and call.id
    jsonschema.validate(call.input, CITY)
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("tool_use", "forecast", call.input)]
    assert final.stop_reason == "tool_use"
    follow = ASK + [{"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name,
                                                        "input": call.input}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "4 C"},
                                                 {"type": "text", "text": "and tomorrow?"}]}]
    again = client.messages.create(model="tiny-llama", max_tokens=4, messages=follow, tools=TOOLS,
                                   extra_body=GREEDY)
    total = again.usage.input_tokens + again.usage.cache_read_input_tokens  # (the first prompt's blocks cached)
    assert total > m.usage.input_tokens + m.usage.cache_read_input_tokens and again.usage.cache_read_input_tokens
    counted = client.messages.count_tokens(model="tiny-llama", messages=follow, tools=TOOLS)
    assert counted.input_tokens == total
    anyone = client.messages.create(**{**kw, "tool_choice": {"type": "any"}})
    assert anyone.stop_reason == "tool_use" and {b.name for b in anyone.content if b.type == "tool_use"} <= {
        "forecast", "noop"}


def test_a_stop_sequence_and_structured_output(client):
    kw = dict(model="tiny-llama", max_tokens=24, messages=[{"role": "user", "content": "count"}],
              extra_body={"temperature": 1.0, "seed": 7, "ignore_eos": True})
    text = client.messages.create(**kw).content[0].text
    # a stop sequence from the (seeded, so repeated) answer itself: two characters first seen past its start
    stop = next(text[k:k + 2] for k in range(3, len(text) - 1) if text.find(text[k:k + 2]) == k)
    m = client.messages.create(**kw, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop and m.content[0].text == text[:text.find(stop)]
    fmt = client.messages.create(model="tiny-llama", max_tokens=40, messages=ASK, extra_body={"seed": 1},
                                 output_config={"format": {"type": "json_schema", "schema": CITY}})
    assert set(json.loads(fmt.content[0].text)) <= {"city", "days"}


@pytest.mark.parametrize("body,status,kind,fragment", [
    ({"messages": ASK}, 400, "invalid_request_error", "'max_tokens' is required"),
    ({"max_tokens": 5, "messages": ASK, "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
    ({"max_tokens": 5, "messages": ASK, "frobnicate": 1}, 400, "invalid_request_error", "unknown field 'frobnicate'"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "'messages[0].content[0].source' must be"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "aGk="}}]}]}, 400, "invalid_request_error",
     "no vision projector"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, 400,
     "invalid_request_error", "'messages[0].content[0]' is a block of type 'document'"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"name": "web_search", "type": "web_search_20250305"}]}, 400,
     "invalid_request_error", "server tools"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x " * 5000}]}, 400, "invalid_request_error",
     "context holds 4096"),
    ({"model": "claude-9", "max_tokens": 5, "messages": ASK}, 404, "not_found_error", "claude-9"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": ["4 C"]}]}]}, 400, "invalid_request_error",
     "'messages[0].content[0].content[0]' must be a content block"),
    ({"max_tokens": 5, "messages": ASK, "mcp_servers": [{"url": "x"}]}, 400, "invalid_request_error", "MCP"),
])
def test_bad_requests_answer_anthropic_s_error_shape(http, body, status, kind, fragment):
    r = http.post("/v1/messages", json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == kind and fragment in err["error"]["message"], err


def test_the_api_key_may_come_as_x_api_key(model_path):
    http = _serve(model_path, api_key="sesame")
    try:
        good = anthropic.Anthropic(base_url="http://testserver", api_key="sesame", http_client=http, max_retries=0)
        assert good.messages.count_tokens(model="tiny-llama", messages=ASK).input_tokens > 0
        bad = anthropic.Anthropic(base_url="http://testserver", api_key="wrong", http_client=http, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            bad.messages.count_tokens(model="tiny-llama", messages=ASK)
    finally:
        http.__exit__(None, None, None)

"""OpenAI's Responses API (server/responses_routes.py, openai/responses_api.py) through the official openai client,
in this process (Starlette's TestClient), on a tiny random model: responses.create plain, with instructions,
streamed (the raw events and the stream helper), a required function call and its output sent back through
previous_response_id, input-token counting equal to the usage, structured text, retrieve and delete, and bad
requests a 400 naming the field."""

import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

from edgeinfer.server.app import ServerConfig, create_app  # noqa: E402

TOOLS = [{"type": "function", "name": "forecast", "description": "Weather forecast", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}}, "required": ["city"],
    "additionalProperties": False}}]
PICK = {"format": {"type": "json_schema", "name": "pick", "schema": {
    "type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from tiny_models import write_tiny_llama

    p = tmp_path_factory.mktemp("responses") / "tiny-llama.gguf"
    write_tiny_llama(p, n_ctx=4096)
    with TestClient(create_app(ServerConfig(models=[str(p)]))) as http:
        t0 = time.monotonic()
        while http.get("/health").status_code != 200 and time.monotonic() - t0 < 120:
            time.sleep(0.1)
        c = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        c.http = http
        yield c


def test_a_response_its_stream_and_its_input_tokens_agree_with_the_chat_route(client):
    kw = dict(model="tiny-llama", input="hi", instructions="Be brief.", max_output_tokens=10, temperature=0)
    r = client.responses.create(**kw)
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"] and r.usage.output_tokens == 10
    counted = client.responses.input_tokens.count(model="tiny-llama", input="hi", instructions="Be brief.")
    assert counted.input_tokens == r.usage.input_tokens > 0
    chat = client.chat.completions.create(model="tiny-llama", max_tokens=10, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == r.output_text and chat.usage.prompt_tokens == counted.input_tokens
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with client.responses.stream(model="tiny-llama", input="pick one", max_output_tokens=100, text=PICK) as s:
        snapshots = [e.snapshot for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()  # (a schema the answer completes: a response.completed event)
    assert final.status == "completed" and final.output_text in ('{"a": "x"}', '{"a": "y"}')
    assert snapshots[-1] == final.output_text  # the helper's running text, built from the events as they came
    kept = client.responses.retrieve(final.id)  # a streamed response is kept whole, with its usage
    assert kept.output_text == final.output_text and kept.usage.output_tokens == final.usage.output_tokens > 0


def test_a_required_call_its_output_back_through_previous_response_id_retrieve_and_delete(client):
    r = client.responses.create(model="tiny-llama", input="weather?", tools=TOOLS, tool_choice="required",
                                max_output_tokens=200, temperature=1.0, extra_body={"seed": 2})
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and call.name == "forecast" and call.arguments in ('{"city": "Oslo"}',
                                                                                      '{"city": "Lima"}')
    follow = dict(model="tiny-llama", previous_response_id=r.id, tools=TOOLS,
                  input=[{"type": "function_call_output", "call_id": call.call_id, "output": "4 C"}])
    r2 = client.responses.create(**follow, max_output_tokens=4, temperature=0)
    assert r2.previous_response_id == r.id and r2.usage.input_tokens > r.usage.input_tokens
    assert r2.usage.input_tokens_details.cached_tokens > 0  # the first prompt's blocks, from the prefix cache
    assert client.responses.input_tokens.count(**follow).input_tokens == r2.usage.input_tokens
    assert client.responses.retrieve(r2.id).output_text == r2.output_text
    client.responses.delete(r2.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.retrieve(r2.id)
    with pytest.raises(openai.BadRequestError, match="no stored response"):
        client.responses.create(model="tiny-llama", previous_response_id=r2.id, input="and?")
    unstored = client.responses.create(model="tiny-llama", input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize("body,param,fragment", [
    ({"input": "hi", "frobnicate": 1}, "frobnicate", "unknown field 'frobnicate'"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type", "item of type 'input_image'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]", "'input_image'"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]", "'web_search' tool"),
    ({"input": "hi", "background": True}, "background", "not supported"),
    ({"input": "x " * 5000}, "messages", "context holds 4096"),
])
def test_bad_requests_name_the_field(client, body, param, fragment):
    r = client.http.post("/v1/responses", json={"model": "tiny-llama", **body})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and fragment in err["message"], err
    if "context" in fragment:
        assert err["code"] == "context_length_exceeded"

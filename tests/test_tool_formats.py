"""Tool-call formats per model family (edgeinfer.tool_formats): each family's real chat template picks its
format; the calls each template writes back are read as calls; each family's recorded replies (llama.cpp's
tests/test-chat.cpp cases for these templates, Meta's Llama 3.1 examples) parse, whole and streamed in any
pieces, to the same calls and content; a malformed call is text, never lost; a forced tool_choice makes a
random model write a valid call in its family's own form."""

import json
import random

import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.chat_template import ChatTemplate
from edgeinfer.config import EngineConfig
from edgeinfer.harmony import split_harmony
from edgeinfer.tool_formats import detect
from edgeinfer.tools import StreamParser, parse_reply, parse_tools, prepare_messages

from conftest import golden_path

SPECIAL_FUNCTION = {"type": "function", "function": {"name": "special_function", "description": "I'm special",
                    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}}
WITH_OPT = {"type": "function", "function": {"name": "special_function_with_opt", "description": "opt", "parameters": {
    "type": "object", "properties": {"arg1": {"type": "integer"}, "arg2": {"type": "integer"}}, "required": ["arg1"]}}}
PYTHON = {"type": "function", "function": {"name": "python", "description": "run code", "parameters": {
    "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer",
                                     "minimum": 1, "maximum": 9}}, "required": ["city", "days"]}}}
TOOLS, _ = parse_tools([SPECIAL_FUNCTION, WITH_OPT, PYTHON, WEATHER])

MISTRAL_SPECIALS = ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                    "[/TOOL_RESULTS]", "[ARGS]", "[CALL_ID]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                   "<|python_tag|>")
HARMONY_SPECIALS = ("<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|constrain|>", "<|return|>", "<|call|>")

# template file -> (format, the control tokens its vocabulary has)
FAMILIES = {
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", ()),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3", LLAMA3_SPECIALS),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3", LLAMA3_SPECIALS),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", MISTRAL_SPECIALS),
    "Mistral-Small-3.2-24B-Instruct-2506": ("mistral_args", MISTRAL_SPECIALS),
    "unsloth-mistral-Devstral-Small-2507": ("mistral_args", MISTRAL_SPECIALS),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral_args", MISTRAL_SPECIALS),
    "Qwen3-Coder": ("qwen3_coder", ()),
    "Qwen3.5-4B": ("qwen3_coder", ()),
    "openai-gpt-oss-120b": ("harmony", HARMONY_SPECIALS),
}


def template(name: str) -> str:
    return open(golden_path(f"templates/{name}.jinja")).read()


def calls_of(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def streamed(text: str, tools, fmt=None, seed: int = 0):
    """StreamParser over text cut at random places: (content, calls)."""
    rng, parser, events, pos = random.Random(seed), StreamParser(tools, fmt), [], 0
    while pos < len(text):
        step = rng.randint(1, 7)
        events += parser.feed(text[pos:pos + step])
        pos += step
    events += parser.finish()
    return "".join(v for k, v in events if k == "text"), [v for k, v in events if k == "call"]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_template_picks_its_format(name):
    fmt, specials = FAMILIES[name]
    got = detect(template(name), {t: 1000 + i for i, t in enumerate(specials)})
    assert got.name == fmt
    assert got.special_text == (fmt in ("llama3", "mistral", "mistral_args", "harmony"))
    assert detect(None).name == detect("{{ messages }}").name == "hermes"  # the fallback


# the reply as the model writes it, (content, [(name, arguments)]) as it is read; per family
RECORDED = {
    "hermes": [
        ('<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
         (None, [("special_function", {"arg1": 1})])),
    ],
    "llama3": [  # Meta's Llama 3.1 / 3.2 JSON tool calling, its <|python_tag|> form, a built-in tool's call
        ('{"name": "special_function", "parameters": {"arg1": 1}}', (None, [("special_function", {"arg1": 1})])),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
         (None, [("get_weather", {"city": "Paris", "days": 2})])),
        ('<|python_tag|>python.call(code="print(1 + 1)")', (None, [("python", {"code": "print(1 + 1)"})])),
        ('{"name": "special_function", "parameters": {"arg1": 1}}; '
         '{"name": "special_function_with_opt", "parameters": {"arg1": 1, "arg2": 2}}',
         (None, [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})])),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
         (None, [("special_function", {"arg1": 1})])),
    ],
    "mistral_args": [
        ('[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}', (None, [("special_function", {"arg1": 1})])),
        ('[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
         '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
         (None, [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})])),
        ('Hello, world!\nWhat\'s up?[TOOL_CALLS]special_function[ARGS]{"arg1": 1}',
         ("Hello, world!\nWhat's up?", [("special_function", {"arg1": 1})])),
    ],
    "qwen3_coder": [
        ("<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
         (None, [("special_function", {"arg1": 1})])),
        # some models leave out the opening <tool_call>
        ("Let me call it.\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
         ("Let me call it.", [("special_function", {"arg1": 1})])),
        ("<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
         "<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n<parameter=arg2>\n2\n</parameter>\n"
         "</function>\n</tool_call>",
         (None, [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})])),
        ('<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n    print("Hello, world!")\n\nhello()\n'
         "</parameter>\n</function>\n</tool_call>",
         (None, [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})])),
    ],
}

MALFORMED = [  # each stays text, all of it
    '[TOOL_CALLS]unknown_tool[ARGS]{"arg1": 1}',
    '[TOOL_CALLS][{"name": "special_function", "arguments": 7}]',
    '[TOOL_CALLS]special_function[ARGS]{"arg1": ',
    "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</function>\n</tool_call>",
    "<function=nope>\n<parameter=arg1>\n1\n</parameter>\n</function>",
    '<|python_tag|>python.call(print("x"))',
    '<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}',
    '{"name": "special_function", "parameters": [1]}',
    '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}\n</tool_call>',
]


@pytest.mark.parametrize("fmt,text,expected", [(f, t, e) for f, cases in RECORDED.items() for t, e in cases])
def test_recorded_replies_parse_whole_and_streamed(fmt, text, expected):
    content, calls = parse_reply(text, TOOLS)
    assert (content, calls_of(calls)) == expected
    for seed in range(4):
        s_content, s_calls = streamed(text, TOOLS, seed=seed)
        assert calls_of(s_calls) == expected[1]
        assert (s_content.strip() or None) == expected[0]


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_call_comes_back_as_text(text):
    assert parse_reply(text, TOOLS) == (text, [])
    for seed in range(3):
        assert streamed(text, TOOLS, seed=seed) == (text, [])


def test_mistral_call_ids_are_nine_letters_and_digits():
    fmt = detect(template("mistralai-Mistral-Nemo-Instruct-2407"), {"[TOOL_CALLS]": 5})
    _, calls = parse_reply('[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', TOOLS, fmt)
    assert len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()
    _, kept = parse_reply('[TOOL_CALLS]special_function[CALL_ID]abcdefgh1[ARGS]{"arg1": 1}', TOOLS, fmt)
    assert kept[0]["id"] == "abcdefgh1"  # the model's own id is kept


def test_harmony_call_reaches_the_tool_parser():
    text = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}')
    reasoning, content = split_harmony(text)
    assert reasoning == "Need weather."
    assert calls_of(parse_reply(content, TOOLS)[1]) == [("get_weather", {"city": "Paris", "days": 2})]


# an assistant message with a call, as each template writes it back, between these marks
WRITTEN = {
    "Qwen-Qwen2.5-7B-Instruct": ("<|im_start|>assistant\n", "<|im_end|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("[/INST]", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("[/INST]", "</s>"),
    "unsloth-mistral-Devstral-Small-2507": ("[/INST]", "</s>"),
    "Qwen3-Coder": ("<|im_start|>assistant\n", "<|im_end|>"),
}


@pytest.mark.parametrize("name", WRITTEN)
def test_a_call_each_template_writes_is_read_back(name):
    """The family's own template writes the model's past call; what it wrote parses back to that call."""
    call = {"id": "abcdefgh1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}
    messages = [{"role": "user", "content": "Weather in Paris for two days?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "abcdefgh1", "content": "20 C"}]
    tmpl = ChatTemplate(template(name), "<s>", "</s>")
    text = tmpl.render(prepare_messages(messages, TOOLS, True), False, tools=[t.openai() for t in TOOLS])
    start, end = WRITTEN[name]
    at = text.index(start, text.index("two days?")) + len(start)
    written = text[at:text.index(end, at)]
    content, calls = parse_reply(written, TOOLS)
    assert calls_of(calls) == [("get_weather", {"city": "Paris", "days": 2})], written
    assert not (content or "").strip()


FORCED = ["meta-llama-Llama-3.2-3B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407",
          "Mistral-Small-3.2-24B-Instruct-2506", "Qwen3-Coder", "openai-gpt-oss-120b"]


@pytest.mark.parametrize("name", FORCED)
def test_a_forced_call_is_a_valid_call_in_the_familys_form(name, tmp_path):
    """tool_choice required / named on a random model with the family's template and control tokens: the
    grammar of the family's form makes every sampled reply a call of a given tool, arguments valid."""
    import jsonschema

    from tiny_models import write_tiny_llama

    fmt, specials = FAMILIES[name]
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, n_ctx=4096, chat_template=template(name), extra_specials=specials)
    llm = LLM(str(path), engine_config=EngineConfig(max_seqs=4, num_kv_blocks=2048, block_size=16), progress=False)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [WEATHER, {"type": "function", "function": {"name": "python", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "maxLength": 24}}, "required": ["code"]}}}]
    for seed, choice in enumerate(["required", {"type": "function", "function": {"name": "get_weather"}}] * 2):
        comp = llm.chat(msgs, SamplingParams(temperature=1.0, seed=seed, max_tokens=600), tools=tools,
                        tool_choice=choice)
        assert comp.finish_reason == "tool_calls", (fmt, comp.text)
        for c in comp.tool_calls:
            name_ = c["function"]["name"]
            assert name_ in ("get_weather", "python") and (choice == "required" or name_ == "get_weather")
            spec = next(t for t in tools if t["function"]["name"] == name_)["function"]["parameters"]
            jsonschema.validate(json.loads(c["function"]["arguments"]), spec)
        if fmt.startswith("mistral"):
            assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in comp.tool_calls)


def test_a_mistral_call_streams_in_openais_delta_shape(tmp_path):
    """Over HTTP: a Mistral Small 3.2 model's forced call, streamed, is OpenAI's tool-call deltas (id and name,
    then the arguments) with a nine-character id, finish_reason tool_calls, and no [TOOL_CALLS] text."""
    from starlette.testclient import TestClient

    from edgeinfer.server import app as server_app
    from tiny_models import write_tiny_llama

    path = tmp_path / "tiny-mistral.gguf"
    write_tiny_llama(path, n_ctx=4096, chat_template=template("Mistral-Small-3.2-24B-Instruct-2506"),
                     extra_specials=MISTRAL_SPECIALS)
    app = server_app.create_app(server_app.ServerConfig(models=[str(path)]))
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER], "stream": True,
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 300, "seed": 3,
            "temperature": 1.0}
    with TestClient(app) as client:
        lines = client.post("/v1/chat/completions", json=body).text.splitlines()
    chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert not "".join(d.get("content") or "" for d in deltas)
    assert calls[0]["function"]["name"] == "get_weather" and len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()
    args = json.loads("".join(tc["function"].get("arguments") or "" for tc in calls))
    assert set(args) == {"city", "days"} and {tc["index"] for tc in calls} == {0}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1] == "tool_calls"


def test_hostile_and_odd_replies_stay_fast_and_lose_nothing():
    """A review's findings: a [TOOL_CALLS] followed by many bracket groups is read in linear time (it was
    exponential backtracking, a frozen server); a schema whose property is `true` (valid JSON Schema) reads;
    an opener never closed is text and a later call is still found, whole and streamed."""
    import time

    tools, _ = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": True, "city": {"type": "string"}}}}}])
    text = "[TOOL_CALLS]x" + "[ABCDEFGHIJ" * 40 + " done"
    t0 = time.perf_counter()
    assert streamed(text, tools) == (text, [])
    assert time.perf_counter() - t0 < 2
    assert calls_of(parse_reply("<function=f>\n<parameter=a>\n[1, 2]\n</parameter>\n</function>", tools)[1]) == \
        [("f", {"a": [1, 2]})]
    call = '<tool_call>\n{"name": "f", "arguments": {"city": "P"}}\n</tool_call>'
    for opener in ("x <function=f> never closed, ", "[TOOL_CALLS][not json ", "<tool_call> lost "):
        content, calls = parse_reply(opener + call, tools)
        assert calls_of(calls) == [("f", {"city": "P"})] and content == opener.strip(), opener
        s_content, s_calls = streamed(opener + call, tools)
        assert calls_of(s_calls) == [("f", {"city": "P"})] and s_content.strip() == opener.strip(), opener
    from edgeinfer.tool_formats import grammar
    assert "p0_0" in grammar(detect("<function= <parameter="), tools, True)  # the grammar takes it too


def test_a_mistral_models_own_id_is_kept_only_if_its_template_takes_it():
    fmt = detect(template("Mistral-Small-3.2-24B-Instruct-2506"), {"[TOOL_CALLS]": 5})
    _, calls = parse_reply('[TOOL_CALLS]special_function[CALL_ID]call_too_long_1[ARGS]{"arg1": 1}', TOOLS, fmt)
    assert len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()

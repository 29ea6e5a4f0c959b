"""Structured output (JSON schema, regex, choice, grammar) and tool calling: the engine on both tiny
models, the pure parsing helpers, and SmolLM2 for real."""

import json
import re
import threading

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.structured import GrammarError, close_objects
from edgeinfer.tools import StreamParser, ToolError, call_grammar, parse_reply, parse_tools, prepare_messages

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    "score": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.125},
    "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]},
}, "required": ["name", "age", "home"]}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
CHOICES = ["red", "green", "blue and white"]
LARK = 'start: "x=" NUM ("+" NUM){0,3}\nNUM: /[1-9][0-9]{0,2}/\n'
GBNF = 'root ::= "answer: " ("yes" | "no")\n'
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999},
                                         "b": {"type": "integer", "minimum": -999, "maximum": 999}},
        "required": ["a", "b"]}}},
]


def sampled(n=8, **kw):
    """n seeded samples at temperature 1.0 (a random tiny model wanders everywhere the mask lets it)."""
    return [SamplingParams(temperature=1.0, seed=s, max_tokens=kw.pop("max_tokens", 120), **kw) for s in range(n)]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def llm(request, tmp_path_factory):
    """Both tiny models with a 2,048-token context: a tools prompt is long in a byte-level vocabulary."""
    from tiny_models import write_tiny_gemma3, write_tiny_llama

    path = tmp_path_factory.mktemp("structured") / f"tiny-{request.param}.gguf"
    (write_tiny_llama if request.param == "llama" else write_tiny_gemma3)(path, n_ctx=2048)
    return LLM(str(path), engine_config=EngineConfig(max_seqs=8, num_kv_blocks=1024, block_size=4), progress=False)


# -- every constraint kind on both tiny models -------------------------------------------------------


def test_json_schema_outputs_validate(llm):
    outs = llm.generate(["a person:"] * 8, sampled(json_schema=PERSON, max_tokens=200))
    for c in outs:
        assert c.finish_reason == "stop", c.text
        obj = json.loads(c.text)
        jsonschema.validate(obj, PERSON)
        assert set(obj) <= set(PERSON["properties"])  # no keys of its own: objects are closed
    assert llm.stats()["kv_blocks_used"] == 0


def test_regex_choice_and_grammars(llm):
    for c in llm.generate(["call"] * 6, sampled(6, regex=PHONE)):
        assert c.finish_reason == "stop" and re.fullmatch(PHONE, c.text), c.text
    texts = {c.text for c in llm.generate(["pick"] * 8, sampled(choice=CHOICES))}
    assert texts <= set(CHOICES) and texts
    for c in llm.generate(["sum"] * 6, sampled(6, grammar=LARK)):
        assert c.finish_reason == "stop" and re.fullmatch(r"x=[1-9][0-9]{0,2}(\+[1-9][0-9]{0,2}){0,3}", c.text), c.text
    for c in llm.generate(["q"] * 4, sampled(4, grammar=GBNF)):  # llama.cpp's GBNF, converted by the library
        assert c.text in ("answer: yes", "answer: no")


def test_the_mask_applies_before_sampling(llm):
    """Every token with a finite log-probability is one the constraint allows (a matcher driven by
    hand agrees at each step), and greedy takes the best of them."""
    params = SamplingParams(temperature=0, max_tokens=40, choice=CHOICES, logprobs=8)
    c = llm.generate("colour:", params)[0]
    guide = llm.engine.grammars.guide(params)
    for entry in c.logprobs:
        ok = guide.allowed()
        finite = [j for j, lp in entry["top"] if np.isfinite(lp)]
        assert finite and all(ok[j] for j in finite)
        assert entry["token_id"] == entry["top"][0][0]
        assert guide.advance(entry["token_id"])
    assert guide.done and c.text in CHOICES and c.finish_reason == "stop"


def test_free_sequences_keep_their_tokens_beside_constrained_ones(llm):
    free = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["the hen", "in a", "sat", "x"]
    alone = [c.token_ids for c in llm.generate(prompts, free)]
    mixed = llm.generate(prompts + ["json:", "phone:", "pick:"],
                         [free] * 4 + [SamplingParams(temperature=1.0, seed=3, max_tokens=150, json_schema=PERSON),
                                       SamplingParams(temperature=1.0, seed=4, regex=PHONE),
                                       SamplingParams(temperature=1.0, seed=5, choice=CHOICES)])
    assert [c.token_ids for c in mixed[:4]] == alone
    jsonschema.validate(json.loads(mixed[4].text), PERSON)
    assert re.fullmatch(PHONE, mixed[5].text) and mixed[6].text in CHOICES


def test_preemption_mid_constraint_keeps_output_valid_and_identical(tiny_llama_path):
    roomy = LLM(str(tiny_llama_path), engine_config=EngineConfig(num_kv_blocks=256, block_size=4), progress=False)
    tight = LLM(str(tiny_llama_path), engine_config=EngineConfig(num_kv_blocks=40, block_size=4, max_seqs=8),
                progress=False)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=150, json_schema=PERSON) for s in range(6)]
    prompts = ["a person:"] * 6
    want = [c.token_ids for c in roomy.generate(prompts, params)]
    got = tight.generate(prompts, params)
    assert tight.stats()["preemptions"] > 0
    assert [c.token_ids for c in got] == want
    for c in got:
        jsonschema.validate(json.loads(c.text), PERSON)
    assert tight.stats()["kv_blocks_used"] == 0


def test_bad_constraints_fail_before_anything_runs(llm):
    eng = llm.engine
    before = eng.stats()["computed_tokens"]
    bad = [dict(json_schema={"type": "objectx"}), dict(regex="a(b"), dict(grammar="start: undefined_rule\n"),
           dict(grammar="root ::= (")]
    for kw in bad:
        with pytest.raises(GrammarError) as e:
            llm.generate("x", SamplingParams(**kw))
        assert next(iter(kw)) in str(e.value)
    assert eng.stats()["computed_tokens"] == before and not eng.has_unfinished()
    for kw, field in [(dict(json_schema="{not json"), "json_schema"), (dict(json_schema=[1]), "json_schema"),
                      (dict(regex=""), "regex"), (dict(choice=[]), "choice"), (dict(choice="ab"), "choice"),
                      (dict(choice=["a", 3]), "choice"), (dict(regex="a", choice=["a"]), "at most one")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)


def test_bad_params_lists_and_conflicting_tool_constraints_are_clear_errors(llm):
    with pytest.raises(ValueError, match="got 2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()])
    with pytest.raises(ValueError, match="cannot be combined with another constraint"):
        llm.chat([{"role": "user", "content": "x"}], SamplingParams(regex="a+"), tools=TOOLS, tool_choice="required")
    assert not llm.engine.has_unfinished()


def test_grammar_cache_is_lru_and_compiles_in_the_callers_thread(llm):
    cache = llm.engine.grammars
    hits, misses = cache.hits, cache.misses
    p = SamplingParams(regex=r"[0-9]{1,3}")
    cache.guide(p)
    cache.guide(SamplingParams(regex=r"[0-9]{1,3}", seed=9))  # same grammar, other sampling: a hit
    assert (cache.hits - hits, cache.misses - misses) == (1, 1)
    old = cache.capacity
    try:
        cache.capacity = 2
        for r in ("a+", "b+", "c+"):
            cache.guide(SamplingParams(regex=r))
        assert len(cache) == 2
        misses = cache.misses
        cache.guide(SamplingParams(regex="c+"))
        cache.guide(SamplingParams(regex="a+"))  # evicted: compiled again
        assert cache.misses - misses == 1
    finally:
        cache.capacity = old

    from edgeinfer.engine.loop import EngineLoop

    seen, real = [], cache.template

    def spy(params):
        seen.append(threading.current_thread().name)
        return real(params)

    cache.template = spy
    loop = EngineLoop(llm.engine, "t").start()
    try:
        done = threading.Event()
        loop.submit(llm.tokenize("q"), SamplingParams(regex=r"[a-z]{2}x", max_tokens=10),
                    lambda out: out.finished and done.set())
        assert done.wait(30)
    finally:
        loop.stop()
        del cache.template
    assert seen and all(name != "edgeinfer-t" for name in seen)


def test_chat_with_tools_on_a_tiny_model(llm):
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        c = llm.chat([{"role": "user", "content": "add 2 and 3"}],
                     SamplingParams(temperature=1.0, seed=1, max_tokens=120), tools=TOOLS, tool_choice=choice)
        assert c.finish_reason == "tool_calls" and c.tool_calls
        for call in c.tool_calls:
            spec = next(t["function"] for t in TOOLS if t["function"]["name"] == call["function"]["name"])
            jsonschema.validate(json.loads(call["function"]["arguments"]), spec["parameters"])
            assert call["id"].startswith("call_") and call["type"] == "function"
        if isinstance(choice, dict):
            assert {x["function"]["name"] for x in c.tool_calls} == {"add"}


def test_a_template_that_knows_tools_renders_them_itself(llm, monkeypatch):
    from edgeinfer.chat_template import ChatTemplate

    src = ("{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
           "{% for m in messages %}{{ m.role }}: {{ m.content }}"
           "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}\n"
           "{% endfor %}")
    monkeypatch.setattr(llm, "_chat_template", ChatTemplate(src))
    tools, _ = parse_tools(TOOLS)
    msgs = [{"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    text = llm.detokenize(llm.render_chat(msgs, tools=tools))
    # (trim_blocks, as transformers renders: a newline right after a block tag goes)
    assert text == 'TOOLS:get_weather;add;user: 2+3?assistant: [add {"a": 2, "b": 3}]tool: 5'


# -- pure helpers ------------------------------------------------------------------------------------


def test_close_objects_only_closes_objects_that_list_properties():
    s = close_objects({"type": "object", "properties": {"a": {"type": "object", "properties": {}}},
                       "$defs": {"x": {"properties": {"b": {}}}}, "anyOf": [{"properties": {}}],
                       "items": {"type": "object"}})
    assert s["additionalProperties"] is False and s["properties"]["a"]["additionalProperties"] is False
    assert s["$defs"]["x"]["additionalProperties"] is False and s["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in s["items"]  # {"type": "object"} alone: any object
    assert close_objects({"properties": {}, "additionalProperties": True})["additionalProperties"] is True


def test_parse_tools_errors_name_the_field():
    cases = [
        ("x", None, "tools"),
        ([{"type": "function", "function": {"name": "bad name!"}}], None, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "f"}}] * 2, None, "tools[1].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, "tools[0].function.parameters"),
        ([{"type": "retrieval"}], None, "tools[0]"),
        (TOOLS, "sometimes", "tool_choice"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, "required", "tool_choice"),
    ]
    for tools, choice, param in cases:
        with pytest.raises(ToolError) as e:
            parse_tools(tools, choice)
        assert e.value.param == param
    tools, choice = parse_tools(TOOLS)
    assert [t.name for t in tools] == ["get_weather", "add"] and choice.mode == "auto"
    assert parse_tools(None)[1].mode == "none"


def test_call_grammar_only_for_forced_calls():
    tools, _ = parse_tools(TOOLS)
    assert call_grammar(tools, parse_tools(TOOLS, "auto")[1]) is None
    g = call_grammar(tools, parse_tools(TOOLS, {"type": "function", "function": {"name": "add"}})[1])
    assert '"add"' in g and "get_weather" not in g and g.startswith("start: call\n")
    assert call_grammar(tools, parse_tools(TOOLS, "required")[1]).startswith('start: call ("\\n" call)*')


def test_parse_reply_keeps_text_that_is_not_a_call():
    tools, _ = parse_tools(TOOLS)
    text = ('Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>')
    content, calls = parse_reply(text, tools)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 1, "b": 2}]
    assert "unknown" in content and content.startswith("Sure.")
    assert parse_reply("no calls here", tools) == ("no calls here", [])
    content, calls = parse_reply('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>', tools)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"a": 1}
    content, calls = parse_reply(' {"name": "add", "arguments": {"a": 1, "b": 2}}\n', tools)  # a bare call
    assert content is None and calls[0]["function"]["name"] == "add"
    assert parse_reply('{"name": "nope", "arguments": {}}', tools)[1] == []  # not a given tool: text


REPLIES = [
    'I will call. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_ca',
    '  {"name": "add", "arguments": {"a": 1, "b": 2}}',  # a bare call
    '{"not": "a call"} and then <tool_call>{"name": "add", "arguments": {}}</tool_call>',
    '{"name": "add", "arguments": {"a": 1}} trailing words',
    "plain prose, no calls",
]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(REPLIES), st.lists(st.integers(1, 12), min_size=1, max_size=60))
def test_stream_parser_agrees_with_parse_reply_at_any_split(text, cuts):
    tools, _ = parse_tools(TOOLS)
    p, events, pos = StreamParser(tools), [], 0
    for n in cuts:
        events += p.feed(text[pos:pos + n])
        pos += n
    events += p.feed(text[pos:]) + p.finish()
    content, calls = parse_reply(text, tools)
    assert "".join(v for k, v in events if k == "text").strip() == (content or "").strip()
    assert [v["function"] for k, v in events if k == "call"] == [c["function"] for c in calls]


def test_fallback_prompt_format_for_templates_without_tools():
    tools, _ = parse_tools(TOOLS)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"},
            {"role": "tool", "tool_call_id": "call_2", "content": "6"}]
    out = prepare_messages(msgs, tools, native=False)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.") and '"name": "get_weather"' in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response>"
    native = prepare_messages(msgs, tools, native=True)
    assert native[2]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3} and native[3]["role"] == "tool"
    with pytest.raises(ToolError, match=r"messages\[0\].tool_calls"):
        prepare_messages([{"role": "user", "content": "x", "tool_calls": [{}]}], tools, native=False)


def test_parse_constraint_reads_openai_and_vllm_fields():
    from edgeinfer.openai.protocol import APIError, parse_constraint

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse_constraint({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                                        "strict": True}}}) \
        == ({"json_schema": schema}, "response_format")
    assert parse_constraint({"response_format": {"type": "json_object"}}) == ({"json_schema": {"type": "object"}},
                                                                             "response_format")
    assert parse_constraint({"response_format": {"type": "text"}}) == ({}, None)
    assert parse_constraint({"structured_outputs": {"regex": "a+"}}) == ({"regex": "a+"}, "structured_outputs.regex")
    assert parse_constraint({"guided_choice": ["a", "b"]}) == ({"choice": ["a", "b"]}, "guided_choice")
    assert parse_constraint({"guided_json": json.dumps(schema)}) == ({"json_schema": schema}, "guided_json")
    assert parse_constraint({"structured_outputs": {"grammar": "root ::= \"a\""}})[0] == {"grammar": 'root ::= "a"'}
    for body, param in [({"response_format": {"type": "xml"}}, "response_format"),
                        ({"response_format": {"type": "json_schema", "json_schema": "x"}}, "response_format"),
                        ({"guided_json": "{bad"}, "guided_json"),
                        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
                        ({"structured_outputs": 3}, "structured_outputs")]:
        with pytest.raises(APIError) as e:
            parse_constraint(body)
        assert e.value.status == 400 and e.value.param == param


# -- SmolLM2 for real --------------------------------------------------------------------------------

ORDER = {"type": "object", "properties": {
    "order_id": {"type": "integer", "minimum": 1, "maximum": 99999},
    "customer": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 30},
                                                  "vip": {"type": "boolean"}}, "required": ["name"]},
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
        "product": {"type": "string", "minLength": 1, "maxLength": 25},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 20},
        "price": {"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.25}},
        "required": ["product", "quantity", "price"]}},
    "status": {"type": "string", "enum": ["new", "paid", "shipped"]}},
    "required": ["order_id", "customer", "items", "status"]}


def valid_orders(llm, n):
    """n seeded samples of ORDER at temperature 1.0 in one batch, each asserted whole and schema-valid."""
    prompt = llm.render_chat([{"role": "user", "content": "Write a customer order as JSON."}])
    outs = llm.generate([prompt] * n, [SamplingParams(temperature=1.0, seed=s, max_tokens=300, json_schema=ORDER)
                                       for s in range(n)])
    for c in outs:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), ORDER)
    return outs


@pytest.fixture(scope="module")
def smollm2():
    from conftest import real_model_path

    return LLM(str(real_model_path("smollm2-135m-instruct")), progress=False)


@pytest.mark.model
def test_smollm2_fifty_samples_at_temperature_one_all_valid(smollm2):
    outs = valid_orders(smollm2, 50)
    assert len({c.text for c in outs}) > 40  # sampled, not one answer 50 times


@pytest.mark.model
def test_smollm2_regex_choice_grammar_and_tools(smollm2):
    chat = lambda q: smollm2.render_chat([{"role": "user", "content": q}])  # noqa: E731
    outs = smollm2.generate([chat("Give me a US phone number.")] * 5, sampled(5, regex=PHONE))
    assert all(re.fullmatch(PHONE, c.text) for c in outs)
    outs = smollm2.generate([chat("Is the sky blue? Answer yes or no.")] * 5, sampled(5, choice=["yes", "no"]))
    assert all(c.text in ("yes", "no") and c.finish_reason == "stop" for c in outs)
    c = smollm2.generate(chat("What is 12 plus 30?"), SamplingParams(temperature=0, grammar=LARK))[0]
    assert re.fullmatch(r"x=[1-9][0-9]{0,2}(\+[1-9][0-9]{0,2}){0,3}", c.text)
    c = smollm2.chat([{"role": "user", "content": "What is the weather in Paris?"}],
                     SamplingParams(temperature=0, max_tokens=100), tools=TOOLS, tool_choice="required")
    assert c.finish_reason == "tool_calls"
    assert c.tool_calls[0]["function"]["name"] == "get_weather"
    assert json.loads(c.tool_calls[0]["function"]["arguments"])["city"] == "Paris"


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(1, 260), st.integers(0, 2**32 - 1))
def test_mask_kernel_matches_unpacked_bits(vocab, rows, seed):
    from edgeinfer.kernels.cpu.mask import mask_logits

    rng = np.random.default_rng(seed)
    words = rng.integers(-2**31, 2**31, size=(vocab + 31) // 32, dtype=np.int64).astype(np.int32)
    words[rng.random(words.shape) < 0.3] = -1  # whole words allowed
    logits = rng.standard_normal(rows).astype(np.float32)
    ok = np.unpackbits(words.view(np.uint8), bitorder="little", count=vocab).view(bool)
    want = logits.copy()
    n = min(rows, vocab)
    want[:n][~ok[:n]] = -np.inf
    want[n:] = -np.inf
    mask_logits(logits, words, np.int64(vocab))
    assert np.array_equal(logits, want)


@pytest.mark.model
def test_gemma3_schema_samples_and_a_forced_tool_call():
    from conftest import real_model_path

    gemma = LLM(str(real_model_path("gemma3-270m")), progress=False)
    valid_orders(gemma, 10)
    c = gemma.chat([{"role": "user", "content": "Add 17 and 25."}], SamplingParams(temperature=0, max_tokens=60),
                   tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    assert c.finish_reason == "tool_calls" and [t["function"]["name"] for t in c.tool_calls] == ["add"]
    jsonschema.validate(json.loads(c.tool_calls[0]["function"]["arguments"]), TOOLS[1]["function"]["parameters"])


@pytest.mark.model
def test_qwen_template_renders_tools_itself_and_an_auto_call_round_trips():
    from conftest import real_model_path

    qwen = LLM(str(real_model_path("qwen2.5-coder-0.5b-instruct")), progress=False)
    assert qwen.chat_template.knows_tools
    msgs = [{"role": "user", "content": "What is 2 plus 3? Use the tool."}]
    text = qwen.tokenizer.decode(qwen.render_chat(msgs, tools=parse_tools(TOOLS)[0]), special=True)
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text  # the template's own words
    c = qwen.chat(msgs, SamplingParams(temperature=0, max_tokens=60), tools=TOOLS)  # auto: the model decides
    assert c.finish_reason == "tool_calls" and c.tool_calls[0]["function"]["name"] == "add"
    assert json.loads(c.tool_calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": c.tool_calls},
                     {"role": "tool", "tool_call_id": c.tool_calls[0]["id"], "content": "5"}]
    text = qwen.tokenizer.decode(qwen.render_chat(follow, tools=parse_tools(TOOLS)[0]), special=True)
    assert "<tool_response>\n5\n</tool_response>" in text  # rendered by the template, not by our fallback
    # tool_choice "none": the tools leave the prompt and nothing is parsed as a call (the 0.5B model still
    # writes call-like JSON here: it is text)
    answer = qwen.chat(follow, SamplingParams(temperature=0, max_tokens=80), tools=TOOLS, tool_choice="none")
    assert answer.finish_reason == "stop" and answer.tool_calls == [] and answer.text

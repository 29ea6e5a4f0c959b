"""Gemma 4's tool calls (`<|tool_call>call:NAME{ARGS}<tool_call|>`, ARGS in Gemma 4's own syntax) read
back into OpenAI tool calls by edgeinfer.tools (edgeinfer.tools_gemma4 for the argument syntax): whole
replies and streams cut anywhere, replies rendered by Gemma 4's official template read back to the same
calls, the server's reply builders (OpenAI's and Ollama's) after Gemma 4's reasoning, and a tiny Gemma 4
model served with forced replies.

The expected parses of well-formed calls are llama.cpp's (0.3.36's vendored tests/test-chat.cpp, "Google
Gemma 4" cases, and its peg-gemma4 grammar in common/parsers/gemma4.cpp); where llama.cpp drops text (after
the calls, or from a call it cannot read on) edgeinfer keeps it as content, as it does for Hermes calls."""

import json
import re
from types import SimpleNamespace

import pytest

from edgeinfer import harmony
from edgeinfer.reasoning import GEMMA4 as GEMMA4_FORMAT, ReplyStart
from edgeinfer.tools import StreamParser, parse_reply, parse_tools, prepare_messages
from edgeinfer.tools_gemma4 import G_CLOSE, G_OPEN, read_call

from test_gemma4_template import CURRENT, api, render, write_tiny_gemma4_chat  # noqa: F401  (api: a fixture)

NAMES = ["get_time", "get_weather", "empty_args", "special_function", "amount", "toggle", "set_nullable",
         "todo_list", "set_config", "f"]
TOOLS = parse_tools([{"type": "function", "function": {"name": n}} for n in NAMES])[0]
Q = '<|"|>'


def call(name, args):
    return f"<|tool_call>call:{name}{args}<tool_call|>"


# reply -> (content, [(name, arguments)]); the first ones are llama.cpp's own test cases
PARSES = [
    (call("get_time", "{city:<|\"|>London<|\"|>}"), (None, [("get_time", {"city": "London"})])),
    (call("get_time", "{city:<|\"|>San Francisco<|\"|>}"), (None, [("get_time", {"city": "San Francisco"})])),
    (call("empty_args", "{}"), (None, [("empty_args", {})])),
    ("Hello, world!\nWhat's up?" + call("get_time", "{city:<|\"|>Paris<|\"|>}"),
     ("Hello, world!\nWhat's up?", [("get_time", {"city": "Paris"})])),
    (call("get_time", "{city:<|\"|>London<|\"|>}") + call("get_weather", "{city:<|\"|>Paris<|\"|>}"),
     (None, [("get_time", {"city": "London"}), ("get_weather", {"city": "Paris"})])),
    (call("special_function", "{arg1:42}"), (None, [("special_function", {"arg1": 42})])),
    (call("special_function", "{arg1:-7}"), (None, [("special_function", {"arg1": -7})])),
    (call("amount", "{orig:3.14}"), (None, [("amount", {"orig": 3.14})])),
    (call("toggle", "{enabled:true}"), (None, [("toggle", {"enabled": True})])),
    (call("toggle", "{enabled:false}"), (None, [("toggle", {"enabled": False})])),
    (call("set_nullable", "{value:null}"), (None, [("set_nullable", {"value": None})])),
    (call("todo_list", "{todos:[<|\"|>buy milk<|\"|>,<|\"|>walk dog<|\"|>]}"),
     (None, [("todo_list", {"todos": ["buy milk", "walk dog"]})])),
    (call("set_config", "{config:{theme:<|\"|>dark<|\"|>,count:3}}"),
     (None, [("set_config", {"config": {"theme": "dark", "count": 3}})])),
    (call("todo_list", "{todos:[]}"), (None, [("todo_list", {"todos": []})])),
    (call("set_config", "{config:{}}"), (None, [("set_config", {"config": {}})])),
    (call("amount", "{orig:1.5e10}"), (None, [("amount", {"orig": 1.5e10})])),
    # strings hold anything but the mark: commas, braces, brackets, colons, quotes, newlines, tags
    (call("f", '{s:<|"|>a, b} {c] d:e "q" \'r\'\n\tline<|"|>,t:<|"|><|"|>}'),
     (None, [("f", {"s": "a, b} {c] d:e \"q\" 'r'\n\tline", "t": ""})])),
    (call("f", '{s:<|"|>x<tool_call|>y<|tool_call>z<|"|>}'), (None, [("f", {"s": "x<tool_call|>y<|tool_call>z"})])),
    (call("f", '{s:<|"|>\\n \\" \\u00e9 é<|"|>}'), (None, [("f", {"s": '\\n \\" \\u00e9 é'})])),
    (call("f", '{s:<|"|>  padded \n<|"|>}'), (None, [("f", {"s": "  padded \n"})])),  # blanks kept
    # nesting, numbers of every JSON form, bools and nulls in arrays
    (call("f", '{a:{b:{c:[1,[2,[3,{d:<|"|>deep<|"|>}]]]}},n:[0,-0.5,1E+3,2e-2,123456789012345678901],'
               'm:[true,false,null]}'),
     (None, [("f", {"a": {"b": {"c": [1, [2, [3, {"d": "deep"}]]]}}, "n": [0, -0.5, 1000.0, 0.02,
                                                                          123456789012345678901],
                    "m": [True, False, None]})])),
    # blanks where llama.cpp's grammar takes them (a key keeps its own: any run of characters but : and })
    (call("f", '{ a: 1,\n b:\t[ 1, 2 ] ,c d :<|"|>x<|"|> }'), (None, [("f", {"a": 1, "b": [1, 2], "c d ": "x"})])),
    # what the template can write that llama.cpp does not read: keys in marks, Python's None
    (call("f", '{<|"|>k:1<|"|>:2,n:None}'), (None, [("f", {"k:1": 2, "n": None})])),
    # text around and between calls: stripped, blanks between calls are separators
    ("  I'll check.\n" + call("get_time", "{}") + "\n\n" + call("get_weather", "{}") + "\n",
     ("I'll check.", [("get_time", {}), ("get_weather", {})])),
    (call("get_time", "{}") + " and then " + call("get_weather", "{}") + " done.",
     ("and then  done.", [("get_time", {}), ("get_weather", {})])),
    # both forms in one reply
    (call("get_time", "{}") + '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
     (None, [("get_time", {}), ("f", {"x": 1})])),
]

# replies where a block is not a call: it stays in the content, as it is; other calls still count
MALFORMED = [
    (call("nope", "{a:1}"), []),  # not a given tool
    ('<|tool_call>call:get_time{city:<|"|>Paris<|"|>}', []),  # never closed
    ('<|tool_call>call:get_time{city:<|"|>Paris', []),  # a string never closed
    ("<|tool_call>call:get_time", []),
    ("<|tool_call>", []),
    ("<|tool_call>get_time{}<tool_call|>", []),  # no call:
    ("<|tool_call>call:get_time {}<tool_call|>", []),  # a blank before the arguments
    ("<|tool_call>call:get_time{} <tool_call|>", []),  # and after them
    ("<|tool_call>call:get_time{a:?}<tool_call|>", []),
    ("<|tool_call>call:get_time{a:1x}<tool_call|>", []),
    ("<|tool_call>call:get_time{a:01}<tool_call|>", []),
    ("<|tool_call>call:get_time{a:1e999}<tool_call|>", []),  # no JSON number for it
    ("<|tool_call>call:get_time{a:tru}<tool_call|>", []),
    ("<|tool_call>call:get_time{:1}<tool_call|>", []),  # an empty key
    ("<|tool_call>call:get_time{a}<tool_call|>", []),
    ("<|tool_call>call:get_time{a:1,}<tool_call|>", []),
    ("<|tool_call>call:get_time{a:[1,]}<tool_call|>", []),
    ('<|tool_call>call:get_time{a:"x"}<tool_call|>', []),  # JSON's quotes are not Gemma 4's
    ("<|tool_call>call:get_time[1]<tool_call|>", []),
    ("<|tool_call>call:" + "x" * 65 + "{}<tool_call|>", []),
    ("<|tool_call>call:get_time{a:" + "[" * 100 + "]" * 100 + "}<tool_call|>", []),  # too deep
    ("<|tool_call>call:get_time{a:" + "[" * 5000, []),  # (and no recursion error)
    # a broken call, then a good one: the good one is a call, the broken one text
    ("<|tool_call>call:get_time{a:?}<tool_call|>ok" + call("get_weather", "{}"), [("get_weather", {})]),
    ("<|tool_call>call:get_time{a:1" + call("get_weather", "{}"), [("get_weather", {})]),  # cut off by the next
    ("<tool_call|>stray close" + call("get_weather", "{}") + "<tool_call|>", [("get_weather", {})]),
]


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("text,want", PARSES, ids=[repr(t[:60]) for t, _ in PARSES])
def test_whole_replies_parse(text, want):
    content, calls = parse_reply(text, TOOLS)
    assert (content, _calls(calls)) == want
    for c in calls:
        assert c["type"] == "function" and re.fullmatch(r"call_[0-9a-f]{24}", c["id"])


def test_arguments_are_json_text():
    _, calls = parse_reply(call("get_time", '{city:<|"|>Zürich "old town"<|"|>,n:2}'), TOOLS)
    assert calls[0]["function"]["arguments"] == '{"city": "Zürich \\"old town\\"", "n": 2}'


@pytest.mark.parametrize("text,want", MALFORMED, ids=[repr(t[:60]) for t, _ in MALFORMED])
def test_malformed_calls_stay_text(text, want):
    content, calls = parse_reply(text, TOOLS)
    assert _calls(calls) == want
    if not want:
        assert content == text  # the reply as it is
    else:  # the text of the broken call is all in the content
        assert content == text.replace(call("get_weather", "{}"), "").strip()


def test_read_call_tells_where_a_call_ends():
    good = call("f", "{a:1}")
    assert read_call(good + "rest", False) == (len(good), "f", {"a": 1})
    for cut in range(len(G_OPEN), len(good)):
        assert read_call(good[:cut], False) is None  # more may complete it
        assert read_call(good[:cut], True) == (cut, None, None)  # all there is: not a call
    bad = "<|tool_call>call:f{a:?}"
    assert read_call(bad, False) is None  # broken, but where does it end?
    assert read_call(bad + G_CLOSE + "x", False) == (len(bad) + len(G_CLOSE), None, None)
    assert read_call(bad + "x" + G_OPEN, False) == (len(bad) + 1, None, None)


def _stream(text, cuts, tools=TOOLS):
    p, events, prev = StreamParser(tools), [], 0
    for c in [*cuts, len(text)]:
        events += p.feed(text[prev:c])
        prev = c
    events += p.finish()
    return events


def _agree(text, events):
    content, calls = parse_reply(text, TOOLS)
    assert "".join(v for k, v in events if k == "text").strip() == (content or "").strip()
    assert [v["function"] for k, v in events if k == "call"] == [c["function"] for c in calls]
    assert all(v for k, v in events if k == "text")


STREAMED = [t for t, _ in PARSES] + [t for t, _ in MALFORMED if len(t) < 400]


@pytest.mark.parametrize("text", STREAMED, ids=[repr(t[:60]) for t in STREAMED])
def test_a_stream_cut_anywhere_reads_as_the_whole_reply(text):
    """Cut in two at every place, and one character at a time: the same calls and the same content."""
    for i in range(len(text) + 1):
        _agree(text, _stream(text, [i]))
    _agree(text, _stream(text, range(1, len(text))))


def test_a_stream_cut_in_three_anywhere_reads_as_the_whole_reply():
    text = ("Sure.\n" + call("get_time", '{city:<|"|>a,b}<tool_call|><|"|>,n:[1,{x:-2.5e3}]}') + "\n"
            + "<|tool_call>call:get_time{a:?}<tool_call|>" + call("f", "{}") + " end")
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            _agree(text, _stream(text, [i, j]))


def test_a_stream_sends_text_and_calls_as_soon_as_they_are_settled():
    p = StreamParser(TOOLS)
    assert p.feed("Let me look. <|tool") == [("text", "Let me look. ")]  # "<|tool" may open a call: held
    assert p.feed('_call>call:get_time{city:<|"|>Paris') == []  # a call: held until it is complete
    out = p.feed('<|"|>}<tool_call|>')
    assert [k for k, _ in out] == ["call"] and out[0][1]["function"]["name"] == "get_time"
    assert json.loads(out[0][1]["function"]["arguments"]) == {"city": "Paris"}
    assert p.feed("\n") == []  # blanks after a call: held, dropped if nothing else follows
    assert p.feed("<|tool_call>call:get_time{a:?}") == []  # broken, its end not seen yet
    assert p.feed("<tool_call|>") == [("text", "\n<|tool_call>call:get_time{a:?}<tool_call|>")]
    assert p.feed("<|tool_call>call:get_time{a:1") == []
    assert p.finish() == [("text", "<|tool_call>call:get_time{a:1")]  # cut off: text


# -- the official template's calls read back ----------------------------------------------------------

ROUND_TRIPS = [
    [("get_weather", {"city": "Paris", "days": 2})],
    [("f", {"s": "a, b} {c] d:e \"q\" 'r'\n\tx\n", "empty": "", "unicode": "Zürich ✓"})],
    [("f", {"n": 0, "neg": -7, "pi": 3.14, "big": 1.5e10, "tiny": 1e-07, "large": 65536,
            "yes": True, "no": False, "nothing": None})],
    [("f", {"config": {"theme": "dark", "nested": {"list": [1, "two", [3.5, {"k": False}], {}], "e": []}}})],
    [("get_time", {}), ("get_weather", {"city": "London"}), ("f", {"todos": ["buy milk", "walk dog"]})],
]


def _rendered_calls(calls, reasoning=None):
    """An assistant turn with these calls, rendered by Gemma 4's official template: the model's part of it."""
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                  for i, (n, a) in enumerate(calls)]
    msg = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    if reasoning:
        msg["reasoning_content"] = reasoning
    text = render(CURRENT, [{"role": "user", "content": "Go"}, msg], add_generation_prompt=False)
    start = text.index("<|turn>model\n") + len("<|turn>model\n")
    return text[start:text.rindex(G_CLOSE) + len(G_CLOSE)]


@pytest.mark.parametrize("calls", ROUND_TRIPS, ids=[",".join(n for n, _ in c) for c in ROUND_TRIPS])
def test_the_templates_calls_read_back_to_the_same_calls(calls):
    text = _rendered_calls(calls)
    assert text.startswith(G_OPEN + "call:" + calls[0][0] + "{") and text.count(G_OPEN) == len(calls)
    content, parsed = parse_reply(text, TOOLS)
    assert content is None and _calls(parsed) == calls
    _agree(text, _stream(text, range(1, len(text))))


def test_the_templates_arguments_are_gemma4s_syntax():
    """(What the round trip reads: keys bare and sorted, strings in marks, Python's None and floats.)"""
    assert _rendered_calls([("f", {"b": "x, y", "a": [1, None, True, 2.5e10]})]) == \
        '<|tool_call>call:f{a:[1,None,true,25000000000.0],b:<|"|>x, y<|"|>}<tool_call|>'


def test_a_calls_reasoning_and_the_calls_read_back():
    """The template writes the reasoning before the calls (<|channel>thought ... <channel|>): split off by
    Gemma 4's reasoning rules, then the calls read out of the rest, as the server reads a reply."""
    calls = [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    text = _rendered_calls(calls, reasoning="Two lookups:\nweather, then time.")
    assert text.startswith("<|channel>thought\n")
    gen = SimpleNamespace(harmony=False, reasoning=True, reasoning_open=ReplyStart(GEMMA4_FORMAT))
    thinking, rest = harmony.split_for(gen, text)
    assert thinking == "Two lookups:\nweather, then time.\n"
    assert parse_reply(rest, TOOLS)[0] is None and _calls(parse_reply(rest, TOOLS)[1]) == calls


# -- the server's replies (OpenAI's and Ollama's), from Gemma 4's reply text -----------------------------

REPLY = ('<|channel>thought\nNeed the weather.<channel|>Checking.'
         + call("get_weather", '{city:<|"|>Paris, FR<|"|>,days:2}') + call("get_time", "{}"))
WANT_CALLS = [("get_weather", {"city": "Paris, FR", "days": 2}), ("get_time", {})]


def _generation(stream):
    from edgeinfer.openai import handlers as H
    from edgeinfer.openai import ollama_requests as OQ

    req = OQ.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream})
    return req, H.Generation(req.parsed, True, [1, 2], None, tools=TOOLS, shown=TOOLS, reasoning=True,
                             reasoning_open=ReplyStart(GEMMA4_FORMAT))


@pytest.mark.parametrize("step", [1, 3, 7, len(REPLY)])
def test_openai_replies_after_gemma4_reasoning(step):
    from edgeinfer.openai.responses import Chunks, chat_message

    _, gen = _generation(False)
    message, called = chat_message(gen, REPLY)
    assert called and message["reasoning_content"] == "Need the weather." and message["content"] == "Checking."
    assert _calls(message["tool_calls"]) == WANT_CALLS
    tok = SimpleNamespace(token_bytes=lambda t: b"x")
    chunks = Chunks(gen, "m", tok, "id", 0)
    out = [c for i in range(0, len(REPLY), step)
           for c in chunks(REPLY[i:i + step], "stop" if i + step >= len(REPLY) else None, [])]
    deltas = [c["choices"][0]["delta"] for c in out]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    names = [t["function"]["name"] for d in deltas for t in d.get("tool_calls", []) if "name" in t["function"]]
    args = [t["function"]["arguments"] for d in deltas for t in d.get("tool_calls", []) if "name" not in t["function"]]
    assert list(zip(names, map(json.loads, args))) == WANT_CALLS
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_replies_after_gemma4_reasoning(stream):
    from edgeinfer.openai import ollama_replies as OR

    req, gen = _generation(stream)
    replies = OR.Replies(gen, req, SimpleNamespace(token_bytes=lambda t: b"x"))
    if stream:
        objs = [o for i in range(0, len(REPLY), 4) for o in replies.deltas(REPLY[i:i + 4], [], i + 4 >= len(REPLY))]
        thinking = "".join(o["message"].get("thinking", "") for o in objs)
        calls = [c for o in objs for c in o["message"].get("tool_calls", [])]
        content = "".join(o["message"]["content"] for o in objs)
    else:
        m = replies.whole(REPLY, [], "stop", {})["message"]
        thinking, calls, content = m["thinking"], m["tool_calls"], m["content"]
    assert thinking == "Need the weather." and content == "Checking."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == WANT_CALLS
    assert [c["function"]["index"] for c in calls] == [0, 1]


# -- a tiny Gemma 4 model, served ------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}




BROKEN = "<|tool_call>call:get_weather{city:?}<tool_call|>"


def _regex(text):
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}" else c for c in text).replace("\n", "\\n")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("forced,want", [
    ("<|channel>thought\nplan\n<channel|>Checking." + call("get_weather", '{city:<|"|>Paris, FR<|"|>,days:2}'),
     ("plan\n", "Checking.", [("get_weather", {"city": "Paris, FR", "days": 2})])),
    (call("get_weather", '{city:<|"|>Oslo<|"|>}') + call("get_weather", '{city:<|"|>Rome<|"|>}'),
     (None, None, [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})])),
    (BROKEN, (None, BROKEN, [])),
])
def test_tool_calls_through_the_server(api, stream, forced, want):
    """The server renders the tools through Gemma 4's template and reads the forced reply's reasoning, text
    and calls (their tags as text, as Gemma 4's user-defined tokens decode)."""
    kw = dict(model="tiny-gemma4", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
              max_tokens=120, temperature=0,
              extra_body={"guided_regex": _regex(forced), "chat_template_kwargs": {"enable_thinking": True}})
    if stream:
        reasoning, content, names, args, finish = "", "", [], [], None
        for ch in api.chat.completions.create(stream=True, **kw):
            for c in ch.choices:
                reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
                content += c.delta.content or ""
                for t in c.delta.tool_calls or []:
                    if t.function.name:
                        names.append(t.function.name)
                    elif t.function.arguments:
                        args.append(json.loads(t.function.arguments))
                finish = c.finish_reason or finish
        got = (reasoning or None, content or None, list(zip(names, args)))
    else:
        choice = api.chat.completions.create(**kw).choices[0]
        msg, finish = choice.message, choice.finish_reason
        got = ((msg.model_extra or {}).get("reasoning_content"), msg.content,
               [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls or []])
    assert got == want
    assert finish == ("tool_calls" if want[2] else "stop")


def test_prepare_messages_leaves_gemma4_calls_to_the_template():
    """(The round trip's input: a call's JSON arguments become an object for the template to write.)"""
    msgs = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": [1]}'}}]}]
    assert prepare_messages(msgs, TOOLS, True)[0]["tool_calls"][0]["function"]["arguments"] == {"a": [1]}


def test_a_large_integer_argument_renders_through_the_template_macro():
    """The official template passes every tool-call argument to its format_argument macro: a timestamp is
    not a width or a count, and must render (the sandbox's integer bound is for filters and methods)."""
    call = {"id": "c1", "type": "function", "function": {"name": "at", "arguments": json.dumps({"ts": 1700000000})}}
    text = render(CURRENT, [{"role": "user", "content": "when?"},
                            {"role": "assistant", "content": "", "tool_calls": [call]}], add_generation_prompt=False)
    assert "ts:1700000000" in text.replace(" ", "")

"""Gemma 4's chat templates (tests/data/templates: llama.cpp's copies of Google's, the current one and the
older "interleaved" one) through edgeinfer's chat-template code, and Gemma 4's thought channel apart from
the answer (edgeinfer.reasoning, format "gemma4").

The expected prompts are what llama.cpp (0.3.36's vendored common/chat.cpp) renders for the same
conversations; the template's own output is also checked against jinja2 rendering it directly, the way
Hugging Face transformers does. The expected splits of replies are what llama.cpp's peg-gemma4 parser
gives (with reasoning_format auto)."""

import json
import pathlib
from types import SimpleNamespace

import pytest

from edgeinfer import harmony
from edgeinfer.chat_template import GEMMA4, ChatTemplate, default_template, gemma4_tool_responses
from edgeinfer.reasoning import (GEMMA4 as GEMMA4_FORMAT, THINK, ReasoningParser, ReplyStart, prompt_opens_reasoning,
                                 split_reasoning, splits, template_format, template_thinks)
from edgeinfer.tools import prepare_messages

TEMPLATES = pathlib.Path(__file__).parent / "data" / "templates"
CURRENT = (TEMPLATES / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")
INTERLEAVED = (TEMPLATES / "google-gemma-4-31B-it-interleaved.jinja").read_text(encoding="utf-8")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "days": {"type": "integer"}}, "required": ["city"]}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}
DECL = ('<|turn>system\n<|tool>declaration:get_weather{description:<|"|>The weather in a city<|"|>,parameters:'
        '{properties:{city:{description:<|"|>The city<|"|>,type:<|"|>STRING<|"|>},days:{type:<|"|>INTEGER<|"|>}},'
        'required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n')
NO_THINKING = "<|channel>thought\n<channel|>"  # what the generation prompt adds unless enable_thinking

SYSTEM_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
MULTI_TURN = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<|channel>thought\nhidden<channel|>Hello!"},
              {"role": "user", "content": "Again"}]
TOOL_FLOW = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
             {"role": "assistant", "content": "It is 21 degrees."}, {"role": "user", "content": "Thanks"}]
CALL_WITH_TEXT = [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
CALLED = '<|turn>model\n<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'

# (template, messages, tools, enable_thinking) -> the prompt llama.cpp renders (add_generation_prompt)
CASES = {
    "system and user": (CURRENT, SYSTEM_USER, None, False,
                        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n" + NO_THINKING),
    "thinking on": (CURRENT, SYSTEM_USER, None, True,
                    "<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    "an earlier answer's thoughts are dropped": (
        CURRENT, MULTI_TURN, None, False,
        "<bos><|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n<|turn>user\nAgain<turn|>\n<|turn>model\n"
        + NO_THINKING),
    "tools": (CURRENT, [{"role": "user", "content": "Weather in Paris?"}], [WEATHER], False,
              "<bos>" + DECL + "<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n" + NO_THINKING),
    "a call, its result and the answer": (
        CURRENT, TOOL_FLOW, [WEATHER], False,
        "<bos>" + DECL + "<|turn>user\nWeather in Paris?<turn|>\n" + CALLED
        + '<|tool_response>response:get_weather{value:<|"|>{"temp": 21}<|"|>}<tool_response|>It is 21 degrees.'
        "<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n" + NO_THINKING),
    # the turn ends after the result and the text; llama.cpp opens the model's next turn
    "a call with text": (
        CURRENT, CALL_WITH_TEXT, [WEATHER], False,
        "<bos>" + DECL + "<|turn>user\nWeather in Paris?<turn|>\n" + CALLED
        + '<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>Let me look.<turn|>\n'
        "<|turn>model\n"),
    "older template: system and user": (
        INTERLEAVED, SYSTEM_USER, None, False,
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n" + NO_THINKING),
    "older template: thinking on": (
        INTERLEAVED, SYSTEM_USER, None, True,
        "<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    # llama.cpp merges the tool messages into the call's message (tool_responses, the JSON parsed) for it
    "older template: a call, its result and the answer": (
        INTERLEAVED, TOOL_FLOW, [WEATHER], False,
        "<bos>" + DECL + "<|turn>user\nWeather in Paris?<turn|>\n" + CALLED
        + "<|tool_response>response:get_weather{temp:21}<tool_response|>It is 21 degrees.<turn|>\n"
        "<|turn>user\nThanks<turn|>\n<|turn>model\n" + NO_THINKING),
    "older template: a call with text": (  # (llama.cpp's merge keeps only a following answer's text)
        INTERLEAVED, CALL_WITH_TEXT, [WEATHER], False,
        "<bos>" + DECL + "<|turn>user\nWeather in Paris?<turn|>\n" + CALLED
        + '<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>' + NO_THINKING),
}


def render(source, messages, tools=None, thinking=False, add_generation_prompt=True):
    """As LLM.render_chat and the server do: tool calls' arguments as objects, the tools to the template."""
    t = ChatTemplate(source, "<bos>", "<eos>")
    return t.render(prepare_messages(messages, [], True), add_generation_prompt, tools=tools,
                    variables={"enable_thinking": thinking})


@pytest.mark.parametrize("name", list(CASES))
def test_prompts_as_llama_cpp_renders_them(name):
    source, messages, tools, thinking, want = CASES[name]
    assert render(source, messages, tools, thinking) == want


def _jinja2(source, messages, add_generation_prompt=True, **variables):
    """The template rendered by jinja2 itself, in transformers' environment."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    return env.from_string(source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          bos_token="<bos>", eos_token="<eos>", **variables)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_template_renders_as_jinja2_renders_it(name, add_generation_prompt):
    """edgeinfer's sandboxed, bounded environment renders the template as jinja2 does; what llama.cpp adds
    (the older template's merged tool messages, the model turn after a tool result's text) is the only
    difference."""
    source, messages, tools, thinking, _ = CASES[name]
    msgs = prepare_messages(messages, [], True)
    ours = render(source, messages, tools, thinking, add_generation_prompt)
    if source is INTERLEAVED:
        msgs = gemma4_tool_responses(msgs)
    want = _jinja2(source, msgs, add_generation_prompt, enable_thinking=thinking, **({"tools": tools} if tools else {}))
    if add_generation_prompt and want.endswith("<turn|>\n"):
        want += "<|turn>model\n"
    assert ours == want


def test_without_a_generation_prompt():
    assert render(CURRENT, SYSTEM_USER, add_generation_prompt=False) == \
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n"
    assert render(CURRENT, CALL_WITH_TEXT, [WEATHER], add_generation_prompt=False).endswith("Let me look.<turn|>\n")


def test_tool_messages_merged_as_llama_cpp_does():
    calls = [CALL, {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "ignored", "reasoning_content": "plan", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
            {"role": "tool", "tool_call_id": "c2", "content": "noon"},
            {"role": "tool", "tool_call_id": "c3", "content": "NaN"},  # a third result: named by its id
            {"role": "assistant", "content": "Done."}, {"role": "user", "content": "ok"}]
    assert gemma4_tool_responses(msgs) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": calls, "reasoning_content": "plan", "content": "Done.",
         "tool_responses": [{"name": "get_weather", "response": {"temp": 21}}, {"name": "get_time", "response": "noon"},
                            {"name": "c3", "response": "NaN"}]},
        {"role": "user", "content": "ok"}]
    # the current template renders tool messages itself: they are left alone
    assert ChatTemplate(CURRENT)._gemma4_merge_tools is False and ChatTemplate(INTERLEAVED)._gemma4_merge_tools


def test_a_gemma4_vocabulary_without_a_template_gets_gemma4_turns():
    tok = SimpleNamespace(_special_text={"<|turn>": 105, "<turn|>": 106, "<bos>": 2})
    assert default_template(tok) == GEMMA4
    t = ChatTemplate(None, "<bos>", fallback=GEMMA4)
    assert t.render(SYSTEM_USER) == ("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
                                     + NO_THINKING)
    assert t.render(SYSTEM_USER, variables={"enable_thinking": True}).endswith("Hi<turn|>\n<|turn>model\n")


def test_the_prompt_tokenizes_into_gemma4s_control_tokens(tmp_path):
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.tokenizer import Tokenizer
    from test_gemma4_tokenizer import write_vocab

    write_vocab(tmp_path / "v.gguf")
    tok = Tokenizer(GGUFFile(tmp_path / "v.gguf"))
    prompt = render(CURRENT, SYSTEM_USER)
    ids = tok.encode(prompt, parse_special=True)
    specials = [tok.tokens[i] for i in ids if tok.token_types[i] in (3, 4)]
    assert specials == ["<bos>", "<bos>", "<|turn>", "<turn|>", "<|turn>", "<turn|>", "<|turn>", "<|channel>",
                        "<channel|>"]  # (the tokenizer's BOS and the template's: LLM.render_chat drops one)
    assert tok.decode(ids[1:], special=True) == prompt


# -- the thought channel --------------------------------------------------------------------------

# reply -> (reasoning, content), as llama.cpp's peg-gemma4 parser splits it
REPLIES = [
    ("<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?", ("I'm\nthinking", "Hello, world!\nWhat's up?")),
    ("<|channel>thought<channel|>Hello, world!\nWhat's up?", (None, "Hello, world!\nWhat's up?")),
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<channel|>", (None, "Hello, world!\nWhat's up?")),
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|>", (None, "Hello, world!\nWhat's up?")),
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|><channel|>",
     (None, "Hello, world!\nWhat's up?")),
    ("<|channel><|channel>thought\n<channel|>Hello, world!\nWhat's up?", (None, "Hello, world!\nWhat's up?")),
    ("Hello, world!", (None, "Hello, world!")),
    ("", (None, "")),
    ("<|channel>thought\nI am\nthinking\n<channel|>Hello!", ("I am\nthinking\n", "Hello!")),  # trailing blanks kept
    ("  <|channel>thought\n  x  <channel|>  answer  ", ("x  ", "    answer  ")),  # the answer's blanks kept
    ("<|channel>thought\n \t\n<channel|>answer", (None, "answer")),
    ("A<|channel>thought\nX<channel|>B", ("X", "AB")),  # a block anywhere
    ("<|channel>thought\nA<channel|>B<|channel>thought\nC<channel|>D", ("AC", "BD")),
    ("A<|channel>thought\nX<|channel>thought\nY<channel|>Z", ("X<|channel>thought\nY", "AZ")),
    ("<|channel>thoughts\nX<channel|>Y", ("s\nX", "Y")),
    ("A\n\n<|channel>thought\n\n<channel|>\n\nB", (None, "A\n\n\n\nB")),
    ("<|channel>thought\nnever closed", ("never closed", "")),
    ("<|channel>thought\nnever closed \n", ("never closed \n", "")),
    ("<|channel>thought", (None, "")),
    ("Hello<channel|>more", (None, "Hello")),  # a close outside a block ends the reply
    ("<|channel>thought\nX<channel|><channel|>Y", ("X", "")),
    ("A<|channel>foo", (None, "A")),  # so does another channel
    ("Hello<|chan", (None, "Hello")),  # a partial tag at the end is dropped
    ("A<|channel>th", (None, "A")),
    ("A<channel", (None, "A")),
    ("<|channel>thought\nabc<chan", ("abc", "")),
    ("<|channel>thought\nabc<|chan", ("abc<|chan", "")),
    ("<think>x</think>y", (None, "<think>x</think>y")),  # not Gemma 4's tags
    ("Hi<turn|>x", (None, "Hi<turn|>x")),
]
# the prompt ends inside an open thought channel (a reply continued from its reasoning)
OPEN_REPLIES = [
    ("plan<channel|>answer", ("plan", "answer")),
    ("\n plan \n<channel|>\nanswer", ("plan \n", "\nanswer")),
    ("all reasoning", ("all reasoning", "")),
    ("<channel|>answer", (None, "answer")),
    ("", (None, "")),
]
ALL = [(t, False, w) for t, w in REPLIES] + [(t, True, w) for t, w in OPEN_REPLIES]


@pytest.mark.parametrize("text,inside,want", ALL, ids=[repr(t) + ("+open" if o else "") for t, o, _ in ALL])
def test_replies_split_as_llama_cpp_splits_them(text, inside, want):
    assert split_reasoning(text, ReplyStart(GEMMA4_FORMAT, inside)) == want
    assert split_reasoning(text, inside, fmt=GEMMA4_FORMAT) == want


@pytest.mark.parametrize("text,inside,want", ALL, ids=[repr(t) + ("+open" if o else "") for t, o, _ in ALL])
def test_every_cut_of_a_stream_gives_the_whole_texts_split(text, inside, want):
    """Cut in two and in three at every place, and one character at a time: the pieces join to the
    whole text's split, none of them empty."""
    n = len(text)
    cuts = [(i,) for i in range(n + 1)] + [(i, j) for i in range(n + 1) for j in range(i, n + 1)]
    cuts.append(tuple(range(1, n)))
    for cut in cuts:
        p = ReasoningParser(ReplyStart(GEMMA4_FORMAT, inside))
        out, prev = [], 0
        for c in [*cut, n]:
            out += p.feed(text[prev:c])
            prev = c
        out += p.finish()
        got = ("".join(t for k, t in out if k == "reasoning") or None, "".join(t for k, t in out if k == "content"))
        assert got == want, (cut, out)
        assert all(t for _, t in out)


def test_a_stream_gives_reasoning_as_it_comes():
    p = ReasoningParser(ReplyStart(GEMMA4_FORMAT))
    assert p.feed("<|channel>thought\nstep one") == [("reasoning", "step one")]
    assert p.feed(" and two\n<chan") == [("reasoning", " and two\n")]  # "<chan" held: it may close the block
    assert p.feed("nel|>The") == [("content", "The")]
    assert p.feed(" answer<|") == [("content", " answer")]
    assert p.finish() == []


def test_gemma4_templates_and_prompts():
    for source in (CURRENT, INTERLEAVED):
        assert template_thinks(source) and splits("auto", source) and template_format(source) == GEMMA4_FORMAT
        assert not harmony.is_harmony(source)
    assert template_format("{{ '<think>' }}") == THINK
    on = render(CURRENT, SYSTEM_USER, thinking=True)
    off = render(CURRENT, SYSTEM_USER)
    for prompt in (on, off):
        start = prompt_opens_reasoning(prompt)
        assert isinstance(start, ReplyStart) and start.fmt == GEMMA4_FORMAT and not start and start == False  # noqa: E712
    assert prompt_opens_reasoning(on + "<|channel>thought\nI was") == ReplyStart(GEMMA4_FORMAT, True)
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n") is True  # other formats: as before
    # another model's prompt quoting Gemma 4's tokens stays that model's, told by its template's format
    quoting = "<|im_start|>user\nwhat is <|channel>?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert prompt_opens_reasoning(quoting, THINK) is True
    assert prompt_opens_reasoning(on, GEMMA4_FORMAT) == ReplyStart(GEMMA4_FORMAT, False)
    with pytest.raises(ValueError, match="reasoning format"):
        ReasoningParser(fmt="qwen")


def test_the_servers_reply_reading_follows_the_prompts_format():
    """The server keeps prompt_opens_reasoning's answer as Generation.reasoning_open and hands it to
    ReasoningParser and split_reasoning (harmony.parser_for, split_for): a Gemma 4 prompt gets Gemma 4's
    rules with no other change."""
    gen = SimpleNamespace(harmony=False, reasoning=True,
                          reasoning_open=prompt_opens_reasoning(render(CURRENT, SYSTEM_USER, thinking=True)[-60:]))
    reply = "<|channel>thought\nplan\n<channel|>The answer."
    assert harmony.split_for(gen, reply) == ("plan\n", "The answer.")
    p = harmony.parser_for(gen)
    assert p.feed(reply) + p.finish() == [("reasoning", "plan\n"), ("content", "The answer.")]


def test_a_prompt_after_a_tool_result_is_still_gemma4s():
    """The server looks at the prompt's last 16 tokens: after a long tool result they hold no turn token."""
    tail = 'response:get_weather{value:<|"|>' + "x" * 40 + '<|"|>}<tool_response|>'
    assert prompt_opens_reasoning(tail) == ReplyStart(GEMMA4_FORMAT, False)
    assert prompt_opens_reasoning("plain text<|im_end|>\n<|im_start|>assistant\n") is False


# -- through the server ---------------------------------------------------------------------------


def write_tiny_gemma4_chat(path, chat_template: str) -> None:
    """A tiny random `llama` model with test_gemma4_tokenizer's gemma4 vocabulary and a Gemma 4 template:
    its replies are forced by a regular expression, so nothing depends on the weights."""
    import gguf
    import numpy as np
    from gguf.constants import GGMLQuantizationType as T
    from test_gemma4_tokenizer import MERGES, vocabulary
    from tiny_models import add_tensor, finish

    tokens, types = vocabulary()
    dim, n_head, ffn, vocab = 32, 2, 64, len(tokens)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 1), (w.add_context_length, 512), (w.add_embedding_length, dim),
                   (w.add_feed_forward_length, ffn), (w.add_head_count, n_head), (w.add_head_count_kv, n_head),
                   (w.add_rope_dimension_count, dim // n_head), (w.add_vocab_size, vocab)):
        add(v)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)
    add_tensor(w, "token_embd.weight", rng.standard_normal((vocab, dim)) * 0.5, T.F32)
    for name, shape in (("attn_q", (dim, dim)), ("attn_k", (dim, dim)), ("attn_v", (dim, dim)),
                        ("attn_output", (dim, dim)), ("ffn_gate", (ffn, dim)), ("ffn_up", (ffn, dim)),
                        ("ffn_down", (dim, ffn))):
        add_tensor(w, f"blk.0.{name}.weight", rng.standard_normal(shape) / np.sqrt(shape[1]), T.F32)
    add_tensor(w, "blk.0.attn_norm.weight", np.ones(dim), T.F32)
    add_tensor(w, "blk.0.ffn_norm.weight", np.ones(dim), T.F32)
    add_tensor(w, "output_norm.weight", np.ones(dim), T.F32)
    finish(w)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    openai = pytest.importorskip("openai")
    pytest.importorskip("starlette")
    import time

    from starlette.testclient import TestClient

    from edgeinfer.server.app import ServerConfig, create_app

    path = tmp_path_factory.mktemp("gemma4") / "tiny-gemma4.gguf"
    write_tiny_gemma4_chat(path, CURRENT)
    app = create_app(ServerConfig(models=[str(path)]))
    with TestClient(app) as http:
        t0 = time.monotonic()
        while http.get("/health").status_code != 200 and time.monotonic() - t0 < 120:
            time.sleep(0.1)
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("forced,want", [
    ("<|channel>thought\nplan it\n<channel|>the answer", ("plan it\n", "the answer")),
    ("the answer", (None, "the answer")),
    ("<|channel>thought\nstill thinking", ("still thinking", "")),
])
def test_reasoning_content_through_the_server(api, stream, forced, want):
    """The server renders the Gemma 4 template, and reads the reply (the channel tags as text, as Gemma 4's
    user-defined tokens decode) by Gemma 4's rules: reasoning_content apart from content."""
    regex = "".join("\\" + c if c in "\\.^$|?*+()[]{}" else c for c in forced).replace("\n", "\\n")
    kw = dict(model="tiny-gemma4", messages=SYSTEM_USER, max_tokens=80, temperature=0,
              extra_body={"guided_regex": regex, "chat_template_kwargs": {"enable_thinking": True}})
    if stream:
        reasoning, content = "", ""
        for ch in api.chat.completions.create(stream=True, **kw):
            for c in ch.choices:
                reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
                content += c.delta.content or ""
        got = (reasoning or None, content)
    else:
        msg = api.chat.completions.create(**kw).choices[0].message
        got = ((msg.model_extra or {}).get("reasoning_content"), msg.content)
    assert got == want

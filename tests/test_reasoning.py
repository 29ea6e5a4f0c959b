"""A thinking model's <think> block apart from its answer (edgeinfer.reasoning): the splitter on whole
texts and on every way a stream can cut them, and through the server's chat endpoint (reasoning_content,
streamed and not, `--reasoning-format none`, chat_template_kwargs) on tiny models whose chat templates
think, their replies forced by a regular-expression constraint so nothing depends on random weights."""

import time

import pytest

from edgeinfer.reasoning import ReasoningParser, prompt_opens_reasoning, split_reasoning, splits, template_thinks

# (text, prompt ends in an open <think>) -> (reasoning, answer)
CASES = [
    (("<think>plan</think>answer", False), ("plan", "answer")),
    (("<think>\nplan\n</think>\n\nanswer", False), ("plan", "answer")),  # Qwen3's blanks, stripped
    (("  <think> a  plan </think>  the answer ", False), ("a  plan", "the answer ")),
    (("no thinking here", False), (None, "no thinking here")),  # a reply that does not think: untouched
    (("  leading blanks kept", False), (None, "  leading blanks kept")),
    (("text before <think>x</think>y", False), (None, "text before <think>x</think>y")),  # only at the start
    (("<think>a <think> b</think>c</think>d", False), ("a <think> b", "c</think>d")),  # the first </think> ends it
    (("<think></think>answer", False), (None, "answer")),  # empty reasoning is none
    (("<think> \n </think>answer", False), (None, "answer")),
    (("<think>never closed", False), ("never closed", "")),  # an open block is all reasoning
    (("<think>never closed </thi", False), ("never closed </thi", "")),
    (("<thinking>not our tag</thinking>", False), (None, "<thinking>not our tag</thinking>")),
    (("<thi", False), (None, "<thi")),
    (("", False), (None, "")),
    (("<think>", False), (None, "")),
    (("</think>answer", False), (None, "</think>answer")),
    # the template opened the block: the reply starts in it
    (("plan</think>answer", True), ("plan", "answer")),
    (("\nplan\n</think>\n\nanswer", True), ("plan", "answer")),
    (("<think>plan</think>answer", True), ("plan", "answer")),  # a <think> written again is dropped
    (("all reasoning", True), ("all reasoning", "")),
    (("</think>answer", True), (None, "answer")),
    (("", True), (None, "")),
]


@pytest.mark.parametrize("case,want", CASES, ids=[repr(c[0]) + ("+open" if c[1] else "") for c, _ in CASES])
def test_split_reasoning(case, want):
    assert split_reasoning(*case) == want


def _pieces(text: str, cuts, in_reasoning: bool) -> list[tuple[str, str]]:
    p = ReasoningParser(in_reasoning)
    out, prev = [], 0
    for c in [*cuts, len(text)]:
        out += p.feed(text[prev:c])
        prev = c
    return out + p.finish()


def _joined(pieces) -> tuple[str | None, str]:
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    return reasoning or None, "".join(t for k, t in pieces if k == "content")


@pytest.mark.parametrize("case,want", CASES, ids=[repr(c[0]) + ("+open" if c[1] else "") for c, _ in CASES])
def test_every_cut_of_a_stream_gives_the_whole_texts_split(case, want):
    """Cut in two and in three at every place (so every tag is split at every boundary), and one
    character at a time: the pieces join to the whole text's split (so no part of a tag ever went out
    as text of either kind)."""
    text, open_ = case
    n = len(text)
    cuts = [(i,) for i in range(n + 1)] + [(i, j) for i in range(n + 1) for j in range(i, n + 1)]
    cuts.append(tuple(range(1, n)))
    for cut in cuts:
        pieces = _pieces(text, cut, open_)
        assert _joined(pieces) == want, (cut, pieces)
        assert all(t for _, t in pieces)  # no empty pieces


def test_a_stream_gives_reasoning_as_it_comes():
    """Reasoning is not held back until the block ends: only what could be a tag or trailing blanks."""
    p = ReasoningParser()
    assert p.feed("<think>step one") == [("reasoning", "step one")]
    assert p.feed(" and two </th") == [("reasoning", " and two")]  # " </th" held: it may close the block
    assert p.feed("ink>\n\nThe") == [("content", "The")]
    assert p.feed(" answer") == [("content", " answer")]
    assert p.finish() == []


def test_which_templates_and_prompts_think():
    assert template_thinks("{{ '<think>' }}") and not template_thinks("{{ messages }}") and not template_thinks(None)
    assert splits("auto", "...<think>...") and not splits("auto", "plain") and splits("deepseek", "plain")
    assert not splits("none", "<think>")
    with pytest.raises(ValueError, match="reasoning_format"):
        splits("qwen", "<think>")
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("user: what does <think> do?<|im_end|>\n<|im_start|>assistant\n")


# -- through the server ---------------------------------------------------------------------------

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

_TURNS = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}")
# Qwen3's shape: the model opens its own <think> block; enable_thinking=false writes an empty one
QWEN3_LIKE = (_TURNS + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
              "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
              "{% endif %}{% endif %}")
# DeepSeek-R1's shape: the template opens the block for the model
OPENS_THINK = _TURNS + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
MESSAGES = [{"role": "user", "content": "the hen"}]


def _regex(text: str) -> str:
    """A regular expression matching exactly `text`."""
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}" else c for c in text).replace("\n", "\\n")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from tiny_models import write_tiny_llama

    d = tmp_path_factory.mktemp("reasoning")
    out = {}
    for name, template in (("tiny-think", QWEN3_LIKE), ("tiny-think-open", OPENS_THINK), ("tiny-plain", None)):
        out[name] = d / f"{name}.gguf"
        kw = {} if template is None else {"chat_template": template}
        write_tiny_llama(out[name], n_ctx=1024, **kw)  # room for the tools' prompt
    return out


def _serve(paths, **config):
    from starlette.testclient import TestClient

    from edgeinfer.server.app import ServerConfig, create_app

    app = create_app(ServerConfig(models=[str(p) for p in paths.values()], **config))
    with TestClient(app) as http:
        t0 = time.monotonic()
        while http.get("/health").status_code != 200 and time.monotonic() - t0 < 120:  # loading
            time.sleep(0.1)
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
        client.http = http
        yield client


@pytest.fixture(scope="module")
def api(paths):
    yield from _serve(paths)


@pytest.fixture(scope="module")
def api_none(paths):
    yield from _serve(paths, reasoning_format="none")


def reply(client, model: str, forced: str, stream: bool, **extra) -> dict:
    """The message of a reply forced to be `forced`: {"content", "reasoning_content" (absent when the
    server gave none), "finish_reason"}; a stream's deltas joined, each delta checked to be one kind."""
    tools = {"tools": extra.pop("tools")} if "tools" in extra else {}
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=120, temperature=0, stream=stream,
                                       extra_body={"guided_regex": _regex(forced), **extra}, **tools)
    if not stream:
        msg = r.choices[0].message
        out = {"content": msg.content, "finish_reason": r.choices[0].finish_reason, "tool_calls": msg.tool_calls}
        if "reasoning_content" in (msg.model_extra or {}):
            out["reasoning_content"] = msg.model_extra["reasoning_content"]
        return out
    out = {"content": "", "finish_reason": None, "tool_calls": None}
    for ch in r:
        for c in ch.choices:
            d = c.delta
            extra_fields = d.model_extra or {}
            assert not (d.content and extra_fields.get("reasoning_content")), d  # one kind per delta
            out["content"] += d.content or ""
            if extra_fields.get("reasoning_content"):
                out["reasoning_content"] = out.get("reasoning_content", "") + extra_fields["reasoning_content"]
            out["tool_calls"] = out["tool_calls"] or d.tool_calls
            out["finish_reason"] = c.finish_reason or out["finish_reason"]
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_content_apart_from_content(api, stream):
    r = reply(api, "tiny-think", "<think>\nplan it\n</think>\n\nthe answer", stream)
    assert r["reasoning_content"] == "plan it" and r["content"] == "the answer" and r["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_block_never_closed_is_all_reasoning(api, stream):
    r = reply(api, "tiny-think", "<think>still thinking", stream)
    assert r["reasoning_content"] == "still thinking" and r["content"] == ""


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_that_opens_the_block_starts_in_reasoning(api, stream):
    r = reply(api, "tiny-think-open", "plan</think>answer", stream)
    assert r["reasoning_content"] == "plan" and r["content"] == "answer"


@pytest.mark.parametrize("stream", [False, True])
def test_a_thinking_model_that_does_not_think_has_no_reasoning(api, stream):
    r = reply(api, "tiny-think", "just <think> an answer", stream)
    assert r["content"] == "just <think> an answer" and r.get("reasoning_content") is None


@pytest.mark.parametrize("stream", [False, True])
def test_models_whose_template_does_not_think_are_untouched(api, stream):
    r = reply(api, "tiny-plain", "<think>plan</think>answer", stream)
    assert r["content"] == "<think>plan</think>answer" and "reasoning_content" not in r


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_format_none_leaves_the_text_whole(api_none, stream):
    r = reply(api_none, "tiny-think", "<think>plan</think>answer", stream)
    assert r["content"] == "<think>plan</think>answer" and "reasoning_content" not in r
    r = reply(api_none, "tiny-think-open", "plan</think>answer", stream)
    assert r["content"] == "plan</think>answer" and "reasoning_content" not in r


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_inside_reasoning_are_not_tool_calls(api, stream):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    r = reply(api, "tiny-think", f"<think>{call}</think>done", stream, tools=tools)
    assert r["reasoning_content"] == call and r["content"] == "done"
    assert not r["tool_calls"] and r["finish_reason"] == "stop"
    r = reply(api, "tiny-think", f"<think>plan</think>{call}", stream, tools=tools)  # after it, they are
    assert r["reasoning_content"] == "plan" and r["tool_calls"][0].function.name == "f"
    assert r["finish_reason"] == "tool_calls"


def test_n_choices_each_split(api):
    r = api.chat.completions.create(model="tiny-think", messages=MESSAGES, max_tokens=40, temperature=1.0, seed=3,
                                    n=3, extra_body={"guided_regex": "<think>(a|b|c)</think>(x|y|z)"})
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert c.message.model_extra["reasoning_content"] in ("a", "b", "c") and c.message.content in ("x", "y", "z")


def test_chat_template_kwargs_reach_the_template(api):
    """{"enable_thinking": false} makes Qwen3's template write an empty block: the prompt is longer, and
    it does not end inside a block (a reply without one is all answer)."""
    plain = api.chat.completions.create(model="tiny-think", messages=MESSAGES, max_tokens=2, temperature=0)
    off = api.chat.completions.create(model="tiny-think", messages=MESSAGES, max_tokens=40, temperature=0,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                                  "guided_regex": "the answer"})
    assert off.usage.prompt_tokens > plain.usage.prompt_tokens
    assert off.choices[0].message.content == "the answer"
    assert off.choices[0].message.model_extra.get("reasoning_content") is None
    for kwargs, why in (({"messages": 1}, "the server sets it"), ({"not a name": 1}, "chat_template_kwargs"),
                        ([1], "must be an object")):
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model="tiny-think", messages=MESSAGES, max_tokens=2,
                                        extra_body={"chat_template_kwargs": kwargs})
        err = e.value.response.json()["error"]
        assert err["param"] == "chat_template_kwargs" and why in err["message"], err

"""gpt-oss beside the other families: its MXFP4 experts and layer kinds as loaded, its harmony replies apart
into reasoning, answer and tool calls (streamed and whole, on the OpenAI and Ollama paths), its stop tokens and
its official chat template with the reasoning effort. The golden checks against llama.cpp, compiled step
against per-op, chunked and batched runs are test_arch_zoo's (the zoo's `gpt-oss`)."""

import numpy as np
import pytest

from conftest import golden_path
from edgeinfer.chat_template import ChatTemplate
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.harmony import HarmonyParser, is_harmony, split_harmony
from edgeinfer.kernels import get_backend, kinds
from edgeinfer.models import load_model

TEMPLATE = golden_path("templates/openai-gpt-oss-120b.jinja")
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. Use the tool.<|end|>"
CALL = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 20 C in Paris."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def test_the_zoo_model_loads_mxfp4_experts_and_alternating_windows(zoo):
    m = load_model(GGUFFile(zoo("gpt-oss")), get_backend("cpu"))
    lw = m.layers[0]
    assert kinds.info(lw.exp_gate[0].kind).ggml.name == "MXFP4" and lw.sinks.shape == (4,)
    assert [m.cfg.is_sliding(i) for i in range(4)] == [True, False, True, False]  # every second layer full
    assert m.cfg.rope_yarn == (16, 32.0, 1.0) and m.stack is not None and m.stack.moe.oai == 1


@pytest.mark.parametrize("text, want", [
    (ANALYSIS + FINAL, ("The user wants the weather. Use the tool.", "It is 20 C in Paris.")),
    (ANALYSIS + CALL, ("The user wants the weather. Use the tool.",
                       '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')),
    # the recipient before the channel, the call's terminator in the text
    ("<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>",
     (None, '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')),
    # a preamble on the commentary channel is shown; a reply without any header is text as it is
    ("<|channel|>commentary<|message|>Checking.<|end|>" + FINAL, (None, "Checking.It is 20 C in Paris.")),
    ("Just text, no channels.", (None, "Just text, no channels.")),
    # a reply cut off in the reasoning: all reasoning; a malformed call's text kept for the tool parser
    (ANALYSIS[:-len("<|end|>")], ("The user wants the weather. Use the tool.", "")),
    (CALL.replace('"Paris"}', '"Par'), (None, '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Par"}'
                                              '\n</tool_call>')),
])
def test_a_harmony_reply_splits_by_channel_whole_and_streamed(text, want):
    assert split_harmony(text) == want
    for step in (1, 3, 7):  # any cut of the stream, through the control tokens: the same pieces joined
        p, pieces = HarmonyParser(), []
        for i in range(0, len(text), step):
            pieces += p.feed(text[i:i + step])
        pieces += p.finish()
        joined = {"reasoning": "", "content": ""}
        for kind, piece in pieces:
            joined[kind] += piece
        assert (joined["reasoning"] or None, joined["content"]) == want
    reasoning, content = split_harmony(text, reasoning=False)  # --reasoning-format none: analysis is content
    assert reasoning is None and content == (want[0] or "") + want[1]


def test_harmony_stops_at_return_and_call_not_at_end(zoo):
    from edgeinfer.tokenizer import Tokenizer

    with GGUFFile(zoo("gpt-oss")) as gf:
        tok = Tokenizer(gf)
    ids = {t: tok.encode(t, add_bos=False, parse_special=True)[0] for t in ("<|end|>", "<|return|>", "<|call|>")}
    assert ids["<|return|>"] in tok.stop_ids and ids["<|call|>"] in tok.stop_ids and ids["<|end|>"] not in tok.stop_ids
    assert tok.decode([ids["<|end|>"]]) == "" and tok.decode([ids["<|end|>"]], special=True) == "<|end|>"


def test_the_official_template_renders_the_reasoning_effort_and_tools():
    src = open(TEMPLATE).read()
    assert is_harmony(src)
    t = ChatTemplate(src)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    assert "Reasoning: medium" in t.render(msgs) and "Reasoning: high" in t.render(msgs, variables={"reasoning_effort": "high"})
    called = msgs + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "20 C"}]
    text = t.render(called, tools=TOOLS)
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in text
    assert text.endswith('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
                         '<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"20 C"'
                         '<|end|><|start|>assistant')


@pytest.fixture(scope="module")
def llm(zoo):
    from edgeinfer import LLM

    return LLM(str(zoo("gpt-oss")))


def _generation(llm, body):
    from edgeinfer.openai import handlers, protocol

    req = protocol.parse_common(body, chat=True)
    return handlers.prepare_generation(llm, "gpt-oss", body, req, True)


def test_a_chat_request_to_a_harmony_model_keeps_the_control_tokens_and_splits_the_reply(llm):
    from edgeinfer.openai.responses import Chunks, chat_message

    body = {"model": "gpt-oss", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
            "reasoning_effort": "low", "max_tokens": 4}
    gen = _generation(llm, body)
    assert gen.harmony and gen.reasoning and gen.params.special_text
    assert "Reasoning: low" in llm.tokenizer.decode(gen.prompt_ids, special=True)
    message, called = chat_message(gen, ANALYSIS + CALL)
    assert called and message["reasoning_content"] == "The user wants the weather. Use the tool."
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    chunks = Chunks(gen, "gpt-oss", llm.tokenizer, "id", 0)
    text = ANALYSIS + CALL
    out = []
    for i in range(0, len(text), 5):
        out += chunks(text[i:i + 5], None, [])
    out += chunks("", "stop", [])
    deltas = [c["choices"][0]["delta"] for c in out]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user wants the weather. Use the tool."
    assert not any(d.get("content") for d in deltas)
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_ollama_chat_puts_the_analysis_channel_in_thinking(llm):
    from edgeinfer.openai import ollama_replies, ollama_requests

    req = ollama_requests.parse_chat({"model": "gpt-oss", "messages": [{"role": "user", "content": "Hi"}]})
    gen = ollama_requests.prepare(llm, "gpt-oss", req)
    r = ollama_replies.Replies(gen, req, llm.tokenizer)
    whole = r.whole(ANALYSIS + FINAL, [], "stop", {})
    assert whole["message"]["thinking"] == "The user wants the weather. Use the tool."
    assert whole["message"]["content"] == "It is 20 C in Paris."


def test_reasoning_effort_needs_a_template_that_takes_it(zoo):
    from edgeinfer import LLM
    from edgeinfer.openai.protocol import APIError

    other = LLM(str(zoo("qwen3")))
    with pytest.raises(APIError, match="its chat template has no reasoning effort"):
        _generation(other, {"model": "q", "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "high"})
    with pytest.raises(APIError, match="must be low, medium or high"):
        _generation(other, {"model": "q", "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "max"})


def test_quantize_model_writes_llama_quantizes_mxfp4_moe_file_byte_for_byte(tmp_path):
    """MXFP4_MOE of the zoo model's F16 form: the 3-D experts MXFP4, every other matrix (output and token_embd
    too) Q8_0, the router, norms, biases and sinks kept; sha256 from llama-quantize (make_arch_golden.py)."""
    import json

    from arch_zoo import quantize_model_q4_k_m

    want = json.load(open(golden_path("arch_zoo.json")))["models"]["gpt-oss"]["llama_quantize_mxfp4_moe_sha256"]
    sha, dst = quantize_model_q4_k_m("gpt-oss", tmp_path, "MXFP4_MOE")
    types = {n: t.ggml_type.name for n, t in GGUFFile(dst).tensors.items()}
    assert (types["blk.0.ffn_up_exps.weight"], types["blk.0.attn_q.weight"], types["output.weight"],
            types["token_embd.weight"], types["blk.0.ffn_gate_inp.weight"], types["blk.0.attn_sinks.weight"]) == \
        ("MXFP4", "Q8_0", "Q8_0", "Q8_0", "F32", "F32")
    assert sha == want


def test_the_cli_chat_keeps_only_the_answer_of_a_harmony_reply(capsys):
    """`edgeinfer chat` shows the reasoning (dimmed on a terminal) then the answer, and only the answer goes
    back into the conversation."""
    from cli.chat import _show

    text, answer, parser = ANALYSIS + FINAL, [], HarmonyParser()
    for i in range(0, len(text), 4):
        _show(text[i:i + 4], parser, answer)
    _show("", parser, answer, True)
    assert "".join(answer) == "It is 20 C in Paris."
    assert capsys.readouterr().out == "The user wants the weather. Use the tool.It is 20 C in Paris."


def test_ollama_generate_and_show_know_a_harmony_model(llm, zoo):
    """/api/generate through the template parses the reply by channel too; /api/show lists thinking."""
    from edgeinfer.openai import ollama_models, ollama_replies, ollama_requests

    req = ollama_requests.parse_generate({"model": "gpt-oss", "prompt": "Hi"})
    gen = ollama_requests.prepare(llm, "gpt-oss", req)
    assert gen.harmony and gen.params.special_text
    whole = ollama_replies.Replies(gen, req, llm.tokenizer).whole(ANALYSIS + FINAL, [], "stop", {})
    assert (whole["thinking"], whole["response"]) == ("The user wants the weather. Use the tool.", "It is 20 C in Paris.")
    raw = ollama_requests.prepare(llm, "gpt-oss", ollama_requests.parse_generate({"model": "gpt-oss", "prompt": "Hi",
                                                                                   "raw": True}))
    assert not raw.harmony and not raw.params.special_text  # a raw prompt's reply is the model's text as it is
    with GGUFFile(zoo("gpt-oss")) as gf:
        assert "thinking" in ollama_models.model_facts(gf)["capabilities"]


def test_the_python_chat_parses_a_harmony_reply(llm, monkeypatch):
    """LLM.chat on a harmony model asks for the control tokens' text and splits the reply: reasoning apart, the
    answer as text, a call as tool_calls (the generation itself stubbed with a reply the model would give)."""
    from edgeinfer.llm import Completion

    seen = {}

    def generate(prompts, params):
        seen["special"] = params.special_text
        return [Completion(ANALYSIS + CALL, [], [], "stop")]

    monkeypatch.setattr(llm, "generate", generate)
    comp = llm.chat([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    assert seen["special"] and comp.reasoning == "The user wants the weather. Use the tool."
    assert comp.finish_reason == "tool_calls" and comp.tool_calls[0]["function"]["name"] == "get_weather"

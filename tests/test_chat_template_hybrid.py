"""The hybrid families' official chat templates render (Qwen3.5, LFM2 and LFM2.5, Granite 4.0, Nemotron Nano
v2): copies of llama.cpp's models/templates/ (each a model's tokenizer_config.json chat_template) in
tests/golden/templates/. The expected strings are each family's documented turn format."""

import pytest

from conftest import golden_path
from edgeinfer.chat_template import ChatTemplate

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def template(name: str, **kw) -> ChatTemplate:
    return ChatTemplate(open(golden_path(f"templates/{name}.jinja")).read(), **kw)


def test_qwen35_thinks_by_default_and_writes_xml_tool_calls():
    t = template("Qwen3.5-4B")
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(MSGS) == head + "<think>\n"
    assert t.render(MSGS, variables={"enable_thinking": False}) == head + "<think>\n\n</think>\n\n"
    out = t.render([*MSGS, {"role": "assistant", "content": "", "tool_calls": [CALL]},
                    {"role": "tool", "content": "sunny"}], tools=[WEATHER])
    assert "# Tools\n\nYou have access to the following functions:\n\n<tools>" in out
    assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>" in out
    assert "<tool_response>\nsunny\n</tool_response>" in out and out.endswith("<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize("name", ["LFM2.5-Instruct", "LFM2-8B-A1B"])
def test_lfm2_chatml_with_the_bos_token(name):
    t = template(name, bos_token="<|startoftext|>")
    assert t.render(MSGS) == ("<|startoftext|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                              "<|im_start|>assistant\n")
    assert "List of tools: " in t.render(MSGS, tools=[WEATHER])


def test_granite4_roles_and_tools():
    t = template("ibm-granite-granite-4.0")
    assert t.render(MSGS) == ("<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n"
                              "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
                              "<|start_of_role|>assistant<|end_of_role|>")
    with_tools = t.render(MSGS, tools=[WEATHER])
    assert "<tools>" in with_tools and '"name": "get_weather"' in with_tools


def test_nemotron_nano_v2_turns_and_its_thinking_switch():
    t = template("NVIDIA-Nemotron-Nano-v2")
    assert t.render(MSGS) == "<SPECIAL_10>System\nBe brief.\n\n<SPECIAL_11>User\nHi\n<SPECIAL_11>Assistant\n<think>\n"
    off = t.render([{"role": "system", "content": "/no_think"}, MSGS[1]])
    assert off.endswith("<SPECIAL_11>Assistant\n<think></think>")

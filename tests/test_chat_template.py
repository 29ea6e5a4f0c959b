"""Chat templates rendered in a sandbox as transformers does."""

import pytest

from edgeinfer.chat_template import CHATML, GEMMA, ChatTemplate, ChatTemplateError

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_chatml():
    out = ChatTemplate(None).render(MSGS)
    assert out == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_gemma_fallback_folds_system_into_the_first_turn():
    out = ChatTemplate(None, bos_token="<bos>", fallback=GEMMA).render(MSGS)
    assert out == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_gguf_template_with_bos_and_raise_exception():
    src = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
           "{{ raise_exception('no tools here') }}{% endif %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}")
    t = ChatTemplate(src, bos_token="<s>")
    assert t.render(MSGS, add_generation_prompt=False) == "<s>[system]Be brief.[user]Hi"
    with pytest.raises(ChatTemplateError, match="no tools here"):
        t.render([{"role": "tool", "content": "x"}])


def test_template_that_does_not_parse():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for %}")


def test_sandbox_blocks_attribute_escapes():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        t.render(MSGS)


@pytest.mark.parametrize("msgs,fragment", [
    ([], "non-empty list"),
    ([{"role": "wizard", "content": "x"}], "role 'wizard'"),
    ([{"role": "user", "content": 3}], "content must be a string"),
    (["hi"], "must be an object"),
])
def test_bad_messages(msgs, fragment):
    with pytest.raises(ChatTemplateError, match=fragment):
        ChatTemplate(CHATML).render(msgs)


def test_content_parts_are_joined():
    out = ChatTemplate(None).render([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]}])
    assert "ab<|im_end|>" in out


# -- the new families' official templates ----------------------------------------------------------
# Copied from llama.cpp's models/templates/ (each a model's tokenizer_config.json chat_template), except
# OLMO2 (see there). Raw strings: a `\n` inside a template's own string literal stays the two characters.

# models/templates/Qwen-Qwen3-0.6B.jinja
QWEN3 = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}'''

# models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja
LLAMA32 = r'''{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
'''

# models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja (Llama 3.1's, with builtin_tools), the part
# after the system message's extraction cut to its tool-call branch
LLAMA33_BUILTIN = r'''{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
'''

# models/templates/microsoft-Phi-3.5-mini-instruct.jinja
PHI35 = r'''{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %}'''

# microsoft/Phi-4-mini-instruct's tokenizer_config.json
PHI4_MINI = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] "
    "is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + "
    "'<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)

# models/templates/google-gemma-2-2b-it.jinja
GEMMA2 = r'''{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %}'''

# allenai/OLMo-2-1124-*-Instruct: Tulu 3's template (open-instruct) after the BOS (<|endoftext|>), the
# format the model card gives; llama.cpp keeps no copy of it
OLMO2 = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + "
    "message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + "
    "eos_token + '\n' }}{% else %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}"
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def test_qwen3_plain_and_enable_thinking():
    t = ChatTemplate(QWEN3)
    plain = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(MSGS) == plain
    assert t.render(MSGS, variables={"enable_thinking": True}) == plain  # thinking: the model opens <think>
    assert t.render(MSGS, variables={"enable_thinking": False}) == plain + "<think>\n\n</think>\n\n"


def test_qwen3_reasoning_of_earlier_turns_is_dropped_and_the_last_kept():
    t = ChatTemplate(QWEN3)
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "\nAdd them.\n"}]
    out = t.render(msgs, add_generation_prompt=False)
    assert out == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                   "<|im_start|>user\n2+2?<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>\n")


def test_qwen3_tools_tool_calls_and_responses():
    t = ChatTemplate(QWEN3)
    assert t.knows_tools
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "c2"}]},
            {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "warm"}]
    out = t.render(msgs, tools=[WEATHER])
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "The weather in a ' \
           'city."' in out  # tojson: plain JSON, not HTML-escaped
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    # a turn after the last query that is not the last and has no reasoning: no think block
    assert f"<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n{call}\n{call}<|im_end|>\n" in out
    assert out.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n"
                        "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_llama3_templates_date_tools_and_builtin_tools():
    from datetime import datetime

    t = ChatTemplate(LLAMA32, bos_token="<|begin_of_text|>")
    out = t.render(MSGS, variables={"date_string": "26 Jul 2024"})
    assert out == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
                   "2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                   "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}\n" in t.render(MSGS)  # strftime_now
    with_tools = t.render(MSGS, tools=[WEATHER])
    assert "Environment: ipython\n" in with_tools and '{\n    "type": "function",\n' in with_tools  # tojson(indent=4)
    assert with_tools.count("<|start_header_id|>user<|end_header_id|>") == 1 and "Hi<|eot_id|>" in with_tools
    called = t.render([*MSGS, {"role": "assistant", "content": "", "tool_calls": [CALL]}], add_generation_prompt=False)
    assert called.endswith('{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>')
    with pytest.raises(ChatTemplateError, match="only supports single tool-calls"):
        t.render([*MSGS, {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]}])
    b = ChatTemplate(LLAMA33_BUILTIN, bos_token="<|begin_of_text|>")
    search = {"function": {"name": "brave_search", "arguments": {"query": "paris weather"}}}
    out = b.render([MSGS[1], {"role": "assistant", "content": "", "tool_calls": [search]}], add_generation_prompt=False,
                   variables={"builtin_tools": ["brave_search", "code_interpreter"]})
    assert "Tools: brave_search\n\n" in out  # reject('equalto', ...) | join
    assert out.endswith('<|python_tag|>brave_search.call(query="paris weather")<|eom_id|>')  # | items


def test_phi_templates():
    assert ChatTemplate(PHI35, eos_token="<|endoftext|>").render(MSGS) == \
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert ChatTemplate(PHI35, eos_token="<|endoftext|>").render(MSGS[1:], add_generation_prompt=False) == \
        "<|user|>\nHi<|end|>\n<|endoftext|>"
    t = ChatTemplate(PHI4_MINI, eos_token="<|endoftext|>")
    assert t.render(MSGS) == "<|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>"
    tools = [{**MSGS[0], "tools": '[{"name": "get_weather"}]'}, MSGS[1]]  # Phi-4-mini: tools on the system message
    assert t.render(tools).startswith('<|system|>Be brief.<|tool|>[{"name": "get_weather"}]<|/tool|><|end|><|user|>')


def test_gemma2_template_and_its_own_errors():
    t = ChatTemplate(GEMMA2, bos_token="<bos>")
    msgs = [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"}]
    assert t.render(msgs) == ("<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
                              "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(ChatTemplateError, match="the chat template raised: System role not supported"):
        t.render(MSGS)
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render([msgs[0], msgs[0]])


def test_olmo2_template():
    t = ChatTemplate(OLMO2, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    assert t.render(MSGS) == "<|endoftext|><|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    turns = [MSGS[1], {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    assert t.render(turns, add_generation_prompt=False) == \
        "<|endoftext|><|user|>\nHi\n<|assistant|>\nHello<|endoftext|>\n<|user|>\nBye\n"


def test_loop_controls_and_generation_blocks_render():
    # transformers' environment has jinja2's loopcontrols and a {% generation %} tag: templates use both
    src = ("{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
           "{% if loop.index > 3 %}{% break %}{% endif %}{% if m['role'] == 'assistant' %}{% generation %}"
           "{% set x = m['content'] %}[{{ x }}]{% endgeneration %}{% else %}<{{ m['content'] }}>{% endif %}{% endfor %}"
           "{{ x | default('unset') }}")
    msgs = [*MSGS, {"role": "assistant", "content": "a"}, {"role": "user", "content": "never"}]
    assert ChatTemplate(src).render(msgs) == "<Hi>[a]unset"


@pytest.mark.parametrize("variables,fragment", [
    ({"messages": []}, "'messages' is set by edgeinfer itself"),
    ({"bos_token": "x"}, "'bos_token' is set by edgeinfer itself"),
    ({"not a name": 1}, "is not an identifier"),
    (["enable_thinking"], "must be an object"),
    ({"big": "x" * (2 ** 21 + 1)}, "longer than"),
])
def test_bad_template_variables(variables, fragment):
    with pytest.raises(ChatTemplateError, match=fragment):
        ChatTemplate(QWEN3).render(MSGS, variables=variables)


def test_missing_template_still_falls_back():
    t = ChatTemplate(None)
    assert t.is_fallback and not t.knows_tools
    assert t.render(MSGS, variables={"enable_thinking": False}) == ChatTemplate(None).render(MSGS)

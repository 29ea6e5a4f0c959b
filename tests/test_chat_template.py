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

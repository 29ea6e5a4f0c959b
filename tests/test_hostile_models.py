"""Hostile model files past the header: chat templates that loop or build huge strings, vocabularies
whose merges or special-token ids point nowhere, a vocabulary of 10 million empty strings. Each gets a
clear error in bounded time and memory, never a hang, a crash or a traceback."""

import struct
import time
import tracemalloc

import pytest

from edgeinfer.chat_template import ChatTemplate, ChatTemplateError
from edgeinfer.errors import EdgeInferError

MESSAGES = [{"role": "user", "content": "hello"}]

HOSTILE_TEMPLATES = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop over a huge range": "{% for i in range(10**9) %}x{% endfor %}",
    "string times a big number": "{{ 'a' * 10**10 }}",
    "list times a big number": "{{ (['abc'] * 10**9)|length }}",
    "doubling with ~": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s|length }}",
    "doubling with +": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                       "{% endfor %}",
    "padding filter": "{{ 'x'|center(10**9) }}",
    "padding method": "{{ 'x'.ljust(10**9) }}",
    "format width": "{{ ('%-999999999s' % 'a')|length }}",
    "join of many copies": "{{ (['a' * 1000] * 100000)|join }}",
    "huge power": "{{ 7 ** 123456789 }}",
    "endless recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "output that never ends": "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'yy' }}{% endfor %}"
                              "{% endfor %}",
    "reaching internals": "{{ messages.__class__.__mro__[1].__subclasses__() }}",
}


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_hostile_chat_templates_stop_in_bounded_time_and_memory(name):
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ChatTemplateError) as e:
            ChatTemplate(HOSTILE_TEMPLATES[name]).render(MESSAGES)
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "chat template" in str(e.value)
    assert elapsed < 10, f"{name}: {elapsed:.1f} s"
    assert peak < 64 * 2**20, f"{name}: {peak / 2**20:.0f} MiB"


def test_normal_templates_still_render():
    t = ChatTemplate("{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' + m['content'] | trim }}{% endfor %}"
                     "{{ 'a' * 3 }}{{ '%5s' % 'b' }}{{ 'x'|center(9) }}{{ range(3)|join(',') }}")
    assert t.render(MESSAGES) == "<|user|>hello" + "aaa" + "    b" + "    x    " + "0,1,2"


def test_a_hostile_template_in_a_model_file_is_a_clear_error(tmp_path):
    from tiny_models import write_tiny_llama

    from edgeinfer import LLM

    p = tmp_path / "loop.gguf"
    write_tiny_llama(p, chat_template=HOSTILE_TEMPLATES["nested loops"])
    llm = LLM(str(p), progress=False)
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="ran for more than"):
        llm.render_chat(MESSAGES)
    assert time.monotonic() - t0 < 10
    from edgeinfer import SamplingParams

    out = llm.generate("plain prompts still work", SamplingParams(max_tokens=2, temperature=0))
    assert len(out[0].token_ids) == 2


@pytest.mark.parametrize("kw,needle", [
    (dict(extra_merges=("q z", )), "needs the token 'qz'"),            # the merged token is missing
    (dict(extra_merges=("Ġ ☃", )), "needs the token '☃'"),            # a part is missing
    (dict(extra_merges=("nospace", )), "malformed merge"),
    (dict(bos_id=10_000), "bos_token_id = 10000 is outside the vocabulary"),
    (dict(eos_id=2**32 - 1), "eos_token_id = 4294967295 is outside the vocabulary"),
    (dict(extra_ids={"eot": 99_999}), "eot_token_id = 99999 is outside the vocabulary"),
    (dict(extra_ids={"unknown": 70_000}), None),  # a BPE vocabulary never reads unknown_token_id: loads
])
def test_broken_vocabulary_metadata_is_a_clear_error(tmp_path, kw, needle):
    from tiny_models import write_tiny_llama

    from edgeinfer import LLM

    p = tmp_path / "vocab.gguf"
    write_tiny_llama(p, **kw)
    t0 = time.monotonic()
    if needle is None:
        LLM(str(p), progress=False)
        return
    with pytest.raises(EdgeInferError) as e:
        LLM(str(p), progress=False)
    assert needle in str(e.value), str(e.value)
    assert time.monotonic() - t0 < 30


def test_ten_million_empty_vocabulary_strings_are_refused_before_reading(tmp_path):
    """80 MB of zero lengths: the array's count is checked before one string is read."""
    from gguf_bytes import kv, s

    n = 10_000_000
    p = tmp_path / "ten-million.gguf"
    with open(p, "wb") as f:  # no tensors, two keys: the architecture, then an ARRAY (9) of n STRINGs (8)
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv("general.architecture", 8, "llama"))
        f.write(s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, n))
        zeros = bytes(8 * 1_000_000)
        for _ in range(n // 1_000_000):
            f.write(zeros)
    from edgeinfer import LLM
    from edgeinfer.gguf_file import GGUFError, GGUFFile

    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(GGUFError, match="holds 10,000,000 strings; at most 2,097,152"):
            GGUFFile(p)
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 5 and peak < 32 * 2**20, (elapsed, peak)
    with pytest.raises(GGUFError, match="10,000,000 strings"):  # what `edgeinfer run` prints as its error
        LLM(str(p), progress=False)

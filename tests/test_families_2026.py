"""The transformer families of 2026 beside the llama layer: SmolLM3 (`smollm3`: every fourth layer's q and k not
rotated), Granite 3.x (`granite`, `granitemoe`: Granite's multipliers, through the compiled step) and
Ministral 3 (`mistral3`: YaRN RoPE, the attention temperature past the original context). Their golden checks
against llama.cpp, compiled step against per-op, chunked and batched runs are test_arch_zoo's (the zoo's
models); here what is each family's own: the positions each layer sees, quantize-model's file, the official
chat templates."""

import json

import numpy as np
import pytest

from conftest import golden_path
from edgeinfer.chat_template import ChatTemplate
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend
from edgeinfer.models import load_model


def rewritten(src, dst, new_arch: str, **fields):
    """A copy of a model file as architecture `new_arch`, its metadata through arch_zoo.copy_fields(**fields),
    its tensors as they are."""
    import gguf

    from arch_zoo import copy_fields

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), new_arch)
    copy_fields(r, w, **fields)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def smollm3(zoo):
    return zoo("smollm3")


def test_every_fourth_layer_has_no_positions(smollm3):
    m = load_model(GGUFFile(smollm3), get_backend("cpu"))
    assert m.cfg.nope_interval == 4 and m.cfg.n_layer == 4
    freqs = [np.asarray(m.layer_inv_freq(i)) for i in range(4)]
    assert all(f.any() for f in freqs[:3]) and not freqs[3].any()  # layer 3: every angle 0


def test_the_layer_without_positions_changes_the_logits(smollm3, tmp_path):
    """The same file read as llama (RoPE in every layer) gives other logits from the second position on, the
    first the same: what llama.cpp's smollm3 graph does differently (the golden check holds ours to it)."""
    from test_arch_zoo import _all_logits

    as_llama = rewritten(smollm3, tmp_path / "llama.gguf", "llama", old_arch="smollm3", arch="llama")
    kb = get_backend("cpu")
    ids = [11, 40, 97, 150, 33, 260, 8]
    a = _all_logits(load_model(GGUFFile(smollm3), kb), ids)
    b = _all_logits(load_model(GGUFFile(as_llama), kb), ids)
    assert np.array_equal(a[0], b[0]) and not np.allclose(a[1:], b[1:], atol=1e-3)


@pytest.mark.parametrize("name, embd", [("smollm3", "Q6_K"), ("granite", "Q4_K"), ("granitemoe", "Q4_K"),
                                        ("mistral3", "Q4_K"), ("gemma4", "Q6_K"),
                                        ("gemma4moe", "Q6_K"), ("gemma3n", "Q6_K")])
def test_quantize_model_writes_llama_quantizes_file_byte_for_byte(tmp_path, name, embd):
    """Q4_K_M of the zoo models' F16 forms; smollm3's output is tied, so token_embd takes the output's Q6_K,
    as llama-quantize does; sha256 from llama.cpp (benchmarks/make_arch_golden.py)."""
    from arch_zoo import quantize_model_q4_k_m

    want = json.load(open(golden_path("arch_zoo.json")))["models"][name]["llama_quantize_q4_k_m_sha256"]
    sha, dst = quantize_model_q4_k_m(name, tmp_path)
    assert sha == want and GGUFFile(dst).tensors["token_embd.weight"].ggml_type.name == embd


def test_the_official_template_renders_its_reasoning_switch():
    """HuggingFaceTB/SmolLM3-3B's chat template (llama.cpp's models/templates copy): a metadata system block
    whose reasoning mode is /think unless enable_thinking is false or the system prompt says /no_think, then
    an empty think block opens the answer."""
    t = ChatTemplate(open(golden_path("templates/HuggingFaceTB-SmolLM3-3B.jinja")).read())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    head = "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: "
    tail = "\n\n## Custom Instructions\n\nBe brief.\n\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(msgs) == head + "/think" + tail
    off = head + "/no_think" + tail + "<think>\n\n</think>\n"
    assert t.render(msgs, variables={"enable_thinking": False}) == off
    no_think = [{"role": "system", "content": "Be brief. /no_think"}, msgs[1]]
    assert t.render(no_think) == off


def test_granite_runs_the_compiled_step_with_its_multipliers(zoo):
    m = load_model(GGUFFile(zoo("granite")), get_backend("cpu"))
    assert m.stack is not None and m.stack.norms.res_scale == np.float32(0.5)
    assert (m.cfg.embed_scale, m.cfg.logit_scale, m.cfg.attn_scale) == (8.0, 4.0, float(np.float32(0.09)))


def test_the_granite_3_template_renders_its_default_system_prompt():
    """ibm-granite/granite-3.3-2b-instruct's template: Granite's roles; with no system message its own, with
    today's date (strftime_now)."""
    import datetime

    t = ChatTemplate(open(golden_path("templates/ibm-granite-granite-3.3-2B-Instruct.jinja")).read())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    turns = ("<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>")
    assert t.render(msgs) == "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n" + turns
    own = t.render(msgs[1:])
    assert own.startswith("<|start_of_role|>system<|end_of_role|>Knowledge Cutoff Date: April 2024. Today's Date: ")
    assert datetime.date.today().strftime("%B %d, %Y") in own and own.endswith(turns)


def test_mistral3_reads_yarn_and_the_attention_temperature(zoo):
    """The zoo's Ministral 3: YaRN factor 4 from 16 tokens (each pair's angle between a quarter and all of the
    original, cos and sin times 1 + 0.1 ln 4), the temperature 0.1 from position 16 on."""
    from edgeinfer.kernels.cpu.ops import attn_temperature

    m = load_model(GGUFFile(zoo("mistral3")), get_backend("cpu"))
    assert m.cfg.rope_yarn == (16, 32.0, 1.0) and m.cfg.attn_temp == (float(np.float32(0.1)), 16.0)
    assert m.cfg.rope_mscale == pytest.approx(1 + 0.1 * np.log(4), rel=1e-6)
    orig = 1e6 ** (-np.arange(0, 64, 2) / 64)
    ratio = np.asarray(m.inv_freq) / orig
    assert ratio[0] == 1.0 and ratio[-1] == 0.25 and np.all(np.diff(ratio) <= 0)  # fast pairs kept, slow ones /4
    q = np.ones((3, 1, 2), np.float32)
    attn_temperature(q, np.array([15, 16, 40]), np.float32(0.1), 16.0)
    assert q[0, 0, 0] == 1.0 and q[1, 0, 0] == np.float32(np.log(2) * 0.1 + 1) and q[2, 0, 0] == np.float32(np.log(3) * 0.1 + 1)


def test_the_ministral_3_template_renders_its_system_block():
    t = ChatTemplate(open(golden_path("templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja")).read(),
                     bos_token="<s>")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert t.render(msgs) == "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST]"
    assert t.render(msgs[1:]).startswith("<s>[SYSTEM_PROMPT]# HOW YOU SHOULD THINK AND ANSWER")


@pytest.mark.parametrize("key, value", [("rope.scaling.factor", -4.0)])  # (the original context is unsigned)
def test_a_bad_yarn_setting_is_a_one_line_error(zoo, tmp_path, key, value):
    from edgeinfer.models import ModelLoadError

    dst = rewritten(zoo("mistral3"), tmp_path / "bad.gguf", "mistral3", meta={f"mistral3.{key}": value})
    with pytest.raises(ModelLoadError, match="YaRN RoPE scaling needs a positive"):
        load_model(GGUFFile(dst), get_backend("cpu"))

"""generate, chat, perplexity and warmup through the CLI on a tiny model."""

import json

import pytest
from click.testing import CliRunner

from edgeinfer.cli.main import main


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def test_generate_streams_and_json(tiny_llama_path):
    r = run("generate", tiny_llama_path, "the hen", "-n", 6, "-t", 0)
    assert r.exit_code == 0, r.output
    j = run("generate", tiny_llama_path, "the hen", "-n", 6, "-t", 0, "--json")
    assert j.exit_code == 0, j.output
    data = json.loads(j.stdout.strip().splitlines()[-1])
    assert data["completion_tokens"] <= 6 and data["finish_reason"] in ("stop", "length")
    assert r.stdout == data["text"] + "\n"  # the streamed text, then a newline
    assert {"ttft_s", "total_s", "decode_tok_s", "prompt_tokens"} <= set(data)


def test_generate_same_seed_same_text(tiny_llama_path):
    a = run("generate", tiny_llama_path, "the", "-n", 8, "--seed", 5, "--json")
    b = run("generate", tiny_llama_path, "the", "-n", 8, "--seed", 5, "--json")
    assert json.loads(a.stdout)["text"] == json.loads(b.stdout)["text"]


def test_bad_sampling_values_are_one_line_errors(tiny_llama_path):
    for args, fragment in [(["-t", "-1"], "temperature"), (["--top-p", "0"], "top_p"), (["-n", "0"], "max_tokens"),
                           (["--top-k", "-3"], "top_k")]:
        r = run("generate", tiny_llama_path, "hi", *args)
        assert r.exit_code != 0 and fragment in r.output and "Traceback" not in r.output


def test_unknown_model_for_generate(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_HOME", str(tmp_path))
    r = run("generate", "no-such-model", "hi")
    assert r.exit_code == 1 and "Known names" in r.output


def test_prompt_longer_than_context(tiny_llama_path):
    r = run("generate", tiny_llama_path, "x " * 400, "-n", 5)
    assert r.exit_code == 1 and "the prompt has" in r.output and "context holds 256" in r.output


def test_chat_through_a_pipe(tiny_llama_path):
    script = "hello there\n/stats\n/system be brief\n/reset\nthe hen\n/bogus\n/exit\nnever read\n"
    r = run("chat", tiny_llama_path, "-n", 5, "-t", 0, input=script)
    assert r.exit_code == 0, r.output
    assert '"completion_tokens"' in r.output  # /stats
    assert "system message set" in r.output and "conversation cleared" in r.output
    assert "unknown command /bogus" in r.output


def test_perplexity_command(tiny_llama_path, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("the hen sat on the thin line. " * 60)
    r = run("perplexity", tiny_llama_path, f, "--ctx", 64, "--chunks", 2, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout.strip().splitlines()[-1])
    assert data["chunks"] == 2 and data["n_scored"] == 62 and data["ppl"] > 1
    # prompt-processing speed over every token of every chunk, and no faster than the whole command ran
    assert 0 < data["tok_s"] and 2 * 64 / data["tok_s"] <= data["seconds"] + 0.01


def test_perplexity_text_too_short(tiny_llama_path, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("short")
    r = run("perplexity", tiny_llama_path, f, "--ctx", 64)
    assert r.exit_code == 1 and "fewer than one chunk" in r.output


def test_system_reports_the_kernel_path():
    r = run("system", "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["kernel_path"] in info["kernel_paths_available"] and info["threading_layer"]
    assert run("system").output.startswith("CPU")


def test_system_names_the_cpu_of_an_x86_machine_and_of_an_arm_board():
    from edgeinfer.system import cpu_name

    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2\n"
    pi5 = ("processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd asimddp\nCPU part\t: 0xd0b\n\n"
           "Revision\t: d04170\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
    jetson = "processor\t: 0\nFeatures\t: fp asimd\nCPU part\t: 0xd07\nHardware\t: NVIDIA Jetson Nano\n"
    assert cpu_name(x86) == "AMD EPYC 7B13"
    assert cpu_name(pi5) == "Raspberry Pi 5 Model B Rev 1.0"
    assert cpu_name(jetson) == "NVIDIA Jetson Nano"


def test_bad_kernel_path_is_a_one_line_error():
    import subprocess
    import sys

    env = dict(__import__("os").environ, EDGEINFER_KERNELS="sse9")
    p = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "system"], capture_output=True, text=True, env=env)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines() == ["error: EDGEINFER_KERNELS must be one of portable, avx2, vnni, avx512, neon, dotprod, i8mm, "
                                            "got 'sse9'"]


def test_warmup(tiny_gemma3_path):
    r = run("warmup", tiny_gemma3_path, "--kv-type", "f16", "--kv-type", "q8_0")
    assert r.exit_code == 0 and "kernels ready" in r.output, r.output


def test_q8_0_kv_needs_head_sizes_of_32(tiny_llama_path):
    r = run("generate", tiny_llama_path, "the", "-n", 2, "--kv-type", "q8_0")
    assert r.exit_code == 1
    assert "q8_0 KV cache needs head sizes that are multiples of 32" in r.output and "Traceback" not in r.output


def test_bench_json_has_every_figure(tmp_path):
    from tiny_models import write_tiny_llama

    path = tmp_path / "ctx1024.gguf"
    write_tiny_llama(path, n_ctx=1024)  # room for the 512-token prompt
    r = run("bench", path, "--repeats", 1, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("pp128_tok_s", "pp512_tok_s", "tg128_tok_s", "batched8_tok_s", "ttft_cold_s", "wall64_cold_s",
                "peak_rss_mb", "rss_load_mb", "rss_first_mb"):
        assert data[key] > 0, key
    assert data["prefix500_ttft_ratio"] > 0  # a timing: its value is for benchmarks, not tests
    assert data["rss_load_mb"] <= data["rss_first_mb"] + 1 and data["rss_first_mb"] <= data["peak_rss_mb"] + 1
    # the start-up breakdown: every phase, together the whole time to the first token
    from edgeinfer.bench import STARTUP

    phases = data["startup"]
    assert list(phases) == list(STARTUP) and all(v >= 0 for v in phases.values())
    assert abs(sum(phases.values()) - data["ttft_cold_s"]) < 0.1 * data["ttft_cold_s"] + 0.05
    assert data["kv_type"] == "f16" and data["wall64_cold_s"] > data["ttft_cold_s"]


def test_generate_and_chat_with_constraints(tiny_llama_path, tmp_path):
    import re

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}}, "required": ["n", "ok"]}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(schema))
    for seed in (1, 2):
        r = run("generate", tiny_llama_path, "x", "--json-schema", f, "-t", 1.0, "--seed", seed, "--json")
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        obj = json.loads(out["text"])
        assert set(obj) == {"n", "ok"} and 0 <= obj["n"] <= 99 and out["finish_reason"] == "stop"
    r = run("generate", tiny_llama_path, "x", "--json-schema", json.dumps(schema), "-t", 0)  # inline JSON
    assert r.exit_code == 0 and set(json.loads(r.stdout)) == {"n", "ok"}
    r = run("generate", tiny_llama_path, "x", "--regex", "[0-9]{4}", "--json")
    assert re.fullmatch("[0-9]{4}", json.loads(r.stdout)["text"])
    r = run("generate", tiny_llama_path, "x", "--choice", "left, right", "--json")
    assert json.loads(r.stdout)["text"] in ("left", "right")
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "v" [0-9] "." [0-9]')
    r = run("generate", tiny_llama_path, "x", "--grammar", g, "--json")
    assert re.fullmatch(r"v[0-9]\.[0-9]", json.loads(r.stdout)["text"])
    r = run("chat", tiny_llama_path, "--json-schema", f, "-t", 0.5, input="hi\nagain\n")
    assert r.exit_code == 0, r.output
    answers = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(answers) == 2 and all(set(json.loads(a)) == {"n", "ok"} for a in answers)


def test_bad_constraints_on_the_command_line(tiny_llama_path, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args, fragment in [(["--json-schema", tmp_path / "missing.json"], "cannot read"),
                           (["--json-schema", bad], "not valid JSON"),
                           (["--regex", "a", "--choice", "a,b"], "at most one"),
                           (["--regex", "a(b"], "regex is not valid"),
                           (["--json-schema", '{"type": "objectx"}'], "json_schema is not valid"),
                           (["--grammar", tmp_path / "none.lark"], "cannot read")]:
        r = run("generate", tiny_llama_path, "hi", *args)
        assert r.exit_code != 0 and fragment in r.output and "Traceback" not in r.output, r.output


@pytest.mark.model
def test_chat_with_qwen_uses_its_own_template():
    from conftest import real_model_path

    real_model_path("qwen2.5-coder-0.5b-instruct")
    r = run("chat", "qwen2.5-coder-0.5b-instruct", "-t", 0, "-n", 24, input="Write a Python hello world.\n/stats\n")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) >= 2 and lines[0].strip()  # an answer, then the /stats line
    stats = json.loads(lines[-1])
    # the template's default system prompt ("You are Qwen, created by Alibaba Cloud. ...") is in the prompt
    assert stats["prompt_tokens"] > 25 and stats["completion_tokens"] > 0


@pytest.mark.model
def test_chats_default_model_answers_a_first_question():
    """`edgeinfer chat` with no model: the catalog's chat default, at chat's own sampling defaults (seeded here),
    answers a newcomer's first question rightly, without the degenerate repetition SmolLM2-135M falls into."""
    from conftest import real_model_path

    from edgeinfer import registry

    real_model_path(registry.CHAT_MODEL)
    r = run("chat", "--seed", 1, "-n", 40, input="What is the capital of France?\n")
    assert r.exit_code == 0, r.output
    assert "Paris" in r.stdout and r.stdout.count("France") < 4, r.stdout


def test_speculation_on_the_command_line(tiny_llama_path, tmp_path):
    """generate and chat with --speculate lookup and --draft-model: the same greedy text as without, and
    the counters in --json / /stats; bench --spec-only measures with and without."""
    from gguf.constants import GGMLQuantizationType as T
    from tiny_models import write_tiny_llama

    draft = tmp_path / "draft.gguf"
    write_tiny_llama(draft, qtype=T.Q4_0)
    base = ["generate", tiny_llama_path, "the hen the hen the hen", "-n", 30, "-t", 0, "--json"]
    want = json.loads(run(*base).stdout.strip().splitlines()[-1])
    for extra in (["--speculate", "lookup"], ["--draft-model", draft, "--draft-tokens", 3]):
        r = run(*base, *extra)
        assert r.exit_code == 0, r.output
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["text"] == want["text"]
        assert got["spec_proposed_tokens"] > 0 and 0 <= got["spec_acceptance_rate"] <= 1
    r = run("chat", tiny_llama_path, "-t", 0, "-n", 10, "--speculate", "lookup", input="hi\n/stats\n")
    assert r.exit_code == 0, r.output
    assert '"spec_method": "lookup"' in r.output
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["the hen the hen", {"prompt": "abc abc"}, {"messages": [{"role": "user",
                                                                                           "content": "hi"}]}]))
    r = run("bench", tiny_llama_path, "--speculate", "lookup", "--spec-only", "--repeats", 1, "--json",
            "--spec-prompts", prompts)
    assert r.exit_code == 0, r.output
    spec = json.loads(r.stdout.strip().splitlines()[-1])["speculation"]
    assert spec["identical_output"] is True and spec["proposed_tokens"] > 0
    assert spec["decode_tok_s_with"] > 0 and spec["decode_tok_s_without"] > 0


def test_bad_speculation_options(tiny_llama_path, tiny_gemma3_path, tmp_path):
    for args, fragment in [(["--draft-model", tiny_gemma3_path], "vocabulary"),
                           (["--draft-model", tiny_llama_path, "--speculate", "lookup"], "not both"),
                           (["--draft-tokens", 4], "draft_tokens needs"),
                           (["--speculate", "lookup", "--device", "cuda"], "not available on the cuda backend")]:
        r = run("generate", tiny_llama_path, "hi", "-n", 2, *args)
        assert r.exit_code != 0 and fragment in r.output and "Traceback" not in r.output, (args, r.output)
    r = run("bench", tiny_llama_path, "--spec-only")
    assert r.exit_code != 0 and "--spec-only needs" in r.output
    for body, fragment in [("{not json", "not valid JSON"), ('{"prompt": "x"}', "expected a non-empty JSON list")]:
        bad = tmp_path / "prompts.json"
        bad.write_text(body)
        r = run("bench", tiny_llama_path, "--speculate", "lookup", "--spec-only", "--spec-prompts", bad)
        assert r.exit_code == 1 and fragment in r.output and "Traceback" not in r.output, r.output

"""Batch jobs (`edgeinfer batch`, edgeinfer.batch.run_batch) on tiny models: every url, bad lines, resume, kills."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from edgeinfer import LLM, SamplingParams
from edgeinfer.batch import BatchError, BatchOutput, read_input, run_batch
from edgeinfer.cli.main import main


def line(cid, url, body, method="POST"):
    return json.dumps({"custom_id": cid, "method": method, "url": url, "body": body})


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
EMB = "/v1/embeddings"


def chat_body(text, n=8, **kw):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": n, "temperature": 0, **kw}


GOOD = [
    line("chat-a", CHAT, chat_body("the hen sat")),
    line("chat-b", CHAT, chat_body("in the garden", 5, stop=["zzz"])),
    line("chat-lp", CHAT, chat_body("on the", 4, logprobs=True, top_logprobs=2)),
    line("comp-a", COMP, {"prompt": "the hen", "max_tokens": 6, "temperature": 0}),
    line("comp-ids", COMP, {"prompt": [40, 41, 42], "max_tokens": 3, "temperature": 0}),
    line("emb-a", EMB, {"input": ["the hen", "a cat"]}),
    line("emb-dim", EMB, {"input": "on the", "dimensions": 8, "encoding_format": "base64"}),
]
# (line, custom_id in the output, status, a fragment of the error message)
BAD = [
    ('{"custom_id": "torn", "method": "POST", "url": ', "torn", 400, "not valid JSON"),
    ('{"method": "POST", "url": "/v1/completions", "body": {}}', None, 400, "custom_id"),
    ('[1, 2, 3]', None, 400, "JSON object"),
    (line("bad-url", "/v1/images/generations", {}), "bad-url", 404, "unknown url"),
    (line("bad-method", COMP, {"prompt": "x"}, method="GET"), "bad-method", 400, "method"),
    (line("bad-body", CHAT, {"messages": "hello"}), "bad-body", 400, "messages"),
    (line("bad-temp", COMP, {"prompt": "x", "temperature": -1}), "bad-temp", 400, "temperature"),
    (line("bad-model", COMP, {"prompt": "x", "model": "gpt-4o-mini"}), "bad-model", 404, "not this batch's model"),
    (line("bad-stream", COMP, {"prompt": "x", "stream": True}), "bad-stream", 400, "stream"),
    (line("too-long", COMP, {"prompt": "the " * 400, "max_tokens": 4}), "too-long", 400, "context"),
    (line("bad-token", COMP, {"prompt": [1, 99999]}), "bad-token", 400, "vocabulary"),
    (json.dumps({"custom_id": "extra", "method": "POST", "url": COMP, "body": {}, "oops": 1}), "extra", 400, "oops"),
    (json.dumps({"custom_id": "x" * 513, "method": "POST", "url": COMP, "body": {}}), None, 400, "custom_id"),
    (json.dumps({"custom_id": "list-body", "method": "POST", "url": COMP, "body": [1]}), "list-body", 400,
     "'body' must be a JSON object"),
]


def write_lines(path, lines):
    path.write_text("".join(x + "\n" for x in lines))
    return path


def read_out(path) -> dict:
    out = {}
    for text in open(path):
        rec = json.loads(text)
        key = rec["custom_id"] if rec["custom_id"] is not None else f"line {rec['error']['line']}"
        assert key not in out, f"{key} answered twice"
        out[key] = rec
    return out


def answer(rec) -> tuple:
    """What must agree between two runs: the status and body, less ids, timestamps and the prompt tokens the
    prefix cache held (what ran before decides them)."""
    body = {k: v for k, v in rec["response"]["body"].items() if k not in ("id", "created")}
    if isinstance(body.get("usage"), dict):
        body["usage"] = {k: v for k, v in body["usage"].items() if k != "prompt_tokens_details"}
    return rec["response"]["status_code"], json.dumps(body, sort_keys=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(str(tiny_llama_path), threads=1, progress=False)


def test_every_url_and_every_bad_line(llm, tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD + [""] + [b[0] for b in BAD])  # a blank line is skipped
    s = run_batch(llm, inp, tmp_path / "out.jsonl")
    out = read_out(tmp_path / "out.jsonl")
    assert len(out) == len(GOOD) + len(BAD)
    assert (s.requests, s.succeeded, s.failed, s.skipped) == (len(GOOD) + len(BAD), len(GOOD), len(BAD), 0)
    for rec in out.values():
        assert set(rec) == {"id", "custom_id", "response", "error"} and rec["id"].startswith("batch_req_")
        assert set(rec["response"]) == {"status_code", "request_id", "body"}

    # a generation's answer is the engine's greedy text, as LLM.generate gives it
    messages = [{"role": "user", "content": "the hen sat"}]
    want = llm.generate(llm.render_chat(messages), SamplingParams(max_tokens=8, temperature=0))[0]
    body = out["chat-a"]["response"]["body"]
    assert out["chat-a"]["error"] is None and out["chat-a"]["response"]["status_code"] == 200
    assert body["object"] == "chat.completion" and body["model"] == llm.name
    assert body["choices"][0]["message"]["content"] == want.text
    usage = dict(body["usage"])
    assert 0 <= usage.pop("prompt_tokens_details")["cached_tokens"] < len(want.prompt_token_ids)
    assert usage == {"prompt_tokens": len(want.prompt_token_ids), "completion_tokens": len(want.token_ids),
                     "total_tokens": len(want.prompt_token_ids) + len(want.token_ids)}
    comp = llm.generate("the hen", SamplingParams(max_tokens=6, temperature=0))[0]
    assert out["comp-a"]["response"]["body"]["choices"][0]["text"] == comp.text
    assert out["comp-ids"]["response"]["body"]["usage"]["prompt_tokens"] == 3
    lp = out["chat-lp"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(lp) == out["chat-lp"]["response"]["body"]["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 2 for e in lp)
    emb = out["emb-a"]["response"]["body"]
    assert emb["object"] == "list" and len(emb["data"]) == 2
    assert emb["data"][0]["embedding"] == pytest.approx(llm.embed("the hen").tolist(), abs=1e-6)
    assert isinstance(out["emb-dim"]["response"]["body"]["data"][0]["embedding"], str)  # base64

    # each bad line: its own error line, with the status the server would give and a message naming it
    for n, (_, cid, status, fragment) in enumerate(BAD):
        lineno = len(GOOD) + 2 + n
        rec = out[cid if cid is not None else f"line {lineno}"]
        assert rec["custom_id"] == cid
        assert rec["response"]["status_code"] == status, rec
        assert fragment in rec["response"]["body"]["error"]["message"], rec
        assert rec["error"]["line"] == lineno and fragment in rec["error"]["message"]
    assert s.statuses == {"200": len(GOOD), "400": len(BAD) - 2, "404": 2}


def test_embedding_model_answers_embeddings_and_refuses_generation(tiny_nomic_path, tmp_path):
    enc = LLM(str(tiny_nomic_path), threads=1, progress=False)
    inp = write_lines(tmp_path / "in.jsonl", [line("e", EMB, {"input": ["a b c", "d e"]}),
                                              line("c", CHAT, chat_body("hi"))])
    s = run_batch(enc, inp, tmp_path / "out.jsonl")
    out = read_out(tmp_path / "out.jsonl")
    assert (s.succeeded, s.failed) == (1, 1)
    assert out["e"]["response"]["body"]["data"][1]["embedding"] == pytest.approx(enc.embed("d e").tolist(), abs=1e-6)
    assert out["c"]["response"]["status_code"] == 400 and "embedding model" in out["c"]["error"]["message"]


def test_resume_skips_answered_drops_a_torn_line_and_retries_errors(llm, tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD + [BAD[3][0], BAD[5][0]])
    outp = tmp_path / "out.jsonl"
    run_batch(llm, inp, outp)
    first = outp.read_bytes()
    again = run_batch(llm, inp, outp)  # everything answered: nothing to do, nothing written
    assert (again.skipped, again.succeeded, again.failed) == (len(GOOD) + 2, 0, 0)
    assert outp.read_bytes() == first

    # a run killed mid-line: the torn line is dropped and that request answered again
    lines = first.splitlines(keepends=True)
    last = json.loads(lines[-1])["custom_id"]
    outp.write_bytes(b"".join(lines[:-1]) + lines[-1][:25])
    resumed = run_batch(llm, inp, outp)
    assert resumed.torn_line_dropped and resumed.succeeded + resumed.failed == 1
    out = read_out(outp)
    assert len(out) == len(GOOD) + 2 and last in out

    # --retry-errors: the two error lines are answered again, in place of the old ones
    retried = run_batch(llm, inp, outp, retry_errors=True)
    assert retried.retried_errors == 2 and retried.failed == 2 and retried.skipped == len(GOOD)
    assert len(read_out(outp)) == len(GOOD) + 2


def test_output_that_is_not_a_batch_output_is_refused(llm, tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD[:1])
    outp = tmp_path / "out.jsonl"
    for text in ("my notes\n", "my notes, no newline"):  # a last line without one is not taken for torn
        outp.write_text(text)
        with pytest.raises(BatchError, match="not a batch output line"):
            run_batch(llm, inp, outp)
        assert outp.read_text() == text  # nothing lost


def test_job_errors_are_one_line(tiny_llama_path, tmp_path):
    dup = write_lines(tmp_path / "dup.jsonl", [GOOD[0], GOOD[3], GOOD[0]])
    with pytest.raises(BatchError, match="custom_id 'chat-a' is on line 1 and line 3"):
        read_input(dup)
    r = CliRunner().invoke(main, ["batch", str(tiny_llama_path), str(dup), str(tmp_path / "o.jsonl")])
    assert r.exit_code == 1 and "line 1 and line 3" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["batch", str(tiny_llama_path), str(tmp_path / "missing.jsonl"),
                                  str(tmp_path / "o.jsonl")])
    assert r.exit_code == 1 and "cannot read the batch input" in r.output
    r = CliRunner().invoke(main, ["batch", "no-such-model", str(dup), str(tmp_path / "o2.jsonl")])
    assert r.exit_code == 1 and "line 1 and line 3" in r.output  # the input is checked before the model
    good = write_lines(tmp_path / "good.jsonl", GOOD[:2])
    r = CliRunner().invoke(main, ["batch", "no-such-model", str(good), str(tmp_path / "o3.jsonl")])
    assert r.exit_code == 1 and "unknown model" in r.output and "Traceback" not in r.output
    held = BatchOutput(tmp_path / "held.jsonl")  # another job writing the same output
    try:
        r = CliRunner().invoke(main, ["batch", str(tiny_llama_path), str(good), str(tmp_path / "held.jsonl")])
        assert r.exit_code == 1 and "another batch job is writing" in r.output
    finally:
        held.close()


def test_cli_json_summary(tiny_llama_path, tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", GOOD + [BAD[0][0]])
    r = CliRunner().invoke(main, ["batch", str(tiny_llama_path), str(inp), str(tmp_path / "out.jsonl"), "--quiet",
                                  "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert (s["requests"], s["succeeded"], s["failed"]) == (len(GOOD) + 1, len(GOOD), 1)
    assert s["completion_tokens"] == sum(rec["response"]["body"]["usage"].get("completion_tokens", 0)
                                         for rec in read_out(tmp_path / "out.jsonl").values() if rec["error"] is None)


def test_cli_usage_errors_are_one_line(tiny_llama_path, tmp_path):
    good = write_lines(tmp_path / "good.jsonl", GOOD[:1])
    out = str(tmp_path / "o.jsonl")
    for args, fragment in [(["--workers", "2"], "--workers needs --ray"),
                           (["--ray", "local", "--device", "cuda"], "not there yet")]:
        r = CliRunner().invoke(main, ["batch", str(tiny_llama_path), str(good), out, *args])
        assert r.exit_code == 2 and fragment in r.output and "Traceback" not in r.output


def test_ray_cluster_that_is_not_there_is_one_line(tiny_llama_path, tmp_path):
    pytest.importorskip("ray")
    good = write_lines(tmp_path / "good.jsonl", GOOD[:1])
    r = subprocess.run(cli(tiny_llama_path, good, tmp_path / "o.jsonl", "--ray"), capture_output=True, text=True,
                       timeout=120, env={**os.environ, "RAY_ADDRESS": ""})
    assert r.returncode == 1 and "error: cannot reach the Ray cluster at 'auto'" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def many(n: int, max_tokens: int = 24) -> list[str]:
    words = ["the hen", "a cat sat", "in the", "on a garden", "the sea", "winter"]
    return [line(f"r{i:03d}", CHAT if i % 2 else COMP,
                 chat_body(words[i % 6], max_tokens) if i % 2 else
                 {"prompt": words[i % 6] + f" {i}", "max_tokens": max_tokens, "temperature": 0})
            for i in range(n)]


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "edgeinfer.cli.main", "batch", *map(str, args), "--quiet"]


def test_resume_after_a_kill(tiny_llama_path, tmp_path):
    """SIGKILL mid-job, then the same command: every request answered exactly once, as an uninterrupted
    run answers it."""
    inp = write_lines(tmp_path / "in.jsonl", many(160, 48))
    ref = tmp_path / "ref.jsonl"
    subprocess.run(cli(tiny_llama_path, inp, ref, "--threads", "1"), check=True, timeout=600)
    want = {k: answer(v) for k, v in read_out(ref).items()}
    outp = tmp_path / "out.jsonl"
    p = subprocess.Popen(cli(tiny_llama_path, inp, outp, "--threads", "1"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        if outp.exists() and outp.read_bytes().count(b"\n") >= 40:
            break
        time.sleep(0.02)
    assert p.poll() is None, "the job ended before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    n_before = outp.read_bytes().count(b"\n")
    assert 40 <= n_before < 160
    r = subprocess.run(cli(tiny_llama_path, inp, outp, "--threads", "1", "--json"), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["skipped"] == n_before and s["succeeded"] == 160 - n_before
    got = {k: answer(v) for k, v in read_out(outp).items()}
    assert got == want


# -- Ray ---------------------------------------------------------------------------------------------


def test_ray_local_equals_the_local_run(tiny_llama_path, tmp_path):
    pytest.importorskip("ray")
    inp = write_lines(tmp_path / "in.jsonl", GOOD + [b[0] for b in BAD] + many(24, 12))
    local, ray_out = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    subprocess.run(cli(tiny_llama_path, inp, local, "--threads", "1"), check=True, timeout=600)
    r = subprocess.run(cli(tiny_llama_path, inp, ray_out, "--ray", "local", "--workers", "2", "--json"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    assert s["workers"] == 2 and s["failed"] == len(BAD)
    a, b = read_out(local), read_out(ray_out)
    assert a.keys() == b.keys()
    assert {k: answer(v) for k, v in a.items()} == {k: answer(v) for k, v in b.items()}


def _ray_workers() -> list[int]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(x.split()[0]) for x in ps.splitlines() if "MapWorker(MapBatches(BatchWorker))" in x]


def test_ray_worker_killed_mid_job_is_retried_without_duplicates(tiny_llama_path, tmp_path):
    pytest.importorskip("ray")
    inp = write_lines(tmp_path / "in.jsonl", many(96, 64))
    local, ray_out = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    subprocess.run(cli(tiny_llama_path, inp, local, "--threads", "1"), check=True, timeout=600)
    p = subprocess.Popen(cli(tiny_llama_path, inp, ray_out, "--ray", "local", "--workers", "2", "--json"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:  # both actors up, and answers coming in
        workers = _ray_workers()
        if len(workers) == 2 and ray_out.exists() and ray_out.read_bytes().count(b"\n") >= 8:
            victim = workers[0]
            break
        time.sleep(0.05)
    assert victim is not None, "no Ray worker to kill before the job ended"
    os.kill(victim, signal.SIGKILL)
    written_at_kill = ray_out.read_bytes().count(b"\n")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert written_at_kill < 96, "the kill came after the last answer"
    got = read_out(ray_out)  # read_out fails on a custom_id answered twice
    assert len(got) == 96 and json.loads(out)["succeeded"] == 96
    assert {k: answer(v) for k, v in got.items()} == {k: answer(v) for k, v in read_out(local).items()}
    assert victim not in _ray_workers()


@pytest.mark.model
def test_real_model_batch_matches_chat(tmp_path):
    from conftest import real_model_path

    llm = LLM(str(real_model_path("smollm2-135m-instruct")), threads=2, progress=False)
    questions = ["What is the capital of France?", "Name three colours.", "Say hello in Spanish.", "What is 2+2?"]
    inp = write_lines(tmp_path / "in.jsonl", [line(f"q{i}", CHAT, chat_body(q, 24)) for i, q in enumerate(questions)])
    s = run_batch(llm, inp, tmp_path / "out.jsonl")
    assert s.succeeded == 4
    out = read_out(tmp_path / "out.jsonl")
    for i, q in enumerate(questions):
        want = llm.chat([{"role": "user", "content": q}], SamplingParams(max_tokens=24, temperature=0)).text
        assert out[f"q{i}"]["response"]["body"]["choices"][0]["message"]["content"] == want

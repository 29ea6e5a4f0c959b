"""The prompt cache on disk (engine/prompt_store.py, engine/prompt_cache.py): blocks written as they are
computed, found by a later engine, the same output with it as without; damaged, truncated and foreign entries
removed, never used; a kill mid-write leaves nothing that is used; the folder bounded."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.engine.prompt_store import PromptStore, block_digest, part_digest

KEY = {"model": "m", "kv_type": "f16", "block_size": 4, "rows": []}


def _rows(seed, n=3):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(n)]


def _nbytes(rows):
    return sum(r.nbytes for r in rows)


def test_a_block_comes_back_as_it_was_saved(tmp_path):
    store = PromptStore(tmp_path, 1 << 20, KEY)
    tokens, rows = (5, 6, 7, 8), _rows(0)
    d = block_digest(b"", tokens)
    store.save(d, tokens, rows)
    store.flush()
    assert d in store and store.entries == 1
    again = PromptStore(tmp_path, 1 << 20, KEY)  # another process would see the same
    data = again.load(d, tokens, _nbytes(rows))
    np.testing.assert_array_equal(np.frombuffer(data, np.float32), np.concatenate([r.ravel() for r in rows]))
    assert again.hits == 1
    # another key (another model, KV type or layout) is another folder: nothing found there
    other = PromptStore(tmp_path, 1 << 20, {**KEY, "kv_type": "q8_0"})
    assert d not in other and other.dir != again.dir


@pytest.mark.parametrize("damage", ["flip", "truncate", "tokens", "garbage"])
def test_a_damaged_entry_is_removed_never_used(tmp_path, damage):
    store = PromptStore(tmp_path, 1 << 20, KEY)
    tokens, rows = (1, 2, 3, 4), _rows(1)
    d = block_digest(b"", tokens)
    store.save(d, tokens, rows)
    store.flush()
    path = store._path(d)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-5] ^= 0x10
    elif damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    path.write_bytes(bytes(data))
    reopened = PromptStore(tmp_path, 1 << 20, KEY)
    asked = (1, 2, 3, 5) if damage == "tokens" else tokens  # a digest collision: other tokens, the same name
    assert reopened.load(d, asked, _nbytes(rows)) is None
    assert not path.exists() and d not in reopened and reopened.damaged == 1


def test_the_folder_is_bounded_least_recently_used_out(tmp_path):
    rows = _rows(2)
    entry = 56 + 16 + _nbytes(rows)  # header, four int32 tokens, the rows
    store = PromptStore(tmp_path, 3 * entry, KEY)
    digests = []
    for i in range(3):
        tokens = (i, i, i, i)
        digests.append(block_digest(b"", tokens))
        store.save(digests[-1], tokens, rows)
        store.flush()
        time.sleep(0.02)
    assert store.load(digests[0], (0, 0, 0, 0), _nbytes(rows)) is not None  # the oldest, used again
    time.sleep(0.02)
    store.save(block_digest(b"", (9, 9, 9, 9)), (9, 9, 9, 9), rows)
    store.flush()
    assert store.size <= 3 * entry and store.entries == 3
    assert digests[0] in store and digests[1] not in store and digests[2] in store


WRITER = """
import sys, numpy as np
from edgeinfer.engine.prompt_store import PromptStore, block_digest
store = PromptStore(sys.argv[1], 1 << 34, {"model": "m", "kv_type": "f16", "block_size": 4, "rows": []})
rows = [np.ones((64, 1024, 64), np.float32)]  # 16 MB a block: writes take a while
print("ready", flush=True)
i = 0
while True:
    store.save(block_digest(b"", (i, 0, 0, 0)), (i, 0, 0, 0), rows)
    store.flush()
    i += 1
"""


def test_a_kill_mid_write_leaves_nothing_that_is_used(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    while not list(tmp_path.glob("*/*.kvb")) and time.monotonic() - t0 < 60:  # a first block written,
        time.sleep(0.01)
    while not list(tmp_path.glob("*/*.tmp")) and time.monotonic() - t0 < 60:  # and the next one under way
        time.sleep(0.001)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert list(tmp_path.glob("*/*.tmp")), "the kill did not land mid-write"
    store = PromptStore(tmp_path, 1 << 34, KEY)
    assert not list(store.dir.glob("*.tmp"))  # the half-written block (its process dead) removed at open
    n = 16 << 20
    entries = {block_digest(b"", (i, 0, 0, 0)): (i, 0, 0, 0) for i in range(500)}
    found = [d for d in entries if d in store]
    assert found and len(found) == store.entries  # every entry there is a block the writer finished
    assert all(store.load(d, entries[d], n) is not None for d in found)


def _generate(llm, prompt, n=6):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2)
    out = llm.generate(prompt, params)[0]
    return out.token_ids, [lp["logprob"] for lp in out.logprobs]


def test_a_later_engine_skips_the_prefill_and_answers_the_same(tmp_path, tiny_llama_path):
    prompt = "the quick brown fox jumps over the lazy dog, " * 6
    plain = LLM(str(tiny_llama_path), progress=False)
    want = _generate(plain, prompt)
    first = LLM(str(tiny_llama_path), progress=False, prompt_cache=tmp_path)
    assert _generate(first, prompt) == want
    first.engine.disk.store.flush()
    written = first.engine.stats()["prompt_cache_bytes"]
    assert written > 0 and first.engine.stats()["prompt_cache_hits"] == 0
    later = LLM(str(tiny_llama_path), progress=False, prompt_cache=tmp_path)  # as after a restart
    before = later.engine.stats()["computed_tokens"]
    assert _generate(later, prompt) == want  # the same tokens and log-probabilities, bit for bit
    st = later.engine.stats()
    n_prompt = len(later.tokenize(prompt))
    assert st["prompt_cache_hits"] == (n_prompt - 1) // 16  # every full block but one token's
    assert st["computed_tokens"] - before < n_prompt // 2  # the prefill skipped


@pytest.mark.parametrize("kind", ["gemma3", "lfm2", "granitehybrid"])
def test_window_and_hybrid_models_resume_from_disk(tmp_path, zoo, tiny_gemma3_path, kind):
    """A sliding-window model (Gemma 3: the window rows the next token sees come back beside the blocks) and
    hybrid models (LFM2's convolution state, Granite 4's Mamba2 and attention: the recurrent state at the hit's
    last block comes back into a checkpoint slot): the same tokens and log-probabilities after a restart, the
    prefill skipped."""
    path = str(tiny_gemma3_path if kind == "gemma3" else zoo(kind))
    ids = [int(t) for t in np.random.default_rng(7).integers(3, 200, 150)]
    want = _generate(LLM(path, progress=False), ids)
    first = LLM(path, progress=False, prompt_cache=tmp_path)
    assert _generate(first, ids) == want
    first.engine.disk.store.flush()
    later = LLM(path, progress=False, prompt_cache=tmp_path)
    before = later.engine.stats()["computed_tokens"]
    assert _generate(later, ids) == want
    st = later.engine.stats()
    blocks = (len(ids) - 1) // 16
    assert st["prompt_cache_hits"] == blocks + 1  # and the last block's window rows, or the state at its end
    assert st["computed_tokens"] - before == len(ids) - 16 * blocks + 5


def test_a_damaged_state_checkpoint_is_never_used(tmp_path, zoo):
    """A hybrid model's blocks are of no use without the state after them: with that entry damaged, the
    prompt is computed again (the same answer), the entry replaced."""
    path = str(zoo("lfm2"))
    ids = [int(t) for t in np.random.default_rng(7).integers(3, 200, 150)]
    first = LLM(path, progress=False, prompt_cache=tmp_path)
    want = _generate(first, ids)
    first.engine.disk.store.flush()
    digest = b""
    for i in range((len(ids) - 1) // 16):
        digest = block_digest(digest, ids[16 * i:16 * (i + 1)])
    entry = first.engine.disk.store.dir / (part_digest(digest, "state").hex() + ".kvb")
    data = bytearray(entry.read_bytes())
    data[-1] ^= 1
    entry.write_bytes(bytes(data))
    later = LLM(path, progress=False, prompt_cache=tmp_path)
    before = later.engine.stats()["computed_tokens"]
    assert _generate(later, ids) == want
    st = later.engine.stats()
    assert st["computed_tokens"] - before == len(ids) + 5 and st["prompt_cache_damaged"] == 1
    later.engine.disk.store.flush()
    assert entry.read_bytes() != bytes(data)  # removed, and written whole again by the prefill that recomputed it


def test_a_size_of_zero_is_a_one_line_error(tmp_path, tiny_llama_path):
    with pytest.raises(ValueError, match="prompt_cache_mb must be > 0"):
        LLM(str(tiny_llama_path), progress=False, prompt_cache=tmp_path, prompt_cache_mb=0)


def test_a_restarted_server_reports_the_cached_tokens_and_counts_them(tmp_path, tiny_llama_path):
    """serve --prompt-cache: a prompt seen before the restart is answered the same after it, with
    usage.prompt_tokens_details.cached_tokens (as OpenAI reports it; streamed too) and the Prometheus counters."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from edgeinfer.config import EngineConfig
    from edgeinfer.server.app import ServerConfig, create_app

    prompt = "the quick brown fox jumps over the lazy dog, " * 6
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}

    def run(requests):
        cfg = ServerConfig(models=[str(tiny_llama_path)], engine_config=EngineConfig(prompt_cache=str(tmp_path)))
        with TestClient(create_app(cfg)) as http:
            t0 = time.monotonic()
            while http.get("/health").status_code != 200 and time.monotonic() - t0 < 120:
                time.sleep(0.1)
            out = [r(http) for r in requests]
            for llm in _loaded(http):
                llm.engine.disk.store.flush()
            return out, http.get("/metrics").text

    def plain(http):
        return http.post("/v1/completions", json=body).json()

    def streamed(http):
        chunks = [line[6:] for line in http.post("/v1/completions", json={
            **body, "stream": True, "stream_options": {"include_usage": True}}).text.splitlines()
                  if line.startswith("data: {")]
        import json

        return json.loads(chunks[-1])["usage"]

    (first,), _ = run([plain])
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    (again, usage), metrics = run([plain, streamed])
    n = first["usage"]["prompt_tokens"]
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16
    assert usage["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16  # (from memory by now)
    assert f'edgeinfer_prompt_cache_hits_total{{model="tiny-llama"}} {float((n - 1) // 16)}' in metrics
    assert 'edgeinfer_prompt_cache_bytes{model="tiny-llama"}' in metrics


def _loaded(http):
    return [sm.llm for sm in http.app.state.served.values() if sm.llm is not None]


def test_a_folder_that_cannot_be_written_is_a_one_line_error(tmp_path, tiny_llama_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=r"the prompt cache folder .*a-file/cache cannot be written"):
        LLM(str(tiny_llama_path), progress=False, prompt_cache=blocker / "cache")

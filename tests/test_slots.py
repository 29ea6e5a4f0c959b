"""llama.cpp's slots (engine/slots.py, server/slots.py): a slot's KV saved to a file and restored into another
engine's prefix cache gives the same answer with the prefill skipped (attention, sliding-window and hybrid
models); damaged, foreign and oversized files are refused by name, nothing placed; the HTTP API as llama.cpp's."""

import json
import struct
import time

import numpy as np
import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import EngineConfig
from edgeinfer.engine import slots as S

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)


def _answer(llm, ids):
    out = llm.generate(ids, GREEDY)[0]
    return out.token_ids, [lp["logprob"] for lp in out.logprobs]


@pytest.mark.parametrize("kind", ["llama", "gemma3", "lfm2"])
def test_a_saved_slot_restored_elsewhere_skips_the_prefill(tmp_path, zoo, tiny_llama_path, tiny_gemma3_path, kind):
    path = str({"llama": tiny_llama_path, "gemma3": tiny_gemma3_path}.get(kind) or zoo(kind))
    ids = [int(t) for t in np.random.default_rng(3).integers(3, 200, 100)]
    first = LLM(path, progress=False)
    want = _answer(first, ids)
    tokens = ids + want[0]
    saved = S.save(first.engine, tokens, tmp_path / "s.bin")
    assert saved["n_saved"] == len(tokens) // 16 * 16  # (a hybrid's: to its last checkpoint, the prompt's last here)
    assert 0 < saved["n_saved"] <= len(tokens) and saved["n_written"] == (tmp_path / "s.bin").stat().st_size

    later = LLM(path, progress=False)
    got = S.restore(later.engine, tmp_path / "s.bin")
    assert got["token_ids"] == tokens[:saved["n_saved"]] and got["n_restored"] == saved["n_saved"]
    before = later.engine.stats()["computed_tokens"]
    assert _answer(later, ids) == want  # the same tokens and log-probabilities, bit for bit
    assert later.engine.stats()["computed_tokens"] - before < len(ids) // 2


def test_bad_slot_files_are_refused_by_name_and_place_nothing(tmp_path, tiny_llama_path):
    ids = list(range(5, 5 + 70))
    llm = LLM(str(tiny_llama_path), progress=False)
    llm.generate(ids, GREEDY)
    S.save(llm.engine, ids, tmp_path / "good.bin")
    data = (tmp_path / "good.bin").read_bytes()
    (tmp_path / "flipped.bin").write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    (tmp_path / "short.bin").write_bytes(data[:-10])
    (tmp_path / "other.bin").write_bytes(b"GGUF" + data[4:])
    fresh = LLM(str(tiny_llama_path), progress=False)
    for name, why in [("flipped.bin", "damaged or truncated"), ("short.bin", "damaged or truncated"),
                      ("other.bin", "not a slot file"), ("missing.bin", "no slot file missing.bin")]:
        with pytest.raises(S.SlotError, match=why):
            S.restore(fresh.engine, tmp_path / name)
    assert fresh.engine.stats()["kv_blocks_cached"] == 0
    f32 = LLM(str(tiny_llama_path), progress=False, kv_type="f32")  # another KV type: other bytes
    with pytest.raises(S.SlotError, match="saved from another model file, KV type or layout"):
        S.restore(f32.engine, tmp_path / "good.bin")
    tight = LLM(str(tiny_llama_path), progress=False, engine_config=EngineConfig(num_kv_blocks=3))
    with pytest.raises(S.NoRoom, match=r"needs 4 free KV blocks and 3 are free"):
        S.restore(tight.engine, tmp_path / "good.bin")
    # a digest that matches over a header that does not: parts past the tokens, unknown parts
    n, pieces = S.collect(llm.engine, ids)
    header = json.loads(pieces[2])
    for parts in ([[99, ""]] + header["parts"][1:], [[0, "extra"]] + header["parts"][1:]):
        forged = json.dumps({**header, "parts": parts}).encode()
        S.write(tmp_path / "forged.bin", [pieces[0], struct.pack("<I", len(forged)), forged, *pieces[3:]])
        with pytest.raises(S.SlotError, match="malformed header"):
            S.restore(fresh.engine, tmp_path / "forged.bin")
    assert fresh.engine.stats()["kv_blocks_cached"] == 0


def test_a_slot_shared_by_two_requests_is_busy_until_both_finish():
    table = S.SlotTable(2)
    a, b = table.assign(1), table.assign(1)
    assert a is b and a.processing and table.assign(None).id == 0  # (the idle one)
    table.finish(a, [1, 2, 3])
    assert a.processing and a.tokens == [1, 2, 3]
    table.finish(a, None)  # (a request that never ran leaves the tokens as they were)
    assert not a.processing and a.tokens == [1, 2, 3]
    with pytest.raises(ValueError, match="id_slot must be an integer from 0 to 1"):
        table.assign(2)


def test_the_slots_api_as_llama_cpp_s(tmp_path, tiny_llama_path):
    """A completion in slot 1, saved; a restarted server restores it into slot 0 and answers the same prompt
    the same, its tokens cached; erase; and every bad request a 4xx naming the problem."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from edgeinfer.server.app import ServerConfig, create_app

    prompt = "the quick brown fox jumps over the lazy dog, " * 4
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}

    def server(**kw):
        cfg = ServerConfig(models=[str(tiny_llama_path)], max_seqs=2, **kw)
        http = TestClient(create_app(cfg))
        http.__enter__()
        t0 = time.monotonic()
        while http.get("/health").status_code != 200 and time.monotonic() - t0 < 120:
            time.sleep(0.1)
        return http

    http = server(slot_save_path=str(tmp_path / "slots"))
    try:
        first = http.post("/v1/completions", json={**body, "id_slot": 1}).json()
        n = first["usage"]["prompt_tokens"] + 5
        listed = http.get("/slots").json()
        assert [(s["id"], s["is_processing"], s["n_tokens"]) for s in listed] == [(0, False, 0), (1, False, n)]
        saved = http.post("/slots/1?action=save", json={"filename": "conv.bin"}).json()
        assert saved["id_slot"] == 1 and saved["filename"] == "conv.bin" and saved["n_saved"] == n // 16 * 16
        assert (tmp_path / "slots" / "conv.bin").stat().st_size == saved["n_written"]
        for url, json_body, status, fragment in [
                ("/slots/1?action=save", {"filename": "../escape.bin"}, 400, "invalid filename"),
                ("/slots/1?action=save", {"filename": ".hidden"}, 400, "invalid filename"),
                ("/slots/1?action=save", {"name": "x"}, 400, "filename"),
                ("/slots/1?action=load", {"filename": "x"}, 400, "action must be one of save, restore, erase"),
                ("/slots/7?action=save", {"filename": "x"}, 400, "id_slot must be an integer from 0 to 1"),
                ("/slots/one?action=save", {"filename": "x"}, 400, "must be an integer"),
                ("/slots/0?action=restore", {"filename": "absent.bin"}, 400, "no slot file absent.bin")]:
            r = http.post(url, json=json_body)
            assert r.status_code == status and fragment in r.json()["error"]["message"], (url, r.text)
        r = http.post("/v1/completions", json={**body, "id_slot": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "id_slot"
    finally:
        http.__exit__(None, None, None)
    assert not (tmp_path / "escape.bin").exists()

    http = server(slot_save_path=str(tmp_path / "slots"))  # a restart
    try:
        restored = http.post("/slots/0?action=restore", json={"filename": "conv.bin"}).json()
        assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] > 0
        again = http.post("/v1/completions", json={**body, "id_slot": 0}).json()
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 5 - 1) // 16 * 16
        assert http.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": n}
        assert http.get("/slots").json()[0]["n_tokens"] == 0
    finally:
        http.__exit__(None, None, None)

    http = server()  # no --slot-save-path: saving is off, as llama.cpp's
    try:
        r = http.post("/slots/0?action=save", json={"filename": "x.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    finally:
        http.__exit__(None, None, None)

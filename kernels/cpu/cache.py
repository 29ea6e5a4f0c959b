"""Where compiled kernels live, and what makes one valid on another machine.

Numba keys a cached function by its signature, the code generator's (triple, CPU name, features) and a
stamp of its source file, and files it under a folder named after the source file's absolute path. So,
left alone, nothing compiled in one checkout serves another, and nothing compiled on one CPU model
serves another of the same ISA. Here:

- the **ISA tier** pins the CPU name and features the code is generated for (``NUMBA_CPU_NAME`` /
  ``NUMBA_CPU_FEATURES``, set before the first compile), named after the psABI levels: ``x86-64-v3`` for
  the avx2 path, ``x86-64-v4-vnni`` (AVX-512 VNNI) or ``x86-64-v3-avxvnni`` for the vnni path,
  ``x86-64-v2`` for the portable path; on aarch64 ``armv8-a`` (neon, portable), ``armv8.2-a-dotprod`` and
  ``armv8.6-a-i8mm``. Every machine of a tier generates and accepts the same code; a CPU
  that lacks a feature of the tier gets a tier of its own (``host-CPU``), which never travels;
- a **locator** (numba's ``_CacheLocator``) files the kernels of this package under
  ``ROOT/TIER/numba-V-llvmlite-V-pyXY/SOURCE`` and stamps them with SOURCE, a hash of every kernel
  source file (`source_files`: this package's, subpackages such as int8/ included, and the kinds
  table, kernels/kinds.py, whose ids are compiled in as constants, and the weight formats, kernels/formats/,
  whose decodes are inlined): a compiled step holds inlined copies of what it calls in other files, so any change to
  any of them starts afresh, and two checkouts of the same sources share one cache;
- ROOT is ``$NUMBA_CACHE_DIR`` when set, else ``$EDGEINFER_HOME/kernels``.

`export_cache` packs the current tier's folder with a manifest; `import_cache` refuses a pack made for
another tier, Numba, llvmlite, Python or kernel source, with a one-line reason, and loads nothing of it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import sys
import tarfile
import time
from dataclasses import dataclass

import numba
import numba.core.caching
import numba.core.registry

KERNEL_DIR = os.path.dirname(os.path.abspath(__file__))
FORMAT = 1  # of the exported pack


def _package_dirs() -> frozenset:
    # the folders of this package (subpackages too) whose njit(cache=True) functions the locator files
    # (the package maps sibling folders into one namespace, so they are found by module, not by path)
    import importlib.util

    dirs = {os.path.dirname(p) for p in source_files() if _is_kernel_source(p)}
    for name in ("edgeinfer", "edgeinfer.models", "edgeinfer.quant", "edgeinfer.kernels"):
        spec = importlib.util.find_spec(name)
        dirs.update(os.path.abspath(d) for d in (spec.submodule_search_locations or ()))
    return frozenset(dirs)


class CacheError(ValueError):
    """A kernel pack that cannot be imported here (other tier or versions, damaged, not a pack)."""


@dataclass(frozen=True)
class Tier:
    name: str
    cpu: str          # LLVM CPU name the code is generated for
    features: str     # LLVM features on top of the CPU's own
    needs: frozenset  # host features (llvmlite's names) a machine must have to run it


_V2 = frozenset({"cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
TIERS = {
    "portable": [Tier("x86-64-v2", "x86-64-v2", "", _V2)],
    "avx2": [Tier("x86-64-v3", "x86-64-v3", "", _V3)],
    # AVX-512 VNNI machines (Cascade Lake and later Xeons, Zen 4) and AVX-VNNI ones (Alder Lake and later)
    "vnni": [Tier("x86-64-v4-vnni", "x86-64-v4", "+avx512vnni", _V4 | {"avx512vnni"}),
             Tier("x86-64-v3-avxvnni", "x86-64-v3", "+avxvnni", _V3 | {"avxvnni"})],
    # the same machines' zmm registers: the same tier as vnni's (the isa type keeps the two paths' code apart)
    "avx512": [Tier("x86-64-v4-vnni", "x86-64-v4", "+avx512vnni", _V4 | {"avx512vnni"})],
}
# aarch64: LLVM's generic ARMv8-A core plus the extensions each path's kernels are written in
_A8 = frozenset({"neon"})
ARM_TIERS = {
    "portable": [Tier("armv8-a", "generic", "+neon", _A8)],
    "neon": [Tier("armv8-a", "generic", "+neon", _A8)],
    "dotprod": [Tier("armv8.2-a-dotprod", "generic", "+neon,+dotprod", _A8 | {"dotprod"})],
    "i8mm": [Tier("armv8.6-a-i8mm", "generic", "+neon,+dotprod,+i8mm", _A8 | {"dotprod", "i8mm"})],
}


def tier_for(path: str, host: set[str], machine: str | None = None) -> Tier:
    """The ISA tier the kernels of `path` are generated for on a host with these features."""
    machine = machine or platform.machine()
    tiers = TIERS if machine in ("x86_64", "AMD64") else ARM_TIERS if machine in ("aarch64", "arm64") else {}
    for t in tiers.get(path, ()):
        if t.needs <= host:
            return t
    import llvmlite.binding as llvm

    cpu = llvm.get_host_cpu_name()
    return Tier(f"host-{machine}-{cpu}", cpu, llvm.get_host_cpu_features().flatten(), frozenset())


def versions() -> dict:
    import llvmlite

    return {"numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}", "machine": platform.machine()}


# read by the kernels as they compile (constants frozen into the code; the weight formats' decodes inlined),
# outside this package
_FORMATS_DIR = os.path.join(os.path.dirname(KERNEL_DIR), "formats")
SOURCE_EXTRA = (os.path.join(os.path.dirname(KERNEL_DIR), "kinds.py"),) + tuple(
    os.path.join(_FORMATS_DIR, n) for n in sorted(os.listdir(_FORMATS_DIR)) if n.endswith(".py"))


def source_files() -> list[str]:
    """The files SOURCE fingerprints, in a fixed order: every .py file of this package and its
    subpackages, then SOURCE_EXTRA."""
    files = []
    for dirpath, dirnames, names in os.walk(KERNEL_DIR):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".py")]
    return files + [p for p in SOURCE_EXTRA if os.path.exists(p)]


def _is_kernel_source(path: str) -> bool:
    # a file of this package or one of its subpackages (its code is covered by SOURCE)
    return os.path.abspath(path).startswith(KERNEL_DIR + os.sep)


def _source_hash() -> str:
    h = hashlib.sha256()
    base = os.path.dirname(KERNEL_DIR)
    for path in source_files():
        with open(path, "rb") as f:
            h.update(os.path.relpath(path, base).encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


SOURCE = _source_hash()
_state: dict = {}  # the tier and folder of this process, set once by `configure`


def root() -> str:
    """The folder every kernel cache lives under."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return os.path.abspath(env)
    # kernels import nothing of ours, so this reads EDGEINFER_HOME itself, with the default of
    # edgeinfer.registry.home(); tests/test_kernel_cache.py holds the two to the same folder
    home = os.environ.get("EDGEINFER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "edgeinfer")
    return os.path.join(home, "kernels")


def _version_dir() -> str:
    v = versions()
    return f"numba-{v['numba']}-llvmlite-{v['llvmlite']}-py{v['python'].replace('.', '')}"


def tier() -> Tier:
    return _state["tier"]


def codegen_features() -> frozenset:
    """The x86 features (llvmlite's names) the code generator targets: the tier's, or where the tier is the
    host's own or the user's (NUMBA_CPU_NAME), the host's and NUMBA_CPU_FEATURES' additions. simd/vec.py
    emulates an instruction this set lacks (see there)."""
    t = _state.get("tier")
    if t is not None and t.needs:
        return t.needs
    import llvmlite.binding as llvm

    feats = {name for name, on in llvm.get_host_cpu_features().items() if on}
    for f in (numba.config.CPU_FEATURES or "").split(","):
        if f.startswith("+"):
            feats.add(f[1:])
        elif f.startswith("-"):
            feats.discard(f[1:])
    return frozenset(feats)


def folder() -> str:
    """This process's kernel folder: ROOT/TIER/VERSIONS/SOURCE."""
    return _state["folder"]


class _Locator(numba.core.caching._CacheLocator):
    """Files this package's cached functions under `folder()`, one subfolder per source module, stamped
    with the kernel sources' hash (not the file's path or modification time)."""

    def __init__(self, py_func, py_file):
        self._lineno = py_func.__code__.co_firstlineno
        d, name = os.path.split(os.path.abspath(py_file))
        self._path = os.path.join(folder(), os.path.basename(d) + "." + os.path.splitext(name)[0])
        own = b""
        if not _is_kernel_source(py_file):
            with open(py_file, "rb") as f:
                own = f.read()
        self._stamp = SOURCE + hashlib.sha256(own).hexdigest()[:16]

    def get_cache_path(self):
        return self._path

    def get_source_stamp(self):
        return self._stamp

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        if "folder" not in _state or os.path.dirname(os.path.abspath(py_file)) not in _state["dirs"]:
            return None
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:
            return None
        return self


def _locked_save(self, key, data):
    """numba's IndexDataCacheFile.save under an exclusive lock on the index, data first.

    Numba picks the data file's number from the index it read, writes the index, then the data. Two
    processes saving different entries of one function (another signature or ISA tag: the worker
    processes of a parallel compile, a server beside the tests) can pick the same number, and one's
    code then sits under the other's key: a kernel that computes garbage, loaded forever after. Under
    the lock the choice is made once; the data is in place before the index names it."""
    import fcntl

    os.makedirs(self._cache_path, exist_ok=True)
    with open(self._index_path + ".lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        overloads = self._load_index()
        data_name = overloads.get(key)
        if data_name is None:
            existing = set(overloads.values())
            n = 1
            while self._data_name(n) in existing or os.path.exists(self._data_path(self._data_name(n))):
                n += 1
            data_name = self._data_name(n)
        self._save_data(data_name, data)
        if overloads.get(key) != data_name:
            overloads[key] = data_name
            self._save_index(overloads)


def _distinct_symbols() -> None:
    """Numba names each compiled function after its qualified name, argument types and a per-process
    counter. Every process counts from 1, so two specializations compiled in two processes (the parallel
    compile's workers) could carry one symbol, and once both are loaded from the cache into one process a
    call meant for one reaches the other (seen: K-quant matmuls running the legacy types' kernel). Each
    process counts from its own random point instead."""
    import itertools
    import random

    from numba.core.bytecode import FunctionIdentity

    FunctionIdentity._unique_ids = itertools.count(random.SystemRandom().randrange(1 << 40, 1 << 62))


def configure(path: str, host: set[str]) -> Tier:
    """Pin the code generator to `path`'s tier and file this package's kernels under its folder. Once per
    process, before anything compiles (a second call with another path keeps the first tier: Numba's code
    generator is made once)."""
    if "tier" in _state:
        return _state["tier"]
    if "_toplevel_target_context" in vars(numba.core.registry.cpu_target):
        # Numba's code generator exists (an @njit was decorated before this package's kernels were
        # imported): it was made for the host CPU, and its code would be filed under the wrong tier
        raise RuntimeError("edgeinfer.kernels.cpu must be imported before any @njit function is defined "
                           "(its ISA tier pins Numba's code generator)")
    t = tier_for(path, host)
    if os.environ.get("NUMBA_CPU_NAME") is None:  # an explicit choice of the user's wins
        numba.config.CPU_NAME = t.cpu
        numba.config.CPU_FEATURES = t.features
    else:
        t = Tier(f"user-{numba.config.CPU_NAME}", numba.config.CPU_NAME, numba.config.CPU_FEATURES or "", frozenset())
    _state["tier"] = t
    _state["dirs"] = _package_dirs()
    _state["folder"] = os.path.join(root(), t.name, _version_dir(), SOURCE)
    numba.core.caching.IndexDataCacheFile.save = _locked_save
    _distinct_symbols()
    impl = numba.core.caching.CacheImpl
    if _Locator not in impl._locator_classes:
        impl._locator_classes.insert(0, _Locator)
    _prune_old(_state["folder"])
    return t


def _prune_old(current: str, max_age_s: float = 3600.0) -> None:
    # caches of earlier kernel sources (5-10 MB each), untouched for an hour, are dead weight
    parent = os.path.dirname(current)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            if path != current and time.time() - os.path.getmtime(path) > max_age_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def dir_size(path: str) -> tuple[int, int]:
    """(bytes, files) under path."""
    total = n = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
                n += 1
            except OSError:
                pass
    return total, n


def manifest() -> dict:
    t = tier()
    return {"format": FORMAT, "tier": t.name, "cpu": t.cpu, "features": t.features, "source": SOURCE, **versions()}


def export_cache(dest: str) -> dict:
    """Pack this tier's compiled kernels (the current folder) into `dest` (.tar.gz) with a manifest."""
    src = folder()
    if not os.path.isdir(src) or dir_size(src)[1] == 0:
        raise CacheError(f"no compiled kernels to export in {src}: run `edgeinfer warmup` first")
    m = manifest()
    tmp = f"{dest}.partial"
    try:
        _write_pack(tmp, src, m)
        os.replace(tmp, dest)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CacheError(f"cannot write the kernel pack {dest}: {e.strerror or e}") from None
    m["bytes"] = os.path.getsize(dest)
    return m


def _write_pack(tmp: str, src: str, m: dict) -> None:
    with tarfile.open(tmp, "w:gz") as tar:
        data = json.dumps(m, indent=1).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for dirpath, _, files in os.walk(src):
            for f in sorted(files):
                if ".tmp." in f:
                    continue
                full = os.path.join(dirpath, f)
                tar.add(full, arcname="kernels/" + os.path.relpath(full, src), recursive=False)


def import_cache(src: str) -> dict:
    """Install a pack made by `export_cache` into this machine's kernel folder. A pack for another tier,
    other versions or other kernel sources is refused (CacheError, one line); nothing of it is written."""
    try:
        tar = tarfile.open(src, "r:gz")
    except (OSError, tarfile.TarError) as e:
        raise CacheError(f"{src} is not a kernel pack (a .tar.gz from `edgeinfer warmup --export`): {e}") from None
    with tar:
        try:
            m = json.load(tar.extractfile("manifest.json"))
        except (KeyError, ValueError, tarfile.TarError, OSError, AttributeError):
            raise CacheError(f"{src} has no readable manifest.json: not a kernel pack") from None
        here = manifest()
        for key, what in (("format", "pack format"), ("machine", "machine"), ("tier", "ISA tier"),
                          ("numba", "Numba version"), ("llvmlite", "llvmlite version"), ("python", "Python version"),
                          ("source", "kernel source")):
            if m.get(key) != here[key]:
                raise CacheError(f"{src} was built for {what} {m.get(key)!r}, this machine needs {here[key]!r}: "
                                 "refused, nothing loaded")
        members = [i for i in tar.getmembers() if i.name != "manifest.json"]
        for i in members:
            rel = i.name[len("kernels/"):] if i.name.startswith("kernels/") else ""
            if not i.isfile() or not rel or os.path.isabs(rel) or ".." in rel.split("/"):
                raise CacheError(f"{src}: unexpected entry {i.name!r}: refused, nothing loaded")
        dest = folder()
        staging = f"{dest}.import-{os.getpid()}"
        try:
            for i in members:
                out = os.path.join(staging, i.name[len("kernels/"):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with tar.extractfile(i) as fin, open(out, "wb") as fout:
                    shutil.copyfileobj(fin, fout)
            for dirpath, _, files in os.walk(staging):
                for f in files:
                    full = os.path.join(dirpath, f)
                    target = os.path.join(dest, os.path.relpath(full, staging))
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    os.replace(full, target)
        except tarfile.TarError as e:
            raise CacheError(f"{src} is damaged: {e}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    m["files"] = len(members)
    return m


def clear() -> int:
    """Remove every compiled kernel under root() (all tiers and versions); bytes freed."""
    r = root()
    freed = dir_size(r)[0]
    shutil.rmtree(r, ignore_errors=True)
    return freed

import os
import sys

# The CUDA backend's tests run on numba's CUDA simulator (no GPU here or in CI). It must be chosen
# before numba is imported, and it changes nothing for the CPU kernels.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# One kernel cache for the whole run: tests that start processes with another EDGEINFER_HOME (an empty
# model cache) still load the kernels compiled so far instead of compiling them all again.
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(
    os.environ.get("EDGEINFER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "edgeinfer"), "kernels"))

# Models run the compiled step from their first forward pass, as `edgeinfer warmup` and the benchmarks do; the
# tests of a first answer before it (kernels/cpu/background.py) set this themselves.
os.environ.setdefault("EDGEINFER_BACKGROUND_COMPILE", "0")

# On an AVX2 machine without VNNI or AVX-512 (CI's may be one), the vnni and avx512 paths' kernels run too,
# with those instructions emulated by exact AVX2 sequences (kernels/cpu/simd/vec.py): every x86 path's
# arithmetic is checked on every x86 machine. A model still runs the best native path.
os.environ.setdefault("EDGEINFER_EMULATE_PATHS", "1")

import platform  # noqa: E402

import pytest  # noqa: E402

# tests/aarch64/ is the aarch64 part of the suite: collected on aarch64 machines only (tests/aarch64/run.sh
# runs it under qemu-user on an x86 host, and CI runs that); everything else runs on every machine
if platform.machine() not in ("aarch64", "arm64"):
    collect_ignore_glob = ["aarch64/*"]

sys.path.insert(0, os.path.dirname(__file__))

from tiny_models import write_tiny_gemma3, write_tiny_llama, write_tiny_nomic_bert  # noqa: E402

# llama.cpp's reference outputs, kept with the tests (see golden/README.md)
GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "tiny-llama.gguf"
    write_tiny_llama(p)
    return p


@pytest.fixture(scope="session")
def tiny_gemma3_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "tiny-gemma3.gguf"
    write_tiny_gemma3(p)
    return p


@pytest.fixture(scope="session")
def tiny_nomic_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "tiny-nomic.gguf"
    write_tiny_nomic_bert(p)
    return p


def written_on_first_use(tmp_path_factory, folder: str, write):
    """get(name): the path of folder/NAME.gguf, made by write(name, path) the first time it is asked for."""
    d = tmp_path_factory.mktemp(folder)
    paths = {}

    def get(name):
        if name not in paths:
            paths[name] = d / f"{name}.gguf"
            write(name, paths[name])
        return paths[name]

    return get


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    """zoo(name): the path of tests/arch_zoo.py's model `name`, written on first use (once a session)."""
    from arch_zoo import write

    return written_on_first_use(tmp_path_factory, "zoo", write)


def real_model_path(name: str):
    """The cached real model, pulled on first use (CI pulls both before the tests)."""
    from edgeinfer import registry

    return registry.resolve(name, progress=False)


def golden_path(model_file: str) -> str:
    return os.path.join(GOLDEN_DIR, model_file)

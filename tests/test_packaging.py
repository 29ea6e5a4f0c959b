"""Packaging that tells the truth: pyproject.toml lists every package of the sources, a source checkout imports
exactly the names the package-dir maps, and a wheel built from the sources installs and runs.

The wheel and checkout tests use fresh virtual environments that see this interpreter's installed dependencies
through a .pth file (nothing is downloaded but the build backend pip's isolated build fetches), never the
checkout's own folders: what runs there is what the wheel holds."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

import edgeinfer

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
# the folders the packages come from: edgeinfer/ and the siblings pyproject maps into it
SOURCE_DIRS = ("edgeinfer", "kernels", "quant", "models", "cli")


def package_folder(name: str) -> Path:
    """Where setuptools takes package `name` from: the nearest package-dir entry at or above it, then the
    rest of the name as folders."""
    mapping = SETUPTOOLS.get("package-dir", {})
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in mapping:
            return ROOT / mapping[head] / Path(*parts[i:])
    return ROOT / Path(*parts)


def folders_with_init() -> set[Path]:
    return {p.parent for d in SOURCE_DIRS for p in (ROOT / d).rglob("__init__.py") if "__pycache__" not in p.parts}


def test_pyproject_lists_every_package_and_nothing_else():
    listed = {package_folder(name): name for name in SETUPTOOLS["packages"]}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders_with_init() - set(listed))
    assert missing == [], f"folders with an __init__.py that pyproject.toml's packages list does not name: {missing}"
    absent = sorted(name for folder, name in listed.items() if not (folder / "__init__.py").is_file())
    assert absent == [], f"packages pyproject.toml lists whose folder has no __init__.py: {absent}"
    assert len(listed) == len(SETUPTOOLS["packages"]), "two packages map to one folder"


def test_package_dir_agrees_with_itself_and_with_the_checkout_finder():
    mapping = SETUPTOOLS["package-dir"]
    for name, folder in mapping.items():
        assert name in SETUPTOOLS["packages"], f"package-dir maps {name}, which packages does not list"
        assert (ROOT / folder / "__init__.py").is_file(), f"package-dir maps {name} to {folder}, not a package"
    # the entries that move a package out of the folder its parent's implies are the ones a checkout's
    # finder must map
    moved = {name: folder for name, folder in mapping.items() if "." in name
             and ROOT / folder != package_folder(name.rpartition(".")[0]) / name.rpartition(".")[2]}
    assert moved == edgeinfer._SIBLINGS


@pytest.mark.parametrize("name", ["edgeinfer.tests", "edgeinfer.edgeinfer", "edgeinfer.benchmarks"])
def test_the_checkout_folders_that_are_no_packages_do_not_import(name):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


def fresh_venv(where: Path) -> Path:
    """A virtual environment at `where` without pip that sees this interpreter's site-packages (the
    dependencies) through a .pth file, whose lines add folders without running their .pth files; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    Path(site, "edgeinfer-test-deps.pth").write_text("\n".join(deps) + "\n")
    return python


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def run(cmd, cwd, timeout=120) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


CHECKOUT = """
import importlib, sys
import edgeinfer, edgeinfer.kernels, edgeinfer.quant, edgeinfer.models, edgeinfer.cli, edgeinfer.kernels.cpu.simd
root = sys.argv[1]
for m in (edgeinfer, edgeinfer.kernels, edgeinfer.quant, edgeinfer.models, edgeinfer.cli, edgeinfer.kernels.cpu.simd):
    assert m.__file__.startswith(root + "/"), m.__file__
for name in ("edgeinfer.tests", "edgeinfer.edgeinfer", "edgeinfer.benchmarks"):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        continue
    raise AssertionError(name + " imports")
print("ok")
"""


def test_a_checkout_that_is_not_installed_maps_exactly_its_sibling_folders(tmp_path):
    python = fresh_venv(tmp_path / "venv")
    assert run([python, "-c", CHECKOUT, ROOT], cwd=ROOT).strip() == "ok"


SMOKE = """
import subprocess, sys
prefix, model, script = sys.argv[1:4]
import edgeinfer, edgeinfer.cli.main, edgeinfer.llm, edgeinfer.models, edgeinfer.quant
from edgeinfer.kernels import get_backend
for m in (edgeinfer, edgeinfer.llm, edgeinfer.kernels, edgeinfer.quant, edgeinfer.models, edgeinfer.cli):
    assert m.__file__.startswith(prefix), m.__file__ + " is not the wheel's"
assert get_backend("cpu").NAME == "cpu"
from edgeinfer import LLM, SamplingParams
llm = LLM(model, progress=False)
out = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
assert len(out.token_ids) == 4, out
usage = subprocess.run([script, "--help"], capture_output=True, text=True, check=True).stdout
assert "generate" in usage and "serve" in usage, usage
print("tokens", out.token_ids)
"""


def test_a_wheel_built_from_the_sources_installs_and_runs(tmp_path, tiny_llama_path):
    src = tmp_path / "src"  # a copy, so that the build's build/ and egg-info never land in the checkout
    for d in SOURCE_DIRS:
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"the wheel did not build (pip wheel --no-deps):\n{build.stdout[-3000:]}\n" \
                                  f"{build.stderr[-3000:]}"
    (wheel,) = dist.glob("edgeinfer-*.whl")
    # every source file of every package is in the wheel, under its installed name
    names = set(zipfile.ZipFile(wheel).namelist())
    installed_as = {"edgeinfer": "edgeinfer", **{d: n.replace(".", "/") for n, d in edgeinfer._SIBLINGS.items()}}
    want = {f"{installed_as[d]}/{p.relative_to(ROOT / d).as_posix()}"
            for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(want - names) == []

    python = fresh_venv(tmp_path / "venv")
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        cwd=tmp_path)
    venv = python.parent.parent
    out = run([python, "-c", SMOKE, venv, tiny_llama_path, venv / "bin" / "edgeinfer"], cwd=tmp_path, timeout=240)
    assert out.startswith("tokens")

"""The layout's rules (docs/architecture.md), checked on the sources: imports point one way, quant kinds are
named, files do one job."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# where each installed package's sources live (pyproject's package-dir)
PACKAGES = {"edgeinfer": ROOT / "edgeinfer", "edgeinfer.kernels": ROOT / "kernels", "edgeinfer.quant": ROOT / "quant",
            "edgeinfer.models": ROOT / "models", "edgeinfer.cli": ROOT / "cli"}
MAX_LINES = 450


def sources():
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([pkg, *parts]), path, path.name == "__init__.py"


def imported(module: str, path: Path, is_pkg: bool) -> set[str]:
    """Every edgeinfer module this file imports, at the top or lazily, resolved to absolute names."""
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("edgeinfer"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if base.startswith("edgeinfer"):
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
    return out


def in_package(name: str, pkg: str) -> bool:
    return name == pkg or name.startswith(pkg + ".")


CORE = ("edgeinfer.llm", "edgeinfer.engine", "edgeinfer.models", "edgeinfer.kernels", "edgeinfer.quant")
OUTER = ("edgeinfer.server", "edgeinfer.batch", "edgeinfer.batch_ray", "edgeinfer.bench", "edgeinfer.cli")


def test_the_core_never_imports_the_server_batch_jobs_bench_or_cli():
    bad = [(m, i) for m, p, pkg in sources() if any(in_package(m, c) for c in CORE)
           for i in imported(m, p, pkg) if any(in_package(i, o) for o in OUTER)]
    assert bad == []


def test_kernels_import_nothing_of_ours_and_the_openai_layer_no_http():
    for m, p, pkg in sources():
        deps = imported(m, p, pkg)
        if in_package(m, "edgeinfer.kernels"):
            assert all(in_package(i, "edgeinfer.kernels") for i in deps), (m, deps)
        if in_package(m, "edgeinfer.openai"):
            assert not any(in_package(i, o) for i in deps for o in OUTER), (m, deps)
        if in_package(m, "edgeinfer.engine"):  # through the model and backend interfaces only
            assert not any(in_package(i, p) for i in deps
                           for p in ("edgeinfer.models", "edgeinfer.kernels", "edgeinfer.quant")), (m, deps)


def test_this_check_sees_imports():
    # the checks above pass vacuously if the parser finds nothing: it must see llm's own imports
    m, p, pkg = next(s for s in sources() if s[0] == "edgeinfer.llm")
    deps = imported(m, p, pkg)
    assert "edgeinfer.engine.llm_engine" in deps and "edgeinfer.registry" in deps


NUMERIC_KIND = re.compile(r"\bkind\w*\s*(<|>|<=|>=|==|!=)\s*\d|\d\s*(<|>|<=|>=|==|!=)\s*kind\b|\bkind\s+in\s*\(\s*\d")


def test_no_bare_numeric_quant_kind_comparison_in_kernels_or_quant():
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
           for folder in (ROOT / "kernels", ROOT / "quant") for p in sorted(folder.rglob("*.py"))
           for n, line in enumerate(p.read_text().splitlines(), 1)
           if NUMERIC_KIND.search(line.split("#")[0])]
    assert bad == []


def test_no_source_file_over_450_lines_without_saying_why_it_is_one_file():
    long = []
    for _, p, _ in sources():
        text = p.read_text()
        if text.count("\n") > MAX_LINES and "one file" not in text[:3000].lower():
            long.append(f"{p.relative_to(ROOT)}: {text.count(chr(10))} lines")
    assert long == []


def test_def_forward_per_op_exists_once():
    hits = [p for _, p, _ in sources() if re.search(r"^\s*def forward_per_op\b", p.read_text(), re.M)]
    assert [str(p.relative_to(ROOT)) for p in hits] == ["models/decoder.py"]

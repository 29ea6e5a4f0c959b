"""The layout's rules (docs/architecture.md), checked on the sources: imports point one way, quant kinds are
named, files do one job."""

import ast
import re
import subprocess
import sys
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


def _import_nodes(tree: ast.AST):
    """Every node of a module but the bodies of `if TYPE_CHECKING:` (annotations' imports, which never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def imported(module: str, path: Path, is_pkg: bool) -> set[str]:
    """Every edgeinfer module this file imports when it runs, at the top or lazily (not for annotations alone),
    resolved to absolute names; `from X import y` gives X and X.y, whether y is a module or a name."""
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    out = set()
    for node in _import_nodes(ast.parse(path.read_text())):
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


def import_graph() -> dict[str, set[str]]:
    """module -> the edgeinfer modules importing it runs. Importing a.b.c runs the packages a and a.b first,
    so they count too, except the importer's own packages, which are already running when it is imported (a
    package whose __init__ imports its submodules is no cycle unless one of them imports it back)."""
    found = list(sources())
    modules = {m for m, _, _ in found}

    def with_packages(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    graph = {}
    for m, p, pkg in found:
        own = with_packages(m)
        graph[m] = {d for i in imported(m, p, pkg) for d in with_packages(i) if d in modules} - own
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = "done"
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: set[str]) -> dict[str, str]:
    """Every module reachable from start, each with the module that first imported it."""
    via = {m: "" for m in start}
    todo = sorted(start)
    while todo:
        m = todo.pop()
        for n in sorted(graph[m]):
            if n not in via:
                via[n] = m
                todo.append(n)
    return via


def test_no_import_cycles_lazy_imports_included():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_cycles_and_packages():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    # importing a submodule runs its package: llm imports engine.llm_engine, and so the engine package
    assert {"edgeinfer.engine", "edgeinfer.engine.llm_engine"} <= graph["edgeinfer.llm"]
    # ... but a package's own submodules import one another without importing the package back
    assert "edgeinfer.registry.cache" in graph["edgeinfer.registry.hf"]
    assert "edgeinfer.registry" not in graph["edgeinfer.registry.hf"]


def test_the_engine_reaches_no_models_kernels_quant_lazy_imports_included():
    graph = import_graph()
    via = reachable(graph, {m for m in graph if in_package(m, "edgeinfer.engine")})
    bad = []
    for m in sorted(via):
        if any(in_package(m, p) for p in ("edgeinfer.models", "edgeinfer.kernels", "edgeinfer.quant")):
            chain = [m]
            while via[chain[-1]]:
                chain.append(via[chain[-1]])
            bad.append(" <- ".join(chain))
    assert bad == []


def _loads_in_a_fresh_process(code: str) -> list[str]:
    check = (f"import sys\n{code}\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'numba' or "
             "m.startswith(('edgeinfer.models', 'edgeinfer.kernels', 'edgeinfer.quant'))))")
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_the_engine_imports_no_numba_and_no_kernels():
    engine = sorted(m for m, _, _ in sources() if in_package(m, "edgeinfer.engine"))
    assert len(engine) > 5 and _loads_in_a_fresh_process("\n".join(f"import {m}" for m in engine)) == []


def test_a_json_schema_constraint_imports_no_numba():
    code = ("from edgeinfer.sampling import SamplingParams\n"
            "SamplingParams(json_schema={'type': 'object', 'properties': {'a': {'type': 'integer'}}})")
    assert _loads_in_a_fresh_process(code) == []


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


def test_no_source_file_over_450_lines():
    long = [f"{p.relative_to(ROOT)}: {p.read_text().count(chr(10))} lines" for _, p, _ in sources()
            if p.read_text().count("\n") > MAX_LINES]
    assert long == []


def test_def_forward_per_op_exists_once():
    hits = [p for _, p, _ in sources() if re.search(r"^\s*def forward_per_op\b", p.read_text(), re.M)]
    assert [str(p.relative_to(ROOT)) for p in hits] == ["models/decoder.py"]

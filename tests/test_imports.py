"""Import direction of the packages: the core ``dlm`` imports neither strategy package nor the
experiments, the harness imports neither the experiments nor the research probes, and the library
packages (dlm, fastdllm, bd3lm, tasks, harness) have no import cycles.

The static checks read every ``import`` statement with :mod:`ast`, function-local ones included
(a local import still makes a cycle, it only hides it until call time). Run as a script
(``python tests/test_imports.py``) it prints the module graph's cycles and upward imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("dlm", "fastdllm", "bd3lm", "tasks", "harness")
ABOVE_CORE = ("fastdllm", "bd3lm", "tasks", "harness", "experiments", "research")


def module_files(package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of ``package`` (``__init__`` as the package)."""
    out = {}
    for path in sorted((REPO / package).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(name: str, path: Path) -> set[str]:
    """Absolute dotted names ``path`` (module ``name``) imports, at any depth of the file;
    ``from m import x`` yields ``m.x`` too (x may be a submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def import_graph(packages=LIBRARY) -> dict[str, set[str]]:
    """Edges module -> internal modules it imports (a name resolves to the longest known module)."""
    files = {m: p for pkg in packages for m, p in module_files(pkg).items()}
    graph = {}
    for name, path in files.items():
        edges = set()
        for target in imported_names(name, path):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward_imports(package: str = "dlm", above=ABOVE_CORE) -> list[tuple[str, str]]:
    """(module, imported name) pairs where a module of ``package`` imports a package in ``above``."""
    return sorted((name, target) for name, path in module_files(package).items()
                  for target in imported_names(name, path) if target.split(".")[0] in above)


def test_graph_sees_relative_and_local_imports():
    graph = import_graph()
    assert "bd3lm.loss" in graph["bd3lm.clipping"] and "bd3lm.schedules" in graph["bd3lm.loss"]
    assert "dlm.sample" in graph["fastdllm.generate"]
    assert "dlm.tokenizer" in graph["tasks.tokenizer"]


def test_no_import_cycles_in_the_library():
    assert cycles(import_graph()) == []


def test_core_imports_nothing_above_it():
    assert upward_imports("dlm") == []
    for pkg in ("fastdllm", "bd3lm"):  # the strategy packages import the core, never the harness or experiments
        assert upward_imports(pkg, ("harness", "experiments", "research")) == []


def test_the_tasks_are_data_not_methods():
    """tasks (the testbed's procedural tasks, GSM8K loading, their tokenizer) builds on the core
    only: no sampler package, no experiments."""
    assert upward_imports("tasks", ("fastdllm", "bd3lm", "harness", "experiments", "research")) == []


def test_the_harness_is_a_library_below_the_entry_points():
    """harness (results I/O, the evaluation loop, reports, the entry points' plumbing) is imported by
    experiments and research, and imports neither."""
    assert upward_imports("harness", ("experiments", "research")) == []
    assert upward_imports("research", ("experiments",)) == []  # a probe builds on the library, not the entry points
    graph = import_graph(("harness", "experiments"))
    assert "harness.results" in graph["harness.evaluate"] and "harness.cli" in graph["experiments.eval.gsm8k"]


@pytest.mark.slow
def test_importing_every_core_module_loads_no_strategy_package():
    names = sorted(module_files("dlm"))
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ABOVE_CORE!r}))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


if __name__ == "__main__":
    g = import_graph()
    print(f"{len(g)} modules, {sum(map(len, g.values()))} internal imports")
    print("cycles:", cycles(g) or "none")
    print("dlm importing fastdllm/bd3lm/experiments/research:", upward_imports("dlm") or "none")


def test_the_registry_finds_the_method_packages_without_an_install(monkeypatch):
    """A checkout that was not pip-installed has no entry points: the registry reads the same
    ``dlm.methods`` table from pyproject.toml."""
    from dlm import registry

    installed = registry._method_modules()
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    registry._method_modules.cache_clear()
    try:
        assert registry._method_modules() == installed and ("llada", "dlm.llada") in installed
    finally:
        registry._method_modules.cache_clear()


def test_the_house_keeps_its_shape():
    """Issue 49's bars: no Python file over 400 lines, and the entry points (``experiments/``) at most
    35% of the non-test lines: logic lives in the library packages."""
    files = [p for p in REPO.rglob("*.py") if p.relative_to(REPO).parts[0] in (*LIBRARY, *ABOVE_CORE, "methods",
                                                                                "dream", "tests")]
    lines = {p.relative_to(REPO): len(p.read_text().splitlines()) for p in files}
    assert not {str(p): n for p, n in lines.items() if n > 400}
    code = {p: n for p, n in lines.items() if p.parts[0] != "tests"}
    share = sum(n for p, n in code.items() if p.parts[0] == "experiments") / sum(code.values())
    assert share <= 0.35, f"experiments/ holds {100 * share:.1f}% of the non-test lines"

"""The project's import graph, read with ``ast``: no import circle and no private name taken from another module.

Module-level and function-level imports count alike. A private name is one with a single leading underscore;
``from m import _name`` and ``m._name`` (``m`` bound by ``import m`` / ``import m as x`` / ``from p import m``)
are caught when ``m`` is another module of the project. Each rule is shown to catch its case on a synthetic tree.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("client", "server", "strategies", "theory", "studies", "checks", "tools", "benchmarks", "hydra_plugins")


def modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted name -> file of every module of the ``packages`` that exist under ``root``."""
    out = {}
    for package in packages:
        if not (root / package).is_dir():
            continue
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def analyse(root: Path, packages: Iterable[str] = PACKAGES) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> project modules it imports, descriptions of private names used across modules)."""
    mods = modules(root, packages)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for module, path in mods.items():
        bound: dict[str, str] = {}  # local name -> project module it is bound to
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name not in mods:
                        continue
                    if alias.name != module:
                        edges[module].add(alias.name)
                    top = alias.name.split(".")[0]  # ``import a.b`` binds ``a``; ``import a.b as x`` binds ``a.b``
                    bound[alias.asname or top] = alias.name if alias.asname else top
            elif isinstance(node, ast.ImportFrom):
                base = _base(module, path, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        if sub != module:
                            edges[module].add(sub)
                            bound[alias.asname or alias.name] = sub
                        continue
                    if base in mods and base != module:
                        edges[module].add(base)
                        if _private(alias.name):
                            private.append(f"{module}: from {base} import {alias.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                target = _dotted(node.value, bound)
                if target in mods and target != module:
                    private.append(f"{module}: {target}.{node.attr}")
    return edges, private


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The project module an expression such as ``m`` or ``pkg.sub`` stands for (None: not a bound module)."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value, bound)
        return None if head is None else f"{head}.{node.attr}"
    return None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@functools.cache
def _project() -> tuple[dict[str, set[str]], list[str]]:
    return analyse(ROOT)


def test_the_project_has_no_import_circle() -> None:
    edges, _ = _project()
    assert len(edges) > 100 and any(edges.values())  # the packages were found and read
    assert cycles(edges) == []


def test_no_module_takes_a_private_name_of_another() -> None:
    _, private = _project()
    assert private == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_finds_circles_through_function_level_and_relative_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "client/__init__.py": "",
            "client/a.py": "from client.b import f\n",
            "client/b.py": "def f():\n    from client import c\n",
            "client/c.py": "from . import a\n",
            "client/d.py": "import client.a\n",
            "server/__init__.py": "",
            "server/x.py": "import server.y as y\n",
            "server/y.py": "def g():\n    import server.x\n",
        },
    )
    edges, private = analyse(root)
    assert sorted(cycles(edges)) == [["client.a", "client.b", "client.c"], ["server.x", "server.y"]]
    assert private == []
    (root / "client/c.py").write_text("import numpy\n")
    (root / "server/y.py").write_text("import json\n")
    assert cycles(analyse(root)[0]) == []


def test_the_checker_finds_private_names_taken_from_another_module(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "strategies/__init__.py": "",
            "strategies/m.py": "_hidden = 1\n__version__ = 2\ndef _own():\n    return _hidden\n",
            "strategies/a.py": "from strategies.m import _hidden\n",
            "strategies/b.py": "import strategies.m as mm\nx = mm._own\n",
            "strategies/c.py": "def f():\n    from strategies import m\n    return m._hidden\n",
            "strategies/d.py": "import strategies.m\ny = strategies.m._hidden\n",
            "strategies/e.py": "from .m import _own\n",
            "strategies/ok.py": "from strategies.m import __version__\nimport json\nz = json._default_decoder\n",
        },
    )
    _, private = analyse(root)
    assert sorted(private) == [
        "strategies.a: from strategies.m import _hidden",
        "strategies.b: strategies.m._own",
        "strategies.c: strategies.m._hidden",
        "strategies.d: strategies.m._hidden",
        "strategies.e: from strategies.m import _own",
    ]


# What a run's processes import when they start (the ServerApp, the ClientApp, the round loop, the engines' Grids),
# and the libraries they load only when a step needs them: each costs start-up time in every process of a run (a
# deployment's ServerApp, a ClientApp fork, a Ray actor), e.g. ~0.5 s for scipy.stats.
START_MODULES = (
    "server.run.app",
    "server.run.cli",
    "server.deploy.server_app",
    "server.deploy.cli",
    "server.batched.engine",
    "client.app",
)
ON_DEMAND = ("scipy", "matplotlib", "pandas", "ray", "flwr_datasets", "datasets", "pyarrow")


def start_imports(root: Path, entries: Iterable[str], packages: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Third-party top-level package -> the project module that imports it at module level, over every project
    module that importing ``entries`` runs (module-level statements only: not function bodies, not
    ``if TYPE_CHECKING:`` blocks; a module's parent packages count as imported)."""
    mods = modules(root, packages)
    found: dict[str, str] = {}
    todo, seen = list(entries), set()
    while todo:
        module = todo.pop()
        if module in seen or module not in mods:
            continue
        seen.add(module)
        todo += [".".join(module.split(".")[:k]) for k in range(1, module.count(".") + 1)]
        path = mods[module]
        for node in _module_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _base(module, path, node)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                if name in mods:
                    todo.append(name)
                elif name and name.split(".")[0] not in {m.split(".")[0] for m in mods}:
                    found.setdefault(name.split(".")[0], module)
    return found


def _module_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements an import of a module runs: its body and the blocks of its ``if``/``try``/``with``/``class``
    statements, not functions and not ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _module_level(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _module_level(inner)
        for handler in getattr(node, "handlers", ()):
            yield from _module_level(handler.body)


def test_starting_a_run_loads_no_library_that_only_some_steps_use() -> None:
    found = start_imports(ROOT, START_MODULES)
    assert {"torch", "flwr", "numpy"} <= set(found)  # the walk reached the modules that import them
    assert {lib: module for lib, module in found.items() if lib in ON_DEMAND} == {}


def test_the_start_import_walk_follows_module_level_imports_only(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "server/__init__.py": "import yaml\n",
            "server/a.py": "from server import b\ntry:\n    import scipy.stats\n"
            "except ImportError:\n    import sklearn\n",
            "server/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas\n"
            "def f():\n    import matplotlib\nclass C:\n    import ray\n",
            "server/c.py": "import datasets\n",
        },
    )
    found = start_imports(root, ["server.a"])
    assert found == {
        "yaml": "server",
        "scipy": "server.a",
        "sklearn": "server.a",
        "typing": "server.b",
        "ray": "server.b",
    }

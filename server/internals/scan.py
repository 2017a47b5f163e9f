"""Which modules outside :mod:`server.internals` import a library's internals: an ``ast`` scan of their imports.

An import of a library of :data:`~server.internals.pins.LIBRARIES` is public when its module is one of
:data:`~server.internals.pins.PUBLIC_MODULES` (and the names taken from it do not start with ``_``), or when it
is one of the :data:`~server.internals.pins.PUBLIC_ALIASES`; anything else (``flwr.supercore``, ``ray._private``,
a pinned module, ...) is private. ``importlib.import_module("...")`` calls with a literal name count as imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

from server.internals.pins import LIBRARIES, PUBLIC_ALIASES, PUBLIC_MODULES

SKIPPED_DIRS = frozenset({".git", ".venv", "tests", "outputs", "multirun", "build", "dist", "__pycache__"})
INTERNALS_DIR = Path("server") / "internals"


def imports(tree: ast.AST) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names taken from it; () for ``import module``) of every absolute import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module, tuple(alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value, ()


def is_private(module: str, names: Iterable[str] = ()) -> bool:
    """Whether importing ``names`` (or the module itself) from library module ``module`` reaches internals;
    False for modules of other packages."""
    if module.split(".")[0] not in LIBRARIES:
        return False
    names = tuple(names)
    if module in PUBLIC_MODULES:
        return any(name.startswith("_") for name in names)
    return not names or any((module, name) not in PUBLIC_ALIASES for name in names)


def private_imports(source: str, filename: str = "<source>") -> list[str]:
    """``filename:line: module[.names]`` of every private library import in ``source``."""
    found = []
    for line, module, names in sorted(imports(ast.parse(source, filename))):
        if is_private(module, names):
            what = f"{module} ({', '.join(names)})" if names else module
            found.append(f"{filename}:{line}: {what}")
    return found


def project_files(root: Path) -> list[Path]:
    """The project's Python files outside tests/ and server/internals/ (and outside build and run folders)."""
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts[:-1]) or rel.is_relative_to(INTERNALS_DIR):
            continue
        if any(part.startswith(".") for part in rel.parts[:-1]):
            continue
        files.append(path)
    return files


def project_private_imports(root: Path) -> list[str]:
    """Every private library import of the project's files under ``root`` (see :func:`project_files`)."""
    found = []
    for path in project_files(root):
        found += private_imports(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return found

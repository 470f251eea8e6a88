"""What `pip install anatomy` gives holds what anatomy imports: every library the package's code
imports is one of its dependencies (or, for the dashboard and the figures it draws, of the
dashboard extra)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.conftest import PROJECT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib


def _libraries(files: Iterable[Path]) -> set[str]:
    """The top-level modules these files import (at module level or inside a function), other
    than the standard library and anatomy itself."""
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "anatomy"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def test_every_library_anatomy_imports_is_a_dependency_of_the_package():
    """A library that only requirements.txt names (peft was one) fails in the user's
    environment: LoRA printed a ModuleNotFoundError from an installed anatomy."""
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    with_extra = base | _names(project["optional-dependencies"]["dashboard"])
    distributions = importlib.metadata.packages_distributions()

    def undeclared(modules: set[str], declared: set[str]) -> set[str]:
        return {m for m in modules if not declared & {
            d.lower().replace("_", "-") for d in distributions.get(m, [m])}}

    files = list((PROJECT / "anatomy").rglob("*.py"))
    drawn = [f for f in files if {"dashboard", "views"} & set(f.relative_to(PROJECT).parts)]
    left = undeclared(_libraries(set(files) - set(drawn)), base)
    # A library that one command alone writes with comes with an extra of its own name, which
    # that command names when it is missing (`export --format tensorboard`).
    extras = project["optional-dependencies"]
    assert {m for m in left if not _names(extras.get(m, [])) & {m}} == set()
    for module in left:
        assert any(f'pip install "anatomy[{module}]"' in path.read_text() for path in files), module
    assert undeclared(_libraries(drawn), with_extra) == set()

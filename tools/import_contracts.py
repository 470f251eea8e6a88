"""An import-linter contract that import-linter lacks: "no module-level import of these packages".

import-linter's own contracts see every import, also those inside functions. The rule here is
narrower on purpose: outside the engine, torch and transformers may be imported lazily (inside
the function that needs them), never when a module is imported, so that the CLI, the pages and
the worker's baseline load without them. The module's own source is read with `ast`: an import
counts when it runs at import time (the module body, including its `if` / `try` / `with` blocks;
not `if TYPE_CHECKING:`, not function or class bodies).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def module_level_imports(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every import that runs when the module is imported."""
    found: list[tuple[int, str]] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, _NESTED):
                continue
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((node.lineno, node.module.split(".")[0]))
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)
            else:
                for name in ("body", "orelse", "finalbody", "handlers"):
                    block = getattr(node, name, None)
                    if isinstance(block, list):
                        visit([b for b in block if isinstance(b, ast.stmt)] if name != "handlers"
                              else [s for h in block for s in h.body])

    visit(ast.parse(source).body)
    return found


def _source_file(module: str) -> Path | None:
    """The module's source file, found without importing it (only its root package's location
    is looked up)."""
    root, *rest = module.split(".")
    spec = importlib.util.find_spec(root)
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(list(spec.submodule_search_locations)[0]).joinpath(*rest)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class ModuleLevelForbiddenContract(Contract):
    """Modules of `source_modules`, except those in `allowed_modules`, must not import any of
    `forbidden_modules` (top-level package names) at module level."""

    type_name = "module_level_forbidden"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.ModuleField(), required=False)
    forbidden_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        forbidden = set(self.forbidden_modules)
        allowed = [m.name for m in (self.allowed_modules or [])]
        breaks = []
        for source in self.source_modules:
            names = {source.name} | graph.find_descendants(source.name)
            for name in sorted(names):
                if any(name == a or name.startswith(a + ".") for a in allowed):
                    continue
                path = _source_file(name)
                if path is None:
                    continue
                for line, package in module_level_imports(path.read_text(encoding="utf-8")):
                    if package in forbidden:
                        breaks.append({"module": name, "line": line, "package": package})
        return ContractCheck(kept=not breaks, metadata={"breaks": breaks})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for item in check.metadata["breaks"]:
            output.print_error(f"{item['module']} imports {item['package']} at module level "
                               f"(line {item['line']}): import it inside the function that "
                               "needs it", bold=False)
            output.new_line()

"""docs/ARCHITECTURE.md's module map names every module of the package where it lives, and
nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY = re.compile(r"^( *)([\w.-]+(?:/|\.py|\.png))(?: |$)")


def mapped() -> list[str]:
    """The paths the map's block lists (a line's indent, two spaces a level, says its folder;
    a line without a file or folder name first continues the one above)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## Modules\n", 1)[1].split("```\n", 2)[1]
    paths: list[str] = []
    folders: list[str] = []
    for line in block.splitlines():
        found = ENTRY.match(line)
        if not found:
            continue
        depth, name = len(found.group(1)) // 2, found.group(2)
        assert len(found.group(1)) % 2 == 0 and depth <= len(folders), line
        del folders[depth:]
        paths.append("".join(folders) + name)
        if name.endswith("/"):
            folders.append(name)
    return paths


def test_the_module_map_is_the_tree():
    listed = mapped()
    assert len(listed) == len(set(listed)), "a path listed twice"
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "anatomy").rglob("*.py")}
    in_map = {p for p in listed if p.endswith(".py")}
    assert sorted(modules - in_map) == [], "modules missing from docs/ARCHITECTURE.md"
    assert sorted(in_map - modules) == [], "modules docs/ARCHITECTURE.md names that are gone"
    assert [p for p in listed if not (ROOT / p).exists()] == []

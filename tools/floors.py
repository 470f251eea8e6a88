"""The floors pyproject.toml declares, as pins: `python tools/floors.py transformers peft` prints
`transformers==5.20 peft==0.21.2`, the oldest versions the package allows, for `make floors`
(the unit tier on them). Each named library must have a `>=` floor there."""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floors(names: list[str]) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    declared = [*project["dependencies"],
                *(line for extra in project["optional-dependencies"].values() for line in extra)]
    lowest = {}
    for line in declared:
        requirement = Requirement(line)
        low = [s.version for s in requirement.specifier if s.operator == ">="]
        if low:
            lowest[requirement.name.lower()] = low[0]
    missing = [n for n in names if n.lower() not in lowest]
    if missing:
        raise SystemExit(f"no >= floor in pyproject.toml for {', '.join(missing)}")
    return [f"{name}=={lowest[name.lower()]}" for name in names]


if __name__ == "__main__":
    print(" ".join(floors(sys.argv[1:])))

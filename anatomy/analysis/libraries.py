"""The libraries anatomy trains and predicts with, against the versions the package declares.

pip keeps what a user's environment already holds where it satisfies the package's floors, so the
floors in pyproject.toml are the oldest versions the suite was run on (docs/RELIABILITY.md).
An environment that holds an older one anyway (installed with `--no-deps`, downgraded since) is
told in one line before a run or a prediction starts: the prediction mirrors the Trainer of the
transformers it declares, and older ones lack the modules it reads (a traceback otherwise).

The floors are read from the installed package's own metadata, the one place they are written;
a copy of the source tree that is not installed (PYTHONPATH) has none, and nothing is checked.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import NamedTuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

DISTRIBUTION = "anatomy"
DASHBOARD = "dashboard"  # the extra the dashboard's pages need


class Outdated(NamedTuple):
    """A library installed in a version the package's requirement does not allow."""

    name: str
    installed: str
    needed: str  # the requirement's specifier: ">=5.20"

    def __str__(self) -> str:
        return f"{self.name} {self.installed} ({DISTRIBUTION} needs {self.needed})"


@functools.cache
def too_old(extras: tuple[str, ...] = ()) -> tuple[Outdated, ...]:
    """Each library of the package's requirements, and of the `extras` asked for (the
    dashboard's), installed in a version the requirement does not allow; one not installed at
    all is pip's to tell, and left out. Read once a process (a dashboard asks on every rerun)."""
    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return ()
    found = []
    for line in declared:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if not requirement.specifier or (marker is not None and not any(
                marker.evaluate({"extra": extra}) for extra in extras)):
            continue  # no version asked, or an extra's not asked for
        try:
            installed = metadata.version(requirement.name)
            allowed = requirement.specifier.contains(Version(installed), prereleases=True)
        except (metadata.PackageNotFoundError, InvalidVersion):
            continue
        if not allowed:
            found.append(Outdated(requirement.name, installed, str(requirement.specifier)))
    return tuple(found)


def refusal(extras: tuple[str, ...] = ()) -> str | None:
    """One line naming every library too old (of the `extras` too) and the command that mends
    it; None where all are as declared."""
    old = too_old(extras)
    if not old:
        return None
    wanted = " ".join(f"'{library.name}{library.needed}'" for library in old)
    return f"this environment holds {', '.join(map(str, old))}: pip install --upgrade {wanted}"

"""What several commands print the same way: tables, refusals, and lines that outlive a closed
terminal."""

from __future__ import annotations

import sys

from anatomy.analysis.options import InvalidOptions


def say(*args, **kwargs) -> None:
    """Print, unless the terminal is gone (a hang-up): the run is recorded either way."""
    try:
        print(*args, **kwargs)
    except OSError:
        pass


def refused(error: InvalidOptions) -> int:
    """Each refused option on a line of its own; the exit status of a refusal."""
    for message in error.errors.values():
        print(f"error: {message}", file=sys.stderr)
    return 2


CELL_WIDTH = 48  # a long name or a model's path shortened in its middle; --json has it whole


def _cell(value: object) -> str:
    """A value on one line of a table: its line breaks as spaces, and at most CELL_WIDTH wide
    (one run named with 100,000 characters padded every row of `runs` to as many)."""
    text = "-" if value is None else " ".join(str(value).split("\n"))
    return text if len(text) <= CELL_WIDTH else f"{text[:30]}…{text[-(CELL_WIDTH - 31):]}"


def table(rows: list[list[str]], header: list[str]) -> str:
    """Columns aligned; a missing value ("None") shows as "-"."""
    rows = [[_cell(x) for x in row] for row in rows]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [header, *rows]]
    return "\n".join(lines)

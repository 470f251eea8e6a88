"""The store a command reads, and the one line when the run it names is not there."""

from __future__ import annotations

import sys

from anatomy.analysis.report import RunReport, report
from anatomy.store import RunRow, Store, StoreMissing, resolve_path


def reading(path: str | None) -> Store | None:
    """The store opened read-only (nothing written, whatever the file); None when there is none
    yet."""
    try:
        return Store(path, read_only=True)
    except StoreMissing:
        return None


def editing(path: str | None, run_id: int) -> Store | None:
    """The store opened to change a run of it; None, said in a line, where there is no store
    yet: a mistyped --store made its folders and an empty store only to say the run was not in
    it."""
    if reading(path) is None:
        print(f"error: run {run_id} is not in {resolve_path(path)} (no store there yet)",
              file=sys.stderr)
        return None
    return Store(path)


def run_or_error(store: Store, run_id: int) -> RunRow | None:
    run = store.run(run_id)
    if run is None:
        print(f"error: run {run_id} is not in {store.path}", file=sys.stderr)
    return run


def report_or_error(store: Store | None, run_id: int) -> RunReport | None:
    rep = None
    if store is not None:
        with store.snapshot():  # one moment's rows: a delete under way cuts none
            rep = report(store, run_id)
    if rep is None:
        where = store.path if store is not None else f"{resolve_path(None)} (no store there yet)"
        print(f"error: run {run_id} is not in {where}", file=sys.stderr)
    return rep

"""Moving runs between stores: a self-describing JSON file (with a schema version) and CSV samples."""

from __future__ import annotations

import csv
import io

from anatomy.store import Store, report

SCHEMA = "anatomy.runs"
SCHEMA_VERSION = 1
SAMPLE_COLUMNS = ("t", "gpu", "used", "reserved", "total", "util")


def export_runs(store: Store, run_ids: list[int]) -> dict:
    """Every recorded row of the runs, plus the report (what `show` prints) for the reader's sake."""
    runs = []
    for run_id in run_ids:
        run = store.run(run_id)
        if run is None:
            raise KeyError(f"run {run_id} is not in {store.path}")
        runs.append({
            "run": run,
            "report": report(store, run_id),
            "phases": store.phases(run_id),
            "samples": [[s[c] for c in SAMPLE_COLUMNS] for s in store.samples(run_id)],
            "steps": store.steps(run_id),
            "messages": store.messages(run_id),
        })
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "sample_columns": list(SAMPLE_COLUMNS),
            "runs": runs}


def samples_csv(store: Store, run_ids: list[int]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(("run_id", *SAMPLE_COLUMNS))
    for run_id in run_ids:
        if store.run(run_id) is None:
            raise KeyError(f"run {run_id} is not in {store.path}")
        for sample in store.samples(run_id):
            writer.writerow((run_id, *(sample[c] for c in SAMPLE_COLUMNS)))
    return out.getvalue()

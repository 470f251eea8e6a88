"""Sweeps with the real manager and worker: one through the CLI, and a sweep that holds its device
against a CLI run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

from anatomy.engine.manager import RunManager
from anatomy.engine.sweep import Sweep
from anatomy.store import Store
from tests.conftest import PROJECT, TINY, flags


def test_a_tiny_cpu_sweep_runs_to_the_end(tmp_path):
    """The real manager and worker: two tiny runs through `python -m anatomy sweep`."""
    store = tmp_path / "sweep.sqlite"
    result = subprocess.run(
        [sys.executable, "-m", "anatomy", "sweep", *flags(TINY), "--vary", "batch-size=2,4",
         "--json", "--store", str(store)],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert [(r["values"], r["status"]) for r in printed["runs"]] == [
        ({"batch_size": 2}, "completed"), ({"batch_size": 4}, "completed")]
    assert all(r["peak_mb"] > 0 and r["samples_per_second"] > 0 for r in printed["runs"])
    assert printed["largest_fitting"] == 4
    assert "[2/2] run" in result.stderr and "→ completed" in result.stderr  # progress lines
    runs = Store(store).runs()
    assert {r.sweep for r in runs} == {Store(store).sweep(printed["sweep"]).key}
    assert Store(store).sweep(printed["sweep"]).status == "completed"


def test_a_cpu_sweep_keeps_going_while_a_cli_run_is_refused_naming_the_sweep(store):
    manager = RunManager(store)
    base = replace(TINY, max_steps=3)
    sweep = Sweep(manager, base, {"batch_size": [1, 2]})
    sweep_id = sweep.start()
    try:
        refusals = []
        deadline = time.monotonic() + 120
        # Ask while the first run trains and again after it ended (between two runs, too).
        while sweep.is_alive() and len(refusals) < 3 and time.monotonic() < deadline:
            result = subprocess.run(
                [sys.executable, "-m", "anatomy", "run", *flags(TINY), "--store", str(store.path)],
                capture_output=True, text=True, timeout=120, cwd=PROJECT,
                env={**os.environ, "PYTHONPATH": str(PROJECT)})
            if sweep.is_alive():
                refusals.append(result)
        assert refusals, "the sweep ended before a run could be refused"
        for result in refusals:
            assert result.returncode == 2, result.stderr
            assert f"busy: sweep {sweep_id}" in result.stderr
    finally:
        status = sweep.wait(timeout=180)
    assert status == "completed"
    runs = store.find_runs(sweep=sweep.key)
    assert sorted(r.status for r in runs) == ["completed", "completed"]
    assert len(store.runs()) == 2  # the refused runs recorded nothing

"""A sweep with the real manager and worker, through the CLI: it runs to the end, and holds its
device against a CLI run meanwhile (one sweep for both: each of its runs starts a worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from anatomy.store import Store
from tests.conftest import PROJECT, TINY, flags
from tests.helpers import within


def test_a_tiny_cpu_sweep_runs_to_the_end_and_a_cli_run_meanwhile_is_refused_naming_it(tmp_path):
    """The real manager and worker: two tiny runs through `python -m anatomy sweep`; a CLI run
    asked while the sweep lives, as its first run trains and again after it ended (between two
    runs, too), is refused naming the sweep and records nothing."""
    store = tmp_path / "sweep.sqlite"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "anatomy", "sweep", *flags(TINY), "--vary", "batch-size=2,4",
         "--json", "--store", str(store)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Its first line is said as its first run starts: the sweep holds the device by then.
        said = sweep.stderr.readline()
        assert said.startswith("sweep "), said
        refusals = []

        def asked_enough() -> bool:
            """A CLI run asked again, while the sweep lives, until three were refused."""
            if sweep.poll() is not None or len(refusals) >= 3:
                return True
            result = subprocess.run(
                [sys.executable, "-m", "anatomy", "run", *flags(TINY), "--store", str(store)],
                capture_output=True, text=True, timeout=120, cwd=PROJECT,
                env={**os.environ, "PYTHONPATH": str(PROJECT)})
            if sweep.poll() is None:
                refusals.append(result)
            return False

        within(120, asked_enough, every=0)
        out, err = sweep.communicate(timeout=180)
        err = said + err
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode == 0, err
    printed = json.loads(out)
    assert [(r["values"], r["status"]) for r in printed["runs"]] == [
        ({"batch_size": 2}, "completed"), ({"batch_size": 4}, "completed")]
    assert all(r["peak_mb"] > 0 and r["samples_per_second"] > 0 for r in printed["runs"])
    assert printed["largest_fitting"] == 4
    assert "[2/2] run" in err and "→ completed" in err  # progress lines
    runs = Store(store).runs()
    assert {r.sweep for r in runs} == {Store(store).sweep(printed["sweep"]).key}
    assert Store(store).sweep(printed["sweep"]).status == "completed"
    assert refusals, "the sweep ended before a run could be refused"
    for result in refusals:
        assert result.returncode == 2, result.stderr
        assert f"busy: sweep {printed['sweep']}" in result.stderr
    assert len(runs) == 2  # the refused runs recorded nothing

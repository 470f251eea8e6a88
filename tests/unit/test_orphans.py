"""Runs and sweeps left running by a process that ended are closed when a manager starts."""

from __future__ import annotations

import socket
import time

from anatomy.analysis.options import RunOptions
from anatomy.engine.manager import RunManager
from anatomy.store import PhaseMark, Sample
from anatomy.store.liveness import ENDED_WITHOUT_A_WORD, Recorder


def test_runs_left_running_by_a_dead_process_become_failed(store):
    gone = Recorder(2**22 + 12345, time.time(), socket.gethostname())  # above Linux's pid_max
    orphan = store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {}, recorder=gone)
    store.write(orphan, samples=[Sample(0.5, 0, 10, None, None, None)],
                phases=[PhaseMark("start", "baseline", 0.1)])
    alive = store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {})  # this process's
    assert store.run(orphan, as_recorded=True).status == "running"
    RunManager(store)
    run = store.run(orphan, as_recorded=True)
    assert run.status == "failed" and run.error == ENDED_WITHOUT_A_WORD
    assert store.phases(orphan)[0].end_s == 0.5  # kept, and closed at its last sample
    assert store.run(alive).status == "running"


def test_a_sweep_whose_process_ended_is_over(store):
    sweep_id = store.create_sweep("s", RunOptions().to_dict(), {"batch_size": [1, 2]}, False, 2)
    ours = store.create_sweep("t", RunOptions().to_dict(), {"batch_size": [1, 2]}, False, 2)
    store.update_sweep(sweep_id, pid=2**22 + 12345)  # above Linux's pid_max: never a process
    RunManager(store)
    assert store.sweep(sweep_id).status == "failed"
    assert "ended before the sweep did" in store.sweep(sweep_id).error
    assert store.sweep(ours).status == "running"  # this process runs it

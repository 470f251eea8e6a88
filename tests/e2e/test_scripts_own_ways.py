"""A script that records itself keeps its own ways: anatomy.start() changes nothing of how its
exits are caught, and a child it forks (os.fork, a fork-context Pool) neither ends nor waits on
its parent's run. Each a real script on this CPU, recorded into a store of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from anatomy.analysis.report import report
from anatomy.store import Store
from tests.conftest import PROJECT

HANDLED_EXITS = """
import argparse, multiprocessing, sys
import anatomy

def leave(code):
    sys.exit(code)

if __name__ == "__main__":
    run = anatomy.start(name="handled exits", kernel=False)
    try:
        sys.exit(3)
    except SystemExit as exit_:
        print("caught sys.exit", exit_.code)
    try:
        argparse.ArgumentParser().parse_args(["--no-such-flag"])
    except SystemExit as exit_:
        print("caught argparse", exit_.code)
    worker = multiprocessing.get_context("fork").Process(target=leave, args=(2,))
    worker.start()
    worker.join()
    print("worker exit code", worker.exitcode)
    run.phase("training")
    run.step(loss=1.0)
"""

FORKS = """
import multiprocessing, os, sys, time
import anatomy

def square(x):
    return x * x

if __name__ == "__main__":
    run = anatomy.start(name="forks", kernel=False)
    run.phase("training")
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a normal exit: atexit runs in the child
    os.waitpid(child, 0)
    pool = multiprocessing.get_context("fork").Pool(2)
    print("squares", pool.map(square, range(4)))
    started = time.monotonic()
    pool.terminate()  # SIGTERM to each worker
    pool.join()
    print(f"terminated in {time.monotonic() - started:.1f} s")
    for step in range(1, 6):
        time.sleep(0.1)
        run.step(loss=1.0 / step)
"""


def _script(tmp_path, source: str, timeout: float = 120) -> subprocess.CompletedProcess:
    (tmp_path / "script.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "ANATOMY_STORE": str(tmp_path / "s.sqlite"),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_recorded_script_catches_its_exits_as_without_anatomy(tmp_path):
    """anatomy.start() once put its own SystemExit class in builtins: `except SystemExit` in the
    script let sys.exit(3) through (the script ended there), and a forked worker's sys.exit(2)
    became a traceback and exit code 1."""
    result = _script(tmp_path, HANDLED_EXITS)
    assert result.returncode == 0, result.stderr
    assert "caught sys.exit 3" in result.stdout and "caught argparse 2" in result.stdout
    assert "worker exit code 2" in result.stdout and "Traceback" not in result.stderr
    rep = report(Store(tmp_path / "s.sqlite", read_only=True), 1)
    assert rep.status == "completed", rep.error
    assert rep.steps == 1


def test_a_forked_child_neither_ends_nor_waits_on_its_parents_run(tmp_path):
    """A child's exit once ran the run's atexit ending in the child (waiting forever on a
    collector thread it did not have) and SIGTERMed the parent's sampler; a Pool's terminate
    waited 10 s per worker on the stop the workers' inherited handler made."""
    result = _script(tmp_path, FORKS)
    assert result.returncode == 0, result.stderr
    assert "squares [0, 1, 4, 9]" in result.stdout and "Traceback" not in result.stderr
    terminated = float(result.stdout.split("terminated in ")[1].split()[0])
    assert terminated < 5  # the stop's own wait is 10 s: no worker waited it
    rep = report(Store(tmp_path / "s.sqlite", read_only=True), 1)
    assert rep.status == "completed", rep.error
    assert rep.steps == 5 and rep.samples == rep.samples_sent > 0


FORKED_SIGNALS = """
import os, signal
import anatomy

if __name__ == "__main__":
    # As the script was given them (under `nohup`, SIGHUP ignored): what a child must have again.
    given = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]
    run = anatomy.start(name="forked signals", kernel=False)
    print("parent", signal.getsignal(signal.SIGTERM) is given[0], flush=True)
    child = os.fork()
    if child == 0:
        print("child", [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == given,
              flush=True)
        os._exit(0)
    os.waitpid(child, 0)
    run.end()
"""


def test_a_forked_child_is_ended_by_sigterm_as_without_anatomy(tmp_path):
    """The run's stop handler came across a fork into Pool workers, where it has nothing to
    stop; being Python's, a SIGTERM landing just before a worker blocked on its queue's lock was
    held there, and Pool.terminate() waited forever (about 1 run in 20 of the test above). In a
    forked child the stop signals are again as the script was given them (the default's, or
    SIGHUP ignored under `nohup`); the parent keeps its handler."""
    result = _script(tmp_path, FORKED_SIGNALS)
    assert result.returncode == 0, result.stderr
    assert "parent False" in result.stdout and "child True" in result.stdout


TRAINS_TWICE = """
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
import anatomy

config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, vocab_size=100, max_position_embeddings=32)
examples = [{"input_ids": torch.randint(5, 99, (16,)), "labels": i % 2} for i in range(12)]
arguments = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=2,
                              logging_steps=1, report_to="none", save_strategy="no",
                              disable_tqdm=True, use_cpu=True)
trainer = Trainer(model=BertForSequenceClassification(config), args=arguments,
                  train_dataset=examples, callbacks=[anatomy.AnatomyCallback()])
trainer.train()
trainer.train()  # again, as hyperparameter_search or a resume does
"""


def test_a_trainer_that_trains_twice_records_each_training(tmp_path):
    """The callback ended its run at the first on_train_end; the second train() was reported
    to that ended run, and went unrecorded without a word."""
    result = _script(tmp_path, TRAINS_TWICE)
    assert result.returncode == 0, result.stderr
    store = Store(tmp_path / "s.sqlite", read_only=True)
    reports = [report(store, run.id) for run in reversed(store.runs())]
    assert [(r.status, r.steps) for r in reports] == [("completed", 2), ("completed", 2)]
    assert all([p.name for p in r.phases] == ["weights", "training"] for r in reports)
    assert all(r.ran_with.batch_size == 4 for r in reports)


SPAWNS = """
import multiprocessing
import anatomy

run = anatomy.start(name="spawned pool", kernel=False)  # at the top, as the README says


def square(x):
    return x * x


if __name__ == "__main__":
    run.phase("training")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        print("squares", pool.map(square, range(4)))
    run.step(loss=1.0)
"""


def test_a_spawned_worker_running_the_scripts_top_again_records_nothing(tmp_path):
    """Spawn runs the script's top again in each worker (as __mp_main__): its anatomy.start()
    started a sampler while the worker was still bootstrapping, the worker died of it, the Pool
    started another — 1,000 failed runs in two minutes, and the script never ended."""
    result = _script(tmp_path, SPAWNS, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "squares [0, 1, 4, 9]" in result.stdout and "Traceback" not in result.stderr
    store = Store(tmp_path / "s.sqlite", read_only=True)
    assert len(store.runs()) == 1
    rep = report(store, 1)
    assert rep.status == "completed", rep.error
    assert rep.steps == 1


OWN_STORE = """
import anatomy

run = anatomy.start(name="own store", store="mine.sqlite", kernel=False)
run.phase("training")
run.step(loss=1.0)
"""


def test_the_command_a_script_suggests_shows_its_run_whatever_the_store(tmp_path):
    """A script that named its own store (`start(store="mine.sqlite")`, or $ANATOMY_STORE set
    for it alone) was told "`anatomy show 2`": from the user's shell that read the shell's
    store, whose run 2 is another run, or "run 2 is not in …". The suggestion names the store."""
    import re
    import shlex

    for _ in range(2):
        result = _script(tmp_path, OWN_STORE)
        assert result.returncode == 0, result.stderr
    suggested = shlex.split(re.search(r"\(`(anatomy show [^`]+)`", result.stderr).group(1))
    assert suggested[:3] == ["anatomy", "show", "2"]
    (tmp_path / "shell").mkdir()
    shown = subprocess.run([sys.executable, "-m", *suggested], cwd=tmp_path / "shell",
                           env={**os.environ, "ANATOMY_STORE": str(tmp_path / "shells.sqlite"),
                                "PYTHONPATH": str(PROJECT)},
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "run 2  status: completed" in shown.stdout and "steps: 1" in shown.stdout


TRAINS_IN_A_THREAD = """
import threading
import anatomy

def train():
    run = anatomy.start(name="in a thread", kernel=False)
    run.phase("training")
    run.step(loss=1.0)
    raise RuntimeError("the training thread failed")

worker = threading.Thread(target=train)
worker.start()
worker.join()
print("main thread done")
"""


def test_a_run_started_in_a_thread_that_dies_of_an_error_fails_with_it(tmp_path):
    """The thread's error reaches threading.excepthook, not sys.excepthook, and the process
    exits 0: the run was recorded `completed` though its training died."""
    result = _script(tmp_path, TRAINS_IN_A_THREAD)
    assert result.returncode == 0 and "main thread done" in result.stdout, result.stderr
    assert "RuntimeError: the training thread failed" in result.stderr  # its traceback, as ever
    store = Store(tmp_path / "s.sqlite", read_only=True)
    [run] = store.runs()
    rep = report(store, run.id)
    assert (rep.status, rep.error, rep.steps) == (
        "failed", "RuntimeError: the training thread failed", 1)


TRIALS_IN_A_POOL = """
import multiprocessing
import anatomy

def trial(lr):
    run = anatomy.start(name=f"trial {lr}", kernel=False)
    run.phase("training")
    run.step(loss=lr)
    run.end()
    return lr

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print("trials", pool.map(trial, [0.1, 0.2]))
"""


def test_a_run_started_in_a_pools_worker_records_the_trial(tmp_path):
    """A hyperparameter search whose trials each call anatomy.start() in a Pool's worker: the
    worker is daemonic, and multiprocessing refused it anatomy's sampler ("AssertionError:
    daemonic processes are not allowed to have children"): every trial failed, and so did the
    script, leaving failed runs behind."""
    result = _script(tmp_path, TRIALS_IN_A_POOL)
    assert result.returncode == 0, result.stderr
    assert "trials [0.1, 0.2]" in result.stdout
    store = Store(tmp_path / "s.sqlite", read_only=True)
    reports = [report(store, run.id) for run in store.runs()]
    assert sorted((r.name, r.status, r.steps) for r in reports) == [
        ("trial 0.1", "completed", 1), ("trial 0.2", "completed", 1)]


# A user's script: it trains on, step by step, until its recording has stopped (its own loop,
# as a user's training is, not the tests' helper).
LOSES_ITS_STORE = """
import os, time
import anatomy

run = anatomy.start(name="loses its store", kernel=False)
run.phase("training")
for name in ("s.sqlite", "s.sqlite-wal", "s.sqlite-shm"):
    if os.path.exists(name):
        os.remove(name)
deadline = time.monotonic() + 60
while not run.link.recording.done.is_set() and time.monotonic() < deadline:
    run.step(loss=1.0)  # the training goes on; the recording notices the store is gone
    time.sleep(0.01)
before = run.link.recording.events.qsize()
for _ in range(20_000):
    run.step(loss=1.0)
print("held", run.link.recording.events.qsize() - before, "more")
"""


def test_marks_after_the_recording_stopped_are_not_held_in_the_training(tmp_path):
    """The store deleted mid-run: the recording stops and the training goes on unrecorded, but
    every later step was still put on the recording's queue, which nothing drained any more:
    80 MB of the training's memory for 300,000 steps, growing to its end."""
    result = _script(tmp_path, LOSES_ITS_STORE)
    assert result.returncode == 0, result.stderr
    assert "the training went on unrecorded" in result.stderr
    assert "held 0 more" in result.stdout, result.stdout


INTERRUPTED_AS_IT_STARTS = """
import sys
import anatomy
from anatomy.engine import recording

# Ctrl-C landing while anatomy.start() starts its sampler (the first ~0.2 s of a script), at
# the seam named on the command line: a KeyboardInterrupt there, as the terminal's would be.
seam = getattr(recording.Recording, sys.argv[1])

def interrupted(self, *args):
    seam(self, *args)
    raise KeyboardInterrupt

setattr(recording.Recording, sys.argv[1], interrupted)
anatomy.start(name="interrupted", kernel=False)
"""


@pytest.mark.parametrize("seam", ["start_sampler", "follow"])
def test_ctrl_c_while_the_run_starts_stops_it(tmp_path, seam):
    """Ctrl-C in the first fifth of a second of a script (anatomy.start() waiting for its
    sampler): the run was left running, then read "failed: ended without a word (its processes
    are gone)" instead of stopped by Ctrl-C."""
    (tmp_path / "script.py").write_text(INTERRUPTED_AS_IT_STARTS)
    env = {**os.environ, "ANATOMY_STORE": str(tmp_path / "s.sqlite"), "PYTHONPATH": str(PROJECT)}
    result = subprocess.run([sys.executable, "script.py", seam], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGINT, result.stderr
    store = Store(tmp_path / "s.sqlite", read_only=True)
    [run] = store.runs()
    rep = report(store, run.id)
    assert (rep.status, rep.error) == ("stopped", "stopped by Ctrl-C (SIGINT)")
    assert rep.status == store.run(run.id).status  # written, not only read so by a reader


CHILDREN_THAT_RECORD = """
import multiprocessing, sys
import anatomy

def trial(how):
    run = anatomy.start(name=how, kernel=False)  # never ended by the trial itself
    run.phase("training")
    run.step(loss=1.0)
    if how == "raises":
        raise RuntimeError("the trial failed")
    if how == "exits 3":
        sys.exit(3)

if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    for how in ("completes", "raises", "exits 3"):
        child = context.Process(target=trial, args=(how,))
        child.start()
        child.join()
        print(how, child.exitcode)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_child_that_records_itself_ends_its_run_as_its_target_ends(tmp_path,
                                                                                    method):
    """A Process whose target calls anatomy.start() and leaves its run open: forked, it left by
    os._exit (no atexit), and its target's error reached no hook: each run read "failed: ended
    without a word (its processes are gone)", the one that completed too."""
    (tmp_path / "script.py").write_text(CHILDREN_THAT_RECORD)
    env = {**os.environ, "ANATOMY_STORE": str(tmp_path / "s.sqlite"), "PYTHONPATH": str(PROJECT)}
    result = subprocess.run([sys.executable, "script.py", method], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "completes 0" in result.stdout and "raises 1" in result.stdout \
        and "exits 3 3" in result.stdout, result.stdout
    store = Store(tmp_path / "s.sqlite", read_only=True)
    ended = {run.name: (run.status, run.error) for run in store.runs()}
    assert ended == {
        "completes": ("completed", None),
        "raises": ("failed", "RuntimeError: the trial failed"),
        "exits 3": ("failed", "the script exited with code 3 (sys.exit)")}

"""A script that records itself keeps its own ways: anatomy.start() changes nothing of how its
exits are caught, and a child it forks (os.fork, a fork-context Pool) neither ends nor waits on
its parent's run. Each a real script on this CPU, recorded into a store of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from anatomy.analysis import transfer
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
                  train_dataset=examples, callbacks=[anatomy.AnatomyCallback(predict=False)])
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


def test_a_script_in_a_folder_whose_name_is_not_utf8_is_recorded_and_so_is_its_watch(tmp_path):
    """A script named with a Latin-1 byte (`caf\\xe9.py`, files from an old archive) in such a
    folder, given such an argument: `anatomy.start()` ended the script in anatomy's traceback
    ("RunSource.script: holds the byte 0xe9, which is not UTF-8 text"), and `anatomy watch`
    run in that folder likewise (its command's own arguments are refused in a line where they are
    not UTF-8). Each now records, the name shown with the byte escaped."""
    folder = tmp_path / os.fsdecode(b"d\xe9")
    folder.mkdir()
    script = folder / os.fsdecode(b"caf\xe9.py")
    script.write_text("import anatomy\n"
                      "run = anatomy.start(kernel=False)\n"
                      "run.phase('training')\n"
                      "run.step(loss=1.0)\n")
    (folder / "train.py").write_text(script.read_text())  # the watch's command is UTF-8
    store = Store(tmp_path / "s.sqlite")
    env = {**os.environ, "ANATOMY_STORE": str(store.path),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
    for command in ([sys.executable, script.name, os.fsdecode(b"--data=x\xe9")],
                    [sys.executable, "-m", "anatomy", "watch", "--", sys.executable, "train.py"]):
        result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    runs = sorted(store.runs(), key=lambda run: run.id)
    assert [run.status for run in runs] == ["completed", "completed"]
    by_script, by_watch = (report(store, run.id) for run in runs)
    assert by_script.source.script.endswith("d\\xe9/caf\\xe9.py")
    assert by_script.source.argv[1:] == ("--data=x\\xe9",)
    assert by_watch.source.cwd.endswith("d\\xe9")
    assert [step.step for step in store.steps(by_watch.id)] == [1]


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


ALTERNATING = """
import sys, time
import anatomy

held = []
for round in range(int(sys.argv[1])):  # under watch, anatomy.start() again after run.end()
    run = anatomy.start(name="alternating", kernel=False)
    for k in range(3):
        run.phase("training")
        for step in range(2):
            held.append(b"x" * (8 * 2**20))  # each training holds 16 MB more
            time.sleep(0.1)
            run.step(loss=1.0)
        run.phase("eval")
        time.sleep(0.2)
    run.end()
"""


@pytest.mark.parametrize("front, rounds", [("script", 1), ("watch", 2)])
def test_a_phase_named_again_keeps_each_occurrence_and_its_run_imports(tmp_path, front, rounds):
    """A loop alternating run.phase("training") and run.phase("eval"): every training ended
    where the last one did, all at the same memory; under watch, start() again after end()
    stored steps 1, 2, … twice; and the run's export was refused by every import ("the
    training phase appears twice")."""
    (tmp_path / "script.py").write_text(ALTERNATING)
    command = [sys.executable, "script.py", str(rounds)]
    if front == "watch":
        command = [sys.executable, "-m", "anatomy", "watch", "--", *command]
    env = {**os.environ, "ANATOMY_STORE": str(tmp_path / "s.sqlite"), "PYTHONPATH": str(PROJECT)}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    store = Store(tmp_path / "s.sqlite", read_only=True)
    [run] = store.runs()
    rep = report(store, run.id)
    assert rep.status == "completed", rep.error
    trainings = [p for p in rep.phases if p.name == "training"]
    assert len(trainings) == 3 * rounds
    assert all(p.done and p.start_s < p.end_s for p in rep.phases)
    assert all(a.end_s <= b.start_s for a, b in zip(trainings, trainings[1:]))
    memory = [p.memory_bytes for p in trainings[:3]]
    assert memory == sorted(memory) and memory[2] - memory[0] >= 24 * 2**20, memory
    assert rep.training == trainings[0]  # a reader naming the phase reads its first
    assert [s.step for s in store.steps(run.id)] == list(range(1, 6 * rounds + 1))
    target = Store(tmp_path / "imported.sqlite")
    (imported,) = transfer.import_runs(target, json.dumps(transfer.export_runs(store, [run.id])))
    assert report(target, imported).phases == rep.phases


TRAINERS = """
import sys, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
import anatomy

if "start" in sys.argv:
    anatomy.start(name="trainers", kernel=False)
config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, vocab_size=100, max_position_embeddings=32)
examples = [{"input_ids": torch.randint(5, 99, (16,)), "labels": i % 2} for i in range(12)]
arguments = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=2,
                              logging_steps=1, report_to="none", save_strategy="no",
                              disable_tqdm=True, use_cpu=True)

def trainer():
    return Trainer(model=BertForSequenceClassification(config), args=arguments,
                   train_dataset=examples, callbacks=[anatomy.AnatomyCallback(predict=False)])

first, second = trainer(), trainer()
first.train()
if "start" in sys.argv:
    first.train()  # again, as a resume or hyperparameter_search does
second.train()
"""


@pytest.mark.parametrize("started", [True, False], ids=["anatomy.start()", "callbacks alone"])
def test_several_trainers_and_trainings_in_one_script_are_each_recorded(tmp_path, started):
    """Two Trainers in one script, one trained twice: in the script's run (anatomy.start())
    each training ended at the last one's end and their steps 1, 2 were stored three times;
    with the callbacks alone, the second Trainer (whose callback joined the first one's run)
    trained unrecorded after the first had ended that run."""
    result = _script(tmp_path, TRAINERS.replace('"start" in sys.argv', str(started)),
                     timeout=300)
    assert result.returncode == 0, result.stderr
    store = Store(tmp_path / "s.sqlite", read_only=True)
    reports = [report(store, run.id) for run in reversed(store.runs())]
    assert all(r.status == "completed" for r in reports), [r.error for r in reports]
    if started:
        [rep] = reports
        assert [p.name for p in rep.phases] == ["baseline", "weights", "weights", "training",
                                                "training", "training"]
        assert all(p.done for p in rep.phases)
        assert [(s.step, s.total) for s in store.steps(rep.id)] == [
            (1, 2), (2, 2), (3, 4), (4, 4), (5, 6), (6, 6)]
    else:
        assert [([p.name for p in r.phases], r.steps) for r in reports] == [
            (["weights", "weights", "training"], 2), (["weights", "training"], 2)]


FORKED_RECORDERS = """
import os, sys
import anatomy

if __name__ == "__main__":
    run = anatomy.start(name="parent", kernel=False)
    run.phase("training")
    children = []
    for i in range(12):
        run.step(loss=1.0)  # the parent's collector writes as it forks
        pid = os.fork()
        if pid == 0:
            child = anatomy.start(name=f"child {i}", kernel=False)
            child.phase("training")
            child.step(loss=1.0)
            child.end()
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    run.end()
"""


def test_children_forked_while_the_parent_records_each_record_a_run_of_their_own(tmp_path):
    """A child forked while its parent's collector was writing inherited SQLite's memory of the
    parent's locks: 2 of 12 children's anatomy.start() waited 30 s on a lock nobody held and
    recorded nothing ("another process holds it locked"), and children writing at once
    corrupted the store ("database disk image is malformed"). A fork waits for the process's
    store connections to close."""
    result = _script(tmp_path, FORKED_RECORDERS, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "not recording" not in result.stderr and "could not be written" not in result.stderr
    store = Store(tmp_path / "s.sqlite", read_only=True)
    runs = {run.name: run for run in store.runs()}
    assert sorted(runs) == sorted(["parent", *(f"child {i}" for i in range(12))])
    assert {run.status for run in runs.values()} == {"completed"}
    assert all(store.step_count(run.id) == 1 for name, run in runs.items() if name != "parent")
    assert store.step_count(runs["parent"].id) == 12


TRIALS_LEFT_OPEN = """
import multiprocessing, sys, time
import anatomy

def trial(name):
    run = anatomy.start(name=name, kernel=False)  # never ended by the trial
    run.phase("training")
    run.step(loss=1.0)
    time.sleep(0.3)
    if name == "fails":
        raise RuntimeError("the trial failed")
    return name

if __name__ == "__main__":
    with multiprocessing.get_context(sys.argv[1]).Pool(2) as pool:
        print("trials", pool.map(trial, ["a", "b", "c"], chunksize=1), flush=True)
        try:
            pool.apply(trial, ("fails",))
        except RuntimeError as error:
            print("caught", error, flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pool_trials_that_leave_their_runs_open_each_complete_a_run_of_their_own(tmp_path,
                                                                                   method):
    """A Pool's worker runs trial after trial: the third trial's anatomy.start() returned the
    first trial's run, still open (c recorded inside a), and Pool.terminate()'s SIGTERM stopped
    the runs of trials that had returned, or left them running ("failed: ended without a
    word"). A task's run ends as its task returns, completed or failed with its error; the
    idle worker is ended by SIGTERM as without anatomy (a Python handler that the SIGTERM
    reached as the worker blocked on its next task's lock never ran: the script hung)."""
    (tmp_path / "script.py").write_text(TRIALS_LEFT_OPEN)
    env = {**os.environ, "ANATOMY_STORE": str(tmp_path / "s.sqlite"), "PYTHONPATH": str(PROJECT)}
    result = subprocess.run([sys.executable, "script.py", method], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "trials ['a', 'b', 'c']" in result.stdout and "caught the trial failed" in result.stdout
    assert "Traceback" not in result.stderr and "leaked" not in result.stderr, result.stderr
    store = Store(tmp_path / "s.sqlite", read_only=True)
    ended = sorted((run.name, run.status, run.error, store.step_count(run.id))
                   for run in store.runs())
    assert ended == [("a", "completed", None, 1), ("b", "completed", None, 1),
                     ("c", "completed", None, 1),
                     ("fails", "failed", "RuntimeError: the trial failed", 1)]
    for run in store.runs():
        [training] = [p for p in store.phases(run.id) if p.name == "training"]
        assert training.end_s >= store.last_step(run.id).t + 0.3  # as the trial returned


THREADS_MASKS = """
import os, time
import psutil
import anatomy

run = anatomy.start(name="threads", kernel=False)
run.phase("training")
run.step(loss=1.0)
time.sleep(0.5)  # the collector has begun
for task in sorted(os.listdir(f"/proc/{os.getpid()}/task")):
    status = dict(line.split(":\\t", 1) for line in
                  open(f"/proc/{os.getpid()}/task/{task}/status").read().splitlines() if ":\\t" in line)
    print("thread", task == str(os.getpid()), int(status["SigBlk"], 16), flush=True)
# This script's own children (psutil: a scan of /proc met other tests' processes as they ended).
for child in psutil.Process().children():
    status = open(f"/proc/{child.pid}/status").read()
    blocked = next(line for line in status.splitlines() if line.startswith("SigBlk"))
    print("child", open(f"/proc/{child.pid}/comm").read().strip(), int(blocked.split()[1], 16),
          open(f"/proc/{child.pid}/oom_score_adj").read().strip())
print("score", open("/proc/self/oom_score_adj").read().strip())
run.end()
"""


def test_a_scripts_own_threads_leave_stop_signals_to_its_main_thread(tmp_path):
    """The kernel gives a process's SIGTERM to any of its threads that does not block it; taken
    by anatomy's collector or launcher thread, the Python handler waited for a main thread that
    sat in a lock's wait (a Pool's worker between tasks): the worker never ended, nor did the
    script. anatomy's threads block SIGINT, SIGTERM and SIGHUP; the main thread and anatomy's
    sampler (started by the launcher) take them."""
    result = _script(tmp_path, THREADS_MASKS)
    assert result.returncode == 0, result.stderr
    stops = (1 << (signal.SIGHUP - 1)) | (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    threads = [line.split() for line in result.stdout.splitlines() if line.startswith("thread")]
    assert [int(mask) & stops for _, main, mask in threads if main == "True"] == [0]
    others = [int(mask) & stops for _, main, mask in threads if main == "False"]
    assert others and all(mask == stops for mask in others), result.stdout
    children = {name: rest for _, name, *rest in (line.split() for line in
                                                  result.stdout.splitlines()
                                                  if line.startswith("child"))}
    assert int(children["anatomy-sampler"][0]) & stops == 0, result.stdout
    # The script trains: out of memory, its sampler is not to be ended before it.
    script_score = next(line.split()[1] for line in result.stdout.splitlines()
                        if line.startswith("score"))
    assert children["anatomy-sampler"][1] == script_score, result.stdout

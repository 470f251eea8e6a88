"""Faults a long run meets, each done for real on this CPU: the death of any of its processes
(kill -9, SIGTERM, SIGHUP, Ctrl-C to the process group) in the phase where it matters, a full
disk, a server restart with a run in flight, a store on read-only media, `runs | head`. (Stores
that cannot be used, in this process: tests/unit/test_store_faults.py.) Each asserts what
was stored, that nothing the sampler sent was lost where it lived (`samples == samples_sent`),
and that no process of the run is left (psutil over its tree).

docs/RELIABILITY.md lists them, one row each.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from anatomy import cli
from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import report
from anatomy.engine.devices import machine
from anatomy.engine.lifeline import EXPENDABLE_SCORE, Lifeline, launch
from anatomy.engine.manager import DeviceLock, RunManager, device_key
from anatomy.store import RunRow, Store, StoreMissing
from anatomy.store.liveness import ENDED_WITHOUT_A_WORD
from tests.conftest import PROJECT, TINY, flags, seed_run
from tests.e2e.conftest import (
    HANG_SECONDS,
    Terminal,
    checkpoint,
    fill,
    kill_all,
    left,
    name_of,
    stopped,
    trainer_folders,
)
from tests.helpers import one_line, wait_until, within

# A run long enough to be interrupted: it never ends on its own within a test.
ENDLESS = tuple(flags(replace(TINY, max_steps=100_000)))
PHASE_SECONDS = 180  # a tiny run reaches training within this, however loaded the machine


# --- helpers ---

def _named(processes: list[psutil.Process], name: str) -> psutil.Process:
    (found,) = [p for p in processes if name_of(p) == name]
    return found


def _training(store_path: Path, run_id: int = 1, steps: int = 2) -> RunRow:
    """Wait until the run trains and has taken `steps` steps; its row."""
    def trained() -> RunRow | None:
        try:
            store = Store(store_path, read_only=True)
            if store.run(run_id) and store.step_count(run_id) >= steps:
                return store.run(run_id)
        except StoreMissing:
            pass
        return None

    return wait_until(trained, PHASE_SECONDS, f"run {run_id}'s step {steps} of training",
                      every=0.1)


def _in_session(process: psutil.Process, leader: int) -> bool:
    """Whether `process` is of the session a CliRun leads (its processes keep it, even adopted
    by init), not of another run that another test or suite starts on the machine meanwhile."""
    try:
        return os.getsid(process.pid) == leader
    except OSError:  # ended meanwhile
        return False


class CliRun:
    """`python -m anatomy run` as a terminal starts it: a job with a process group of its own."""

    def __init__(self, store_path: Path, *options: str):
        self.store_path = store_path
        self.temporary = store_path.with_suffix(".tmp")  # its own: what it leaves there is seen
        self.temporary.mkdir()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "anatomy", "run", *(options or ENDLESS), "--store",
             str(store_path)], cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True, env={**os.environ, "TMPDIR": str(self.temporary)})
        self.out = self.err = ""
        self.seen: list[psutil.Process] = []  # every process of it seen, for the cleanup

    @property
    def pid(self) -> int:
        return self.process.pid

    def tree(self) -> list[psutil.Process]:
        try:
            tree = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []
        self.seen += tree
        return tree

    def training(self) -> list[psutil.Process]:
        """Wait until it trains; its processes then (sampler, worker, resource tracker)."""
        _training(self.store_path)
        return self.tree()

    def finish(self, timeout: float = 60) -> int:
        """Its exit status, once it has ended (its output: `out`, `err`). A process it left
        behind would hold its output open: the wait ends at `timeout` all the same."""
        self.process.wait(timeout)
        try:
            self.out, self.err = self.process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            raise AssertionError("the CLI ended, but a process it started still holds its"
                                 " output open") from None
        return self.process.returncode

    def kill(self) -> None:
        """The CLI and every process of it ever seen (by pid: only what this test started)."""
        self.tree()
        self.process.kill()
        kill_all(self.seen)
        try:
            self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def cli_run(tmp_path):
    """Start CliRuns; whatever a failed test leaves is killed."""
    runs: list[CliRun] = []

    def start(*options: str) -> CliRun:
        run = CliRun(tmp_path / f"runs{len(runs)}.sqlite", *options)
        runs.append(run)
        return run

    yield start
    for run in runs:  # a failed test leaves nothing behind either
        run.kill()


def _oom_score(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def _stored(store_path: Path, run_id: int = 1):
    return report(Store(store_path, read_only=True), run_id)


# --- the CLI's processes ---

def test_kill_9_of_the_cli_ends_its_processes_frees_the_device_and_the_next_start_closes_it(cli_run):
    """`kill -9 $!`: no orphan trains or samples on, nothing is left in the temporary directory
    (the Trainer's output folder: its sampler removes it), the device is free at once, and the
    next manager to start closes the run as failed with what it recorded."""
    run = cli_run()
    tree = run.training()
    assert {"anatomy-worker", "anatomy-sampler"} <= {name_of(p) for p in tree}
    assert len(trainer_folders(run.temporary)) == 1
    # Out of memory, the kernel ends the worker, then the sampler, before the CLI that records
    # them: theirs raised, the CLI's what it was given.
    scores = {name_of(p): _oom_score(p.pid) for p in tree}
    assert scores["anatomy-worker"] == scores["anatomy-sampler"] == EXPENDABLE_SCORE
    assert _oom_score(run.pid) == _oom_score(os.getpid()) < EXPENDABLE_SCORE
    run.process.send_signal(signal.SIGKILL)
    run.finish()
    assert "leaked semaphore" not in run.err  # the names its processes opened are unlinked
    assert left(tree) == []
    assert trainer_folders(run.temporary) == []
    lock = DeviceLock(device_key(RunOptions(preset="tiny"), machine()))  # the run's device
    assert lock.acquire("test"), lock.holder()
    lock.release()
    # `runs` and `show` at once see it ended, and write nothing: the store's bytes stay.
    files = sorted(p for p in run.store_path.parent.glob(run.store_path.name + "*")
                   if not p.name.endswith("-shm"))
    before = [p.read_bytes() for p in files]
    listed, shown = (subprocess.run([sys.executable, "-m", "anatomy", *command, "--store",
                                     str(run.store_path)], cwd=PROJECT, capture_output=True,
                                    text=True, timeout=120) for command in (["runs"], ["show", "1"]))
    assert " failed " in listed.stdout.splitlines()[1] and "running" not in listed.stdout
    assert "ended without a word" in shown.stdout
    assert [p.read_bytes() for p in files] == before
    store = Store(run.store_path)
    assert store.run(1, as_recorded=True).status == "running"  # nobody was left to write it
    assert store.run(1).status == "failed"  # but every reader sees it ended
    assert RunManager(store).close_orphans() == [] and store.run(1, as_recorded=True).status == "failed"
    rep = report(store, 1)
    assert rep.error == ENDED_WITHOUT_A_WORD
    assert rep.samples > 0 and rep.steps >= 2  # what it recorded is kept
    weights, training = rep.phase("weights"), rep.training
    assert training.done and training.memory_bytes > weights.memory_bytes  # never 0 MB


def test_kill_9_of_the_cli_while_it_starts_its_processes_leaves_none(cli_run):
    """The race the parent-death signal has: the parent dies before its child asked for it."""
    run = cli_run()

    def with_its_sampler() -> list[psutil.Process]:
        tree = run.tree()
        return tree if any(name_of(p) == "anatomy-sampler" for p in tree) else []

    # asked without a pause: the kill is to come while the worker may still be launching
    seen = wait_until(with_its_sampler, PHASE_SECONDS, "the CLI's sampler to start", every=0,
                      process=run.process)
    started = psutil.Process(run.pid).create_time()
    run.process.send_signal(signal.SIGKILL)
    run.finish()
    time.sleep(0.5)  # a child being launched when the CLI died has named itself by now
    adopted = [p for p in psutil.process_iter(["name", "create_time"])
               if p.info["name"] in ("anatomy-worker", "anatomy-sampler")
               and p.info["create_time"] >= started and _in_session(p, run.pid)]
    assert left([*seen, *adopted]) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_to_the_cli_is_a_stop(cli_run, sig):
    """A scheduler's SIGTERM, a closed terminal's SIGHUP: the run is stopped and recorded as such,
    with every sample, and the CLI says so with 128 + the signal's number."""
    run = cli_run()
    tree = run.training()
    run.process.send_signal(sig)
    assert run.finish() == 128 + sig
    assert left(tree) == []
    rep = _stored(run.store_path)
    assert rep.status == "stopped" and sig.name in rep.error
    assert rep.samples == rep.samples_sent > 0
    assert rep.training.memory_bytes > rep.phase("weights").memory_bytes
    # Its Trainer never returned to report its figures: they are its steps' (the Runs table's
    # Time and Samples/s were blank for a stopped run)
    trained, last = rep.summary, Store(run.store_path, read_only=True).last_step(1)
    assert trained.trained.steps == last.step >= 2
    took = last.t - rep.training.start_s  # the time stored is this to the millisecond
    assert trained.time_s == pytest.approx(took, abs=1e-3)
    assert trained.samples_per_second == pytest.approx(last.step * 4 / took, abs=1e-3)
    assert f"Time: {trained.time_s:.2f} s ({last.step} steps, until stopped)" in run.out
    assert "Traceback" not in run.err
    assert "leaked semaphore" not in run.err  # the worker's progress bars hold no named lock


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_is_a_clean_stop(cli_run, sig):
    """A terminal's Ctrl-C signals the whole foreground group, as a scheduler's SIGTERM to the
    job may: the CLI turns it into a Stop, the worker (a group of its own) is stopped by it, and
    the sampler finishes to send its count."""
    run = cli_run()
    tree = run.training()
    os.killpg(run.pid, sig)
    assert run.finish() == 128 + sig
    assert left(tree) == []
    rep = _stored(run.store_path)
    assert rep.status == "stopped"
    assert ("Ctrl-C" if sig == signal.SIGINT else "SIGTERM") in rep.error
    assert rep.samples == rep.samples_sent > 0
    assert "Traceback" not in run.err and "KeyboardInterrupt" not in run.err
    assert f"stopping ({sig.name})" in run.err


def test_ctrl_z_at_a_terminal_pauses_the_training_with_the_cli_and_fg_continues_it(tmp_path):
    """The worker leads a process group of its own (Ctrl-C reaches the CLI alone, which makes it a
    Stop), so a terminal's Ctrl-Z stopped the CLI and its sampler and left the training going on,
    unseen, while the job was stopped. Now the training pauses with the job, `fg` continues both,
    and Ctrl-C then stops the run as ever."""
    store_path = tmp_path / "runs.sqlite"
    command = " ".join([sys.executable, "-m", "anatomy", "run", *ENDLESS, "--store",
                        str(store_path)])
    terminal = Terminal(PROJECT)
    tree: list[psutil.Process] = []
    try:
        terminal.type(command + "\n")
        row = _training(store_path)
        worker = psutil.Process(row.worker_pid)
        front = worker.parent()  # `anatomy run`, which spawned it
        tree = [front, *front.children(recursive=True)]
        terminal.type("\x1a")  # Ctrl-Z
        wait_until(lambda: stopped(worker), 30, "the worker to stop with the job")
        spent = worker.cpu_times()
        time.sleep(1.0)
        assert stopped(worker) and worker.cpu_times() == spent  # not one instruction more
        assert b"Stopped" in terminal.output
        terminal.type("fg\n")
        wait_until(lambda: not stopped(worker), 30, "the worker to go on with the job")
        steps = Store(store_path, read_only=True).step_count(1)
        _training(store_path, steps=steps + 2)  # it trains again, and it is recorded
        terminal.type("\x03")  # Ctrl-C
        wait_until(lambda: Store(store_path, read_only=True).run(1).status != "running", 60,
                   "the run to end", seen=lambda: terminal.output.decode(errors="replace"))
        rep = _stored(store_path)
        assert rep.status == "stopped" and "Ctrl-C" in rep.error, rep.error
        assert left(tree) == []
    finally:
        terminal.close()
        kill_all(tree)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_killed_worker_fails_the_run_and_its_last_phase_keeps_real_memory(cli_run, sig):
    """The worker killed mid-step: failed, saying how, with every sample; the training phase
    reads the worker's last real memory, not the 0 MB of its zombie."""
    run = cli_run()
    tree = run.training()
    _named(tree, "anatomy-worker").send_signal(sig)
    assert run.finish() == 1
    assert left(tree) == []
    rep = _stored(run.store_path)
    assert rep.training.done
    assert rep.training.memory_bytes > rep.phase("weights").memory_bytes  # not its zombie's 0
    assert not re.search(r"(?<![\d,])0 MiB", run.out)  # a zero, not the end of "530 MB"
    assert rep.status == "failed" and f"killed by {sig.name}" in rep.error
    assert rep.samples == rep.samples_sent > 0


@pytest.fixture
def memory_cgroup():
    """A memory cgroup of 1.2 GB (a container's limit, as docker's --memory sets it): the
    folder whose cgroup.procs takes a process. Skipped where none can be made (not root, no
    memory controller)."""
    name = f"anatomy-test-{os.getpid()}-{time.monotonic_ns()}"
    for root, limit in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
                        ("/sys/fs/cgroup", "memory.max")):
        folder = Path(root) / name
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            (folder / limit).write_text(str(1200 * 2**20))
        except OSError:
            folder.rmdir()
            continue
        break
    else:
        pytest.skip("no memory cgroup can be made here")
    yield folder

    def removed() -> bool:  # emptied once its processes are gone
        try:
            folder.rmdir()
            return True
        except OSError:
            return False

    if not within(10, removed, every=0.2):
        folder.rmdir()  # raises, saying why


def members(cgroup: Path) -> list[psutil.Process]:
    """The processes in a cgroup now: those that end after its run may still be ending."""
    found = []
    for pid in (cgroup / "cgroup.procs").read_text().split():
        try:
            found.append(psutil.Process(int(pid)))
        except psutil.Error:
            pass
    return found


def test_a_run_out_of_ram_is_out_of_memory_not_a_crash(memory_cgroup, tmp_path):
    """Out of RAM, the kernel's out-of-memory killer ends a CPU run's worker with SIGKILL and
    no word: the run was "failed: killed by SIGKILL (killed or crashed)", and a sweep to the
    edge failed there instead of stopping at it. The kernel's count of such kills tells it."""
    store_path = tmp_path / "runs.sqlite"
    command = [sys.executable, "-m", "anatomy", "run", "--model", "tiny", "--batch-size", "128",
               "--seq-len", "512", "--max-steps", "1", "--store", str(store_path)]
    shell = 'echo $$ > "$0" && exec "$@"'  # the whole run in the cgroup, from its first process
    done = subprocess.run(["sh", "-c", shell, str(memory_cgroup / "cgroup.procs"), *command],
                          cwd=PROJECT, capture_output=True, text=True, timeout=PHASE_SECONDS)
    assert done.returncode == 1, done.stderr
    rep = _stored(store_path)
    assert rep.status == "oom", rep.error
    assert rep.error.startswith("the kernel's out-of-memory killer ended it") and \
        "killed by SIGKILL" in rep.error
    # The kernel may kill again before the worker's memory is given back (3 ms later, seen on
    # a loaded machine): then it ends the sampler, whose count is lost, never the CLI.
    if _oom_kills(memory_cgroup) == 1:
        assert rep.samples == rep.samples_sent > 0
    else:
        assert rep.samples > 0 and rep.samples_sent is None
    assert left(members(memory_cgroup)) == []  # nothing left in it


IN_CGROUP = 'echo $$ > "$0" && exec "$@"'  # sh -c IN_CGROUP PROCS COMMAND…: all of it in there

# Fills the memory of its cgroup until the kernel's out-of-memory killer ends it, and is the one
# it ends (the largest score); with $CGROUP, it moves itself into that cgroup first.
HOG = """
import os, time
if os.environ.get("CGROUP"):
    with open(os.path.join(os.environ["CGROUP"], "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
    time.sleep(0.5)  # as a training takes a while to fill its memory
with open("/proc/self/oom_score_adj", "w") as score:
    score.write("1000")
held = []
while True:
    held.append(b"x" * (32 * 2**20))
    time.sleep(0.01)
"""


def _oom_kills(cgroup: Path) -> int:
    from anatomy.engine import cgroups

    counter = cgroup / ("memory.oom_control" if "memory" in cgroup.parts else "memory.events")
    return cgroups.field(counter, "oom_kill")


def test_a_users_kill_9_is_no_oom_though_another_process_of_its_cgroup_ran_out(memory_cgroup,
                                                                               tmp_path):
    """A user's `kill -9` of the worker was `oom` when any process of the same memory cgroup had
    been killed for memory since the run began: the count was read once, at the start, for the
    whole cgroup. It is read for the worker, while it lives."""
    store_path = tmp_path / "runs.sqlite"
    procs = str(memory_cgroup / "cgroup.procs")
    cli = subprocess.Popen(["sh", "-c", IN_CGROUP, procs, sys.executable, "-m", "anatomy", "run",
                            *ENDLESS, "--store", str(store_path)], cwd=PROJECT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        _training(store_path)
        steps = Store(store_path, read_only=True).step_count(1)
        before = _oom_kills(memory_cgroup)
        hog = subprocess.run(["sh", "-c", IN_CGROUP, procs, sys.executable, "-c", HOG],
                             capture_output=True, timeout=PHASE_SECONDS)
        assert hog.returncode == -signal.SIGKILL and _oom_kills(memory_cgroup) > before
        # The run went on after it, its worker read again: steps counted from the hog's end (the
        # worker trained on while the hog grew, and three steps counted from before it had all
        # been taken when it died: the worker was killed before the next reading, CI3's red run).
        after = Store(store_path, read_only=True).step_count(1)
        _training(store_path, steps=max(steps, after) + 3)
        (worker,) = [p for p in psutil.Process(cli.pid).children(recursive=True)
                     if name_of(p) == "anatomy-worker"]
        worker.kill()
        _, err = cli.communicate(timeout=HANG_SECONDS)
    finally:
        cli.kill()
    rep = _stored(store_path)
    assert rep.status == "failed" and "killed by SIGKILL" in rep.error, rep.error
    assert "out-of-memory" not in rep.error and "\nfailed: " in err, err
    assert left(members(memory_cgroup)) == []


def test_a_rank_killed_for_memory_is_out_of_memory_and_the_sweep_stops_there(memory_cgroup,
                                                                            tmp_path):
    """Under `--processes 2` a rank the kernel killed for memory failed the run ("rank 1 was
    killed by SIGKILL (killed or crashed)"), and `sweep --until-oom` climbed on past it, each size
    failing, to "≥ 4096, no run ran out of memory". Each rank's kill is judged in its cgroup."""
    store_path = tmp_path / "runs.sqlite"
    command = [sys.executable, "-m", "anatomy", "sweep", "--model", "tiny", "--seq-len", "512",
               "--max-steps", "1", "--processes", "2", "--vary", "batch-size=128",
               "--until-oom", "--store", str(store_path)]
    done = subprocess.run(["sh", "-c", IN_CGROUP, str(memory_cgroup / "cgroup.procs"), *command],
                          cwd=PROJECT, capture_output=True, text=True, timeout=3 * PHASE_SECONDS)
    assert "largest batch size that fit: none" in done.stdout, done.stdout + done.stderr
    rep = _stored(store_path)
    assert rep.status == "oom", rep.error
    assert re.fullmatch(r"the kernel's out-of-memory killer ended rank [01], the machine's RAM "
                        r"\(or its memory cgroup's limit: a container's, cgexec's\) being full; "
                        r"the launcher ended the other ranks", rep.error), rep.error
    assert len(Store(store_path, read_only=True).runs()) == 1  # it stopped there
    assert left(members(memory_cgroup)) == []


def _watch(store_path: Path, *command: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anatomy", "watch", "--store", str(store_path),
                           "--", *command], cwd=PROJECT, capture_output=True, text=True,
                          timeout=PHASE_SECONDS, env={**os.environ, **env})


def test_a_watched_command_in_another_memory_cgroup_killed_for_memory_is_oom(memory_cgroup,
                                                                            tmp_path):
    """A command that sits in a memory cgroup of its own (cgexec, `systemd-run --scope`, a
    container's limit), killed there for memory: `failed`, "the command was killed by SIGKILL"
    (the count was read in the watch's own cgroup). It is read where the command lives."""
    store_path = tmp_path / "runs.sqlite"
    done = _watch(store_path, sys.executable, "-c", HOG, env={"CGROUP": str(memory_cgroup)})
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    rep = _stored(store_path)
    assert rep.status == "oom", rep.error
    assert rep.error.startswith("the kernel's out-of-memory killer ended it") and \
        rep.error.endswith("the command was killed by SIGKILL"), rep.error
    assert "oom: the kernel's out-of-memory killer ended it" in done.stderr


# As torchrun launches ranks: when one ends, the others get SIGTERM; it fails if any failed.
LAUNCHER = """
import os, signal, subprocess, sys, time
children = [subprocess.Popen([sys.executable, "-c", sys.argv[1]],
                             env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                  "WORLD_SIZE": "2"}) for r in range(2)]
while all(child.poll() is None for child in children):
    time.sleep(0.5)
for child in children:
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
sys.exit(0 if all(child.wait() == 0 for child in children) else 1)
"""

# Two ranks that record themselves: rank 1 fills the memory cgroup (HOG), and rank 0, its peer
# gone, fails as gloo's collective says it.
RANKS = """
import os, time
import anatomy

run = anatomy.start(kernel=False)
run.phase("training")
told = os.environ["PEER"]
if os.environ["RANK"] == "1":
    run.step(0.5)
    with open(told, "w") as peer:
        peer.write(str(os.getpid()))
    exec(os.environ["HOG"])
while not os.path.exists(told):
    run.step(0.5)
    time.sleep(0.05)
with open(told) as peer:
    stat = f"/proc/{peer.read()}/stat"
while True:
    run.step(0.5)
    time.sleep(0.05)
    try:
        with open(stat) as state:
            gone = state.read().rsplit(") ", 1)[1][0] in "ZX"
    except FileNotFoundError:
        gone = True
    if gone:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                           "[127.0.0.1]:29500: Connection reset by peer")
"""


def test_under_watch_a_rank_killed_for_memory_is_the_cause_not_its_peers_error(memory_cgroup,
                                                                              tmp_path):
    """`watch -- torchrun …` whose rank 1 the kernel killed for memory (in a memory cgroup of its
    own): the run's error was rank 0's "rank 0: RuntimeError: … Connection reset by peer",
    `failed`. It is `oom`, naming rank 1."""
    store_path = tmp_path / "runs.sqlite"
    done = _watch(store_path, sys.executable, "-c", LAUNCHER, RANKS,
                  env={"CGROUP": str(memory_cgroup), "HOG": HOG, "PEER": str(tmp_path / "peer"),
                       "PYTHONPATH": os.pathsep.join(filter(None, (
                           str(PROJECT), os.environ.get("PYTHONPATH"))))})
    assert done.returncode == 1, done.stderr
    rep = _stored(store_path)
    assert rep.status == "oom", rep.error
    rank_1 = (tmp_path / "peer").read_text()
    assert rep.error.startswith(
        f"the kernel's out-of-memory killer ended rank 1 (pid {rank_1}), the machine's RAM (or its"
        " memory cgroup's limit: a container's, cgexec's) being full; the command ended with exit"
        " code 1"), rep.error


def test_a_prediction_in_a_container_is_for_its_memory_limit_and_the_size_it_gives_runs(
        memory_cgroup, tmp_path):
    """In a container of 1.2 GB on a machine of more, a CPU prediction's capacity is the
    container's limit (psutil tells the machine's RAM) less the process's measured share; it
    said "not even batch size 1 is predicted to fit" (2 GiB were kept for the process) where
    tiny at 32 × 256 tokens ran in 900 MiB. The largest size it predicts runs there."""
    procs = str(memory_cgroup / "cgroup.procs")
    command = [sys.executable, "-m", "anatomy", "predict", "--model", "tiny", "--seq-len", "256",
               "--max-batch-size"]
    done = subprocess.run(["sh", "-c", IN_CGROUP, procs, *command], cwd=PROJECT,
                          capture_output=True, text=True, timeout=PHASE_SECONDS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "this machine's RAM (1.2 GiB)" in done.stdout
    size = re.search(r"largest batch size predicted to fit [^:]*: (\d+)", done.stdout)
    assert size and int(size[1]) >= 32, done.stdout
    store_path = tmp_path / "runs.sqlite"
    ran = subprocess.run(["sh", "-c", IN_CGROUP, procs, sys.executable, "-m", "anatomy", "run",
                          "--model", "tiny", "--seq-len", "256", "--batch-size", size[1],
                          "--max-steps", "2", "--store", str(store_path)], cwd=PROJECT,
                         capture_output=True, text=True, timeout=3 * PHASE_SECONDS)
    assert ran.returncode == 0, ran.stderr
    assert _stored(store_path).status == "completed"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_dead_sampler_ends_the_run_as_failed_not_completed_with_a_hole(cli_run, sig):
    run = cli_run()
    tree = run.training()
    _named(tree, "anatomy-sampler").send_signal(sig)
    assert run.finish() == 1
    assert left(tree) == []
    rep = _stored(run.store_path)
    assert rep.status == "failed"
    assert "the memory sampler" in rep.error and "while training went on" in rep.error
    assert ("was killed by SIGKILL" if sig == signal.SIGKILL else "stopped (SIGTERM)") in rep.error
    if sig == signal.SIGTERM:  # it lived to send its count: nothing it sent was lost
        assert rep.samples == rep.samples_sent > 0
    assert "the memory sampler" in run.err


# --- a server restart with a run in flight ---

SERVER = """
import sys, threading, time
from anatomy.analysis.options import RunOptions
from anatomy.engine.manager import RunManager
from anatomy.store import Store

manager = RunManager(Store(sys.argv[1]))
# Started from a thread that ends at once, as a dashboard page's script thread does.
starter = threading.Thread(target=manager.start, args=(RunOptions(
    preset="tiny", seq_len=16, dataset_size=64, max_steps=100000),))
starter.start()
starter.join()
print("started", flush=True)
time.sleep(3600)
"""


def test_a_server_killed_with_a_run_in_flight_leaves_no_process_and_its_restart_closes_the_run(
        tmp_path):
    store_path = tmp_path / "server.sqlite"
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SERVER), str(store_path)],
                              cwd=PROJECT, stdout=subprocess.PIPE, text=True)
    tree: list[psutil.Process] = []
    try:
        _training(store_path, steps=3)  # it trains on after the thread that started it ended
        tree = psutil.Process(server.pid).children(recursive=True)
        server.kill()
        server.wait(30)
        assert left(tree) == []
    finally:
        server.kill()
        kill_all(tree)
    store = Store(store_path)
    manager = RunManager(store)  # the restarted server's manager
    assert store.run(1).status == "failed"
    rep = report(store, 1)
    assert rep.samples > 0 and rep.training.done and rep.training.memory_bytes > 0
    assert not manager.is_active(1)



# --- the device lock outlives a dead manager as long as a process of the run lives ---

def _hold(lifeline: Lifeline, ready, seconds: float) -> None:
    lifeline.attach()
    ready.set()
    time.sleep(seconds)


def test_the_device_lock_is_held_by_the_runs_processes_until_the_last_one_ends():
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    lock = DeviceLock("test-shared")
    assert lock.acquire("a test")
    ready = context.Event()
    child = context.Process(target=_hold, args=(Lifeline("anatomy-test", lock.fileno()), ready,
                                                60))
    launch(child)
    try:
        assert ready.wait(60)
        lock.release()  # the manager is gone; its child holds the device on
        assert not DeviceLock("test-shared").acquire("another run")
    finally:
        child.kill()
        child.join(10)
    other = DeviceLock("test-shared")
    assert other.acquire("another run")
    other.release()


# --- a full disk ---

def test_a_full_disk_mid_run_stops_the_run_and_records_why(small_disk):
    """A real ENOSPC: the store's file system fills while the run trains. The room the run held
    in reserve beside the store is what its ending is written into."""
    run = CliRun(small_disk / "runs.sqlite")
    try:
        tree = run.training()
        assert (small_disk / "runs.sqlite-reserve-1").stat().st_size == 256 * 1024
        checkpoint(run.store_path)
        filler = fill(small_disk)
        assert run.finish(timeout=120) == 1
        assert left(tree) == []
        assert "could not be written (the disk is full" in run.err and "Traceback" not in run.err
        rep = _stored(run.store_path)
        assert rep.status == "failed" and "the disk is full" in rep.error
        assert "the run was stopped at" in rep.error
        assert rep.samples > 0 and rep.training.done
        assert rep.training.memory_bytes > rep.phase("weights").memory_bytes
        # While it is full, a later run is refused in one line (no traceback from close_orphans).
        more = fill(small_disk, "more")
        later = subprocess.run([sys.executable, "-m", "anatomy", "run", "--max-steps", "1",
                                "--store", str(run.store_path)], cwd=PROJECT, capture_output=True,
                               text=True, timeout=120)
        assert later.returncode == 1 and later.stderr.count("\n") == 1, later.stderr
        assert later.stderr.startswith(f"error: the store {run.store_path}: the disk is full")
        filler.unlink()
        more.unlink()
        assert RunManager(Store(run.store_path)).close_orphans() == []  # room again: all is well
        assert not [p for p in small_disk.iterdir() if "reserve" in p.name]  # given back
    finally:
        run.kill()


class SizeLimitedStore(Store):
    """SQLite's own size limit (`PRAGMA max_page_count`) on every connection: a genuine
    SQLITE_FULL where no small file system can be mounted."""

    pages: int | None = None

    @contextmanager
    def connect(self):
        with super().connect() as db:
            if SizeLimitedStore.pages is not None:
                db.execute(f"PRAGMA max_page_count = {SizeLimitedStore.pages}")
            yield db


def test_a_store_that_fills_mid_run_stops_the_run_and_records_why(tmp_path, monkeypatch, capsys):
    """The same through SQLite's size limit, the CLI in this process: the reason is recorded."""
    store_path = tmp_path / "limited.sqlite"
    monkeypatch.setattr(cli.run, "Store", SizeLimitedStore)
    monkeypatch.setattr(SizeLimitedStore, "pages", None)

    tree: list[psutil.Process] = []

    def fill():
        _training(store_path)
        tree.extend(p for p in psutil.Process().children(recursive=True)
                    if name_of(p) in ("anatomy-worker", "anatomy-sampler"))
        with sqlite3.connect(store_path) as db:
            SizeLimitedStore.pages = db.execute("PRAGMA page_count").fetchone()[0]

    threading.Thread(target=fill, daemon=True).start()
    try:
        code = cli.main(["run", *ENDLESS, "--store", str(store_path)])
        err = capsys.readouterr().err
        assert len(tree) == 2
        assert code == 1
        assert "could not be written (the disk is full" in err
        assert left(tree) == []
    finally:
        kill_all(tree)
    SizeLimitedStore.pages = None
    rep = report(Store(store_path), 1)
    assert rep.status == "failed" and "the disk is full" in rep.error
    assert "the run was stopped at" in rep.error
    assert rep.samples > 0 and rep.training.done and rep.training.memory_bytes > 0


# --- stores that cannot be used ---


@pytest.fixture
def read_only_media(tmp_path):
    """A directory nothing can write (a read-only tmpfs as root; permissions otherwise)."""
    folder = tmp_path / "media"
    folder.mkdir()
    if os.geteuid() != 0:
        yield folder, lambda: folder.chmod(0o555)
        folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)],
                      capture_output=True).returncode:
        pytest.skip("root without mount: no read-only media to make")

    def freeze():
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)

    yield folder, freeze
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_store_on_read_only_media_lists_shows_and_exports_but_refuses_writes(read_only_media,
                                                                               capsys):
    folder, freeze = read_only_media
    path = folder / "runs.sqlite"
    run_id = seed_run(Store(path))
    freeze()
    assert sorted(p.name for p in folder.iterdir()) == ["runs.sqlite"]  # no -wal, no -shm
    code, out, _ = _main(capsys, "runs", "--store", str(path))
    assert code == 0 and "completed" in out
    code, out, _ = _main(capsys, "show", str(run_id), "--store", str(path))
    assert code == 0 and "peak: 4,096 MiB" in out
    code, out, _ = _main(capsys, "export", str(run_id), "--format", "csv", "--store", str(path))
    assert code == 0 and out.startswith("run_id,t,gpu")
    code, _, err = _main(capsys, "tag", str(run_id), "x", "--store", str(path))
    assert code == 2 and "cannot be" in one_line(err)


def test_a_store_there_on_read_only_media_is_called_read_only_not_unmade(read_only_media,
                                                                         capsys):
    """`anatomy tag 1 x` (and the dashboard) of a store on read-only media said "it cannot be
    made: Read-only file system", of a store that was there: opening it touched it."""
    folder, freeze = read_only_media
    path = folder / "runs.sqlite"
    run_id = seed_run(Store(path))
    freeze()
    code, _, err = _main(capsys, "tag", str(run_id), "x", "--store", str(path))
    assert code == 2 and one_line(err).startswith(
        f"error: the store {path}: it cannot be written: the file or its directory is read-only")



# --- one-line errors ---


def test_runs_piped_to_head_ends_quietly(store):
    for _ in range(200):  # more than a pipe holds (64 KiB), so the writer meets the closed end
        store.create_run(RunOptions().to_dict(), "cpu-rss", "rss", 0, {})
    result = subprocess.run(f"{sys.executable} -m anatomy runs --json --store {store.path}"
                            " | head -2", shell=True, cwd=PROJECT, capture_output=True, text=True,
                            timeout=120)
    assert len(result.stdout.splitlines()) == 2
    assert result.stderr == ""  # no BrokenPipeError, no "Exception ignored"


CLOSED_EARLY = [["--help"], ["--version"], ["runs", "--help"], ["runs"], ["show", "1"],
                ["export", "1", "--format", "csv"], ["predict", "--model", "tiny"],
                ["run", "--model", "tiny", "--max-steps", "2"],
                ["sweep", "--model", "tiny", "--max-steps", "1", "--vary", "batch_size=1,2"]]


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("command", CLOSED_EARLY, ids=" ".join)
def test_every_command_whose_reader_left_ends_141_and_says_nothing(store, command, buffered):
    """(before, as a user's shell runs it, stdout buffered: "Exception ignored … BrokenPipeError"
    and status 120 from every command, --help's too; with PYTHONUNBUFFERED, --help 0, `run` 1,
    `runs` 141, and `sweep` left its run's worker to print a traceback.) A reader that left
    before the first line: the worst case of `| head -1`."""
    seed_run(store, backend="cpu-rss")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update({"ANATOMY_STORE": str(store.path)},
               **({} if buffered else {"PYTHONUNBUFFERED": "1"}))
    reading, writing = os.pipe()
    os.close(reading)
    try:
        result = subprocess.run([sys.executable, "-m", "anatomy", *command], stdout=writing,
                                stderr=subprocess.PIPE, text=True, cwd=PROJECT, env=env,
                                timeout=180)
    finally:
        os.close(writing)
    assert (result.returncode, result.stderr) == (141, "")
    if command[0] in ("run", "sweep"):  # its run never goes on unattended
        newest = store.runs()[0]
        assert newest.id > 1 and newest.status == "stopped", newest
        assert command[0] == "sweep" or "its output was closed" in newest.error, newest.error


def _main(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err

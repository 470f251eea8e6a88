"""The faults of the fronts users meet with their own scripts, each done for real on this CPU:
`anatomy watch -- COMMAND`, a phase-API script (`anatomy.start()`) and a Trainer script with the
callback — killed with -9, SIGTERM, SIGHUP or Ctrl-C (the front, the sampler, the user's process,
its children), a command slow to stop, a full disk, a store that goes away, and the exits a
script makes. Every front drives the one recording (engine/recording.py), so each fault is
handled once and checked here once per front.

Each starts the front as a terminal would (a process group of its own, from another directory
than the project) and asserts what was stored, the exit status, that nothing the sampler sent was
lost where it lived (`samples == samples_sent`), that no traceback reached the terminal, and that
no process of the run is left (psutil over every process of its tree ever seen).

docs/RELIABILITY.md lists them, one row each.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from anatomy.analysis.report import report
from anatomy.store import Store, StoreMissing
from anatomy.store.liveness import ENDED_WITHOUT_A_WORD
from tests.conftest import PROJECT
from tests.e2e.conftest import HANG_SECONDS, checkpoint, fill, left, name_of, trainer_example
from tests.helpers import wait_until

EXAMPLES = PROJECT / "examples"
START_SECONDS = 240  # a front starts recording within this, however loaded the machine

# A user's command that marks nothing (watch's front): it holds some memory and prints progress
# with `\r`, as tqdm does. `--child`: it starts a child of its own. `--slow-stop`: it needs 600 s
# to stop after SIGTERM or Ctrl-C (far past HANG_SECONDS: ended by watch, or not at all).
# (`--shell` runs it under `sh -c`: the shell is the command.)
BUSY = """
import signal, subprocess, sys, time
if "--child" in sys.argv:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if "--slow-stop" in sys.argv:
    def slow(signum, frame):
        time.sleep(600)
        sys.exit(1)
    signal.signal(signal.SIGTERM, slow)
    signal.signal(signal.SIGINT, slow)
held = bytearray(30 * 2**20)
print("ready", flush=True)
tick = 0
while True:
    tick += 1
    print(f"tick {tick}", end="\\r", flush=True)
    time.sleep(0.05)
"""

# A phase-API script without torch (quick to start): a baseline, weights, then training steps
# until it is stopped; the first argument says how it ends after 3 steps, if it does.
# A terminal's shell leaves SIGHUP and SIGTERM to their defaults too: under `nohup make test`
# the suite's processes ignore SIGHUP, and a script that ignores it (the phase API keeps what the
# script was given) would not be stopped by it.
AS_FROM_A_TERMINAL = ("import os, signal, sys; [signal.signal(s, signal.SIG_DFL) for s in "
                      "(signal.SIGINT, signal.SIGHUP, signal.SIGTERM)]; "
                      "os.execvp(sys.argv[1], sys.argv[1:])")

LIGHT = """
import subprocess, sys, time
import anatomy
how = sys.argv[1] if len(sys.argv) > 1 else "never"
run = anatomy.start(name="light", kernel=False)
held = bytearray(20 * 2**20)
run.phase("weights")
run.phase("training")
step = 0
while True:
    step += 1
    run.step(loss=1.0 / step, batch_size=4)
    time.sleep(0.05)
    if step == 3:
        if how == "exit1":
            sys.exit(1)
        if how == "fatal":
            raise SystemExit("fatal")
        if how == "exit0":
            sys.exit(0)
        if how == "child":  # the user's own child, which the test kills
            subprocess.run([sys.executable, "-c", "import time; time.sleep(600)"], check=True)
"""


# --- helpers ---

def _users(process: psutil.Process) -> bool:
    """A process the user's code started (not anatomy's sampler, not multiprocessing's)."""
    try:
        return not process.name().startswith("anatomy-") and not any(
            "multiprocessing" in word for word in process.cmdline())
    except psutil.Error:
        return False


class Front:
    """A front as a user starts it from a terminal: its own process group, in a directory of its
    own; the store in $ANATOMY_STORE."""

    def __init__(self, kind: str, directory: Path, *args: str, store_path: Path | None = None,
                 predict: bool = True):
        self.kind = kind
        self.store_path = store_path or directory / "runs.sqlite"
        (directory / "busy.py").write_text(textwrap.dedent(BUSY))
        (directory / "light.py").write_text(textwrap.dedent(LIGHT))
        python = sys.executable
        argv = {
            "watch": [python, "-m", "anatomy", "watch", "--",
                      *(["sh", "-c", f"{python} busy.py; exit $?"] if "--shell" in args
                        else [python, "busy.py", *args])],
            "script": [python, "light.py", *args],
            "example": [python, str(EXAMPLES / "plain_loop.py"), "--steps", "100000",
                        "--seq-len", "16", "--batch-size", "2"],
            "trainer": [python, str(trainer_example(directory, predict)), "--steps", "20000",
                        "--seq-len", "16", "--batch-size", "2"],
        }[kind]
        env = {**os.environ, "ANATOMY_STORE": str(self.store_path), "PYTHONPATH": os.pathsep.join(
            filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
        # As a terminal's shell starts a foreground job: SIGINT at its default. A test process
        # started in the background (`make test &`) ignores SIGINT, and its children would too.
        argv = [sys.executable, "-c", AS_FROM_A_TERMINAL, *argv]
        self.process = subprocess.Popen(argv, cwd=directory, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.seen: list[psutil.Process] = [psutil.Process(self.process.pid)]
        self.out = self.err = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def tree(self) -> list[psutil.Process]:
        try:
            tree = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        known = {p.pid for p in self.seen}
        self.seen += [p for p in tree if p.pid not in known]
        return tree

    def store(self) -> Store:
        return Store(self.store_path, read_only=True)

    def recording(self, steps: int = 2) -> None:
        """Wait until the run records: its training has taken `steps` steps (a command that
        marks none: its sampler has sent samples)."""
        def recorded() -> bool:
            self.tree()
            try:
                store = self.store()
                run = store.run(1)
                return run is not None and bool(run.worker_pid) and (
                    store.step_count(1) >= steps if self.kind != "watch"
                    else store.sample_count(1) > 0)
            except StoreMissing:
                return False

        wait_until(recorded, START_SECONDS, f"the {self.kind} front to record", every=0.2,
                   process=self.process)
        time.sleep(0.5)
        self.tree()

    def sampler(self) -> psutil.Process:
        (found,) = [p for p in self.tree() if name_of(p) == "anatomy-sampler"]
        return found

    def user_process(self) -> psutil.Process:
        """The process that trains: the watched command (its shell), or the script itself."""
        return psutil.Process(self.store().run(1).worker_pid) if self.kind == "watch" \
            else psutil.Process(self.pid)

    def user_child(self) -> psutil.Process:
        """The user's process's own child (under a watched shell: the python it runs)."""
        children = wait_until(lambda: [p for p in self.user_process().children() if _users(p)],
                              30, "the user's process to start a child", every=0.1)
        self.tree()
        return children[0]

    def finish(self, timeout: float = 90) -> int:
        self.process.wait(timeout)
        try:
            out, err = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError("the front ended, but a process it started still holds its"
                                 " output open") from None
        self.out, self.err = self.out + out, self.err + err
        return self.process.returncode

    def said(self, words: str, timeout: float = 60) -> None:
        """Wait until the front has printed `words` on its stderr (kept in `err`)."""
        stream = self.process.stderr.fileno()

        def heard() -> bool:
            if words not in self.err and select.select([stream], [], [], 1.0)[0]:
                chunk = os.read(stream, 65536)
                assert chunk, f"ended without saying {words!r}: {self.err}"
                self.err += chunk.decode(errors="replace")
            return words in self.err

        wait_until(heard, timeout, f"the front to say {words!r}", every=0, seen=lambda: self.err)

    def stored(self):
        return report(self.store(), 1)

    def kill(self) -> None:
        self.tree()
        for process in self.seen:
            try:
                process.kill()
            except psutil.Error:
                pass
        try:
            self.process.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):
            pass


@pytest.fixture
def front(tmp_path):
    """Start Fronts, each in a directory of its own; whatever a failed test leaves is killed."""
    started: list[Front] = []

    def start(kind: str, *args: str, store_path: Path | None = None, predict: bool = True
              ) -> Front:
        directory = tmp_path / f"{kind}{len(started)}"
        directory.mkdir()
        started.append(Front(kind, directory, *args, store_path=store_path, predict=predict))
        return started[-1]

    yield start
    for each in started:
        each.kill()


def _no_traceback(err: str) -> None:
    """No traceback of anatomy's reached the terminal (the user's own script may print its own,
    as it would without anatomy: a KeyboardInterrupt's)."""
    ours = [line for line in err.splitlines()
            if line.lstrip().startswith('File "') and str(PROJECT / "anatomy") in line]
    assert not ours, err


# --- the front itself: kill -9, SIGTERM, SIGHUP, Ctrl-C ---

@pytest.mark.parametrize("kind", ["watch", "script", "example", "trainer"])
def test_kill_9_of_the_front_leaves_no_process_and_readers_see_the_run_ended_unchanged(front, kind):
    """Nobody is left to write the ending: every reader shows the run ended, at once, and
    reading writes nothing (the store's bytes are the same after `runs` and `show`)."""
    run = front(kind, *(["--child"] if kind == "watch" else []))
    run.recording()
    if kind == "watch":
        run.user_child()  # the command's own child must go too
    leftovers_before = {p.name for p in Path(tempfile.gettempdir()).glob("anatomy-watch-*")}
    run.process.send_signal(signal.SIGKILL)
    run.finish()
    # The semaphores the front shared with its sampler are unlinked once the sampler has them:
    # multiprocessing's resource tracker, which outlives the front, had 9 to clean up and said
    # "resource_tracker: There appear to be 9 leaked semaphore objects" on the terminal.
    assert "leaked semaphore" not in run.err, run.err
    assert left(run.seen) == [], [(p.pid, p.cmdline(), p.ppid()) for p in left(run.seen, 0)]
    assert {p.name for p in Path(tempfile.gettempdir()).glob("anatomy-watch-*")} <= leftovers_before
    files = [p for p in run.store_path.parent.iterdir() if p.name.startswith("runs.sqlite")]
    before = {p.name: p.read_bytes() for p in files if not p.name.endswith("-shm")}
    listed = subprocess.run([sys.executable, "-m", "anatomy", "runs", "--store",
                             str(run.store_path)], capture_output=True, text=True, cwd=PROJECT,
                            timeout=120)
    shown = subprocess.run([sys.executable, "-m", "anatomy", "show", "1", "--store",
                            str(run.store_path)], capture_output=True, text=True, cwd=PROJECT,
                           timeout=120)
    assert listed.returncode == shown.returncode == 0, listed.stderr + shown.stderr
    assert " failed " in listed.stdout.splitlines()[1] and "running" not in listed.stdout
    assert "ended without a word" in shown.stdout + shown.stderr
    assert {p.name: p.read_bytes() for p in files if not p.name.endswith("-shm")} == before
    rep = run.stored()
    assert rep.status == "failed" and rep.error == ENDED_WITHOUT_A_WORD
    assert rep.samples > 0 and all(p.done for p in rep.phases)


def _each_signal(signals: list[signal.Signals]) -> list:
    """(front, signal) for a fault that comes by several signals: watch and the script by each;
    the Trainer by the first only — its callback records through the phase API's run
    (engine/callbacks.py starts or joins `attach.start`), whose handling of each signal the
    script front checks, and each of its runs costs a Trainer's start (~7 CPU s)."""
    return [pytest.param(kind, sig, id=f"{int(sig)}-{kind}")
            for kind in ("watch", "script", "trainer") for sig in signals
            if kind != "trainer" or sig == signals[0]]


@pytest.mark.parametrize(("kind", "sig"), _each_signal([signal.SIGTERM, signal.SIGHUP]))
def test_sigterm_or_sighup_to_the_front_stops_the_run_with_the_signals_name(front, kind, sig):
    run = front(kind, *(["--child"] if kind == "watch" else []))
    run.recording()
    run.process.send_signal(sig)
    code = run.finish()
    assert code == (128 + sig if kind == "watch" else -sig)  # a script dies by it, as it would
    assert left(run.seen) == []
    rep = run.stored()
    assert rep.status == "stopped" and f"stopped by {sig.name}" in rep.error
    assert rep.samples == rep.samples_sent > 0
    assert all(p.done for p in rep.phases)
    _no_traceback(run.err)
    if kind != "watch":  # said, and summed up, as a Ctrl-C's stop is (the handler said neither)
        assert f"anatomy: run {rep.id} stopped, stored in " in run.err
    if kind == "script":
        assert rep.summary.time_s > 0 and rep.summary.samples_per_second > 0


@pytest.mark.parametrize("kind", ["watch", "script", "trainer"])
def test_ctrl_c_at_the_terminal_stops_the_run(front, kind):
    """Ctrl-C signals the whole foreground group: the front, its sampler (which ignores it) and
    the user's processes."""
    run = front(kind, *(["--child"] if kind == "watch" else []))
    run.recording()
    os.killpg(run.pid, signal.SIGINT)
    code = run.finish()
    assert code in ((130,) if kind == "watch" else (1, 130, -signal.SIGINT))
    assert left(run.seen) == []
    rep = run.stored()
    assert rep.status == "stopped" and "Ctrl-C (SIGINT)" in rep.error
    assert rep.samples == rep.samples_sent > 0
    if kind == "watch":
        _no_traceback(run.err)


# --- the sampler ---

@pytest.mark.parametrize(("kind", "sig"), _each_signal([signal.SIGKILL, signal.SIGTERM]))
def test_a_dead_sampler_fails_the_run_and_the_users_training_goes_on(front, kind, sig):
    """The recording has lost its sampler: the run is failed there, saying how and when, and the
    user's training — not anatomy's to end — goes on, unrecorded, until the user stops it."""
    run = front(kind, predict=False)  # the sampler's fault, not the predicted peak's
    run.recording()
    run.sampler().send_signal(sig)
    wait_until(lambda: run.store().run(1, as_recorded=True).status != "running", 60,
               "the run to be ended when its sampler died", every=0.2)
    assert run.process.poll() is None  # the training goes on
    run.process.send_signal(signal.SIGTERM)
    run.finish()
    assert left(run.seen) == []
    rep = run.stored()
    assert rep.status == "failed" and "the memory sampler" in rep.error
    assert ("was killed by SIGKILL" if sig == signal.SIGKILL else "stopped (SIGTERM)") in rep.error
    assert "the training went on unrecorded" in rep.error
    if sig == signal.SIGTERM:  # it lived to send its count: nothing it sent was lost
        assert rep.samples == rep.samples_sent > 0
    assert "the memory sampler" in run.err
    _no_traceback(run.err)


@pytest.mark.parametrize("kind", ["watch", "script"])
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_the_sampler_ignores_hang_ups_and_ctrl_c(front, kind, sig):
    run = front(kind)
    run.recording()
    run.sampler().send_signal(sig)
    time.sleep(2)  # no event to wait for: a signal it did not ignore would have ended it by now
    run.process.send_signal(signal.SIGTERM)
    run.finish()
    assert left(run.seen) == []
    rep = run.stored()
    assert rep.status == "stopped" and rep.samples == rep.samples_sent > 0


# --- the user's process and its children ---

@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_command_fails_the_run_with_the_signals_name_and_leaves_none_of_its_tree(
        front, sig):
    """The watched command killed: its own child, orphaned, is ended too; the watch exits as a
    shell does, 128 + N."""
    run = front("watch", "--child")
    run.recording()
    child = run.user_child()
    run.user_process().send_signal(sig)
    assert run.finish() == 128 + sig
    assert left([*run.seen, child]) == []
    rep = run.stored()
    assert rep.status == "failed" and f"the command was killed by {sig.name}" in rep.error
    assert rep.samples == rep.samples_sent > 0
    _no_traceback(run.err)


def test_a_killed_child_of_the_command_fails_the_run_with_its_exit(front):
    run = front("watch", "--shell")
    run.recording()
    run.user_child().send_signal(signal.SIGKILL)
    assert run.finish() == 137  # the shell's exit: 128 + 9
    assert left(run.seen) == []
    rep = run.stored()
    assert rep.status == "failed" and "exited with code 137" in rep.error and "SIGKILL" in rep.error


def test_a_killed_child_of_a_phase_api_script_fails_the_run_with_the_scripts_error(front):
    run = front("script", "child")
    run.recording(steps=3)
    run.user_child().send_signal(signal.SIGKILL)
    assert run.finish() == 1
    assert left(run.seen) == []
    rep = run.stored()
    assert rep.status == "failed" and "CalledProcessError" in rep.error
    assert rep.samples == rep.samples_sent > 0


def test_a_command_slow_to_stop_is_ended_with_its_whole_tree(front):
    """A command that needs 600 s after SIGTERM: 10 s later its whole tree is ended (SIGTERM,
    then SIGKILL), without a traceback, and the run is stopped."""
    run = front("watch", "--child", "--slow-stop")
    run.recording()
    child = run.user_child()
    started = time.monotonic()
    run.process.send_signal(signal.SIGTERM)
    assert run.finish() == 143
    assert time.monotonic() - started < HANG_SECONDS  # ended by watch: on its own it takes 600 s
    assert left([*run.seen, child]) == []
    rep = run.stored()
    assert rep.status == "stopped" and "stopped by SIGTERM" in rep.error
    assert "did not exit 10 s after the stop" in run.err
    _no_traceback(run.err)


# --- how a script ends ---

@pytest.mark.parametrize("how, status, words", [
    ("exit1", "failed", "exited with code 1 (sys.exit)"),
    ("fatal", "failed", "exited with code 1: fatal"),
    ("exit0", "completed", None),
])
def test_a_scripts_exit_is_how_its_run_ends(front, how, status, words):
    """sys.exit and SystemExit skip sys.excepthook: the run still ends as the exit says."""
    run = front("script", how)
    assert run.finish(timeout=START_SECONDS) == (0 if how == "exit0" else 1)
    rep = run.stored()
    assert rep.status == status, rep.error
    if words:
        assert words in rep.error
    assert rep.samples == rep.samples_sent > 0 and all(p.done for p in rep.phases)
    assert left(run.seen) == []


@pytest.mark.parametrize("how, status, code", [("exit1", "failed", 1), ("exit0", "completed", 0)])
def test_under_watch_a_scripts_exit_is_the_same(tmp_path, how, status, code):
    (tmp_path / "light.py").write_text(textwrap.dedent(LIGHT))
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    result = subprocess.run([sys.executable, "-m", "anatomy", "watch", "--store",
                             str(tmp_path / "s.sqlite"), "--", sys.executable, "light.py", how],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == code
    rep = report(Store(tmp_path / "s.sqlite", read_only=True), 1)
    assert rep.status == status
    assert len(Store(tmp_path / "s.sqlite", read_only=True).runs()) == 1  # the script joined it


# --- the store ---

@pytest.mark.parametrize("kind", ["watch", "script", "trainer"])
def test_a_full_disk_fails_the_run_says_so_and_the_users_training_goes_on(front, small_disk, kind):
    # No predicted peak (its child is ended as the others, checked by the stops above): the
    # store's fault is what this checks.
    run = front(kind, store_path=small_disk / "runs.sqlite", predict=False)
    try:
        run.recording()
        checkpoint(run.store_path)
        filler = fill(small_disk)
        run.said("could not be written")
        assert run.process.poll() is None  # the training goes on
        run.process.send_signal(signal.SIGTERM)
        run.finish()
        assert "the disk is full" in run.err and "the training went on unrecorded" in run.err
        _no_traceback(run.err)
        assert left(run.seen) == []
        filler.unlink()
        rep = run.stored()
        assert rep.status == "failed" and "the disk is full" in rep.error
        assert rep.samples > 0 and all(p.done for p in rep.phases)
        assert not [p for p in small_disk.iterdir() if "reserve" in p.name]  # given back
    finally:
        run.kill()


@pytest.mark.parametrize("kind", ["watch", "script", "trainer"])
def test_a_store_that_goes_away_is_not_made_again_and_the_users_training_goes_on(front, kind):
    run = front(kind, predict=False)  # the store's fault, as the full disk's
    run.recording()
    for path in run.store_path.parent.glob("runs.sqlite*"):
        path.unlink(missing_ok=True)
    run.said("could not be written")
    assert "it is gone" in run.err
    assert run.process.poll() is None
    run.process.send_signal(signal.SIGTERM)
    run.finish()
    _no_traceback(run.err)
    assert left(run.seen) == []
    assert not run.store_path.exists()  # not made again, empty, at the same place


# --- refused before anything starts ---

def test_watch_of_a_script_whose_interpreter_is_missing_is_refused_and_records_nothing(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/no/such/interpreter\necho never\n")
    script.chmod(0o755)
    result = subprocess.run([sys.executable, "-m", "anatomy", "watch", "--store",
                             str(tmp_path / "s.sqlite"), "--", str(script)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(PROJECT)}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "/no/such/interpreter" in result.stderr
    assert not (tmp_path / "s.sqlite").exists() or Store(tmp_path / "s.sqlite").runs() == []


def test_watch_passes_progress_bars_through_as_they_come(tmp_path):
    """`\\r` progress (tqdm) reaches the terminal without waiting for a newline, and what the
    watch keeps of it is bounded."""
    from anatomy.engine.watch import TAIL_BYTES, _Output

    reader, writer = os.pipe()
    target = tmp_path / "out"
    with open(target, "w") as out:
        output = _Output()
        import threading

        tee = threading.Thread(target=output.tee, args=(os.fdopen(reader, "rb"), out))
        tee.start()
        os.write(writer, b"progress 1%\r")
        wait_until(lambda: target.read_bytes() == b"progress 1%\r", 10,
                   "the progress passed through", every=0.01, seen=target.read_bytes)
        for _ in range(200):  # 12.8 MB without a newline
            os.write(writer, b"x" * 65536)
        os.close(writer)
        tee.join(30)
    assert len(output.tail) <= TAIL_BYTES
    assert target.stat().st_size == len("progress 1%\r") + 200 * 65536


def test_while_the_disk_is_full_every_command_says_so_in_a_line(small_disk):
    """A reader cannot make its WAL index on a full disk: SQLite says "disk I/O error"; the
    commands say what it is."""
    store = Store(small_disk / "runs.sqlite")
    run_id = store.create_run({"model": "tiny"}, "cpu-rss", "rss", 0, {})
    store.finish(run_id, "completed")
    filler = fill(small_disk)
    try:
        for command in (["runs"], ["show", "1"], ["run", "--max-steps", "1"]):
            result = subprocess.run([sys.executable, "-m", "anatomy", *command, "--store",
                                     str(store.path)], cwd=PROJECT, capture_output=True,
                                    text=True, timeout=120)
            assert result.returncode == 1, (command, result.stderr)
            assert result.stderr.count("\n") == 1, result.stderr
            assert result.stderr.startswith(f"error: the store {store.path}: the disk is full")
    finally:
        filler.unlink()


# --- Ctrl-C pressed again while the run's ending is written ---

@pytest.mark.parametrize("gap", [0.02, 0.15])
def test_ctrl_c_twice_in_a_phase_api_script_stops_the_run(front, gap):
    """The second Ctrl-C landed while the first one's stop was being written: "Error in
    sys.excepthook … KeyboardInterrupt" from inside anatomy, and the run left running, later
    read "failed: ended without a word". It is held until the ending is written."""
    run = front("script")
    run.recording()
    os.killpg(run.pid, signal.SIGINT)
    time.sleep(gap)
    os.killpg(run.pid, signal.SIGINT)
    code = run.finish()
    assert code in (1, 130, -signal.SIGINT)
    assert left(run.seen) == []
    assert "Error in sys.excepthook" not in run.err
    _no_traceback(run.err)
    rep = run.stored()
    assert (rep.status, rep.error) == ("stopped", "stopped by Ctrl-C (SIGINT)")
    assert run.store().run(1, as_recorded=True).status == "stopped"  # written, not only read so
    assert rep.samples == rep.samples_sent > 0

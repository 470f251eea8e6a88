"""`anatomy watch -- COMMAND`: any command's GPU memory, recorded as a run.

The command runs as a child, untouched but for a few environment variables, and drives the same
recording as every run (engine/recording.py): the sampler samples the GPUs it can use (or, without
a GPU, the RSS of its process tree), and where the command records itself (the Trainer callback,
the phase API) its phase marks and steps reach the recording over a local socket
(engine/link.py). A command that marks nothing gets one phase, Phase.PROCESS, from its start to its
exit. The GPUs watched are locked as anatomy's own runs lock them.

How it ends: the command's exit code (0 completed, else failed; `oom` only for torch's own
out-of-memory error in what it printed), the signal that killed it ("killed by SIGKILL"), or a
stop — Ctrl-C, SIGTERM or SIGHUP to the watch — passed on to the command (unless it came to
the process group they share, which the command got it from already), whose whole tree is
ended if it has not exited STOP_GRACE_SECONDS later. The watch exits with the command's status
(128 + N for signal N), or 128 + N for the signal that stopped the watch itself.

On several hosts, each host's watch records its own part of one run in a shared store, found by
the launch's key (engine/launch.py).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from multiprocessing.connection import Listener
from typing import NamedTuple, TextIO

import psutil

from anatomy.analysis.machine import Device, Machine
from anatomy.engine import launch, link, protocol
from anatomy.engine.attach import as_text
from anatomy.engine.collector import Outcome
from anatomy.engine.endings import (
    Ending,
    OomKills,
    death,
    exit_status,
    killed_for_memory,
    oom_in,
    rank_signalled,
    shell_death,
    stop_signal_in,
    stopped_by,
)
from anatomy.engine.figures import Answers
from anatomy.engine.locks import DeviceBusy, gpu_key, held_by, take_all
from anatomy.engine.processes import (
    LIST_SECONDS,
    Tree,
    adopted,
    adopting_orphans,
    alive,
    end_left,
    end_tree,
)
from anatomy.engine.recording import (
    FIRST_SAMPLE_TIMEOUT,
    OOM_LOOK_SECONDS,
    Recording,
    environment_facts,
)
from anatomy.store import (
    DatabaseError,
    Message,
    PhaseMark,
    RunFacts,
    RunSource,
    Store,
    StoreError,
    TrainingSummary,
    checks,
    device_key,
)
from anatomy.units import mib_text
from anatomy.vocabulary import Edge, Level, Phase, SourceKind, Status

STOP_GRACE_SECONDS = 10.0  # after a stop the command may save and exit on its own
KILL_GRACE_SECONDS = 3.0   # then its tree gets SIGTERM, and SIGKILL this long after
PROGRESS_SECONDS = 1.0
TAIL_BYTES = 8192  # what is kept of the command's output, for the error: its last lines
OOM_OVERLAP = 128  # bytes of the previous output searched again, for a message cut in two
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A stop signal the sampler (of the watch's process group) hears within this long came to the
# whole group; the sampler's handler runs at once, unless the machine is loaded.
GROUP_SECONDS = 1.0


class WatchRefused(ValueError):
    """Bad input to `watch`: nothing was started, nothing recorded."""


class _Output:
    """What the command prints, passed through to our terminal as it comes (progress bars'
    `\\r` included), with its last few KB kept for the error and searched for torch's
    out-of-memory error."""

    def __init__(self) -> None:
        self.tail = b""
        self.oom = False
        self._lock = threading.Lock()
        self._screens: dict[object, _Screen] = {}

    def _screen(self, stream: TextIO) -> _Screen:
        with self._lock:
            return self._screens.setdefault(_screen_of(stream), _Screen())

    def say(self, text: str, out: TextIO) -> None:
        """`text` on a line of its own: where the command's output left a line unended on the
        same terminal (a progress bar, drawn with `\r`), a newline first; else the line was
        glued to the bar ("2/40 [00:00<00:03]CPU memory (RSS) occupied: …")."""
        screen = self._screen(out)
        with screen.lock:
            if screen.open and not text.startswith("\n"):
                text = "\n" + text
            screen.open = False
            _say(text, out)

    def tee(self, stream, target: TextIO) -> None:
        raw = getattr(target, "buffer", None)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        passing = True
        fd = stream.fileno()
        screen = self._screen(target)
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            if passing:  # once our terminal is gone the output is still drained, or it blocks
                try:
                    with screen.lock:
                        if raw is not None:
                            raw.write(chunk)
                            raw.flush()
                        else:
                            target.write(decoder.decode(chunk))
                            target.flush()
                        screen.open = not chunk.endswith(b"\n")
                except (OSError, ValueError):
                    passing = False
            with self._lock:
                seen = self.tail[-OOM_OVERLAP:] + chunk
                self.oom = self.oom or oom_in(seen.decode(errors="replace"))
                self.tail = (self.tail + chunk)[-TAIL_BYTES:]

    def last_lines(self, count: int = 10) -> str:
        with self._lock:
            text = self.tail.decode(errors="replace")
        lines = [line.rstrip() for line in text.replace("\r", "\n").split("\n")]
        return "\n".join([line for line in lines if line.strip()][-count:])


class _Screen:
    """Where lines are shown (a terminal, a log file): whether the last output passed to it left
    a line unended, and the lock that keeps a line of the watch's from landing mid-write."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a signal's handler may say a line mid-line
        self.open = False


def _screen_of(stream: TextIO) -> object:
    """One key for the streams that show on the same screen: stdout and stderr on one terminal,
    or redirected to one file (`2>&1`), are one."""
    try:
        found = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # no file behind it (a test's StringIO)
        return id(stream)
    return found.st_dev, found.st_ino


def _one_screen() -> bool:
    """Whether our stdout and stderr show on one screen."""
    return _screen_of(sys.stdout) == _screen_of(sys.stderr)


class Gone(NamedTuple):
    """A process under the command, seen gone while the command ran."""
    t: float  # monotonic, when it was seen gone
    pid: int
    name: str
    for_memory: bool  # its cgroup's count of out-of-memory kills rose while it lived (OomKills)


class Vanished(NamedTuple):
    """A rank whose link closed mid-phase without a word (killed, crashed): which, and when its
    close was seen on the run's clock (no earlier than its end: its receiving thread may see it
    late, never early), and whether any rank's failure had arrived by then."""
    rank: int
    seen_at: float
    after_a_word: bool

    def is_cause(self, failure: protocol.Failure | None) -> bool:
        """Whether this silent end is the run's cause rather than `failure` (the earliest said):
        the others were then stopped by the launcher (torchrun's SIGTERM) or lost their peer.
        Not an end after another rank had said its stop — the launcher's SIGTERM can end a rank
        before it says its own — by the clock where the failure carries its time, not by which
        receiving thread ran first; by arrival where it carries none."""
        if failure is None or failure.after_peer:
            return True
        if failure.status != Status.STOPPED:
            return False
        if failure.t is None:
            return not self.after_a_word
        return self.seen_at < failure.t


class _Command:
    """The command, a child process, as the recording follows it. The processes under it are
    listed while it runs, so that those it leaves behind when it ends (orphans, no longer under
    it) are found and ended too, and so that one the kernel's out-of-memory killer ends is
    known (a launcher's rank: the launcher, the command, then fails of it)."""

    def __init__(self, child: subprocess.Popen, key: str = ""):
        self.child, self.pid = child, child.pid
        self.tree = Tree(child.pid)
        self.key = key  # the watch's key in its environment: what marks a process of the command
        try:
            self.born = psutil.Process(child.pid).create_time()
        except psutil.Error:  # gone already: what it left was made after the watch's own
            self.born = psutil.Process().create_time()
        # Each process under it while it lives: its name, and its cgroup's out-of-memory kills.
        self.kills: dict[int, tuple[psutil.Process, str, OomKills]] = {}
        self.gone: list[Gone] = []
        self._listed_at = self._looked_at = float("-inf")
        self._listing = threading.RLock()  # the watch's loop and the recording's both ask

    def exit_code(self) -> int | None:
        code = self.child.poll()
        if code is None and time.monotonic() - self._looked_at >= OOM_LOOK_SECONDS:
            with self._listing:
                if time.monotonic() - self._listed_at >= LIST_SECONDS:
                    self.tree.refresh()
                    self._listed_at = time.monotonic()
                self.follow_kills()
                self._looked_at = time.monotonic()
        return code

    def follow_kills(self) -> None:
        """Each process under the command: its cgroup's out-of-memory kills read while it lives,
        and, once it is gone, whether they rose meanwhile (`gone`)."""
        with self._listing:
            for pid, (process, name, kills) in list(self.kills.items()):
                if alive(process):
                    kills.look()
                else:
                    del self.kills[pid]
                    self.gone.append(Gone(time.monotonic(), pid, name, kills.rose()))
            for process in self.tree.known:
                if process.pid not in self.kills and alive(process):
                    with contextlib.suppress(psutil.Error):
                        self.kills[process.pid] = (process, process.name(), OomKills(process.pid))

    def end_left(self) -> None:
        """What the command left running when it ended: the orphans listed while it ran, and
        those re-parented to the watch (`adopting_orphans`) that carry its key, made before
        any listing saw them."""
        end_left(self.tree.known + adopted(self.born, {self.pid}, self._ours), KILL_GRACE_SECONDS)

    def _ours(self, process: psutil.Process) -> bool:
        """Whether a process is of the command (its environment holds the watch's key), not
        one of the watch's own."""
        try:
            return bool(self.key) and process.environ().get(link.WATCH_KEY_ENV) == self.key
        except psutil.Error:
            return False

    def end(self, grace: float) -> None:
        end_tree(self.pid, lambda: self.child.poll() is not None, self._wait, grace)

    def _wait(self, seconds: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.wait(seconds)


def choose_devices(info: Machine, gpus: str | None) -> list[Device]:
    """The GPUs to sample: `--gpus 0,1` (torch's indices among the visible ones), else all."""
    if gpus is None:
        return list(info.devices)
    chosen = []
    for word in gpus.split(","):
        word = word.strip()
        index = checks.digits(word)
        if index is None or index >= info.gpu_count:
            visible = f"0 to {info.gpu_count - 1}" if info.gpu_count else "none: no GPU here"
            raise WatchRefused(f"--gpus: {word!r} is not a visible GPU ({visible})")
        if info.devices[index] not in chosen:
            chosen.append(info.devices[index])
    return chosen


def why_not_runnable(program: str) -> str | None:
    """Why `program` cannot be run, as exec would find it: not on the PATH, or a script whose
    interpreter (its `#!` line) is missing. None when it looks runnable."""
    path = shutil.which(program)
    if path is None:
        if os.path.isfile(program):  # a file the shell would not run either: name its interpreter
            if program.endswith(".py"):
                return f"a Python script, not a command: run it as python {program}"
            return "a file that is not executable: make it so (chmod +x), or run its interpreter"
        return "no such command or not executable"
    try:
        with open(path, "rb") as script:
            head = script.read(512)
    except OSError:
        return None  # exec will say
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
    words = line.split()
    if not words:
        return "its first line '#!' names no interpreter"
    interpreter = words[0]
    if not (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):
        return f"its interpreter {interpreter} (#!{line}) does not exist or cannot run"
    if os.path.basename(interpreter) == "env":
        program = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), None)
        if program is not None and shutil.which(program) is None:
            return f"its interpreter {program} (#!{line}) is not on the PATH"
    return None


class Watch:
    def __init__(self, command: Sequence[str], store: Store, info: Machine, devices: list[Device],
                 name: str | None = None, sample_rate: int = 200,
                 across: launch.Launch | None = None, *,
                 phase_lines: Callable[[int, Collection[int] | None], list[str]]
                 = lambda run_id, ranks: []):
        if not command:
            raise WatchRefused("no command: write it after `--`, e.g. anatomy watch -- python "
                               "train.py")
        if not 1 <= sample_rate <= 2000:
            raise WatchRefused(f"--sample-rate: {sample_rate} is out of range: 1 to 2000")
        problem = why_not_runnable(command[0])
        if problem is not None:
            raise WatchRefused(f"cannot run {command[0]!r}: {problem}")
        self.command = list(command)
        self.store, self.info, self.devices = store, info, devices
        self.name, self.sample_rate = name, sample_rate
        self.recording: Recording | None = None
        self.output = _Output()
        self.marked_phases = False
        # The lines of the run's phases ended since the last call (of the ranks given: a host's
        # own): the CLI's, which `anatomy run` prints too, from the figures `show` prints (none
        # without it).
        self.phase_lines = phase_lines
        self.asked: list[int] = []  # the signals that stop the command, as they came
        self.started = 0.0  # the run's clock when the command started
        self.ranks: dict[int, int] = {0: 0}  # rank -> its local rank (several processes)
        # The first process that spoke as each rank: the training. Another of the same rank is
        # a process it started that records itself too (a subprocess's evaluation script).
        self.first_pid: dict[int, int] = {}
        self.vanished: Vanished | None = None  # the first rank gone without a word
        self.said_failure: set[int] = set()  # the pids of the processes that said they failed
        self.said_words = False  # a rank's link has carried its failure (its receiving thread's)
        self.followed: _Command | None = None  # the command's process, once started
        self._shown_step: int | None = None
        # Ranks on several hosts (engine/launch.py): the launch, and this host's part of its run.
        self.across = across
        self.part: launch.HostPart | None = None

    # --- the socket the command's processes report through ---
    def _say(self, text: str, out: TextIO) -> None:
        self.output.say(text, out)

    def _listen(self) -> tuple[Listener, str, str]:
        key = secrets.token_bytes(16)
        address = link.new_address()
        listener = Listener(link.socket_address(address), family="AF_UNIX", authkey=key)
        threading.Thread(target=self._accept, args=(listener,), name="anatomy-watch-accept",
                         daemon=True).start()
        return listener, address, key.hex()

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                connection = listener.accept()
            except (OSError, EOFError):
                return  # closed: the watch is over
            except Exception:  # noqa: BLE001 - a peer with the wrong key: refuse it, go on
                continue
            threading.Thread(target=self._receive, args=(connection,), daemon=True).start()

    def _receive(self, connection) -> None:
        with connection:
            # A process that records itself marks its baseline first thing: it waits until the
            # sampler has measured it once (attach._WatchLink), so that phase has a reading.
            self.recording.sampling.wait(FIRST_SAMPLE_TIMEOUT)
            try:
                connection.send(link.Ready(self.recording.run_id))
            except OSError:
                return
            rank, in_phase, said = None, False, False
            # The figures this process reads: its host's recording's (its own GPUs).
            answers = Answers(self.recording.figures)
            while True:
                try:
                    message = connection.recv()
                except (EOFError, OSError):
                    if rank is not None and in_phase and not said and self.vanished is None:
                        self.vanished = Vanished(rank, self.recording.now(), self.said_words)
                    return
                if isinstance(message, protocol.FiguresAsked):
                    try:
                        connection.send(answers.answer(message))
                    except OSError:
                        return
                    continue
                if not self.recording.done.is_set():  # else nothing drains it: it would grow
                    self.recording.events.put(message)
                if isinstance(message, (protocol.Phase, protocol.StepReport, protocol.Failure)):
                    rank = message.source.rank or 0
                    said = said or isinstance(message, protocol.Failure)
                    self.said_words = self.said_words or said
                    if isinstance(message, protocol.Phase):
                        in_phase = message.mark.edge == Edge.START

    def _observe(self, message) -> None:
        """Every rank's phase marks and steps, each stored with its rank; the first
        word of a rank other than 0 makes the run one of several processes (its GPU: the rank's
        LOCAL_RANK among the command's visible GPUs)."""
        source = getattr(message, "source", None)
        if source is not None and source.rank is not None:
            self.first_pid.setdefault(source.rank, source.pid)
        if isinstance(message, protocol.Failure):
            self.said_failure.add(message.source.pid)
        if isinstance(message, (protocol.Phase, protocol.StepReport)):
            rank = message.source.rank or 0
            if self.part is not None and rank not in self.part.ranks:
                self.ranks.setdefault(rank, message.source.device or 0)
                self.part.heard(rank, message.source.device, [d.nvml_index for d in self.devices])
            elif rank and rank not in self.ranks:
                self._join(rank, message.source.device)
            if isinstance(message, protocol.Phase):
                self.marked_phases = True

    def _join(self, rank: int, local: int | None) -> None:
        """A rank of several has spoken: the run's world size and each rank's GPU, as known (on
        several hosts each host places its own ranks: `HostPart.place_rank`)."""
        self.ranks[rank] = local if local is not None else rank
        world = max(self.ranks) + 1
        facts = RunFacts.of(world_size=world)
        if self.devices:
            facts = facts.merged(RunFacts.of(gpus=tuple(
                self.devices[min(self.ranks.get(r, r), len(self.devices) - 1)].nvml_index
                for r in range(world))))
        # Through the recording's queue, as the ranks' own facts: kept in order with the rest
        # while a database server is away (the collector's), not written here to fail.
        self.recording.events.put(protocol.Environment(facts, protocol.SAMPLER))

    def _host_lost(self, why: str) -> None:
        """Another host of the run is lost (or failed, and the ranks here outlived it): the
        command here is ended — its ranks' peer is gone, they could only hang."""
        self._say(f"anatomy: run {self.recording.run_id}: {why}: ending this host's command",
                  sys.stderr)
        threading.Thread(target=self.recording.end_training, args=(KILL_GRACE_SECONDS,),
                         name="anatomy-host-lost", daemon=True).start()

    def _decide(self, outcome: Outcome, code: int | None) -> Ending:
        """How the command ended, when the watch did not stop it: what it said (the phase API's
        error), else its exit."""
        recording = self.recording
        outcome.summary = replace(outcome.summary or TrainingSummary(), exit_code=code)
        if not self.marked_phases:  # one phase: the command's life, ended with the others
            recording.collector.handle(protocol.Phase(PhaseMark(Edge.START, Phase.PROCESS, self.started),
                                                      protocol.Source()))
            recording.collector.flush()
        # Ended because another host was lost or failed: the run's ending names that host.
        if self.part is not None and self.part.ended_others is not None and code != 0:
            return Ending(Status.FAILED, f"ended as {self.part.ended_others}; the command"
                          f" {death(code)}")
        last = self.output.last_lines()
        printed = f":\n{last}" if last else ""
        failure = outcome.failure
        # A process of the command killed for memory is the cause (a launcher's rank: its peers
        # then fail of it, "Connection reset by peer", or are ended by the launcher); the command
        # itself, so killed, the recording tells.
        killed = self._killed_for_memory()
        if killed is not None and code != 0:
            return Ending(Status.OOM, f"{killed_for_memory(killed)}; the command {death(code)}"
                          + printed)
        # A rank gone without a word (kill -9) is the cause, not the words of the ranks the
        # launcher then stopped.
        if self.vanished is not None and len(self.ranks) > 1 and code != 0 \
                and self.vanished.is_cause(failure):
            return Ending(Status.FAILED, f"rank {self.vanished.rank} ended without a word (killed"
                          f" or crashed); the command {death(code)}" + printed)
        if failure is not None and code == 0 \
                and failure.source.pid != self.first_pid.get(failure.source.rank or 0):
            # A process the training started, recording itself too, ended its part so (an
            # evaluation script run by subprocess, exit 3): the command went on and succeeded.
            recording.collector.handle(protocol.Note(Message(
                recording.now(), Level.WARNING, f"a process of the command (pid {failure.source.pid})"
                f" that records itself ended {failure.status}: {failure.text}; the command went"
                " on and exited 0"), protocol.Source()))
            recording.collector.flush()
            return Ending(Status.COMPLETED)
        if failure is not None and len(self.ranks) > 1 and failure.status == Status.STOPPED \
                and code != 0 and (signum := stop_signal_in(failure.text)) is not None:
            # A rank's script recorded its own stop, by a signal that never reached the watch:
            # failed, as under `anatomy run` (endings.rank_signalled).
            return Ending(Status.FAILED, rank_signalled(f"rank {failure.source.rank or 0}", signum)
                          + f"; the command {death(code)}")
        if failure is not None:
            # Of several ranks, the one that failed, as `anatomy run` names it ("rank 1: ...").
            who = f"rank {failure.source.rank or 0}: " if len(self.ranks) > 1 else ""
            return Ending(failure.status, who + failure.text)
        if code == 0:
            return Ending(Status.COMPLETED)
        if self.output.oom:
            how = death(code) if code is not None and code < 0 else f"exited with code {code}"
            return Ending(Status.OOM, f"the command ran out of memory ({how})" + printed)
        if code is not None and code < 0:
            return Ending(Status.FAILED, f"the command {death(code)}" + printed)
        return Ending(Status.FAILED, f"the command exited with code {code}{shell_death(code or 0)}"
                      + printed)

    def _killed_for_memory(self) -> str | None:
        """The first process under the command that the out-of-memory killer ended, in words
        ("rank 1 (pid 123)"), None if none: gone while its cgroup's count rose, without a word of
        its own (one that said how it failed was not killed)."""
        if self.followed is None:
            return None
        self.followed.follow_kills()  # those gone since it was last looked at
        ranks = {pid: rank for rank, pid in self.first_pid.items()}
        gone = [g for g in self.followed.gone if g.for_memory and g.pid not in self.said_failure]
        if not gone:
            return None
        first = min(gone)
        rank = ranks.get(first.pid)
        return f"rank {rank} (pid {first.pid})" if rank is not None and len(self.ranks) > 1 \
            else f"its process {first.pid} ({first.name})"

    # --- running ---
    def run(self, out: TextIO = sys.stderr) -> int:
        """Run the command to its end; the exit status to give back (the command's own, 128 + N
        for a signal)."""
        with self._signals_as_flags():
            return self._run(out)

    def _run(self, out: TextIO) -> int:
        info, devices = self.info, self.devices
        words = {gpu_key(d.nvml_index): f"GPU {d.index}" for d in devices}
        try:
            locks = take_all(list(words), f"a watch (pid {os.getpid()})", words.get)
        except DeviceBusy as error:
            raise WatchRefused(str(error)) from None
        fds = tuple(lock.fileno() for lock in locks)
        environment = environment_facts(info, devices).merged(
            RunFacts.of(gpus_sampled=tuple(d.index for d in devices)))
        source = RunSource.of(kind=SourceKind.WATCH, command=tuple(self.command),
                              cwd=as_text(os.getcwd()), host=socket.gethostname())
        place = None
        if self.across is not None:  # before the sampler starts: its clock is the run's
            try:
                place = launch.arrive(self.store, self.across, info,
                                      devices[0].nvml_index if devices else 0, environment, source,
                                      _label(self.command), self.name)
            except BaseException:
                _release(locks)
                raise
        recording = self.recording = Recording(
            self.store, info.backend, [d.nvml_index for d in devices], self.sample_rate,
            owns_training=False, lock_fds=fds, decide=self._decide, observe=self._observe,
            tell=lambda text: self._say(f"anatomy: {text}", out),
            t0=None if place is None else launch.run_clock(place))
        recording.finished.append(lambda: _release(locks))
        if place is not None:
            self.part = launch.HostPart(self.store, self.across, place, self._host_lost,
                                        lambda text: self._say(f"anatomy: run {place.run_id}: {text}",
                                                          out))
            recording.part, recording.host = self.part, place.host
        recording.start_sampler()
        listener, address, key = self._listen()
        env = {**os.environ, link.WATCH_ENV: address, link.WATCH_KEY_ENV: key,
               link.T0_ENV: repr(recording.t0), "ANATOMY_STORE": self.store.locator(),
               "PYTHONUNBUFFERED": "1",
               **({link.HOST_RANK_ENV: str(place.host)} if place is not None else {})}
        self.started = recording.now()
        # A command that marks nothing is in its one phase from here (its mark is written once
        # it has ended without marking any): /metrics says so while it runs.
        recording.figures.until_marked(Phase.PROCESS, self.started)
        # Orphans of the command come here (not to init) until its end has ended them.
        with adopting_orphans():
            try:
                # The device locks travel with the command too: they stay taken while it lives.
                # Where our stdout and stderr show on one screen (a terminal, `2>&1`), the
                # command's share one pipe: their lines keep the order it wrote them in (two
                # pipes, read by two threads, put a Trainer's logs, printed on stdout, inside
                # its progress bar's line on stderr).
                child = subprocess.Popen(self.command, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT if _one_screen() else
                                         subprocess.PIPE, pass_fds=fds)
            except OSError as error:
                why = f"cannot run {self.command[0]!r}: {error.strerror or error}"
                self._give_up(recording, listener, locks)
                if self.part is not None:  # its part fails at once; the others' end the run
                    self.part.leave.set()
                    with contextlib.suppress(DatabaseError):
                        self.part.end(Ending(Status.FAILED, why), None)
                raise WatchRefused(why) from None
            command = self.followed = _Command(child, key)
            if place is not None:
                run_id = recording.adopt(place.run_id)
            else:
                try:
                    run_id = recording.create_run(
                        {}, info, devices[0].nvml_index if devices else 0, environment,
                        name=self.name, preset=_label(self.command), source=source)
                except StoreError:
                    command.end(KILL_GRACE_SECONDS)
                    self._give_up(recording, listener, locks)
                    raise
            for lock in locks:
                lock.describe(held_by(f"run {run_id}", self.store.path, "a watch"))
            recording.follow(command)
            if self.part is not None:
                self.part.start()
                made = "made it" if place.created else "joined it"
                self._say(f"run {run_id}: host {place.host} ({place.name}) of the launch"
                          f" {self.across.said}: {made} in {self.store.path}", out)
            self._say(f"run {run_id}: watching {shlex.join(self.command)} (pid {child.pid}) on "
                      f"{', '.join(d.name for d in devices) or 'the CPU (RSS)'}", out)
            tees = [threading.Thread(target=self.output.tee, args=(stream, target), daemon=True)
                    for stream, target in ((child.stdout, sys.stdout), (child.stderr, sys.stderr))
                    if stream is not None]
            for tee in tees:
                tee.start()
            self._follow(command, out)
            command.end_left()
        for tee in tees:
            tee.join(timeout=5)
        listener.close()
        self._print_progress(out)
        self._print_end(out)
        if self.asked:
            return 128 + self.asked[0]
        return exit_status(child.returncode)

    def _give_up(self, recording: Recording, listener: Listener, locks: list) -> None:
        recording.abandon()
        listener.close()
        _release(locks)

    def _follow(self, command: _Command, out: TextIO) -> None:
        """Until the command has exited and its recording ended: the stop a signal asks for
        (`_signals_as_flags`), its tree ended when it outlives the grace, progress printed."""
        recording = self.recording
        shown_at = 0.0
        end_at = None
        while command.exit_code() is None or not recording.done.is_set():
            recording.done.wait(0.1)
            if self.asked and end_at is None:
                end_at = self._stop(command, self.asked[0], out)
            if end_at is not None and time.monotonic() > end_at and command.exit_code() is None:
                end_at = float("inf")
                self._say(f"anatomy: the command did not exit {STOP_GRACE_SECONDS:.0f} s after the"
                          " stop: ending its processes", out)
                recording.end_training(KILL_GRACE_SECONDS)
            if time.monotonic() - shown_at >= PROGRESS_SECONDS:
                self._print_progress(out)
                shown_at = time.monotonic()

    @contextlib.contextmanager
    def _signals_as_flags(self):
        """While the command runs and its record is written, Ctrl-C, SIGTERM and SIGHUP only
        raise a flag (`asked`) and mark the stop: a write to the store is never cut in half, and
        a signal that lands as the command ends is still a stop."""
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def handle(signum, frame) -> None:
            self.asked.append(signum)
            if self.part is not None:  # a run across hosts: the others write its ending
                self.part.leave.set()
            if self.recording is not None:
                self.recording.request_stop(stopped_by(self.asked[0]))

        for sig in STOP_SIGNALS:
            signal.signal(sig, handle)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, command: _Command, signum: int, out: TextIO) -> float:
        """Pass the stop on to the command, unless it got the signal already (`reached`); the
        time after which its whole tree is ended instead."""
        self.recording.request_stop(stopped_by(signum))
        self._say(f"\nanatomy: stopping the command ({signal.Signals(signum).name})…", out)
        if command.exit_code() is None and not self.reached(command, signum):
            with contextlib.suppress(ProcessLookupError):
                command.child.send_signal(signum)
        return time.monotonic() + STOP_GRACE_SECONDS

    def reached(self, command: _Command, signum: int) -> bool:
        """Whether the command got `signum` with the watch, sent to the process group they
        share: a terminal's Ctrl-C, a supervisor's `kill -INT -- -PGID`, a closed terminal's
        hang-up. Passed on, it would come twice, and a script that saves its checkpoint when
        interrupted would be interrupted again in the save. The sampler, in that group too,
        tells it (it counts the stop signals it gets): heard within GROUP_SECONDS, the group
        got it; else it came to the watch alone, and is passed on. A command that left the
        group (a launcher that makes a session of its own) never got it."""
        try:
            if os.getpgid(command.pid) != os.getpgrp():
                return False
        except ProcessLookupError:
            return True  # gone: nothing to pass on
        heard, times = self.recording.heard, self.asked.count(signum)
        deadline = time.monotonic() + GROUP_SECONDS
        while heard[signum] < times:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # --- the terminal ---
    def _print_progress(self, out: TextIO) -> None:
        """Each phase's memory as it ends (`phase_lines`), and the latest step when it
        changed."""
        recording = self.recording
        part = self.part  # on several hosts, this host's ranks' (its command's one phase: host 0's)
        ranks = None if part is None else set(part.ranks) or ({0} if recording.host == 0 else set())
        try:
            lines = self.phase_lines(recording.run_id, ranks)
        except Exception:  # noqa: BLE001 - a store that cannot be read now: said when it can be
            lines = []
        for line in lines:
            self._say(line, out)
        step = recording.outcome.last_step
        if step is not None and step.step != self._shown_step:
            self._shown_step = step.step
            total = f"/{step.total}" if step.total else ""
            loss = f", loss {step.loss:.4f}" if step.loss is not None else ""
            self._say(f"  step {step.step}{total}{loss}", out)

    def _print_end(self, out: TextIO) -> None:
        recording = self.recording
        run_id, ending = recording.run_id, recording.ending
        try:
            for device in self.devices or [None]:
                peak = self.store.peak(run_id, device_key(recording.host,
                                                          device.nvml_index if device else 0))
                where = f"GPU {device.index} ({device.name})" if device else "CPU (RSS)"
                self._say(f"{where}: peak {mib_text(peak)}" if peak is not None else
                          f"{where}: no sample: the command ended before the first reading (every"
                          f" {1000 / self.sample_rate:.0f} ms)", out)
            samples = f"{self.store.sample_count(run_id)} samples"
        except Exception:  # noqa: BLE001 - the store is gone or full: say what is known
            samples = "its samples"
        if ending is None:
            self._say(f"run {run_id}: not recorded", out)
            return
        kept = "" if ending.recorded else " (not recorded: the store cannot be written)"
        if self.part is not None:  # this host's part, then the run's ending where it wrote it
            self._say(f"this host's part: {ending.status}{kept}", out)
            if ending.status != Status.COMPLETED and ending.error:
                self._say(f"{ending.status}: {ending.error.splitlines()[0].removesuffix(':')}", out)
            ending = recording.run_ending
            if ending is None:
                self._say(f"run {run_id}: its ending is written by the last of its hosts to end"
                          f" ({self.store.path})", out)
                return
        self._say(f"status: {ending.status}{kept}; {samples} stored in {self.store.path} as run"
                  f" {run_id}", out)
        if ending.status != Status.COMPLETED and ending.error:
            # Its first line: the command's last lines, which follow it in the record, have just
            # been printed by the command itself.
            self._say(f"{ending.status}: {ending.error.splitlines()[0].removesuffix(':')}", out)


def _release(locks: list) -> None:
    for lock in locks:
        lock.release()


def _say(text: str, out: TextIO) -> None:
    """Print, unless the terminal is gone (a hang-up): the run is recorded either way."""
    try:
        print(text, file=out, flush=True)
    except (OSError, ValueError):
        pass


def _label(command: list[str]) -> str:
    """The command in a word for lists: the script a Python command runs, else the program."""
    script = next((os.path.basename(a) for a in command[1:] if a.endswith(".py")), None)
    return script or os.path.basename(command[0])


def watch(command: Sequence[str], store: Store, info: Machine, gpus: str | None = None,
          name: str | None = None, sample_rate: int = 200, out: TextIO = sys.stderr,
          across: launch.Launch | None = None, *,
          phase_lines: Callable[[int, Collection[int] | None], list[str]]
          = lambda run_id, ranks: []) -> int:
    """`anatomy watch`; with `across` one host of a run across hosts (engine/launch.py)."""
    return Watch(command, store, info, choose_devices(info, gpus), name, sample_rate, across,
                 phase_lines=phase_lines).run(out)

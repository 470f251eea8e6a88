"""Runs recorded from inside the user's own training process: the phase API and what the Trainer
callback stands on.

    run = anatomy.start(name="my fine-tune")   # baseline, then torch and the CUDA context
    model = build().to("cuda"); run.phase(Phase.WEIGHTS)   # a Phase, or its name
    run.phase(Phase.TRAINING)
    for batch in data: ...; run.step(loss=loss.item())
    run.end()                                  # or: with anatomy.start() as run: ...

A run started here is recorded by this process, through the same recording as anatomy's own
runs (engine/recording.py: the sampler process, a collector thread, the store by --store's rules:
$ANATOMY_STORE, else the default). Under `anatomy watch -- COMMAND` nothing is started here: the
run is the watch's, found through the environment it set (engine/link.py), and this process's
marks travel to it over a local socket; a store, rate or GPUs the script asked for otherwise are
the watch's to decide, and said so in a line.

How the script ends is how the run ends: completed, an error (failed, or oom for torch's
out-of-memory error), Ctrl-C or a SIGTERM (stopped), `sys.exit(1)` (failed): engine/exits.py.

Nothing here imports torch: memory figures of torch's allocator are read only where the user's
process has imported torch already.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing.util
import os
import shlex
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any, NamedTuple

from anatomy.engine import launch, protocol, tasks
from anatomy.engine import link as watch_link
from anatomy.engine.devices import machine
from anatomy.engine.endings import Ending, stopped_by
from anatomy.engine.exits import (
    ExitWatch,
    default_stop_signals,
    deliver,
    ending_of,
    on_stop_signals,
    stops_while_starting,
)
from anatomy.engine.figures import Figures, LinkedFigures, LinkedReader, Reader
from anatomy.engine.locks import DeviceBusy, DeviceLock, gpu_key, held_by
from anatomy.engine.recording import FIRST_SAMPLE_TIMEOUT, Recording, environment_facts
from anatomy.engine.reporter import Reporter
from anatomy.store import (
    STORE_ENV,
    BadLocation,
    RunFacts,
    RunSource,
    ServerUrl,
    Step,
    Store,
    StoreError,
    TrainingSummary,
    checks,
    default_store,
    resolve_path,
)
from anatomy.vocabulary import Level, Phase, SourceKind, Status

DEFAULT_SAMPLE_RATE = 200
OWN_PROFILING = f"{Phase.PROFILING} (the script's)"  # a script's phase named as anatomy's span
STOP_WAIT_SECONDS = 10.0  # a signal's stop waits this long for the ending to be written
ANSWER_WAIT_SECONDS = 2.0  # the watch's answer to a read of the run's figures, at most

_current: Run | None = None
_current_lock = threading.Lock()
_exits: ExitWatch | None = None


# A host of a run across hosts recording itself whose launcher gave it no rank: its host's place
# (engine/link.py's HOST_RANK_ENV says why; a watch's command reads that).
_host_place: int | None = None


def _rank() -> int:
    """This process's rank under torchrun / accelerate launch; else, one host's process of a
    run across hosts, its host's place; else 0 (alone)."""
    for name in ("RANK", "LOCAL_RANK", watch_link.HOST_RANK_ENV):
        rank = checks.digits(os.environ.get(name, ""))
        if rank is not None:
            return rank
    return _host_place or 0


def launched_world_size() -> int:
    """WORLD_SIZE as torchrun and accelerate launch set it (1 alone, or unreadable)."""
    return checks.digits(os.environ.get("WORLD_SIZE", "")) or 1


def _local_rank() -> int | None:
    """This process's LOCAL_RANK under a launcher (its GPU among the visible ones); None alone."""
    return checks.digits(os.environ.get("LOCAL_RANK", ""))


def _allocator() -> tuple[int | None, int | None]:
    """torch's allocator figures, where this process uses CUDA already (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None, None
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def _libraries() -> RunFacts:
    """The versions of torch and transformers where the script has loaded them (never imported
    here): `show` and the pages say what a user's run trained with."""
    found: dict[str, str | None] = {}
    torch = sys.modules.get("torch")
    if getattr(torch, "__version__", None) is not None:
        # str(): a TorchVersion unpickled in the collector would import torch there.
        found.update(torch=str(torch.__version__), torch_cuda=getattr(torch.version, "cuda", None))
    transformers = sys.modules.get("transformers")
    if getattr(transformers, "__version__", None) is not None:
        found["transformers"] = str(transformers.__version__)
    return RunFacts.of(**found)


def _script() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return as_text(os.path.abspath(path)) if path else None


def as_text(value: str) -> str:
    """A path or argument of the system's (a script's, its folder, its argv) as the store keeps
    text, UTF-8: a byte that is not (a Latin-1 file name, `caf\xe9.py`) is shown as `\xe9`.
    Such a name ended the user's script in anatomy's traceback ("RunSource.script: holds the
    byte 0xe9, which is not UTF-8 text"); it only says where the run came from."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _warn(text: str) -> None:
    """A word to the user's terminal, as their script prints."""
    say(f"anatomy: {text}")


def say(line: str) -> None:
    """`line` on the user's terminal (stderr), on a line of its own where a progress bar of the
    script's is drawn there (tqdm's: a Trainer's, a loop's): the bar is cleared, the line
    printed and the bar drawn again below it, as tqdm.write does; else the line would be glued
    to the bar's end ("6/6 [00:01<00:00]anatomy: run 2 completed"). tqdm is never imported here:
    only a script's bars are drawn."""
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
    try:
        with _bars_aside(tqdm) if getattr(tqdm, "_instances", None) else contextlib.nullcontext():
            print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # no terminal left


@contextlib.contextmanager
def _bars_aside(tqdm):
    """tqdm's open bars on stderr cleared for a line, and drawn again after it; where tqdm
    cannot (a version without external_write_mode, its lock refused), the line goes as it is."""
    entered = None
    try:
        aside = tqdm.external_write_mode(file=sys.stderr)
        aside.__enter__()
        entered = aside
    except Exception:  # noqa: BLE001, S110 - the script's tqdm, whatever its state: the line goes
        pass
    try:
        yield
    finally:
        if entered is not None:
            with contextlib.suppress(Exception):
                entered.__exit__(None, None, None)


class _ThisProcess:
    """The user's own process, as its recording follows it: it trains until its run ends, and is
    never ended by the recording."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.closed = False

    def exit_code(self) -> int | None:
        return 0 if self.closed else None

    def end(self, grace: float) -> None:
        pass


def _visible(info, index: object):
    """The visible GPU `index` names (start's `gpus`); ValueError, in one line, for another."""
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(info.devices):
        return info.devices[index]
    visible = f"0 to {len(info.devices) - 1}" if info.devices else "none: no GPU here"
    raise ValueError(f"gpus: {index!r} is not a visible GPU ({visible})")


class _LocalRecording:
    """A run of this process, recorded here: engine/recording.py, driven by the phase API. The
    GPUs it samples are locked as anatomy's own runs lock them, where they are free; a GPU
    another run holds is recorded all the same, with a warning on the run. `across`: this
    host's part of a launch's run across hosts, as a watch's (engine/launch.py)."""

    def __init__(self, store: Store, name: str | None, sample_rate: int,
                 gpus: Sequence[int] | None, across: launch.Launch | None = None):
        info = machine()
        devices = info.devices if gpus is None else [_visible(info, i) for i in gpus]
        locks, busy = [], []
        for device in devices:
            lock = DeviceLock(gpu_key(device.nvml_index))
            try:
                taken = lock.acquire(f"a script (pid {os.getpid()})")
            except DeviceBusy as error:  # no lock to be had: the training is recorded all the same
                busy.append(f"GPU {device.index} is recorded unlocked: {error}")
                continue
            if taken:
                locks.append(lock)
            else:
                busy.append(f"GPU {device.index} is also used by {lock.holder()}: its samples"
                            " include that run's memory")
        self.locks = locks
        self.ending: Ending | None = None
        self.this = _ThisProcess()
        self.across, self.part = across, None
        script = _script()
        preset = os.path.basename(script) if script else "python"
        source = RunSource.of(kind=SourceKind.SCRIPT, script=script,
                              argv=tuple(as_text(arg) for arg in sys.argv),
                              cwd=as_text(os.getcwd()), host=socket.gethostname())
        gpu, environment = devices[0].nvml_index if devices else 0, environment_facts(info, devices)
        try:
            # Before the sampler starts: its clock is the run's.
            place = None if across is None else launch.arrive(store, across, info, gpu,
                                                               environment, source, preset, name)
            self.recording = Recording(
                store, info.backend, [d.nvml_index for d in devices], sample_rate,
                owns_training=False, t0=time.monotonic() if place is None else launch.run_clock(place),
                lock_fds=tuple(lock.fileno() for lock in locks),
                decide=lambda outcome, code: self.ending, tell=_warn, observe=self._observe)
            if place is None:
                self.run_id = self.recording.create_run({}, info, gpu, environment, name=name,
                                                        preset=preset, source=source)
            else:
                self.part = launch.HostPart(store, across, place, self._host_lost,
                                            lambda text: _warn(f"run {place.run_id}: {text}"))
                self.recording.part, self.recording.host = self.part, place.host
                self.run_id = self.recording.adopt(place.run_id)
            global _host_place
            _host_place = None if place is None else place.host  # this run's (`_rank`)
        except BaseException:
            self._release()
            raise
        try:  # the run is made: a stop or Ctrl-C from here on ends it as such
            for lock in locks:
                lock.describe(held_by(f"run {self.run_id}", store.path, "a script"))
            self.recording.finished.append(self._release)
            for words in busy:
                self.put(protocol.Note(protocol.Message(0.0, Level.WARNING, words),
                                       protocol.Source()))
                _warn(f"run {self.run_id}: {words}")
            self._begin(store)
        except BaseException as error:
            self._interrupted(ending_of(error))
            raise

    def _begin(self, store: Store) -> None:
        self.recording.start_sampler()
        self.recording.follow(self.this)
        # A script that only adds the callback says nothing else: which run, which store.
        where = _store_flag(store.path)
        if self.part is None:
            _warn(f"recording run {self.run_id} into {store.path} (`anatomy show {self.run_id}"
                  f"{where}`, or `anatomy dashboard{where}`)")
        else:
            self.part.start()
            place = self.part.place
            _warn(f"run {self.run_id}: host {place.host} ({place.name}) of the launch"
                  f" {self.across.said}: {'made it' if place.created else 'joined it'} in"
                  f" {store.path} (`anatomy show {self.run_id}{where}`)")
        if not self.recording.sampling.wait(FIRST_SAMPLE_TIMEOUT):
            self.put(protocol.Note(protocol.Message(
                self.recording.now(), Level.WARNING, "the sampler took longer than "
                f"{FIRST_SAMPLE_TIMEOUT:.0f} s to start: the first phase may have no sample"),
                protocol.Source()))

    def _interrupted(self, ending: Ending) -> None:
        """Ctrl-C (or another error) while the run starts, before the script has its run: the
        run ends as it says — stopped, for Ctrl-C — rather than left to be found "ended without
        a word"; the sampler goes with it."""
        if self.recording.training is None and self.part is not None:
            self.recording.abandon()  # this host's part ends; the others' end the run
            self.part.leave.set()
            with contextlib.suppress(Exception):
                self.part.end(ending, None)
            self._release()
        elif self.recording.training is None:  # not followed yet: no collector to end it
            self.recording.abandon()
            with contextlib.suppress(Exception):
                self.recording.store.free_reserve(self.run_id)
                self.recording.store.finish(self.run_id, ending.status, ending.error)
                _warn(f"run {self.run_id} {ending.status}, stored in {self.recording.store.path}")
            self._release()
        else:
            self.close(ending)

    def _observe(self, message) -> None:
        """This process's rank, placed among its host's once it has marked or stepped."""
        if self.part is not None and isinstance(message, (protocol.Phase, protocol.StepReport)):
            self.part.heard(message.source.rank or 0, message.source.device, self.recording.gpus)

    def _host_lost(self, why: str) -> None:
        """Another host of the run is lost (or failed, and the training here outlived it): this
        host's training is ended, as a watch ends its command — its ranks' peer is gone, they
        could only hang (torchrun then ends this host's other ranks)."""
        if self.this.closed:
            return  # this host's training has ended already
        _warn(f"run {self.run_id}: {why}: ending this host's training")
        self.recording.request_stop(f"ended as {why}")
        threading.Thread(target=self._end_training, name="anatomy-host-lost", daemon=True).start()

    def _end_training(self) -> None:
        """A stop, by the signal a scheduler sends (the script's own handling, then the run's);
        a training still there STOP_WAIT_SECONDS later waits in a collective on the peer that is
        gone, where no Python handler runs: its part's ending is written, then it is killed, as
        a watch kills its command's tree."""
        os.kill(os.getpid(), signal.SIGTERM)
        if self.recording.wait(STOP_WAIT_SECONDS):
            return
        self.ending = Ending(Status.STOPPED, self.recording.stop_reason)
        self.this.closed = True
        self.recording.wait(STOP_WAIT_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)

    def _release(self) -> None:
        for lock in self.locks:
            lock.release()
        self.locks = []

    def put(self, message) -> None:
        # Once the recording has ended (its store gone or full, mid-run) nothing drains the
        # queue: every later mark stayed in it, 80 MB for 300,000 steps of a training going on.
        if not self.recording.done.is_set():
            self.recording.events.put(message)

    def stop(self, reason: str) -> None:
        """A stop from a signal: nothing but flags, safe in a handler."""
        self.recording.request_stop(reason)

    def close(self, ending: Ending, held: _HeldCtrlC | None = None) -> None:
        self.ending = ending
        self.this.closed = True
        while not self.recording.wait(0.1):
            if held is not None and held.waited_out():
                _warn(f"run {self.run_id}: left before its ending was written (Ctrl-C held"
                      f" {STOP_WAIT_SECONDS:.0f} s); the next anatomy to start writes it")
                return
        self.say_ending()

    def say_ending(self) -> None:
        """The run's ending as written, in a line to the script's terminal."""
        final = self.recording.ending
        if final is not None and not final.recorded:
            _warn(f"run {self.run_id} {final.status}: {final.error} (not recorded: the store"
                  f" {self.recording.store.path} cannot be written)")
        elif final is not None and self.part is not None:
            ended = self.recording.run_ending
            run = ("its ending is written by the last of its hosts to end" if ended is None else
                   f"the run {ended.status}" + (f": {ended.error.splitlines()[0]}" if ended.error
                                                else ""))
            _warn(f"run {self.run_id}: this host's part {final.status}; {run}; stored in"
                  f" {self.recording.store.path}")
        elif final is not None:
            _warn(f"run {self.run_id} {final.status}, stored in {self.recording.store.path}")


def _store_flag(path: Path | ServerUrl) -> str:
    """`--store PATH` for the commands a script's first line suggests, unless the store is the
    one they read without it: a store the script named (`start(store=…)`, $ANATOMY_STORE set
    for the script alone) has its own run ids, and `anatomy show 1` would show another run 1.
    A database's URL as it prints (its password, if written there, as ***)."""
    if isinstance(path, ServerUrl):
        return f" --store {shlex.quote(str(path))}"
    if path.absolute() == default_store().absolute():
        return ""
    return f" --store {shlex.quote(str(path.absolute()))}"


class _WatchLink:
    """This process's side of `anatomy watch`: its messages go to the watch's collector. `t0`:
    the run's clock (the watch's), which dates this process's failure among its ranks'."""

    def __init__(self, address: str, key: bytes, t0: float):
        self.connection = Client(watch_link.socket_address(address), family="AF_UNIX",
                                 authkey=key)
        self.t0 = t0
        self.run_id = None
        # The watch answers once its sampler measures this process: the first phase has a
        # reading then.
        try:
            if self.connection.poll(FIRST_SAMPLE_TIMEOUT):
                ready = self.connection.recv()
                self.run_id = getattr(ready, "run_id", None)
        except (OSError, EOFError):
            self.connection.close()
            raise
        self.lock = threading.Lock()
        # The run's figures, which the watch's recording holds, asked for as they are read; the
        # answers are the only thing that comes back, read by one question at a time.
        self.figures = LinkedFigures(self.ask)
        self._asking = threading.Lock()
        self._asked = 0

    def ask(self, question: protocol.FiguresAsked) -> dict[str, float]:
        """The watch's answer to `question`; {} where none came within its wait and
        ANSWER_WAIT_SECONDS more (a loaded machine), or the watch is gone. An answer that comes
        later is its question's, and is dropped when the next one reads."""
        with self._asking:
            self._asked += 1
            asked = self._asked
            self.put(replace(question, asked=asked))
            deadline = time.monotonic() + question.wait + ANSWER_WAIT_SECONDS
            try:
                while (left := deadline - time.monotonic()) > 0 and self.connection.poll(left):
                    answer = self.connection.recv()
                    if isinstance(answer, protocol.FiguresTaken) and answer.asked == asked:
                        return answer.figures
            except (OSError, EOFError, ValueError):
                pass  # the watch is gone: the training goes on without its figures
            return {}

    def put(self, message, wait: float = -1) -> None:
        """Send; `wait` bounds the wait for the link (a signal's handler must not wait on a
        lock the code it interrupted holds)."""
        if not self.lock.acquire(timeout=wait):
            return
        try:
            self.connection.send(message)
        except OSError:
            pass  # the watch is gone: the training goes on unrecorded
        finally:
            self.lock.release()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stop(self, reason: str) -> None:
        """Tell the watch this process was stopped (a signal to it, not to the watch)."""
        self.put(protocol.Failure(Status.STOPPED, reason, protocol.Source(_rank()), t=self.now()),
                 wait=1.0)

    def close(self, ending: Ending, held: _HeldCtrlC | None = None) -> None:
        if ending.status != Status.COMPLETED:
            self.put(protocol.Failure(ending.status, ending.error or ending.status,
                                      protocol.Source(_rank()), t=self.now()))
        with self.lock:
            self.connection.close()


class _Unrecorded:
    """A rank other than 0 of a launch without `anatomy watch` (torchrun, accelerate launch):
    rank 0 records the run (its sampler follows every visible GPU; of a launch across hosts,
    each host's LOCAL_RANK 0 its host's part); this rank says nothing. Under `anatomy watch`
    every rank joins the one run instead."""

    run_id = None

    def put(self, message) -> None:
        pass

    def stop(self, reason: str) -> None:
        pass

    def close(self, ending: Ending, held: _HeldCtrlC | None = None) -> None:
        pass


class _HeldCtrlC:
    """Ctrl-C held off while anatomy writes how the run ended (in the main thread, where Python
    raises it): a second Ctrl-C, pressed as the first one's stop was being written, raised
    KeyboardInterrupt inside the ending ("Error in sys.excepthook") and the run was left
    running, later read "ended without a word". A Ctrl-C held is said once; held
    STOP_WAIT_SECONDS, it ends the wait (`waited_out`). Elsewhere, or where SIGINT is not
    Python's to handle (ignored, or left to the kernel), nothing is held."""

    def __init__(self, run_id: int | None):
        self.run_id = run_id
        self.previous: Any = None
        self.first: float | None = None  # when the first Ctrl-C was held

    def __enter__(self) -> _HeldCtrlC:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self.previous = previous
                signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        if self.first is None:
            self.first = time.monotonic()
            _warn(f"run {self.run_id}: Ctrl-C: writing how the run ended first")

    @property
    def held(self) -> bool:
        return self.first is not None

    def waited_out(self) -> bool:
        return self.first is not None and time.monotonic() - self.first > STOP_WAIT_SECONDS

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def deliver(self) -> None:
        """The Ctrl-C held, as the script's handler takes it (KeyboardInterrupt, by default)."""
        if self.held and self.previous is not None:
            self.previous(signal.SIGINT, sys._getframe(1))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _named(what: str, value: object, one_line: bool = True) -> None:
    """A run's or phase's name (one line of printable text: `checks.one_line`), a note's text
    (`one_line` False): text, refused at the call (ValueError) — taken, it would reach the
    store, whose refusal ends the recording of the whole run."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what}: must be text, got {value!r}")
    try:
        # A file name's bytes ("caf\udce9"): no text SQLite keeps.
        (checks.one_line if one_line else checks.encodable)(value, what)
    except checks.InvalidValue as error:
        raise ValueError(str(error)) from None


class Underway(NamedTuple):
    """A Trainer's training begun in a run and not ended yet (Run.training_underway, which the
    Trainer callback keeps): the thread it trains in, its Trainer (weakly: a failed Trainer's
    model is the script's to free), its state (the step reached), and CUDA's count of
    out-of-memory errors as it began."""
    thread: int
    trainer: weakref.ref | None  # None where the Trainer was not found
    state: Any  # transformers' TrainerState
    ooms: int | None

    def raised(self, trainer) -> bool:
        """Whether it raised, as `trainer` (another Trainer, in the same thread) begins: the
        script caught the error and trained again. The same Trainer begun again is its own
        retry (auto_find_batch_size), which the callback follows."""
        return (self.thread == threading.get_ident() and trainer is not None
                and self.trainer is not None and self.trainer() is not trainer)


class PhaseBlock:
    """What `run.phase(name)` returns: the phase as a block, `with run.phase("training"): …`,
    whose end ends the phase where it is still the run's open one (a phase held a moment, as
    "weights" is, has ended already). Before, `run.phase()` returned None, and such a block
    ended the script in "TypeError: 'NoneType' object does not support the context manager
    protocol", the run failed with it."""

    def __init__(self, run: Run, name: Phase | str | None):
        self.run, self.name = run, name

    def __enter__(self) -> Run:
        return self.run

    def __exit__(self, *exc) -> bool:
        reporter = self.run.reporter
        if self.name is not None and not self.run.ended and reporter.open_phase == self.name:
            reporter.end(self.name)
        return False  # an error in the block goes on to end the run as it would have

    def __repr__(self) -> str:
        return f"<run {self.run.id}'s phase {self.name!r}>"


class Run:
    """A run recorded from the training process itself: phases, steps, notes, its end."""

    def __init__(self, link: _LocalRecording | _WatchLink | _Unrecorded, t0: float,
                 dwell: float):
        self.link = link
        self.id = link.run_id
        self.reporter = Reporter(link, t0, dwell, protocol.Source(rank=_rank(),
                                                                  device=_local_rank()))
        self.ended = False
        # What run.step(batch_size=…) said: the examples trained on, for the run's samples/s
        self._examples = 0  # those of the steps measured (after the training's start)
        self._unsized = False  # a step measured that did not say its batch size
        self._largest: int | None = None
        self._training_began: float | None = None  # where its time is measured from
        self._last_step: float | None = None
        self.by_callback = False  # started by a Trainer's AnatomyCallback, ended with its training
        # A Trainer's training begun in it and not ended: one still there when the next
        # begins raised an error the script caught.
        self.training_underway: Underway | None = None
        self.task = tasks.current()  # the pool task that started it, if one did
        self.pid = os.getpid()  # the process that records it
        self._ending = False  # its ending is being written
        self._deferred: int | None = None  # a stop signal to deliver once it is written
        self._thread = threading.get_ident()
        self.steps = 0
        self._lock = threading.Lock()
        self._libraries = RunFacts()  # the versions told so far
        self._told_late = self._told_profiling = False
        self._reader: Reader | LinkedReader | None = None  # what `metrics()` has read of the run's figures
        # What a front tells the run as it ends, before its ending is written (the Trainer
        # callback: a Trainer that never trained); each is given how the run ends.
        self.on_end: list[Callable[[Ending], None]] = []

    def ended_before(self, call: str) -> bool:
        """Whether the run has ended, so that `call` (the script's, or a front's: a Trainer's
        training) goes nowhere; said once where the run was recorded (before, a phase or step
        after run.end() was lost without a word)."""
        if not self.ended:
            return False
        if not self._told_late and not isinstance(self.link, _Unrecorded):
            self._told_late = True
            _warn(f"run {self.id} has ended: {call} after its end is not recorded (nor any "
                  "mark after it); anatomy.start() records a new run")
        return True

    @property
    def watched(self) -> bool:
        return isinstance(self.link, _WatchLink)

    @property
    def of_a_launch(self) -> bool:
        """Whether the run records the ranks of a launch, not this process alone: under
        `anatomy watch`, or as this host's part of a run across hosts."""
        return self.watched or (isinstance(self.link, _LocalRecording)
                                and self.link.part is not None)

    def phase(self, name: Phase | str) -> PhaseBlock:
        """The state `name` is reached (Phase.WEIGHTS: the model is on its device). It is held a
        few sample periods and measured, like the walkthrough's prints; Phase.TRAINING lasts
        until `end()` (or the next phase), or the end of its block: `with
        run.phase("training"): …`."""
        _named("phase", name)  # here, in the caller's line: in the store it would end the recording
        if self.ended_before(f"run.phase({_short(name)})"):
            return PhaseBlock(self, None)
        if name == Phase.PROFILING:
            name = self._own_profiling()
        if self.reporter.open_phase:
            self.reporter.end(self.reporter.open_phase)
        self._tell_libraries()
        if name == Phase.TRAINING:
            if self._training_began is None:
                self._training_began = self.reporter.now()
            self.reporter.begin(name)
        else:
            self.reporter.hold(name)
        return PhaseBlock(self, name)

    def _own_profiling(self) -> str:
        """The script's phase named "profiling", under a name of its own: that name is anatomy's
        stretch of torch.profiler's steps, which every reader leaves out of the run (its peak
        was read before it: 42 MB of a run that held 342 in and after it)."""
        if not self._told_profiling:
            self._told_profiling = True
            _warn(f"run {self.id}: \"{Phase.PROFILING}\" names anatomy's own profiler stretch, "
                  f"which a run's peak leaves out: this phase is recorded as \"{OWN_PROFILING}\"")
        return OWN_PROFILING

    def step(self, loss: float | None = None, *, step: int | None = None,
             total: int | None = None, batch_size: int | None = None) -> None:
        """An optimizer step has ended (its number counts from 1 unless given). `batch_size`:
        the examples it trained on (with gradient accumulation, all its micro-batches'): the
        run then knows its batch size (the largest given) and its samples a second, as a
        Trainer's run does."""
        for what, value, low in (("step", step, 0), ("total", total, 0),
                                 ("batch_size", batch_size, 1)):
            if value is not None and (not checks.is_int(value)
                                      or not low <= value <= checks.MAX_INTEGER):
                # refused here: stored, its run's export would be refused by every import, and
                # one past SQLite's INTEGER ended the recording of the whole run
                raise ValueError(f"{what}: must be a whole number from {low}, got "
                                 f"{checks.shown(value)}")
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(loss, torch.Tensor):
            loss = loss.detach()  # the graph's own loss: read without torch's warning on its grad
        try:
            loss = None if loss is None else float(loss)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"loss: must be one number (loss.item()), got {_short(loss)}"
                             ) from None
        if self.ended_before("run.step()"):
            return
        self.steps = step if step is not None else self.steps + 1
        allocated, reserved = _allocator()
        self._last_step = self.reporter.now()
        self.reporter.step(Step(self._last_step, self.steps, total, loss, allocated, reserved))
        if self._training_began is None:
            # No training phase marked: where the training began is not known (the run's start
            # counted loading torch and building the model as training). This step's end is the
            # first moment known to be in it; its speed is measured over the steps after it.
            self._training_began = self._last_step
        elif batch_size is None:
            self._unsized = True
        else:
            self._examples += batch_size
        if batch_size is not None and (self._largest is None or batch_size > self._largest):
            self._largest = batch_size  # the peak's activations are made at the largest
            self.reporter.described({"batch_size": batch_size}, None)

    def _summarise(self) -> None:
        summary = self._summary()
        if summary is not None:
            self.reporter.summary(summary)

    def _summary(self) -> TrainingSummary | None:
        """The figures a Trainer reports at its end, for steps that said their batch size: the
        steps, the time from the training phase's start (unmarked: the first step's end) to the
        last step, and the samples a second over it (unknown where a step did not say its batch
        size); no time and no speed where that time is too short to measure one
        (TrainingSummary.measured). Arithmetic alone: a stop's signal handler asks for it too."""
        if self._largest is None or self._last_step is None or self._training_began is None:
            return None
        return TrainingSummary.measured(self.steps, self._last_step - self._training_began,
                                        None if self._unsized else self._examples)

    def figures(self) -> Figures | LinkedFigures | None:
        """The run's live figures: this process's recording's, or under `anatomy watch` the
        watch's, read over its link (a rank other than 0 of a launch without the watch records
        nothing)."""
        if isinstance(self.link, _LocalRecording):
            return self.link.recording.figures
        if isinstance(self.link, _WatchLink):
            return self.link.figures
        return None

    def store_locator(self) -> str | None:
        """Where the run is stored, as another process of the run reaches it (Store.locator():
        a watched command's is the watch's $ANATOMY_STORE); None where nothing records it."""
        if isinstance(self.link, _LocalRecording):
            return self.link.recording.store.locator()
        if isinstance(self.link, _WatchLink):
            return os.environ.get("ANATOMY_STORE")
        return None

    def metrics(self) -> dict[str, float]:
        """The run's figures since the last call, by the names a tracker shows them under (README,
        "Your tracker and your cluster's metrics"): each device's peak since then (the first
        call: since the run began), each phase's memory as it ended, the measured components
        once, the predicted peak where one is known. For a plain loop's own logger:
        `wandb.log(run.metrics(), step=step)`. Under `anatomy watch`, the watch's, asked over its
        link. Empty where nothing records the run."""
        if self._reader is None:
            figures = self.figures()
            if figures is None:
                return {}
            self._reader = figures.reader()
        return self._reader.take()

    def note(self, text: str, level: str = Level.INFO) -> None:
        _named("note", text, one_line=False)
        _named("level", level)
        if self.ended_before("run.note()"):
            return
        self.reporter.tell(level, text)

    def describe(self, **facts: Any) -> None:
        """Facts about the training (model, options) for the run's environment: RunFacts' own
        fields are checked (InvalidValue, in one line, for a value of the wrong type), any
        other plain JSON is kept as given."""
        described = RunFacts.from_dict(facts, "describe()")
        if self.ended_before("run.describe()"):
            return
        self._tell_libraries()
        self.reporter.environment(described)

    def _tell_libraries(self) -> None:
        found = _libraries()
        if found != self._libraries:  # loaded since the last phase
            self._libraries = found
            self.reporter.environment(found)

    def end(self, error: BaseException | str | None = None) -> None:
        """Close the run: completed, or as `error` says (an exception: failed, oom for torch's
        out-of-memory error, stopped for Ctrl-C; SystemExit by its code; a text: failed)."""
        ending = ending_of(error)
        held = self._end(ending)
        if held is not None and not isinstance(error, KeyboardInterrupt):
            held.deliver()  # a Ctrl-C pressed meanwhile, once the ending is written

    def end_as(self, ending: Ending) -> None:
        """Close the run as `ending` says, its status and its words (a front's own: the Trainer
        callback's for a training that raised an error its script caught), then deliver a
        Ctrl-C pressed meanwhile; nothing where the run has ended."""
        held = self._end(ending)
        if held is not None:
            held.deliver()

    def _end(self, ending: Ending, at: float | None = None) -> _HeldCtrlC | None:
        """End the run as `ending` says (its open phase now, or at `at`), Ctrl-C held
        meanwhile; what was held (None if the run had ended already). The process's own ends
        (its error, its exit) drop a Ctrl-C held: the process is ending."""
        with self._lock:
            if self.ended:
                return None
            self.ended = self._ending = True
        try:
            with _HeldCtrlC(self.id) as held:
                for told in self.on_end:
                    with contextlib.suppress(Exception):  # a word never keeps the run from ending
                        told(ending)
                self._summarise()
                if self.reporter.open_phase:
                    self.reporter.end(self.reporter.open_phase, at)
                self.link.close(ending, held)
                self._forget()
        finally:
            self._ending = False
            if self._deferred is not None:  # a SIGTERM that came meanwhile ends the process now
                deliver(self._deferred)
        return held

    def task_over(self) -> bool:
        """Whether the pool task that started the run has returned (this thread's pool worker
        runs another task, or waits for one). Asked in another thread: no."""
        return (self.task is not None and not self.ended
                and threading.get_ident() == self._thread and tasks.current() != self.task)

    def _end_with_task(self) -> None:
        """The run of a pool task that returned without ending it: completed, its open phase
        ended at its last mark (when it returned is not known; it marked nothing after)."""
        self._end(Ending(Status.COMPLETED), at=self.reporter.last_mark)

    def _stop(self, signum: int) -> bool:
        """A SIGTERM or SIGHUP to the script (in its handler): the run ends stopped, without a
        lock or a queue the interrupted code may hold; its phases end at the stop. Whether the
        signal is to end the process now: not while the run's ending, as decided, is being
        written (a pool's worker ending its task's run as it exits, when Pool.terminate's
        SIGTERM came): waiting here for what the interrupted code was writing held both 10 s,
        and the run was left running; the signal is delivered once it is written."""
        if self._ending:
            self._deferred = signum
            return False
        reason = stopped_by(signum)
        ends_here = not self.ended
        if ends_here:
            self.link.stop(reason)
            self.ended = True
            if isinstance(self.link, _LocalRecording):
                self.link.ending = Ending(Status.STOPPED, reason)
                self.link.this.closed = True
                # its Time and Samples/s, as a Ctrl-C's stop has them (no queue in a handler)
                self.link.recording.stop_summary = self._summary()
        # else its ending is being written already, as it was decided (a script that completed,
        # then was stopped as it exited): the process waits for it, then ends by the signal
        if isinstance(self.link, _LocalRecording):
            with _HeldCtrlC(self.id):  # the process ends by the signal once this is written
                written = self.link.recording.wait(STOP_WAIT_SECONDS)
            if written and ends_here:  # as a Ctrl-C's stop says it (the other way ends in close)
                self.link.say_ending()
        return True

    def _disown(self) -> None:
        """In a forked child (a multiprocessing or DataLoader worker): the run is its parent's,
        whose recording never came across the fork. The child's marks go nowhere (on watch's
        socket they would interleave with the parent's), and its exit, its error or a SIGTERM
        to it (Pool.terminate) end nothing — they would wait on a collector thread the child
        does not have."""
        self.ended = True
        self.link = self.reporter.queue = _Unrecorded()

    def _forget(self) -> None:
        global _current
        with _current_lock:
            if _current is self:
                _current = None

    def __reduce__(self):
        """Pickled into another process (a spawned DataLoader worker whose dataset holds the
        run, `Process(target=f, args=(run,))`): there it is a run that marks nowhere, as in a
        forked child (`_disown`); the recording is this process's. Unpicklable, it ended the
        user's training with "cannot pickle '_thread.lock' object"."""
        return _elsewhere, (self.id,)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.end(error)


def _elsewhere(run_id: int | None) -> Run:
    """A run unpickled in another process: its id, and marks that go nowhere."""
    run = Run(_Unrecorded(), time.monotonic(), dwell=0.0)
    run.id, run.ended = run_id, True
    return run


def current() -> Run | None:
    """The run this process records, if one was started (by `start` or the callback)."""
    _end_finished_task()
    return _current


def _task_returned(error: BaseException | None) -> None:
    """A pool's task sends its result: the run it started and left open ends as the task did
    (completed, or failed with its error), its phase here. With no run open, the worker takes
    SIGTERM and SIGHUP as without anatomy again: a Python handler is run only between two
    instructions, and a SIGTERM (Pool.terminate's) that came just as the worker blocked on the
    lock of its next task was held there, the worker never ended, and neither did the script."""
    run = _current
    if run is not None and run.task is not None and not run.ended and run.pid == os.getpid():
        run._end(ending_of(error))
    if _current is None:
        default_stop_signals()


def _end_finished_task() -> None:
    """A pool task's run whose task has returned ends before anything asks for the current
    run: the next task's `start()` (or its Trainer's callback) records a run of its own."""
    run = _current
    if run is not None and run.task_over():
        run._end_with_task()


def said_unused(run: Run, call: str = "anatomy.start", **given) -> None:
    """A second `anatomy.start(name=…)` while a run records (a loop over trials, a notebook's
    cell run again, without `run.end()`), or `AnatomyCallback(name=…)` joining the script's
    run: its arguments were dropped without a word, and every trial went into one run under the
    first one's name. Said, with how to record a new run."""
    given = {key: value for key, value in given.items() if value is not None}
    if given:
        shown = ", ".join(f"{key}={(os.fspath(value) if key == 'store' else value)!r}"
                          for key, value in given.items())
        what = ("returned as it is, these not used; run.end() ends it, and start() then records "
                "a new run") if call == "anatomy.start" else \
            "joined as it is, these not used: give them to anatomy.start()"
        _warn(f"{call}({shown}): run {run.id} records this process already and is {what}")


def start(name: str | None = None, *, sample_rate: int | None = None,
          store: str | os.PathLike | None = None, gpus: Sequence[int] | None = None,
          kernel: bool = True, baseline: bool = True) -> Run:
    """Start recording this process's training (or join the run `anatomy watch` runs it in).

    Call it at the top of the script, before the model exists, to see the baseline and (with
    `kernel`) torch and the CUDA context loaded, as the walkthrough does. `sample_rate`: samples
    a second, 1 to 2000 (default 200). `gpus`: the visible GPUs to sample (default: all). Under
    `anatomy watch` the watch's --store, --sample-rate and --gpus decide: one given here
    otherwise is said not used. A second call returns the run already started (in a pool's
    worker, the run of the task that calls it: a task's run ends as the task returns); a name,
    store, rate or GPUs it gives are said not used."""
    global _current
    _end_finished_task()
    with _current_lock:
        if _current is not None:
            said_unused(_current, name=name, store=store, sample_rate=sample_rate, gpus=gpus)
            return _current
        # Refused in the API's words, not a comparison's TypeError from inside anatomy.
        if sample_rate is not None and not checks.is_number(sample_rate):
            raise ValueError(f"sample_rate: must be a number of samples a second, got "
                             f"{checks.shown(sample_rate)}")
        if sample_rate is not None and not 1 <= sample_rate <= 2000:
            raise ValueError(f"sample_rate: {sample_rate} is out of range: 1 to 2000")
        if store is not None and not isinstance(store, (str, os.PathLike)):
            raise ValueError(f"store: must be a path, got {checks.shown(store)}")
        if store is not None and not os.fspath(store).strip():  # as --store '' is refused
            raise ValueError("store: an empty path names no store: give a file, or leave store "
                             "out for the default")
        if store is not None:
            try:
                resolve_path(store)
            except BadLocation as error:
                raise ValueError(f"store: {error}") from None
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name: must be text, got {checks.shown(name)}")
        if gpus is not None and (isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence)):
            raise ValueError("gpus: must be a list of visible GPUs' indices (gpus=[0, 1]), got "
                             f"{checks.shown(gpus)}")
        if name:
            _named("name", name)
        # None: not given (under `anatomy watch`, only a rate the script gave is said unused)
        rate = DEFAULT_SAMPLE_RATE if sample_rate is None else sample_rate
        dwell = max(0.1, 5.0 / rate)
        held: list[int] = []  # stop signals that came while the run started
        if _importing_main():  # the script's top, again, in a spawned worker: the parent records
            return Run(_Unrecorded(), time.monotonic(), dwell)
        address = os.environ.get(watch_link.WATCH_ENV)
        if address:
            t0 = _watch_clock()
            link: _LocalRecording | _WatchLink | _Unrecorded = _watch_link(address, t0)
            if isinstance(link, _WatchLink) and not _local_rank():  # said once a host
                _watchs_own(link.run_id, store, sample_rate, gpus)
            if name:  # the watch's run takes the script's name, unless `--name` gave one
                link.put(protocol.Named(name, protocol.Source(_rank())))
        else:
            with stops_while_starting() as held:
                link = _record_here(store, name, rate, gpus)
            t0 = link.recording.t0 if isinstance(link, _LocalRecording) else time.monotonic()
        run = Run(link, t0, dwell)
        _current = run
    _install_exit_hooks(run)
    if held and run._stop(held[0]):  # a stop that came as the run started: it stops it now
        deliver(held[0])
    if run.task is not None:
        tasks.on_return(_task_returned)
    if baseline:
        run.phase(Phase.BASELINE)
    if kernel:
        _load_kernel(run)
    return run


def _record_here(store: str | os.PathLike | None, name: str | None, sample_rate: int,
                 gpus: Sequence[int] | None) -> _LocalRecording | _Unrecorded:
    """The run recorded by this process: a launch's first rank's (rank 0; of a launch across
    hosts, each host's first, LOCAL_RANK 0, records its host's part of the launch's run), else
    nothing (see _Unrecorded). A launch across hosts that cannot make one run (no key, a store
    that is a file) and a store that cannot be used are said in a line by that rank, nothing
    is started, and the training goes on unrecorded."""
    try:
        across = launch.rank_launch()
    except launch.LaunchRefused as error:
        if not _local_rank():
            _warn(f"not recording: {error}; the training goes on unrecorded")
        return _Unrecorded()
    first = _rank() if across is None else _local_rank()
    if first and (across is not None or launched_world_size() > 1):
        return _Unrecorded()  # the launch's (this host's) first rank records; see _Unrecorded
    try:
        if across is not None:  # before the store is made: a file would be left behind
            launch.refuse_file(resolve_path(store), across, "ANATOMY_STORE=postgresql://user@host"
                               "/db (or store= of anatomy.start, AnatomyCallback)")
        return _LocalRecording(Store(store), name, sample_rate, gpus, across)
    except StoreError as error:  # the user's training is never ended by anatomy
        _warn(f"not recording: the store {error}; the training goes on unrecorded")
    except BadLocation as error:  # `store` was read at the start: $ANATOMY_STORE's
        _warn(f"not recording: ${STORE_ENV} {error}; the training goes on unrecorded")
    except launch.LaunchRefused as error:
        _warn(f"not recording: {error}; the training goes on unrecorded")
    return _Unrecorded()


def _watch_link(address: str, t0: float) -> _WatchLink | _Unrecorded:
    """The socket of the watch this process runs under (`t0`: its run's clock). One that cannot
    be reached (the watch is gone, or its environment was copied into another shell) or a key
    that is no key is said in a line, and the training goes on unrecorded: anatomy never ends
    the user's training."""
    try:
        key = bytes.fromhex(os.environ.get(watch_link.WATCH_KEY_ENV, ""))
        if not key:
            raise ValueError(f"${watch_link.WATCH_KEY_ENV} is not set")
        return _WatchLink(address, key, t0)
    except (OSError, EOFError, ValueError, AuthenticationError) as error:
        why = getattr(error, "strerror", None) or str(error) or type(error).__name__
        _warn(f"not recording: ${watch_link.WATCH_ENV} names the socket of an `anatomy watch` "
              f"that cannot be reached ({why}); unset {watch_link.WATCH_ENV} to record this "
              "script on its own. The training goes on unrecorded")
        return _Unrecorded()


def _watchs_own(run_id: int | None, store: str | os.PathLike | None, sample_rate: int | None,
                gpus: Sequence[int] | None) -> None:
    """What start() was given that the `anatomy watch` the script runs under decides (its
    --store, --sample-rate, --gpus): said in a line where the script gave it (a store other
    than the watch's; any rate, the default's too: the watch's own is not known here). The watch
    records the run, as the environment it set says ($ANATOMY_STORE is its store): it samples
    every process of the command, which a store of the script's own would split."""
    try:
        watchs: Path | ServerUrl | str = resolve_path()  # $ANATOMY_STORE, as the watch set it
    except BadLocation:  # changed by the script since
        watchs = "the watch's store"
    given, flags = [], []
    if store is not None and not _same_store(resolve_path(store), watchs):
        given.append(f"store={os.fspath(store)}")
        flags.append("--store")
    if sample_rate is not None:
        given.append(f"sample_rate={sample_rate}")
        flags.append("--sample-rate")
    if gpus is not None:
        given.append(f"gpus={gpus!r}")
        flags.append("--gpus")
    if given:
        run = "the run" if run_id is None else f"run {run_id}"
        _warn(f"{run} is recorded by the `anatomy watch` this script runs under, into {watchs}:"
              f" its {', '.join(flags)} {'decides' if len(flags) == 1 else 'decide'}, not the"
              f" script's {', '.join(given)}")


def _same_store(one: Path | ServerUrl, other: Path | ServerUrl | str) -> bool:
    if isinstance(one, Path) and isinstance(other, Path):
        return one.resolve() == other.resolve()
    return one == other


def _watch_clock() -> float:
    """The watch's run clock ($ANATOMY_T0), else this process's own (unreadable or unset)."""
    try:
        t0 = float(os.environ.get(watch_link.T0_ENV, ""))
    except ValueError:
        return time.monotonic()
    return t0 if math.isfinite(t0) else time.monotonic()


def _importing_main() -> bool:
    """Whether this is a multiprocessing child importing its parent's script (spawn and
    forkserver run the script's top again, as `__mp_main__`, in every worker: a Pool's, a
    DataLoader's). A run started there would start a sampler before multiprocessing allows it:
    the worker died, the Pool started another, and each recorded a failed run — a thousand in
    two minutes."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _load_kernel(run: Run) -> None:
    """The walkthrough's second moment: torch's runtime loaded and, with a GPU, its CUDA
    context (a tiny tensor on the device), held and measured."""
    import torch

    if torch.cuda.is_available():
        local = _local_rank()  # a rank of several: its own GPU's context, never GPU 0's
        device = "cuda" if local is None else f"cuda:{local}"
        torch.ones((1, 1)).to(device)
        torch.cuda.synchronize(device)
    run.phase(Phase.KERNEL)


def _install_exit_hooks(run: Run) -> None:
    """How the script ends ends the run it left open (engine/exits.py): an uncaught error
    (sys.excepthook), SIGTERM or SIGHUP (a stop), and the process's end (atexit: completed, or
    the exit it made)."""
    global _exits
    previous = sys.excepthook

    def hook(kind, error, traceback):
        if not run.ended:
            run._end(ending_of(error))
        previous(kind, error, traceback)

    sys.excepthook = hook
    if threading.current_thread() is not threading.main_thread():
        # Started in a thread that trains (a worker thread of the script's): its uncaught error
        # reaches threading.excepthook, never sys.excepthook, and the process exits 0.
        starter, previous_thread_hook = threading.current_thread(), threading.excepthook

        def thread_hook(args) -> None:
            if args.thread is starter and not run.ended and args.exc_value is not None:
                run.end(args.exc_value)
            previous_thread_hook(args)

        threading.excepthook = thread_hook
    if _exits is None:
        _exits = ExitWatch()
    on_stop_signals(_stop_current)  # again after a pool's task gave them back (_task_returned)

    def at_exit() -> None:
        if run.task_over():
            run._end_with_task()
        elif not run.ended:
            run._end(_exits.ending())

    atexit.register(at_exit)
    if multiprocessing.parent_process() is not None:
        # A multiprocessing child (a Process's target, a Pool's trial) runs no atexit when
        # forked (it leaves by os._exit), and its target's error reaches neither hook: its run
        # was left running, then read "ended without a word". Its finalizers run as its target
        # ends, inside the `finally` that sees the target's error.
        def at_child_exit() -> None:
            if run.task_over():
                run._end_with_task()
            elif not run.ended:
                run._end(ending_of(sys.exc_info()[1]))

        multiprocessing.util.Finalize(None, at_child_exit, exitpriority=100)


def _after_fork_in_child() -> None:
    global _current, _current_lock
    _current_lock = threading.Lock()  # a thread of the parent may have held it at the fork
    run, _current = _current, None
    if run is not None:
        run._disown()
    default_stop_signals()  # nothing of the child's to stop: ended by them as without anatomy


os.register_at_fork(after_in_child=_after_fork_in_child)


def _stop_current(signum: int) -> bool:
    """A stop signal's handling (exits.on_stop_signals): whether it ends the process now. A
    signal that lands in a forked child before the fork's handler has disowned its parent's
    run (Pool.terminate's SIGTERM to a worker just made) is the child's own: its parent's run
    is not its to stop (it waited 10 s on a recording the child does not have)."""
    run = _current
    if run is not None and run.pid != os.getpid():
        return True
    if run is not None and run.task_over():  # a pool's worker, ended between its tasks
        run._end_with_task()
    elif run is not None:
        return run._stop(signum)
    return True

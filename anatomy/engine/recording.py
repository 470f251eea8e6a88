"""The recording of one run, whoever trains: its row and environment facts, the sampler process,
the collector that drains the queues into the store, the sampler's tail, the ending with its
retries, the disk reserve, and what happens when the recording itself fails.

Every front drives this one recording and differs only in who trains and how the run ends:

- `RunManager` (the dashboard, `anatomy run`, a sweep): anatomy's own worker process, which the
  recording *owns*: when the recording fails (a full disk, a dead sampler) it stops the worker;
- `anatomy watch -- COMMAND`: the user's command, a child process;
- `anatomy.start()` and the Trainer callback: the user's own process, which records itself.

The user's training is never ended by a failure of the recording: the run is recorded as failed
(saying why and when) and the training goes on, unrecorded. Each front tells the recording how
its run ended (`decide`); a stop, a lost sampler and a store that cannot be written are decided
here, the same for all.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.queues
import queue as queue_module
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from anatomy.analysis.machine import Device, Machine
from anatomy.analysis.report import trained_until_stopped
from anatomy.engine import kept, protocol, sampler
from anatomy.engine.collector import FLUSH_SECONDS, Collector, Outcome
from anatomy.engine.endings import Ending, OomKills, death, killed_for_memory
from anatomy.engine.figures import Figures
from anatomy.engine.lifeline import (
    Lifeline,
    forget_names,
    launch,
    signal_group,
    signals_to_the_main_thread,
)
from anatomy.engine.processes import end_tree
from anatomy.store import (
    DatabaseError,
    Message,
    RunFacts,
    RunSource,
    Store,
    TrainingSummary,
    device_key,
    store_error,
    unreachable,
)
from anatomy.store.liveness import ENDED_WITHOUT_A_WORD, is_alive
from anatomy.vocabulary import Level, Status

TAIL_SECONDS = 0.3    # the sampler outlives the training this long, so the end is measured
SAMPLER_TIMEOUT_SECONDS = 10.0
# A sampler that ends on its own may be part of a stop that reaches every process at once (a
# scheduler's SIGTERM to the job): the stop is waited for this long before the run is failed.
SAMPLER_GRACE_SECONDS = 1.0
STOP_GRACE_SECONDS = 3.0  # SIGTERM, then SIGKILL: anatomy's worker is gone well inside 5 s
RECORD_TRIES = 3  # a run's ending is written at once, or retried in the background
RETRY_SECONDS = 2.0
FIRST_SAMPLE_TIMEOUT = 30.0  # a sampler's process starts in ~1 s; a loaded machine may take longer
# How often the out-of-memory killer's count is read where the training lives (endings.OomKills):
# another process of its cgroup killed this long before the training's own end may be taken
# for its kill.
OOM_LOOK_SECONDS = 0.1


def environment_facts(info: Machine, devices: Sequence[Device]) -> RunFacts:
    """What every run's environment says of the machine: the driver, the host, and the (first)
    GPU it trains on — or, without one, the RAM and why there is no GPU."""
    machine = RunFacts.of(driver=info.driver, cuda_driver=info.cuda_driver,
                          gpu_count=info.gpu_count, host=socket.gethostname())
    if devices:
        return machine.merged(RunFacts.of(gpu_name=devices[0].name, gpu_total=devices[0].total,
                                          gpu_uuid=devices[0].uuid))
    return machine.merged(RunFacts.of(gpu_name=None, ram_total=info.ram_total,
                                      why_no_gpu=info.why_no_gpu))


def heard_signals(context):
    """What the sampler counts of the stop signals it gets, by signal number (`sampler.run`)."""
    return context.RawArray("i", signal.NSIG)


def spawn_sampler(context, samples, stop, backend: str, rate: float, t0: float,
                  gpus: Sequence[int], training_pid, lock_fds: tuple[int, ...] = (),
                  heard=None, output_dir: str | None = None,
                  expendable: bool = False) -> tuple[mp.Process, list]:
    """The sampler process, started, and what it said first. It holds the device locks with
    its parent and dies with it (engine/lifeline.py; `expendable`: ended before its parent out
    of memory, where the training is as well), and counts the stop signals it gets in
    `heard` (`heard_signals`). The training starts once the sampler reads
    (its first word: the device panel's), so that its start is measured, however long a loaded
    machine takes to start a process: [] when it said nothing in FIRST_SAMPLE_TIMEOUT (whoever
    collects finds out what became of it)."""
    lock = lock_fds if len(lock_fds) > 1 else (lock_fds[0] if lock_fds else None)
    process = context.Process(
        target=sampler.run, name="anatomy-sampler", daemon=True,
        args=(samples, stop, backend, rate, t0, list(gpus), training_pid,
              Lifeline("anatomy-sampler", lock, death_signal=signal.SIGTERM, expendable=expendable),
              heard, output_dir))
    launch(process)
    try:
        first = samples.get(timeout=FIRST_SAMPLE_TIMEOUT)
    except queue_module.Empty:
        return process, []
    forget_names(samples, stop, training_pid)  # it has opened them: it reads
    return process, [first]


class Training(Protocol):
    """The process that trains, as the recording follows it."""

    pid: int

    def exit_code(self) -> int | None:
        """None while it trains; then its exit code (-N: killed by signal N)."""

    def end(self, grace: float) -> None:
        """End it and everything under it: SIGTERM, SIGKILL after `grace` seconds."""


class WorkerProcess:
    """Anatomy's own worker, a multiprocessing child that leads a process group."""

    def __init__(self, process: mp.Process):
        self.process, self.pid = process, process.pid

    def exit_code(self) -> int | None:
        return self.process.exitcode  # polls: multiprocessing reaps it and keeps the code

    def end(self, grace: float) -> None:
        end_tree(self.pid, lambda: self.process.exitcode is not None, self.process.join, grace)


class Part(Protocol):
    """A host's part of a run across hosts (engine/launch.py): its ranks, and its ending, after
    which the run's, written by the last host to end."""

    ranks: dict[int, int | None]

    def end(self, ending: Ending, samples_sent: int | None) -> Ending | None:
        """This host's part ended so; the run's ending if this host wrote it."""


def on_host(host: int, message: Any) -> Any:
    """A message of the `host`-th host's sampler, its devices as the run stores them
    (`device_key`), its device panel's host row under its place."""
    match message:
        case protocol.Samples(samples=samples):
            return protocol.Samples([s._replace(gpu=device_key(host, s.gpu)) for s in samples])
        case protocol.DeviceStatus(host=machine, gpus=gpus, processes=processes):
            return protocol.DeviceStatus(
                machine._replace(host=host), [g._replace(gpu=device_key(host, g.gpu)) for g in gpus],
                [p._replace(gpu=device_key(host, p.gpu)) for p in processes])
    return message


class Recording:
    """One run's recording. In order: `start_sampler()` (the baseline is measured before the
    training starts), `create_run()` (its row), `follow(training)` (the collector thread, until
    the training has ended and the sampler has had its tail); `done` is set once the ending is
    written (or, on a full disk, kept and retried: `ending.recorded` is False).

    `owns_training`: the training exists only for this run (anatomy's worker): whatever stops
    the recording stops it too. `events` is the queue the training's messages come on.
    `decide(outcome, exit_code)` says how the run ended when it was neither stopped nor lost;
    `observe(message)` sees each of the training's messages before it is stored; `tell(text)`
    is told at once when the recording is lost while the training goes on."""

    def __init__(self, store: Store, backend: str, gpus: Sequence[int], sample_rate: float, *,
                 owns_training: bool, events=None, lock_fds: tuple[int, ...] = (),
                 t0: float | None = None,
                 decide: Callable[[Outcome, int | None], Ending] | None = None,
                 observe: Callable[[Any], None] | None = None,
                 tell: Callable[[str], None] | None = None):
        self.store, self.backend, self.gpus = store, backend, list(gpus)
        self.sample_rate, self.owns_training, self.lock_fds = sample_rate, owns_training, lock_fds
        self.context = mp.get_context("spawn")  # never fork after torch/CUDA is loaded
        self.t0 = time.monotonic() if t0 is None else t0
        # One queue each: a worker killed mid-put leaves its queue's lock held for good, and the
        # sampler, on a queue of its own, must still deliver every sample after that.
        self.samples = self.context.Queue()
        self.events = events if events is not None else queue_module.Queue()
        self.stop_sampler = self.context.Event()
        self.training_pid = self.context.Value("i", 0)  # shared with the sampler
        self.heard = heard_signals(self.context)  # the stop signals the sampler got
        self.decide = decide or _completed_unless_failed
        self.oom_kills: OomKills | None = None  # the training's: the kernel's SIGKILL or another's
        self.observe, self.tell = observe, tell
        self.sampler: mp.Process | None = None
        self.training: Training | None = None
        self.run_id: int | None = None
        self.collector: Collector | None = None
        self.outcome = Outcome()
        self.exit_code: int | None = None
        self.stop_reason: str | None = None
        # A script's figures as a stop's signal handler left them (Run._stop): the summary,
        # where none came by the queue
        self.stop_summary: TrainingSummary | None = None
        self.stop_at: float | None = None  # the run's clock when the stop was asked for
        self.lost_at: float | None = None  # the recording was lost here, the training going on
        self.ending: Ending | None = None
        self.sampling = threading.Event()  # a sample has been collected
        self.done = threading.Event()
        self.finished: list[Callable[[], None]] = []  # called once the run has ended
        self._stopping = threading.Lock()  # one ending of the training's tree at a time
        self._early: list = []  # what the sampler said before the collector began
        self._heard_training = False  # a message of the training's has come
        self.figures = Figures(self.gpus, backend, self.t0)  # as they come: trackers, /metrics
        self.part: Part | None = None  # one host's part of a run across hosts
        self.host = 0  # its place among the run's hosts: its devices are stored apart
        self.run_ending: Ending | None = None  # a run across hosts': written by this host
        self.identity: str | None = None  # a database server's store's id: where it is kept
        self._kept: tuple | None = None  # what the file of its kept writes holds (`_keep`)

    def now(self) -> float:
        return time.monotonic() - self.t0

    # --- starting ---
    def start_sampler(self, output_dir: str | None = None) -> None:
        """The sampler process (`spawn_sampler`), before the training starts; `output_dir`: the
        training's folder, which the sampler removes if this process dies."""
        self.sampler, first = spawn_sampler(self.context, self.samples, self.stop_sampler,
                                            self.backend, self.sample_rate, self.t0, self.gpus,
                                            self.training_pid, self.lock_fds, self.heard,
                                            output_dir, expendable=self.owns_training)
        self._early += first

    def create_run(self, options: dict, info: Machine, gpu: int, environment: RunFacts, *,
                   name: str | None = None, sweep: str | None = None,
                   source: RunSource | None = None, preset: str | None = None) -> int:
        """The run's row (running, recorded by this process) and room for its ending on a
        full disk. StoreError when the store cannot take it."""
        try:
            run_id = self.store.create_run(options, info.backend, info.memory_api, gpu,
                                           environment, name=name, sweep=sweep, source=source,
                                           preset=preset)
        except DatabaseError as error:
            raise store_error(self.store.path, error) from None
        return self.adopt(run_id)

    def adopt(self, run_id: int) -> int:
        """Record into `run_id`, made already (by `create_run`, or by the first host of a run
        across hosts)."""
        self.run_id = run_id
        self.store.reserve(self.run_id)
        if self.store.engine_name == "postgresql":  # its server may go away: keep its writes
            with contextlib.suppress(DatabaseError):
                self.identity = self.store.identity()
        self.figures.run_id = self.run_id
        self.collector = Collector(self.store, self.run_id, self.outcome, self.figures,
                                   say=self._say, clock=self.now)
        return self.run_id

    def follow(self, training: Training) -> None:
        """Collect in a thread of its own until `training` has ended."""
        self.training = training
        self.training_pid.value = training.pid
        self.oom_kills = OomKills(training.pid)
        self.collector.change_run(worker_pid=training.pid)  # with its first write
        threading.Thread(target=self._collect, name=f"anatomy-collector-{self.run_id}",
                         daemon=True).start()

    def abandon(self, reason: str | None = None) -> None:
        """Nothing trains after all (it could not be started): the sampler goes, and a run
        already created ends failed, saying `reason`."""
        if self.sampler is not None:
            self.stop_sampler.set()
            self.sampler.join(5)
            if self.sampler.is_alive():
                self.sampler.kill()
        if self.run_id is not None and reason is not None:
            self.store.free_reserve(self.run_id)
            with contextlib.suppress(DatabaseError):
                self.store.finish(self.run_id, Status.FAILED, reason)

    # --- stopping ---
    def request_stop(self, reason: str) -> None:
        """Mark the run as stopping, at once (safe in a signal handler): whatever ends the
        training from now on, the run ends stopped, and its phases end here."""
        if self.stop_reason is None:
            self.stop_at = self.now()
            self.stop_reason = reason

    def pause_training(self, paused: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) anatomy's own training and everything under it
        (safe in a signal handler): a terminal's Ctrl-Z, then `fg` or `bg`, reach the front's
        process group only, and the worker leads a group of its own (engine/lifeline.py). A
        training that is not the run's own (a watched command, a script) is the user's."""
        if self.owns_training and self.training is not None:
            signal_group(self.training.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def end_training(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """End the training's whole tree: SIGTERM, then SIGKILL after `grace` seconds."""
        if self.training is not None:
            with self._stopping:
                self.training.end(grace)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    # --- collecting ---
    def _collect(self) -> None:
        """Drain both queues into the store until the run is over, then decide and record how it
        ended. Whatever stops the collector (a full disk, a store that is gone) stops the
        recording, and the reason is recorded when the store can take it."""
        signals_to_the_main_thread()
        try:
            self._follow()
            ending = self._decided()
        except Exception as error:  # noqa: BLE001 - the run must end, and say why, whatever it was
            ending = self._lost(error)
        outcome = self.outcome
        if self.stop_at is not None:
            outcome.phases_end = self.stop_at
        elif self.lost_at is not None and outcome.worker_ended is None:
            outcome.phases_end = self.lost_at
        else:
            outcome.phases_end = min(outcome.worker_seen, outcome.worker_left or float("inf"))
        try:
            self._record(ending)
            self.store.free_reserve(self.run_id)
        finally:
            self._let_go()
            for finished in self.finished:
                finished()
            self.done.set()

    def _let_go(self) -> None:
        """The queue and the flags shared with the run's processes, let go now that they are
        gone: their semaphores are unlinked here, not at an exit that may never come (a script
        ended by a signal leaves them to the resource tracker, which warns of leaks)."""
        for shared in (self.samples, self.events):
            if isinstance(shared, mp.queues.Queue):
                shared.close()
        self.samples = self.stop_sampler = self.training_pid = None
        if isinstance(self.events, mp.queues.Queue):
            self.events = queue_module.Queue()

    def _handle(self, message: Any) -> None:
        self.collector.handle(on_host(self.host, message) if self.host else message)

    def _drain_samples(self) -> None:
        if not self.host:
            self.collector.drain(self.samples)
            return
        while True:
            try:
                self._handle(self.samples.get_nowait())
            except queue_module.Empty:
                return

    def _drain_events(self) -> None:
        while True:
            try:
                message = self.events.get_nowait()
            except queue_module.Empty:
                return
            if not self._heard_training and isinstance(self.events, mp.queues.Queue):
                forget_names(self.events)  # the training has opened its queue: it speaks
            self._heard_training = True
            if self.observe is not None:
                self.observe(message)
            self.collector.handle(message)

    def _follow(self) -> None:
        collector, outcome = self.collector, self.outcome
        sampler_over_at = None
        looked_at = time.monotonic()
        for message in self._early:
            self._handle(message)
        while True:
            try:
                self._handle(self.samples.get(timeout=FLUSH_SECONDS / 2))
            except queue_module.Empty:
                pass
            self._drain_samples()  # all of it: a loaded machine must not lag
            self._drain_events()
            collector.flush_when_due()
            if collector.sampled and not self.sampling.is_set():
                self.sampling.set()
            now = time.monotonic()
            if outcome.worker_ended is None:
                code = self.training.exit_code()
                if code is None:
                    outcome.worker_seen = self.now()
                    if now - looked_at >= OOM_LOOK_SECONDS:
                        self.oom_kills.look()
                        looked_at = now
                else:
                    outcome.worker_ended, self.exit_code = self.now(), code
            sampler_over = outcome.samples_sent is not None or (
                not self.sampler.is_alive() and self.samples.empty())
            if sampler_over and sampler_over_at is None:
                sampler_over_at = now
            if outcome.worker_ended is None:
                # Training goes on without its sampler: unless a stop is on its way, the run
                # ends here rather than completed with a hole in its samples.
                if (sampler_over_at is not None and self.stop_reason is None
                        and outcome.sampler_lost is None
                        and now - sampler_over_at >= SAMPLER_GRACE_SECONDS):
                    outcome.sampler_lost = self._sampler_lost(sampler_over_at)
                    if not self.owns_training:
                        self.lost_at = sampler_over_at - self.t0
                        self._say(outcome.sampler_lost)
                        break
                    self._end_processes()
                continue
            if outcome.samples_sent is not None:
                break
            since_training = self.now() - outcome.worker_ended
            if since_training >= TAIL_SECONDS:
                self.stop_sampler.set()
                if sampler_over:
                    break  # the sampler died without its last word: keep what came
                if since_training > SAMPLER_TIMEOUT_SECONDS:
                    self.sampler.kill()  # hung: keep what came; samples_sent stays unknown
        self._drain_events()
        collector.flush()
        self.sampler.join(timeout=5)

    def _sampler_lost(self, over_at: float) -> str:
        when = over_at - self.t0
        if self.outcome.sampler_ended_by is not None:
            what = f"stopped ({self.outcome.sampler_ended_by})"
        else:
            what = death(self.sampler.exitcode, "died")
        if self.owns_training:
            return (f"the memory sampler {what} at {when:.1f} s while training went on: the run"
                    " was stopped there, so its samples have no hole; what was recorded until"
                    " then is kept")
        return (f"the memory sampler {what} at {when:.1f} s while training went on: the"
                " recording stopped there and the training went on unrecorded; what was"
                " recorded until then is kept")

    def _decided(self) -> Ending:
        if self.stop_reason is not None:
            return Ending(Status.STOPPED, self.stop_reason)
        if self.outcome.sampler_lost is not None:
            return Ending(Status.FAILED, self.outcome.sampler_lost)
        ending = self.decide(self.outcome, self.exit_code)
        if ending.status == Status.FAILED and self.oom_kills.killed(self.exit_code):
            return Ending(Status.OOM, f"{killed_for_memory('it')} — {ending.error}")
        return ending

    def _lost(self, error: Exception) -> Ending:
        """The collector failed (the store cannot be written): the recording ends here."""
        self.store.free_reserve(self.run_id)  # room to record it, if the disk is full
        self.collector.drop()  # what the store refused stays out: the ending goes in alone
        problem = (store_error(self.store.path, error).reason if isinstance(error, DatabaseError)
                   else f"{type(error).__name__}: {error}")
        if self.owns_training:
            self._end_processes()
            text = (f"the store {self.store.path} could not be written ({problem}); the run was"
                    f" stopped at {self.now():.1f} s and what was written before is kept")
        else:
            self.lost_at = self.now()
            self._end_sampler()
            text = (f"the store {self.store.path} could not be written ({problem}); the"
                    f" recording stopped at {self.lost_at:.1f} s and the training went on"
                    " unrecorded; what was written before is kept")
            self._say(text)
        return Ending(Status.FAILED, text)

    def _say(self, text: str) -> None:
        if self.tell is not None:
            self.tell(f"run {self.run_id}: {text}")

    def _end_processes(self) -> None:
        """The training's whole tree, then the sampler (its count no longer matters)."""
        self.end_training()
        self._end_sampler()

    def _end_sampler(self) -> None:
        self.stop_sampler.set()
        self.sampler.join(TAIL_SECONDS + 1)
        if self.sampler.is_alive():
            self.sampler.kill()
            self.sampler.join(2)

    # --- the ending ---
    def _record(self, ending: Ending) -> None:
        """Write the ending now, or once a database server that cannot be reached is back
        (whoever waits for the run waits for it, told so), or keep it and retry in the
        background (a full disk may free up): `ending.recorded` says which."""
        attempt = 0
        while attempt < RECORD_TRIES:
            try:
                self._write_ending(ending)
                self.ending = ending
                if self._kept is not None:
                    kept.forget(self.identity, self.run_id)
                return
            except DatabaseError as error:
                if unreachable(error):
                    self._keep(ending)
                    time.sleep(RETRY_SECONDS)
                    continue
                attempt += 1
                time.sleep(0.3 * attempt)
        self.ending = Ending(ending.status, ending.error, recorded=False)
        threading.Thread(target=self._record_later, args=(ending,),
                         name=f"anatomy-record-{self.run_id}", daemon=True).start()

    def _keep(self, ending: Ending) -> None:
        """The training has ended and the server is away: the ending and every write that waits
        for it go to a file as well (engine/kept.py), said once, and again whenever part of them
        has been written meanwhile (a server back for a moment), so that the file never holds a
        row the store has. A host's part of a run across hosts is not kept (its ending is the
        launch's, engine/launch.py)."""
        collector, rows = self.collector, self.collector.rows
        if self.identity is None or self.part is not None:
            return
        first, where = self._kept is None, kept.path_of(self.identity, self.run_id)
        said = None
        if first:
            words = ending.status + (f": {ending.error}" if ending.error else "")
            at = self.outcome.worker_ended if self.outcome.worker_ended is not None else self.now()
            what = kept.Kept(self.run_id, rows, collector.changes, self.outcome, ending).words()
            said = (f"the training has ended ({words}) at {at:.1f} s while the store"
                    f" {self.store.path} is out of reach: its ending and what was recorded"
                    f" meanwhile ({what}) wait for it, kept in {where} too; should this process"
                    " end first, the next `anatomy run`, `anatomy sweep` or `anatomy dashboard`"
                    " on this store writes them in")
            rows.messages.append(Message(self.now(), Level.WARNING, said))
        holds = tuple(map(len, (rows.samples, rows.phases, rows.steps, rows.messages, rows.hosts,
                                rows.gpus, rows.processes, collector.changes)))
        if self._kept == holds:
            return
        self._kept = holds
        try:
            kept.keep(kept.Kept(self.run_id, rows, collector.changes, self.outcome, ending,
                                self.stop_summary), self.identity)
        except OSError as error:
            if first:
                self._say(f"the training has ended ({ending.status}) while the store"
                          f" {self.store.path} is out of reach: what waits for it is held in"
                          f" this process only, as {where} cannot be written ({error.strerror});"
                          " ending this process loses it")
            return
        if said is not None:
            self._say(said)

    def _record_later(self, ending: Ending) -> None:
        signals_to_the_main_thread()
        while True:
            time.sleep(RETRY_SECONDS)
            try:
                self._write_ending(ending)
            except DatabaseError:
                continue
            self.ending = ending
            return

    def _write_ending(self, ending: Ending) -> None:
        self.collector.flush(keep=False)  # what a database server's outage kept, first
        if self.part is not None:
            self._write_part(ending)
            return
        write_ending(self.store, self.run_id, self.outcome, ending, self.stop_summary)

    def _write_part(self, ending: Ending) -> None:
        """A host's part of a run across hosts: only its own ranks' phases end here (the others'
        hosts end theirs), the run's summary is written by the host of its lowest rank, and the
        run ends once every host's part has (engine/launch.py)."""
        store, end = self.store, self.outcome.phases_end
        # A host whose command marks nothing has its one phase under rank 0: host 0's only.
        for rank in sorted(self.part.ranks) or ([0] if self.host == 0 else []):
            last = store.last_step(self.run_id, rank)
            store.close_phases(self.run_id, min(end, last.t) if last is not None and
                               len(self.part.ranks) > 1 else end, rank)
        summary = self.outcome.training_summary()
        lowest = self.collector.summary_rank
        if summary.to_dict() and (lowest == 0 or (lowest is None and self.host == 0)):
            self.store.update_run(self.run_id, summary=summary)
        self.run_ending = self.part.end(ending, self.outcome.samples_sent)


def write_ending(store: Store, run_id: int, outcome: Outcome, ending: Ending,
                 stop_summary: TrainingSummary | None) -> None:
    """A run's ending once its rows are written: its open phases closed, its figures, its
    status; by its recording, or by a later manager from what the recording kept."""
    end = outcome.phases_end
    ranks = store.ranks(run_id)
    if len(ranks) > 1:  # a rank that died early (killed) holds its memory until its last step
        for rank in ranks:
            last = store.last_step(run_id, rank)
            if last is not None and last.t < end:
                store.close_phases(run_id, last.t, rank)
    store.close_phases(run_id, end)
    values: dict[str, Any] = {"samples_sent": outcome.samples_sent}
    if outcome.summary is None:
        # A script's own figures, else a stopped Trainer's from its steps (it never returned
        # to report them, and a stopped run's time and speed were blank)
        outcome.summary = stop_summary or (
            trained_until_stopped(store, run_id) if ending.status == Status.STOPPED else None)
    summary = outcome.training_summary()
    if summary.to_dict():
        values["summary"] = summary
    store.update_run(run_id, **values)
    store.finish(run_id, ending.status, ending.error)


def _completed_unless_failed(outcome: Outcome, code: int | None) -> Ending:
    if outcome.failure is not None:
        return Ending(outcome.failure.status, outcome.failure.text)
    return Ending(Status.COMPLETED)


def end_orphans(store: Store, ours: Sequence[int] = ()) -> list[int]:
    """Write the ending readers already show (store/liveness.py) for the runs still marked
    running whose recorder is gone (killed, or stopped before it could write it): failed,
    keeping what they recorded, their open phases ended at their last sample — unless their
    recording kept on this host what it could not write (engine/kept.py): then that, and the
    run's own ending (a run another host's manager ended so meanwhile too). `ours`: runs this
    process records. The runs' ids; a store that cannot be written now (a full disk) is left as
    it is, for the next try."""
    closed = []
    try:
        runs = store.runs(as_recorded=True)
        identity = (store.identity() if store.engine_name == "postgresql"
                    and kept.folder().is_dir() else None)
    except DatabaseError:
        return closed
    waiting = kept.run_ids(identity) if identity else set()
    for run in runs:
        if run.id in ours or is_alive(run):
            continue
        unended = run.status == Status.RUNNING or run.error == ENDED_WITHOUT_A_WORD
        if run.id in waiting and not unended:  # its recording wrote it, then ended at once
            kept.forget(identity, run.id)
        if run.status != Status.RUNNING and not (run.id in waiting and unended):
            continue
        store.free_reserve(run.id)
        try:
            if not (run.id in waiting and _write_kept(store, identity, run.id)):
                store.close_phases(run.id, store.last_time(run.id))
                store.finish(run.id, Status.FAILED, ENDED_WITHOUT_A_WORD)
        except DatabaseError:
            continue
        closed.append(run.id)
    return closed


def _write_kept(store: Store, identity: str, run_id: int) -> bool:
    """What the run's recording kept on this host (engine/kept.py), written now, then its
    ending; False where nothing readable is kept."""
    found = kept.found(identity, run_id)
    if found is None:
        return False
    collector = Collector(store, run_id, found.outcome)
    collector.rows, collector.changes = found.rows, found.changes
    at = max((m.t for m in found.rows.messages), default=found.outcome.phases_end)  # the last
    collector.rows.messages.append(Message(
        at, Level.WARNING, f"written from {kept.path_of(identity, run_id)} by a later anatomy:"
                           " the process that recorded the run ended before its store was back"))
    collector.flush(keep=False)
    write_ending(store, run_id, found.outcome, found.ending, found.stop_summary)
    kept.forget(identity, run_id)
    return True

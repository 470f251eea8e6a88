"""The run manager: validates, starts the sampler and the worker, collects into the store, stops.

One manager per process (the CLI, or the dashboard's server through one cached resource). One run
at a time per GPU, held by a lock file that other processes respect too; a sweep holds its
device's lock across all its runs (`reserve`), so nothing else starts between two of them.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import queue as queue_module
import signal
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from anatomy.analysis.machine import Machine
from anatomy.analysis.options import InvalidOptions, RunOptions, validate
from anatomy.engine import sampler, worker
from anatomy.engine.collector import FLUSH_SECONDS, Collector, Outcome
from anatomy.engine.devices import machine
from anatomy.engine.lifeline import Lifeline, launch, signal_group
from anatomy.store import RunRow, Store, store_error, why

__all__ = ["DeviceBusy", "DeviceLock", "Ending", "InvalidOptions", "RunManager", "is_live",
           "live_run", "machine"]

LOCK_DIR_ENV = "ANATOMY_LOCK_DIR"  # where the per-device locks live; machine-wide by default
TAIL_SECONDS = 0.3    # the sampler outlives the worker this long, so the end is measured
SAMPLER_TIMEOUT_SECONDS = 10.0
STOP_GRACE_SECONDS = 3.0  # SIGTERM, then SIGKILL: the tree is gone well inside 5 s
# A sampler that ends on its own may be part of a stop that reaches every process at once (a
# scheduler's SIGTERM to the job): the stop is waited for this long before the run is failed.
SAMPLER_GRACE_SECONDS = 1.0
RECORD_TRIES = 3  # a run's ending is written at once, or retried in the background


class DeviceBusy(RuntimeError):
    """The device is taken: another run trains on it, or a sweep holds it."""


def device_key(options: RunOptions, info: Machine) -> str:
    """The lock a run with these options takes: its (first) GPU's (by NVML index, which every
    process agrees on whatever its CUDA_VISIBLE_DEVICES), or the machine's without a GPU."""
    return device_keys(options, info)[0]


def device_keys(options: RunOptions, info: Machine) -> list[str]:
    """Every lock a run takes: one per GPU it trains on (several with --gpus)."""
    if not info.has_gpu:
        return ["cpu"]
    return [f"gpu{info.devices[g].nvml_index}" for g in options.gpu_list()]


def device_words(options: RunOptions, info: Machine, key: str | None = None) -> str:
    if not info.has_gpu:
        return "this machine"
    gpus = options.gpu_list()
    if key is not None:
        gpus = tuple(g for g in gpus if f"gpu{info.devices[g].nvml_index}" == key) or gpus
    return f"GPU {gpus[0]}"


class DeviceLock:
    """A machine-wide lock on one device: a `flock` on <tmp>/anatomy-locks/<key>.lock, whose
    file says who holds it, so the one refused can be told."""

    def __init__(self, key: str):
        directory = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "anatomy-locks")
        directory.mkdir(parents=True, exist_ok=True)
        self.key = key
        self.path = directory / f"{key}.lock"
        self.file = None

    def acquire(self, holder: str) -> bool:
        try:
            self.file = open(self.path, "a+")
        except OSError as error:
            raise DeviceBusy(f"the device lock {self.path} cannot be opened: {error.strerror}"
                             ) from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            self.file = None
            return False
        self.describe(holder)
        return True

    def describe(self, holder: str) -> None:
        """Say who holds the lock (it must be held)."""
        self.file.seek(0)
        self.file.truncate()
        self.file.write(holder)
        self.file.flush()

    def holder(self) -> str:
        """Who holds the lock, in words, as its holder wrote it."""
        try:
            return self.path.read_text().strip() or "another run"
        except OSError:
            return "another run"

    @property
    def held(self) -> bool:
        return self.file is not None

    def fileno(self) -> int:
        return self.file.fileno()

    def release(self) -> None:
        """Let go of our share. Never LOCK_UN: the run's processes share this open file (and its
        flock) and may outlive us; the lock ends when the last descriptor on it closes."""
        if self.file is not None:
            self.file.close()
            self.file = None


@dataclass(frozen=True)
class Ending:
    """How a run ended, as its collector decided: what the store gets, and what a caller is told
    even when the store cannot take it (a full disk)."""
    status: str
    error: str | None = None
    recorded: bool = True


@dataclass
class ActiveRun:
    run_id: int
    worker: mp.Process
    sampler: mp.Process
    stop_sampler: object
    lock: DeviceLock
    owns_lock: bool  # False when a sweep's reservation lent it: the sweep releases it
    sampler_queue: object
    worker_queue: object
    worker_pid: object  # shared with the sampler; kept alive here as long as the run is
    t0: float
    thread: threading.Thread | None = None
    more_locks: list[DeviceLock] = field(default_factory=list)  # the other GPUs' (--gpus)
    stop_requested: bool = False
    stop_reason: str = "stopped by the user"
    stop_at: float | None = None  # the run's clock when the stop was asked for
    stopping: threading.Lock = field(default_factory=threading.Lock)  # one stop at a time
    done: threading.Event = field(default_factory=threading.Event)

    def now(self) -> float:
        return time.monotonic() - self.t0


class RunManager:
    def __init__(self, store: Store | None = None):
        self.store = store or Store()
        self.context = mp.get_context("spawn")  # never fork after torch/CUDA is loaded
        self.active: dict[int, ActiveRun] = {}
        self.endings: dict[int, Ending] = {}  # how this manager's runs ended, recorded or not
        self._guard = threading.Lock()
        self.close_orphans()

    def close_orphans(self) -> list[int]:
        """Runs still marked running whose processes are gone (the server or CLI that ran them
        was killed or stopped first) become failed, keeping what they recorded; so do such
        sweeps. Returns the runs' ids. A store that cannot be written now (a full disk) is left
        as it is: the next manager tries again."""
        closed = []
        try:
            runs = self.store.runs()
        except sqlite3.Error:
            return closed
        for run in runs:
            if run.status != "running" or run.id in self.active:
                continue
            if _alive(run.worker_pid):
                continue  # another process on this machine is running it
            self.store.free_reserve(run.id)
            try:
                self.store.close_phases(run.id, self.store.last_time(run.id))
                self.store.finish(run.id, "failed", "its processes ended before the run finished:"
                                  " the CLI or dashboard that ran it was killed or stopped; what"
                                  " it recorded is kept")
            except sqlite3.Error:
                continue
            closed.append(run.id)
        try:
            for sweep in self.store.sweeps():
                if sweep.status == "running" and not _alive(sweep.pid):
                    self.store.update_sweep(sweep.id, status="failed", ended_at=time.time(),
                                            error="the process that ran it ended before the sweep"
                                                  " did")
        except sqlite3.Error:
            pass
        return closed

    # --- reserving a device (sweeps) ---
    def device_key(self, options: RunOptions) -> str:
        return device_key(options, machine())

    def reserve(self, options: RunOptions, holder: str) -> DeviceLock:
        """Hold the device these options train on until `release()`: runs started with the lock
        use it, anything else is told it is busy. DeviceBusy if it is taken already."""
        info = machine()
        errors = validate(options, info.gpu_count)
        if errors:
            raise InvalidOptions(errors)
        lock = DeviceLock(device_key(options, info))
        if not lock.acquire(holder):
            raise DeviceBusy(f"{device_words(options, info)} is busy: {lock.holder()}")
        return lock

    # --- starting ---
    def start(self, options: RunOptions, name: str | None = None, sweep: str | None = None,
              dwell: float | None = None, reservation: DeviceLock | None = None) -> int:
        """Validate, take the device (or use the `reservation` a sweep holds), record the run
        and start its processes; the run's id. Nothing starts when the options are wrong
        (InvalidOptions), the device is taken (DeviceBusy) or the store cannot take the run
        (StoreError)."""
        info = machine()
        errors = validate(options, info.gpu_count)
        if errors:
            raise InvalidOptions(errors)
        key = device_key(options, info)
        if reservation is not None and reservation.held and reservation.key == key:
            lock = reservation
        else:
            lock = DeviceLock(key)
            if not lock.acquire(f"run by pid {os.getpid()}"):
                raise DeviceBusy(f"{device_words(options, info)} is busy: {lock.holder()}")
        try:
            more = self._more_locks(options, info, key, f"run by pid {os.getpid()}")
        except DeviceBusy:
            if lock is not reservation:
                lock.release()
            raise
        environment = {"driver": info.driver, "cuda_driver": info.cuda_driver,
                       "gpu_count": info.gpu_count}
        gpu_nvml = 0
        if info.has_gpu:
            device = info.devices[options.gpu_list()[0]]
            gpu_nvml = device.nvml_index
            environment.update(gpu_name=device.name, gpu_total=device.total, gpu_uuid=device.uuid)
        else:
            environment.update(gpu_name=None, ram_total=info.ram_total, why_no_gpu=info.why_no_gpu)
        if options.distributed:  # several processes: which GPUs (NVML), and how they share
            environment.update(world_size=options.world_size, strategy=options.strategy,
                               gpus=[info.devices[g].nvml_index for g in options.gpu_list()]
                               if info.has_gpu else [])
        try:
            run_id = self.store.create_run(options.to_dict(), info.backend, info.memory_api,
                                           gpu_nvml, environment, name=name, sweep=sweep)
        except sqlite3.Error as error:
            if lock is not reservation:
                lock.release()
            for other in more:
                other.release()
            raise store_error(self.store.path, error) from None
        if lock is not reservation:
            lock.describe(f"run {run_id} (pid {os.getpid()})")
        for other in more:
            other.describe(f"run {run_id} (pid {os.getpid()})")
        try:
            self._spawn(run_id, options, info, lock, lock is not reservation, dwell, more)
        except BaseException as error:
            if lock is not reservation:
                lock.release()
            for other in more:
                other.release()
            self.store.finish(run_id, "failed", f"could not start the run: {error}")
            raise
        return run_id

    @staticmethod
    def _more_locks(options: RunOptions, info: Machine, first: str, holder: str
                    ) -> list[DeviceLock]:
        """The locks of a run's other GPUs (--gpus 0,1), all or none: DeviceBusy names the
        first that is taken."""
        taken: list[DeviceLock] = []
        for key in device_keys(options, info):
            if key == first:
                continue
            lock = DeviceLock(key)
            if not lock.acquire(holder):
                for other in taken:
                    other.release()
                raise DeviceBusy(f"{device_words(options, info, key)} is busy: {lock.holder()}")
            taken.append(lock)
        return taken

    def _spawn(self, run_id: int, options: RunOptions, info: Machine, lock: DeviceLock,
               owns_lock: bool, dwell: float | None, more_locks: list[DeviceLock] | None = None
               ) -> ActiveRun:
        # One queue each: a worker killed mid-put leaves its queue's lock held for good, and
        # the sampler, on a queue of its own, must still deliver every sample after that.
        sampler_queue, worker_queue = self.context.Queue(), self.context.Queue()
        stop_sampler = self.context.Event()
        worker_pid = self.context.Value("i", 0)
        t0 = time.monotonic()
        gpus = [d.nvml_index for d in info.devices]
        # Both children hold the device lock with us and die with us (engine/lifeline.py).
        sampler_process = self.context.Process(
            target=sampler.run, name=f"anatomy-sampler-{run_id}", daemon=True,
            args=(sampler_queue, stop_sampler, info.backend, options.sample_rate, t0, gpus,
                  worker_pid, Lifeline("anatomy-sampler", lock.fileno(),
                                       death_signal=signal.SIGTERM)))
        launch(sampler_process)
        if dwell is None:
            dwell = max(0.1, 5.0 / options.sample_rate)
        cuda_device = None
        if info.has_gpu:
            # By UUID where NVML gives one: CUDA may number the GPUs in another order than NVML.
            # Several GPUs: all of them, in --gpus order (rank r trains on cuda:r).
            cuda_device = ",".join(info.devices[g].uuid or str(info.devices[g].nvml_index)
                                   for g in options.gpu_list())
        more_locks = more_locks or []
        fds = (lock.fileno(), *(m.fileno() for m in more_locks))
        worker_process = self.context.Process(
            target=worker.main, name=f"anatomy-worker-{run_id}",
            args=(worker_queue, options.to_dict(), t0, cuda_device, dwell,
                  Lifeline("anatomy-worker", fds if more_locks else lock.fileno(),
                           own_group=True)))
        try:
            launch(worker_process)
        except BaseException:
            sampler_process.kill()
            raise
        worker_pid.value = worker_process.pid
        active = ActiveRun(run_id, worker_process, sampler_process, stop_sampler, lock, owns_lock,
                           sampler_queue, worker_queue, worker_pid, t0, more_locks=more_locks)
        active.thread = threading.Thread(target=self._collect, args=(active,),
                                         name=f"anatomy-collector-{run_id}", daemon=True)
        with self._guard:
            self.active[run_id] = active
        self.store.reserve(run_id)
        try:
            self.store.update_run(run_id, worker_pid=worker_process.pid)
        except sqlite3.Error:
            pass  # the collector meets the same store and ends the run, saying why
        active.thread.start()
        return active

    # --- collecting ---
    def _collect(self, active: ActiveRun) -> None:
        """Drain both queues into the store until the run is over, watching both processes; then
        decide and record how it ended. Whatever stops the collector (a full disk, a store that
        fails) stops the run's processes too, and the reason is recorded when the store can take
        it."""
        outcome = Outcome()
        try:
            self._follow(active, outcome)
            ending = self._ending(active, outcome)
        except Exception as error:  # noqa: BLE001 - the run must end, and say why, whatever it was
            self.store.free_reserve(active.run_id)  # room to record it, if the disk is full
            self._end_processes(active)
            if isinstance(error, sqlite3.Error):
                problem = why(error)
            else:
                problem = f"{type(error).__name__}: {error}"
            ending = Ending("failed", f"the store {self.store.path} could not be written"
                            f" ({problem}); the run was stopped at {active.now():.1f} s and what"
                            " was written before is kept")
        if active.stop_at is not None:
            outcome.phases_end = active.stop_at
        else:
            outcome.phases_end = min(outcome.worker_seen, outcome.worker_left or float("inf"))
        try:
            self._record(active.run_id, outcome, ending)
            self.store.free_reserve(active.run_id)
        finally:
            if active.owns_lock:
                active.lock.release()
            for other in active.more_locks:
                other.release()
            with self._guard:
                self.active.pop(active.run_id, None)
            active.done.set()

    def _follow(self, active: ActiveRun, outcome: Outcome) -> None:
        collector = Collector(self.store, active.run_id, outcome)
        handle = collector.handle
        sampler_over_at = None

        while True:
            try:
                handle(active.sampler_queue.get(timeout=FLUSH_SECONDS / 2))
            except queue_module.Empty:
                pass
            collector.drain(active.sampler_queue)  # all of it: a loaded machine must not lag
            collector.drain(active.worker_queue)
            collector.flush_when_due()
            now = time.monotonic()
            if outcome.worker_ended is None:
                if active.worker.is_alive():
                    outcome.worker_seen = active.now()
                else:
                    outcome.worker_ended = active.now()
            sampler_over = outcome.samples_sent is not None or (
                not active.sampler.is_alive() and active.sampler_queue.empty())
            if sampler_over and sampler_over_at is None:
                sampler_over_at = now
            if outcome.worker_ended is None:
                # Training goes on without its sampler: unless a stop is on its way, the run is
                # stopped here rather than completed with a hole in its samples.
                if (sampler_over_at is not None and not active.stop_requested
                        and outcome.sampler_lost is None
                        and now - sampler_over_at >= SAMPLER_GRACE_SECONDS):
                    outcome.sampler_lost = self._sampler_lost(active, outcome, sampler_over_at)
                    self._end_processes(active)
                continue
            if outcome.samples_sent is not None:
                break
            since_worker = active.now() - outcome.worker_ended
            if since_worker >= TAIL_SECONDS:
                active.stop_sampler.set()
                if sampler_over:
                    break  # the sampler died without its last word: keep what came
                if since_worker > SAMPLER_TIMEOUT_SECONDS:
                    active.sampler.kill()  # hung: keep what came; samples_sent stays unknown
        collector.drain(active.worker_queue)
        collector.flush()
        active.sampler.join(timeout=5)
        active.worker.join(timeout=5)

    def _sampler_lost(self, active: ActiveRun, outcome: Outcome, over_at: float) -> str:
        when = over_at - active.t0
        if outcome.sampler_ended_by is not None:
            what = f"stopped ({outcome.sampler_ended_by})"
        else:
            what = _death(active.sampler.exitcode, "died")
        return (f"the memory sampler {what} at {when:.1f} s while training went on: the run was"
                " stopped there, so its samples have no hole; what was recorded until then is"
                " kept")

    def _ending(self, active: ActiveRun, outcome: Outcome) -> Ending:
        code = active.worker.exitcode
        if active.stop_requested:
            return Ending("stopped", active.stop_reason)
        if outcome.sampler_lost is not None:
            return Ending("failed", outcome.sampler_lost)
        if outcome.failure is not None:
            return Ending(outcome.failure.status, outcome.failure.text)
        if code == 0 and outcome.summary is not None:
            return Ending("completed")
        return Ending("failed", f"the training worker {_death(code, 'ended')} before it finished"
                      " (killed or crashed)")

    def _record(self, run_id: int, outcome: Outcome, ending: Ending) -> None:
        """Write the ending now, or keep it and retry in the background (the disk may free up)."""
        for attempt in range(RECORD_TRIES):
            try:
                self._write_ending(run_id, outcome, ending)
                self.endings[run_id] = ending
                return
            except sqlite3.Error:
                time.sleep(0.3 * (attempt + 1))
        self.endings[run_id] = Ending(ending.status, ending.error, recorded=False)
        threading.Thread(target=self._record_later, args=(run_id, outcome, ending),
                         name=f"anatomy-record-{run_id}", daemon=True).start()

    def _record_later(self, run_id: int, outcome: Outcome, ending: Ending) -> None:
        while True:
            time.sleep(2.0)
            try:
                self._write_ending(run_id, outcome, ending)
            except sqlite3.Error:
                continue
            self.endings[run_id] = ending
            return

    def _write_ending(self, run_id: int, outcome: Outcome, ending: Ending) -> None:
        self.store.close_phases(run_id, outcome.phases_end)
        values: dict = {"samples_sent": outcome.samples_sent}
        summary = outcome.summary_values()
        if summary:
            values["summary"] = summary
        self.store.update_run(run_id, **values)
        self.store.finish(run_id, ending.status, ending.error)

    def _end_processes(self, active: ActiveRun) -> None:
        """The worker's whole group, then the sampler (its count no longer matters)."""
        with active.stopping:
            terminate_tree(active.worker)
        active.stop_sampler.set()
        active.sampler.join(TAIL_SECONDS + 1)
        if active.sampler.is_alive():
            active.sampler.kill()
            active.sampler.join(2)

    # --- waiting and stopping ---
    def wait(self, run_id: int, timeout: float | None = None) -> str:
        active = self.active.get(run_id)
        if active is not None:
            active.done.wait(timeout)
        ending = self.endings.get(run_id)
        if ending is not None and not ending.recorded:
            return ending.status  # the store could not take it (yet)
        return self.store.run(run_id).status

    def ending(self, run_id: int) -> Ending | None:
        """How this manager's run ended (None while it runs, or if another process ran it)."""
        return self.endings.get(run_id)

    def is_active(self, run_id: int) -> bool:
        return run_id in self.active

    def stopping(self, run_id: int) -> bool:
        """Stop was asked for this run, and it has not ended yet."""
        active = self.active.get(run_id)
        return active is not None and active.stop_requested

    def request_stop(self, run_id: int, reason: str = "stopped by the user") -> bool:
        """Mark the run as stopping, at once (safe in a signal handler): whatever ends its
        processes from now on, it ends "stopped", and its phases end here. `stop` does the
        stopping."""
        active = self.active.get(run_id)
        if active is None:
            return False
        if not active.stop_requested:
            active.stop_at = active.now()
            active.stop_reason = reason
            active.stop_requested = True
        return True

    def stop(self, run_id: int, reason: str = "stopped by the user") -> bool:
        """End the worker's whole process tree: SIGTERM, then SIGKILL after a grace period."""
        active = self.active.get(run_id)
        if not self.request_stop(run_id, reason):
            return False
        with active.stopping:
            terminate_tree(active.worker)
        active.done.wait(STOP_GRACE_SECONDS + 5)
        return True

    def stop_all(self) -> None:
        for run_id in list(self.active):
            self.stop(run_id)


def is_live(run: RunRow, manager: RunManager) -> bool:
    """A "running" row whose worker still lives: ours, or another process's (the CLI). A row left
    "running" by a server that died has no worker left, and is not shown as live."""
    if run.status != "running":
        return False
    return manager.is_active(run.id) or _alive(run.worker_pid)


def live_run(store: Store, manager: RunManager) -> RunRow | None:
    """The run a freshly opened page shows live: the latest running one, if it really runs."""
    run = store.latest_running()
    return run if run is not None and is_live(run, manager) else None


def _death(code: int | None, verb: str) -> str:
    """How a process ended, in words: "was killed by SIGKILL", "ended with exit code 9"."""
    if code is None:
        return "did not end"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"{verb} with exit code {code}"


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False



def terminate_tree(process: mp.Process, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the process's group (it leads one: the worker) and every descendant, SIGKILL what
    is left after `grace` seconds.

    The root is waited for through multiprocessing, not psutil: psutil would reap it, and
    multiprocessing would then never learn that it ended.
    """
    if process.pid is None:
        return
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    if process.exitcode is None:
        signal_group(process.pid, signal.SIGTERM)
    for child in descendants:  # those that left its group too
        try:
            child.terminate()
        except psutil.Error:
            pass
    process.join(grace)
    if process.exitcode is None:
        signal_group(process.pid, signal.SIGKILL)
        process.join(2)
    _, alive = psutil.wait_procs(descendants, timeout=0.5)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass

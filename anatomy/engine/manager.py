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
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from anatomy.analysis.machine import Machine
from anatomy.analysis.options import InvalidOptions, RunOptions, validate
from anatomy.engine import protocol, sampler, worker
from anatomy.engine.devices import machine
from anatomy.store import (
    GpuProcess,
    GpuStatus,
    HostStatus,
    Message,
    PhaseMark,
    RunRow,
    Sample,
    Step,
    Store,
)

__all__ = ["DeviceBusy", "DeviceLock", "InvalidOptions", "RunManager", "is_live", "live_run",
           "machine"]

LOCK_DIR_ENV = "ANATOMY_LOCK_DIR"  # where the per-device locks live; machine-wide by default
FLUSH_SECONDS = 0.1
TAIL_SECONDS = 0.3    # the sampler outlives the worker this long, so the end is measured
SAMPLER_TIMEOUT_SECONDS = 10.0
STOP_GRACE_SECONDS = 3.0  # SIGTERM, then SIGKILL: the tree is gone well inside 5 s


class DeviceBusy(RuntimeError):
    """The device is taken: another run trains on it, or a sweep holds it."""


def device_key(options: RunOptions, info: Machine) -> str:
    """The lock a run with these options takes: its GPU's (by NVML index, which every process
    agrees on whatever its CUDA_VISIBLE_DEVICES), or the machine's without a GPU."""
    return f"gpu{info.devices[options.gpu].nvml_index}" if info.has_gpu else "cpu"


def device_words(options: RunOptions, info: Machine) -> str:
    return f"GPU {options.gpu}" if info.has_gpu else "this machine"


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
        self.file = open(self.path, "a+")
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

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


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
    stop_requested: bool = False
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class Outcome:
    """What the collector learnt besides the rows it wrote."""
    failure: protocol.Failure | None = None
    summary: dict | None = None
    components: dict | None = None
    operations: dict | None = None
    samples_sent: int | None = None


@dataclass
class Rows:
    """Rows waiting for the next write, in arrival order."""
    samples: list[Sample] = field(default_factory=list)
    phases: list[PhaseMark] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    hosts: list[HostStatus] = field(default_factory=list)
    gpus: list[GpuStatus] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)

    def _all(self) -> tuple[list, ...]:
        return (self.samples, self.phases, self.steps, self.messages, self.hosts, self.gpus,
                self.processes)

    def __bool__(self) -> bool:
        return any(self._all())

    def clear(self) -> None:
        for rows in self._all():
            rows.clear()


class RunManager:
    def __init__(self, store: Store | None = None):
        self.store = store or Store()
        self.context = mp.get_context("spawn")  # never fork after torch/CUDA is loaded
        self.active: dict[int, ActiveRun] = {}
        self._guard = threading.Lock()
        self.close_orphans()

    def close_orphans(self) -> list[int]:
        """Runs still marked running whose worker is gone (the server or CLI that ran them
        ended first) become failed, keeping what they recorded; so do such sweeps. Returns the
        runs' ids."""
        closed = []
        for run in self.store.runs():
            if run.status != "running" or run.id in self.active:
                continue
            if _alive(run.worker_pid):
                continue  # another process on this machine is running it
            self.store.close_phases(run.id, self.store.last_time(run.id))
            self.store.finish(run.id, "failed", "the process that ran it ended before the run "
                              "finished (the dashboard or CLI was stopped)")
            closed.append(run.id)
        for sweep in self.store.sweeps():
            if sweep.status == "running" and not _alive(sweep.pid):
                self.store.update_sweep(sweep.id, status="failed", ended_at=time.time(),
                                        error="the process that ran it ended before the sweep did")
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
        (InvalidOptions) or the device is taken (DeviceBusy)."""
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
        environment = {"driver": info.driver, "cuda_driver": info.cuda_driver,
                       "gpu_count": info.gpu_count}
        gpu_nvml = 0
        if info.has_gpu:
            device = info.devices[options.gpu]
            gpu_nvml = device.nvml_index
            environment.update(gpu_name=device.name, gpu_total=device.total, gpu_uuid=device.uuid)
        else:
            environment.update(gpu_name=None, ram_total=info.ram_total, why_no_gpu=info.why_no_gpu)
        run_id = self.store.create_run(options.to_dict(), info.backend, info.memory_api,
                                       gpu_nvml, environment, name=name, sweep=sweep)
        if lock is not reservation:
            lock.describe(f"run {run_id} (pid {os.getpid()})")
        try:
            self._spawn(run_id, options, info, lock, lock is not reservation, dwell)
        except BaseException as error:
            if lock is not reservation:
                lock.release()
            self.store.finish(run_id, "failed", f"could not start the run: {error}")
            raise
        return run_id

    def _spawn(self, run_id: int, options: RunOptions, info: Machine, lock: DeviceLock,
               owns_lock: bool, dwell: float | None) -> ActiveRun:
        # One queue each: a worker killed mid-put leaves its queue's lock held for good, and
        # the sampler, on a queue of its own, must still deliver every sample after that.
        sampler_queue, worker_queue = self.context.Queue(), self.context.Queue()
        stop_sampler = self.context.Event()
        worker_pid = self.context.Value("i", 0)
        t0 = time.monotonic()
        gpus = [d.nvml_index for d in info.devices]
        sampler_process = self.context.Process(
            target=sampler.run, name=f"anatomy-sampler-{run_id}", daemon=True,
            args=(sampler_queue, stop_sampler, info.backend, options.sample_rate, t0, gpus,
                  worker_pid))
        _start_clean(sampler_process)
        if dwell is None:
            dwell = max(0.1, 5.0 / options.sample_rate)
        cuda_device = None
        if info.has_gpu:
            # By UUID where NVML gives one: CUDA may number the GPUs in another order than NVML.
            device = info.devices[options.gpu]
            cuda_device = device.uuid or str(device.nvml_index)
        worker_process = self.context.Process(
            target=worker.main, name=f"anatomy-worker-{run_id}",
            args=(worker_queue, options.to_dict(), t0, cuda_device, dwell))
        _start_clean(worker_process)
        worker_pid.value = worker_process.pid
        self.store.update_run(run_id, worker_pid=worker_process.pid)
        active = ActiveRun(run_id, worker_process, sampler_process, stop_sampler, lock, owns_lock,
                           sampler_queue, worker_queue, worker_pid, t0)
        active.thread = threading.Thread(target=self._collect, args=(active,),
                                         name=f"anatomy-collector-{run_id}", daemon=True)
        with self._guard:
            self.active[run_id] = active
        active.thread.start()
        return active

    # --- collecting ---
    def _collect(self, active: ActiveRun) -> None:
        run_id = active.run_id
        rows = Rows()
        outcome = Outcome()
        flushed_at = time.monotonic()
        worker_ended_at = None

        def flush():
            if rows:
                self.store.write(run_id, samples=rows.samples, phases=rows.phases,
                                 steps=rows.steps, messages=rows.messages, hosts=rows.hosts,
                                 gpus=rows.gpus, processes=rows.processes)
                rows.clear()

        def handle(message):
            match message:
                case protocol.Samples(samples=samples):
                    rows.samples.extend(samples)
                case protocol.DeviceStatus(host=host, gpus=gpus, processes=processes):
                    rows.hosts.append(host)
                    rows.gpus.extend(gpus)
                    rows.processes.extend(processes)
                case protocol.Phase(mark=mark):
                    rows.phases.append(mark)
                case protocol.StepReport(step=step):
                    rows.steps.append(step)
                case protocol.Note(message=note):
                    rows.messages.append(note)
                case protocol.Environment(values=values):
                    flush()
                    self.store.merge_environment(run_id, values)
                case protocol.TrainingSummary(values=values):
                    outcome.summary = values
                case protocol.ComponentsMeasured(values=values):
                    outcome.components = values
                case protocol.OperationsProfiled(values=values):
                    outcome.operations = values
                case protocol.Failure():
                    outcome.failure = message
                case protocol.SamplerDone(sent=sent):
                    outcome.samples_sent = sent

        try:
            while outcome.samples_sent is None:
                try:
                    handle(active.sampler_queue.get(timeout=FLUSH_SECONDS / 2))
                except queue_module.Empty:
                    pass
                _drain(active.worker_queue, handle)
                now = time.monotonic()
                if now - flushed_at >= FLUSH_SECONDS:
                    flush()
                    flushed_at = now
                if worker_ended_at is None and not active.worker.is_alive():
                    worker_ended_at = now
                if worker_ended_at is not None and now - worker_ended_at >= TAIL_SECONDS:
                    active.stop_sampler.set()
                    if not active.sampler.is_alive() and active.sampler_queue.empty():
                        break  # the sampler died without its last word: keep what came
                    if now - worker_ended_at > SAMPLER_TIMEOUT_SECONDS:
                        active.sampler.kill()  # hung: keep what came; samples_sent stays unknown
            _drain(active.worker_queue, handle)
            flush()
            active.sampler.join(timeout=5)
            self._finish(active, outcome, (worker_ended_at or time.monotonic()) - active.t0)
        finally:
            if active.owns_lock:
                active.lock.release()
            with self._guard:
                self.active.pop(run_id, None)
            active.done.set()

    def _finish(self, active: ActiveRun, outcome: Outcome, worker_ended: float) -> None:
        run_id = active.run_id
        active.worker.join(timeout=5)
        code = active.worker.exitcode
        # A worker killed mid-phase said nothing: its phase ends when the process was seen gone.
        self.store.close_phases(run_id, worker_ended)
        values: dict = {"samples_sent": outcome.samples_sent}
        summary = dict(outcome.summary or {})
        if outcome.components:
            summary["components"] = outcome.components
        if outcome.operations:
            summary["operations"] = outcome.operations
        if summary:
            values["summary"] = summary
        self.store.update_run(run_id, **values)
        if active.stop_requested:
            self.store.finish(run_id, "stopped", "stopped by the user")
        elif outcome.failure is not None:
            self.store.finish(run_id, outcome.failure.status, outcome.failure.text)
        elif code == 0 and outcome.summary is not None:
            self.store.finish(run_id, "completed")
        else:
            self.store.finish(run_id, "failed", f"the training worker ended with exit code {code}"
                              " before it finished (killed or crashed)")

    # --- waiting and stopping ---
    def wait(self, run_id: int, timeout: float | None = None) -> str:
        active = self.active.get(run_id)
        if active is not None:
            active.done.wait(timeout)
        return self.store.run(run_id).status

    def is_active(self, run_id: int) -> bool:
        return run_id in self.active

    def stopping(self, run_id: int) -> bool:
        """Stop was asked for this run, and it has not ended yet."""
        active = self.active.get(run_id)
        return active is not None and active.stop_requested

    def stop(self, run_id: int) -> bool:
        """End the worker's whole process tree: SIGTERM, then SIGKILL after a grace period."""
        active = self.active.get(run_id)
        if active is None:
            return False
        active.stop_requested = True
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


_MAIN_SWAP = threading.Lock()


def _start_clean(process: mp.Process) -> None:
    """Start a spawned process without re-importing the caller's main module in it.

    Spawn re-runs the parent's `__main__` in every child (as `__mp_main__`): a script without an
    `if __name__ == "__main__":` guard would start runs from inside its own worker, and under
    `python -m streamlit` every child imports Streamlit first (+40 MB of RSS in a CPU baseline,
    seconds of start-up). Our targets live in importable modules and need none of it, so the
    main module is hidden while the child's preparation data is written.
    """
    with _MAIN_SWAP:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            process.start()
        finally:
            sys.modules["__main__"] = main


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _drain(queue, handle) -> None:
    while True:
        try:
            handle(queue.get_nowait())
        except queue_module.Empty:
            return


def terminate_tree(process: mp.Process, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the process and its descendants, SIGKILL what is left after `grace` seconds.

    The root is waited for through multiprocessing, not psutil: psutil would reap it, and
    multiprocessing would then never learn that it ended.
    """
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    for child in descendants:
        try:
            child.terminate()
        except psutil.Error:
            pass
    process.terminate()
    process.join(grace)
    if process.is_alive():
        process.kill()
        process.join(2)
    _, alive = psutil.wait_procs(descendants, timeout=0.5)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass

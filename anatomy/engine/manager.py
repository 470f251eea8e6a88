"""The run manager: anatomy's own runs (the dashboard, `anatomy run`, a sweep). It validates the
options, takes the devices, and drives a recording (engine/recording.py) of the worker process
it spawns (engine/worker.py); the recording collects, ends and records the run.

One manager per process (the CLI, or the dashboard's server through one cached resource). One run
at a time per GPU, held by a lock file that other processes respect too (engine/locks.py); a
sweep holds its device's lock across all its runs (`reserve`), so nothing else starts between two
of them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from anatomy.analysis import carried_model, data, models
from anatomy.analysis.data import Tokenized
from anatomy.analysis.machine import Machine
from anatomy.analysis.options import Checked, InvalidOptions, RunOptions, validated
from anatomy.engine import worker
from anatomy.engine.devices import machine
from anatomy.engine.endings import Ending, death
from anatomy.engine.lifeline import Lifeline, launch
from anatomy.engine.locks import (
    LOCK_DIR_ENV,
    DeviceBusy,
    DeviceLock,
    device_key,
    device_keys,
    device_words,
    held_by,
    take_all,
)
from anatomy.engine.recording import (
    STOP_GRACE_SECONDS,
    Recording,
    WorkerProcess,
    end_orphans,
    environment_facts,
)
from anatomy.engine.training import OUTPUT_PREFIX
from anatomy.store import DatabaseError, RunFacts, RunRow, Store
from anatomy.vocabulary import Status

__all__ = ["LOCK_DIR_ENV", "STOP_GRACE_SECONDS", "DeviceBusy", "DeviceLock", "Ending",
           "InvalidOptions", "RunManager", "device_key", "live_run", "machine"]


@dataclass
class ActiveRun:
    recording: Recording
    lock: DeviceLock
    owns_lock: bool  # False when a sweep's reservation lent it: the sweep releases it
    more_locks: list[DeviceLock] = field(default_factory=list)  # the other GPUs' (--gpus)
    # The Trainer's output folder: made and removed here, since a worker killed (Stop, SIGKILL,
    # the OOM killer) never removes one of its own.
    output_dir: str | None = None


class RunManager:
    def __init__(self, store: Store | None = None, tell: Callable[[str], None] | None = None,
                 front: str = ""):
        """`tell(text)`: what its runs' recordings say at once (a database server gone and
        back), besides the run's messages: the CLI prints it. `front`: the program this
        manager runs in, as a busy device's holder names it ("the dashboard, pid 812": the pid
        is this process's, and ending it ends that program, not only its run)."""
        self.store = store or Store()
        self.tell = tell
        self.front = front
        self.active: dict[int, ActiveRun] = {}
        self.recordings: dict[int, Recording] = {}  # this manager's runs, running or ended
        self._guard = threading.Lock()
        self.close_orphans()

    def close_orphans(self) -> list[int]:
        """Runs and sweeps still marked running whose processes are gone are ended in the store
        (engine/recording.py's `end_orphans`; sweeps: failed). The runs' ids."""
        closed = end_orphans(self.store, list(self.active))
        try:
            for sweep in self.store.sweeps():
                if sweep.status == Status.RUNNING and not _pid_alive(sweep.pid):
                    self.store.update_sweep(sweep.id, status=Status.FAILED, ended_at=time.time(),
                                            error="the process that ran it ended before the sweep"
                                                  " did")
        except DatabaseError:
            pass
        return closed

    # --- reserving a device (sweeps) ---
    def device_key(self, options: RunOptions) -> str:
        return device_key(options, machine())

    def reserve(self, options: RunOptions | Checked, holder: str) -> DeviceLock:
        """Hold the device these options train on until `release()`: runs started with the lock
        use it, anything else is told it is busy. DeviceBusy if it is taken already."""
        info = machine()
        options = _checked(options, info)
        lock = DeviceLock(device_key(options, info))
        if not lock.acquire(holder):
            raise DeviceBusy(f"{device_words(options, info)} is busy: {lock.holder()}")
        return lock

    # --- starting ---
    def start(self, options: RunOptions | Checked, name: str | None = None,
              sweep: str | None = None, dwell: float | None = None,
              reservation: DeviceLock | None = None) -> int:
        """Validate (unless the options are `Checked` for this machine already: a front judged
        them), take the device (or use the `reservation` a sweep holds), record the run and
        start its processes; the run's id. Nothing starts when the options are wrong
        (InvalidOptions), the device is taken (DeviceBusy) or the store cannot take the run
        (StoreError)."""
        info = machine()
        options = _checked(options, info).located()
        options, texts = _tokenized(options)
        holder = f"run by pid {os.getpid()}"
        key = device_key(options, info)
        if reservation is not None and reservation.held and reservation.key == key:
            lock = reservation
        else:
            lock = DeviceLock(key)
            if not lock.acquire(holder):
                raise DeviceBusy(f"{device_words(options, info)} is busy: {lock.holder()}")
        owns_lock = lock is not reservation
        try:
            more = take_all([k for k in device_keys(options, info) if k != key], holder,
                            lambda k: device_words(options, info, k))
        except DeviceBusy:
            if owns_lock:
                lock.release()
            raise
        active = ActiveRun(self._recording(options, info, (lock, *more)), lock, owns_lock, more)
        try:
            environment = _environment(options, info)
            if texts is not None:  # what it trains on, so that a reader predicts it again
                environment = environment.merged(RunFacts.of(data=texts.facts))
            run_id = active.recording.create_run(
                options.to_dict(), info, _gpu(options, info), environment,
                name=name, sweep=sweep)
        except BaseException:
            self._release(active)
            raise
        for taken in ((lock, *more) if owns_lock else more):
            taken.describe(held_by(f"run {run_id}", self.store.path, self.front))
        try:
            self._spawn(active, options, info, dwell, texts)
        except BaseException as error:
            self._release(active)
            active.recording.abandon(f"could not start the run: {error}")
            raise
        return run_id

    def _recording(self, options: RunOptions, info: Machine, locks: tuple[DeviceLock, ...]
                   ) -> Recording:
        return Recording(self.store, info.backend, [d.nvml_index for d in info.devices],
                         options.sample_rate, owns_training=True,
                         events=mp.get_context("spawn").Queue(),
                         lock_fds=tuple(lock.fileno() for lock in locks), decide=_decide,
                         tell=self.tell)

    def _spawn(self, active: ActiveRun, options: RunOptions, info: Machine,
               dwell: float | None, texts: Tokenized | None = None) -> None:
        recording = active.recording
        # Made before the sampler starts, which removes it if this process dies (a killed
        # process never removes its own); `_release` removes it as the run ends.
        active.output_dir = tempfile.mkdtemp(prefix=OUTPUT_PREFIX)
        recording.start_sampler(active.output_dir)
        if dwell is None:
            dwell = max(0.1, 5.0 / options.sample_rate)
        cuda_device = None
        if info.has_gpu:
            # By UUID where NVML gives one: CUDA may number the GPUs in another order than NVML.
            # Several GPUs: all of them, in --gpus order (rank r trains on cuda:r).
            cuda_device = ",".join(info.devices[g].uuid or str(info.devices[g].nvml_index)
                                   for g in options.gpu_list())
        fds = recording.lock_fds
        # The worker holds the device locks with us and dies with us (engine/lifeline.py).
        process = recording.context.Process(
            target=worker.main, name=f"anatomy-worker-{recording.run_id}",
            args=(recording.events, options, recording.t0, cuda_device, dwell,
                  Lifeline("anatomy-worker", fds if len(fds) > 1 else fds[0], own_group=True,
                           expendable=True),
                  texts, active.output_dir))
        try:
            launch(process)
        except BaseException:
            recording.abandon()
            raise
        run_id = recording.run_id
        recording.finished.append(lambda: self._finished(active))
        with self._guard:
            self.active[run_id] = active
            self.recordings[run_id] = recording
        recording.follow(WorkerProcess(process))

    def _finished(self, active: ActiveRun) -> None:
        self._release(active)
        with self._guard:
            self.active.pop(active.recording.run_id, None)

    @staticmethod
    def _release(active: ActiveRun) -> None:
        """What the run held, let go once its processes are gone (or never started): its
        devices' locks and the Trainer's output folder."""
        if active.owns_lock:
            active.lock.release()
        for other in active.more_locks:
            other.release()
        if active.output_dir is not None:
            shutil.rmtree(active.output_dir, ignore_errors=True)

    # --- waiting and stopping ---
    def wait(self, run_id: int, timeout: float | None = None) -> str:
        recording = self.recordings.get(run_id)
        if recording is not None:
            recording.wait(timeout)
        ending = self.ending(run_id)
        if ending is not None and not ending.recorded:
            return ending.status  # the store could not take it (yet)
        return self.store.run(run_id).status

    def ending(self, run_id: int) -> Ending | None:
        """How this manager's run ended (None while it runs, or if another process ran it)."""
        recording = self.recordings.get(run_id)
        return None if recording is None else recording.ending

    def is_active(self, run_id: int) -> bool:
        return run_id in self.active

    def stopping(self, run_id: int) -> bool:
        """Stop was asked for this run, and it has not ended yet."""
        active = self.active.get(run_id)
        return active is not None and active.recording.stop_reason is not None

    def request_stop(self, run_id: int, reason: str = "stopped by the user") -> bool:
        """Mark the run as stopping, at once (safe in a signal handler): whatever ends its
        processes from now on, it ends stopped, and its phases end here. `stop` does the
        stopping."""
        active = self.active.get(run_id)
        if active is None:
            return False
        active.recording.request_stop(reason)
        return True

    def stop(self, run_id: int, reason: str = "stopped by the user") -> bool:
        """End the worker's whole process tree: SIGTERM, then SIGKILL after a grace period."""
        active = self.active.get(run_id)
        if active is None or not self.request_stop(run_id, reason):
            return False
        active.recording.end_training(STOP_GRACE_SECONDS)
        active.recording.wait(STOP_GRACE_SECONDS + 5)
        return True

    def pause(self, paused: bool) -> None:
        """Every active run's training stopped or continued with the process that follows it
        (its terminal's Ctrl-Z, fg, bg); safe in a signal handler (`Recording.pause_training`)."""
        for active in list(self.active.values()):
            active.recording.pause_training(paused)

    def stop_all(self, reason: str = "stopped by the user") -> None:
        for run_id in list(self.active):
            self.stop(run_id, reason)


def live_run(store: Store) -> RunRow | None:
    """The run a freshly opened page shows live: the latest one still being recorded."""
    return store.latest_running()


def _checked(options: RunOptions | Checked, info: Machine) -> RunOptions:
    """The options, judged for this machine once: where a front has, as they are."""
    if isinstance(options, Checked) and options.gpu_count == info.gpu_count:
        return options.options
    return validated(options.options if isinstance(options, Checked) else options,
                     info.gpu_count).options


def _tokenized(options: RunOptions) -> tuple[RunOptions, Tokenized | None]:
    """A run on a dataset: its texts tokenized before anything starts, and the options as the
    run stores them (data.prepared); InvalidOptions if they cannot be."""
    try:
        return data.prepared(options)
    except data.DataError as error:
        raise InvalidOptions({error.field: str(error)}) from None


def _gpu(options: RunOptions, info: Machine) -> int:
    """The NVML index of the GPU the run trains on (its first), 0 without one."""
    return info.devices[options.gpu_list()[0]].nvml_index if info.has_gpu else 0


def _environment(options: RunOptions, info: Machine) -> RunFacts:
    devices = [info.devices[options.gpu_list()[0]]] if info.has_gpu else []
    # The model's config kept from the start (validated: it resolves): the run is predicted from
    # it wherever it is read, whatever becomes of the file.
    environment = environment_facts(info, devices).merged(
        carried_model.kept(models.resolve(options.model)))
    if options.distributed:  # several processes: which GPUs (NVML), and how they share
        environment = environment.merged(RunFacts.of(
            world_size=options.world_size, strategy=options.strategy,
            gpus=tuple(info.devices[g].nvml_index for g in options.gpu_list())
            if info.has_gpu else ()))
    return environment


def _decide(outcome, code: int | None) -> Ending:
    """How anatomy's worker ended, when it was neither stopped nor lost its sampler."""
    if outcome.failure is not None:
        return Ending(outcome.failure.status, outcome.failure.text)
    if code == 0 and outcome.summary is not None:
        return Ending(Status.COMPLETED)
    return Ending(Status.FAILED, f"the training worker {death(code)} before it finished (killed or"
                  " crashed)")


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

"""The run manager: validates, starts the sampler and the worker, collects into the store, stops.

One manager per process (the CLI, or the dashboard's server through one cached resource). One run
at a time per GPU, held by a lock file that other processes respect too.
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

from anatomy import nvml, sampler, worker
from anatomy.options import RunOptions, validate
from anatomy.store import Store

LOCK_DIR_ENV = "ANATOMY_LOCK_DIR"  # where the per-device locks live; machine-wide by default
FLUSH_SECONDS = 0.1
TAIL_SECONDS = 0.3    # the sampler outlives the worker this long, so the end is measured
SAMPLER_TIMEOUT_SECONDS = 10.0
STOP_GRACE_SECONDS = 3.0  # SIGTERM, then SIGKILL: the tree is gone well inside 5 s


class InvalidOptions(ValueError):
    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


class DeviceBusy(RuntimeError):
    pass


def machine() -> dict:
    """What this machine measures with: the backend, its devices, and the driver."""
    if nvml.available():
        devices = [nvml.device_info(i) for i in range(nvml.device_count())]
        return {
            "backend": "nvml",
            "memory_api": devices[0].memory_api,
            "gpu_count": len(devices),
            "devices": [d.__dict__ for d in devices],
            "driver": nvml.driver_version(),
            "cuda_driver": nvml.cuda_driver_version(),
        }
    return {
        "backend": "cpu-rss",
        "memory_api": "rss",
        "gpu_count": 0,
        "devices": [],
        "driver": None,
        "cuda_driver": None,
        "why_no_gpu": nvml.status(),
        "ram_total": psutil.virtual_memory().total,
    }


def _cuda_visible_entry(gpu: int) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return visible.split(",")[gpu].strip()
    return str(gpu)


class _DeviceLock:
    def __init__(self, key: str):
        directory = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "anatomy-locks")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{key}.lock"
        self.file = None

    def acquire(self) -> bool:
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            self.file = None
            return False
        return True

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
    lock: _DeviceLock
    queues: tuple  # (sampler's, worker's)
    worker_pid: object  # shared with the sampler; kept alive here as long as the run is
    t0: float
    thread: threading.Thread | None = None
    stop_requested: bool = False
    done: threading.Event = field(default_factory=threading.Event)


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
            if run["status"] != "running" or run["id"] in self.active:
                continue
            if _alive(run["worker_pid"]):
                continue  # another process on this machine is running it
            self.store.close_phases(run["id"], self.store.last_time(run["id"]))
            self.store.finish(run["id"], "failed", "the process that ran it ended before the run "
                              "finished (the dashboard or CLI was stopped)")
            closed.append(run["id"])
        for sweep in self.store.sweeps():
            if sweep["status"] == "running" and not _alive(sweep.get("pid")):
                self.store.update_sweep(sweep["id"], status="failed", ended_at=time.time(),
                                        error="the process that ran it ended before the sweep did")
        return closed

    # --- starting ---
    def start(self, options: RunOptions, name: str | None = None, sweep: str | None = None,
              dwell: float | None = None) -> int:
        info = machine()
        errors = validate(options, info["gpu_count"])
        if errors:
            raise InvalidOptions(errors)
        gpu_nvml = nvml.visible_index(options.gpu) if info["backend"] == "nvml" else 0
        key = f"gpu{gpu_nvml}" if info["backend"] == "nvml" else "cpu"
        lock = _DeviceLock(key)
        if not lock.acquire():
            where = f"GPU {options.gpu}" if info["backend"] == "nvml" else "this machine"
            raise DeviceBusy(f"another run is training on {where}: stop it or wait until it ends")
        environment = {k: info[k] for k in ("driver", "cuda_driver", "gpu_count")}
        if info["devices"]:
            device = info["devices"][gpu_nvml]
            environment.update(gpu_name=device["name"], gpu_total=device["total"],
                               gpu_uuid=device["uuid"])
        else:
            environment.update(gpu_name=None, ram_total=info["ram_total"],
                               why_no_gpu=info["why_no_gpu"])
        run_id = self.store.create_run(options.to_dict(), info["backend"], info["memory_api"],
                                       gpu_nvml, environment, name=name, sweep=sweep)
        try:
            active = self._spawn(run_id, options, info["backend"], lock, dwell)
        except BaseException as error:
            lock.release()
            self.store.finish(run_id, "failed", f"could not start the run: {error}")
            raise
        return active.run_id

    def _spawn(self, run_id, options, backend, lock, dwell) -> ActiveRun:
        # One queue each: a worker killed mid-put leaves its queue's lock held for good, and
        # the sampler, on a queue of its own, must still deliver every sample after that.
        samples_queue, events_queue = self.context.Queue(), self.context.Queue()
        stop_sampler = self.context.Event()
        worker_pid = self.context.Value("i", 0)
        t0 = time.monotonic()
        sampler_process = self.context.Process(
            target=sampler.run, name=f"anatomy-sampler-{run_id}", daemon=True,
            args=(samples_queue, stop_sampler, backend, options.sample_rate, t0, worker_pid))
        _start_clean(sampler_process)
        if dwell is None:
            dwell = max(0.1, 5.0 / options.sample_rate)
        cuda_device = _cuda_visible_entry(options.gpu) if backend == "nvml" else None
        worker_process = self.context.Process(
            target=worker.main, name=f"anatomy-worker-{run_id}",
            args=(events_queue, options.to_dict(), t0, cuda_device, dwell))
        _start_clean(worker_process)
        worker_pid.value = worker_process.pid
        self.store.update_run(run_id, worker_pid=worker_process.pid)
        active = ActiveRun(run_id, worker_process, sampler_process, stop_sampler, lock,
                           (samples_queue, events_queue), worker_pid, t0)
        active.thread = threading.Thread(target=self._collect, args=(active,),
                                         name=f"anatomy-collector-{run_id}", daemon=True)
        with self._guard:
            self.active[run_id] = active
        active.thread.start()
        return active

    # --- collecting ---
    def _collect(self, active: ActiveRun) -> None:
        run_id = active.run_id
        rows: dict[str, list] = {"samples": [], "phases": [], "steps": [], "messages": []}
        outcome: dict = {"error": None, "summary": None, "sent": None, "components": None,
                         "operations": None}
        flushed_at = time.monotonic()
        worker_ended_at = None

        def flush():
            if any(rows.values()):
                self.store.write(run_id, **rows)
                for batch in rows.values():
                    batch.clear()

        def handle(message):
            kind = message[0]
            if kind == "samples":
                rows["samples"].extend(message[1])
            elif kind == "phase":
                rows["phases"].append(("start", message[1], message[2]))
            elif kind == "phase_end":
                rows["phases"].append(("end", message[1], message[2]))
            elif kind == "step":
                rows["steps"].append(message[1])
            elif kind == "message":
                rows["messages"].append((message[3], message[1], message[2]))
            elif kind == "environment":
                flush()
                self.store.merge_environment(run_id, message[1])
            elif kind == "summary":
                outcome["summary"] = message[1]
            elif kind in ("components", "operations"):
                outcome[kind] = message[1]
            elif kind == "error":
                outcome["error"] = (message[1], message[2])
            elif kind == "sampler_done":
                outcome["sent"] = message[1]

        try:
            samples_queue, events_queue = active.queues
            while outcome["sent"] is None:
                try:
                    handle(samples_queue.get(timeout=FLUSH_SECONDS / 2))
                except queue_module.Empty:
                    pass
                _drain(events_queue, handle)
                now = time.monotonic()
                if now - flushed_at >= FLUSH_SECONDS:
                    flush()
                    flushed_at = now
                if worker_ended_at is None and not active.worker.is_alive():
                    worker_ended_at = now
                if worker_ended_at is not None and now - worker_ended_at >= TAIL_SECONDS:
                    active.stop_sampler.set()
                    if not active.sampler.is_alive() and samples_queue.empty():
                        break  # the sampler died without its last word: keep what came
                    if now - worker_ended_at > SAMPLER_TIMEOUT_SECONDS:
                        active.sampler.kill()  # hung: keep what came; samples_sent stays unknown
            _drain(events_queue, handle)
            flush()
            active.sampler.join(timeout=5)
            self._finish(active, outcome, (worker_ended_at or time.monotonic()) - active.t0)
        finally:
            active.lock.release()
            with self._guard:
                self.active.pop(run_id, None)
            active.done.set()

    def _finish(self, active: ActiveRun, outcome: dict, worker_ended: float) -> None:
        run_id = active.run_id
        active.worker.join(timeout=5)
        code = active.worker.exitcode
        # A worker killed mid-phase said nothing: its phase ends when the process was seen gone.
        self.store.close_phases(run_id, worker_ended)
        values: dict = {"samples_sent": outcome["sent"]}
        summary = {**(outcome["summary"] or {}),
                   **{k: outcome[k] for k in ("components", "operations") if outcome[k]}}
        if summary:
            values["summary"] = summary
        self.store.update_run(run_id, **values)
        if active.stop_requested:
            self.store.finish(run_id, "stopped", "stopped by the user")
        elif outcome["error"] is not None:
            self.store.finish(run_id, outcome["error"][0], outcome["error"][1])
        elif code == 0 and outcome["summary"] is not None:
            self.store.finish(run_id, "completed")
        else:
            self.store.finish(run_id, "failed", f"the training worker ended with exit code {code}"
                              " before it finished (killed or crashed)")

    # --- waiting and stopping ---
    def wait(self, run_id: int, timeout: float | None = None) -> str:
        active = self.active.get(run_id)
        if active is not None:
            active.done.wait(timeout)
        return self.store.run(run_id)["status"]

    def is_active(self, run_id: int) -> bool:
        return run_id in self.active

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

"""Runs recorded from inside the user's own training process: the phase API and what the Trainer
callback stands on.

    run = anatomy.start(name="my fine-tune")   # baseline, then torch and the CUDA context
    model = build().to("cuda"); run.phase("weights")
    run.phase("training")
    for batch in data: ...; run.step(loss=loss.item())
    run.end()                                  # or: with anatomy.start() as run: ...

A run started here samples with the same sampler process as anatomy's own runs and is written
to the same store (--store rules: $ANATOMY_STORE, else the default) by a collector thread in
this process. Under `anatomy watch -- COMMAND` nothing is started here: the run is the watch's,
found through the environment it set (WATCH_ENV), and this process's marks travel to it over a
local socket.

Nothing here imports torch: memory figures of torch's allocator are read only where the user's
process has imported torch already.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue as queue_module
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Client
from typing import Any

from anatomy.engine import protocol, sampler
from anatomy.engine.collector import FLUSH_SECONDS, Collector
from anatomy.engine.devices import machine
from anatomy.engine.lifeline import Lifeline, launch
from anatomy.engine.manager import TAIL_SECONDS
from anatomy.engine.reporter import Reporter
from anatomy.store import Step, Store

# Set by `anatomy watch` for the command it runs: where its collector listens, the key to connect
# with, the run's id and the run's clock (time.monotonic() at its start: one clock per machine).
WATCH_ENV = "ANATOMY_WATCH"
WATCH_KEY_ENV = "ANATOMY_WATCH_KEY"
RUN_ID_ENV = "ANATOMY_RUN_ID"
T0_ENV = "ANATOMY_T0"

DEFAULT_SAMPLE_RATE = 200
FIRST_SAMPLE_TIMEOUT = 30.0  # a sampler's process starts in ~1 s; a loaded machine may take longer

_current: Run | None = None
_current_lock = threading.Lock()


def is_oom(error: BaseException) -> bool:
    """CUDA's (or the host's) out-of-memory error, whatever raised it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, MemoryError) or "out of memory" in text


def _rank() -> int:
    """This process's rank under torchrun / accelerate launch (0 alone)."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _local_rank() -> int | None:
    """This process's LOCAL_RANK under a launcher (its GPU among the visible ones); None alone."""
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else None


def _allocator() -> tuple[int | None, int | None]:
    """torch's allocator figures, where this process uses CUDA already (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None, None
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def _script() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


class _LocalRecording:
    """A run of this process: its row in the store, a sampler process and a collector thread."""

    def __init__(self, store: Store, name: str | None, sample_rate: int,
                 gpus: Sequence[int] | None, t0: float):
        info = machine()
        self.store = store
        self.t0 = t0
        self.context = mp.get_context("spawn")
        devices = info.devices if gpus is None else [info.devices[i] for i in gpus]
        environment = {"driver": info.driver, "cuda_driver": info.cuda_driver,
                       "gpu_count": info.gpu_count, "host": socket.gethostname()}
        if devices:
            environment.update(gpu_name=devices[0].name, gpu_total=devices[0].total,
                               gpu_uuid=devices[0].uuid)
        else:
            environment.update(gpu_name=None, ram_total=info.ram_total, why_no_gpu=info.why_no_gpu)
        script = _script()
        label = os.path.basename(script) if script else "python"
        self.run_id = store.create_run(
            {}, info.backend, info.memory_api, devices[0].nvml_index if devices else 0,
            environment, name=name, preset=label,
            source={"kind": "script", "script": script, "argv": list(sys.argv),
                    "cwd": os.getcwd(), "host": socket.gethostname()})
        store.update_run(self.run_id, worker_pid=os.getpid())
        self.events: queue_module.Queue = queue_module.Queue()
        self.samples = self.context.Queue()
        self.stop_sampler = self.context.Event()
        worker_pid = self.context.Value("i", os.getpid())
        self.sampler = self.context.Process(
            target=sampler.run, name=f"anatomy-sampler-{self.run_id}", daemon=True,
            args=(self.samples, self.stop_sampler, info.backend, sample_rate, t0,
                  [d.nvml_index for d in devices], worker_pid,
                  Lifeline("anatomy-sampler", death_signal=signal.SIGTERM)))
        launch(self.sampler)
        self.collector = Collector(store, self.run_id)
        self.first_sample = threading.Event()
        self.closing = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._collect, name=f"anatomy-collector-{self.run_id}",
                                       daemon=True)
        self.thread.start()
        if not self.first_sample.wait(FIRST_SAMPLE_TIMEOUT):
            self.events.put(protocol.Note(protocol.Message(
                time.monotonic() - t0, "warning", "the sampler took longer than "
                f"{FIRST_SAMPLE_TIMEOUT:.0f} s to start: the first phase may have no sample"),
                protocol.Source()))

    def put(self, message) -> None:
        self.events.put(message)

    def _collect(self) -> None:
        collector = self.collector
        closing_at = None
        while collector.outcome.samples_sent is None:
            try:
                collector.handle(self.samples.get(timeout=FLUSH_SECONDS / 2))
            except queue_module.Empty:
                pass
            if collector.rows.samples:
                self.first_sample.set()
            collector.drain(self.events)
            collector.flush_when_due()
            if self.closing.is_set():
                closing_at = closing_at or time.monotonic()
                if time.monotonic() - closing_at >= TAIL_SECONDS:
                    self.stop_sampler.set()
                if not self.sampler.is_alive() and self.samples.empty():
                    break  # the sampler died without its last word: keep what came
        collector.drain(self.events)
        collector.flush()
        self.done.set()

    def close(self, status: str, error: str | None, t_end: float) -> None:
        self.closing.set()
        self.done.wait(TAIL_SECONDS + 15)
        self.sampler.join(timeout=5)
        if self.sampler.is_alive():
            self.sampler.kill()
        store = self.store
        store.close_phases(self.run_id, t_end)
        values: dict[str, Any] = {"samples_sent": self.collector.outcome.samples_sent}
        summary = self.collector.summary_values()
        if summary:
            values["summary"] = summary
        store.update_run(self.run_id, **values)
        store.finish(self.run_id, status, error)


class _WatchLink:
    """This process's side of `anatomy watch`: its messages go to the watch's collector."""

    def __init__(self, address: str, key: str):
        self.connection = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key))
        # The watch answers once its sampler measures this process: the first phase has a
        # reading then.
        if self.connection.poll(FIRST_SAMPLE_TIMEOUT):
            self.connection.recv()
        self.lock = threading.Lock()
        self.run_id = int(os.environ.get(RUN_ID_ENV, "0") or 0)

    def put(self, message) -> None:
        with self.lock:
            try:
                self.connection.send(message)
            except OSError:
                pass  # the watch is gone: the training goes on unrecorded

    def close(self, status: str, error: str | None, t_end: float) -> None:
        if status in ("failed", "oom"):
            self.put(protocol.Failure(status, error or status, protocol.Source(_rank())))
        with self.lock:
            self.connection.close()


class _Unrecorded:
    """A rank other than 0 of a launch without `anatomy watch` (torchrun, accelerate launch):
    rank 0 records the run (its sampler follows every visible GPU); this rank says nothing.
    Under `anatomy watch` every rank joins the one run instead."""

    run_id = None

    def put(self, message) -> None:
        pass

    def close(self, status: str, error: str | None, t_end: float) -> None:
        pass


class Run:
    """A run recorded from the training process itself: phases, steps, notes, its end."""

    def __init__(self, link: _LocalRecording | _WatchLink | _Unrecorded, t0: float,
                 dwell: float):
        self.link = link
        self.id = link.run_id
        self.reporter = Reporter(link, t0, dwell, protocol.Source(rank=_rank(),
                                                                  device=_local_rank()))
        self.ended = False
        self.steps = 0
        self._lock = threading.Lock()

    @property
    def watched(self) -> bool:
        return isinstance(self.link, _WatchLink)

    def phase(self, name: str) -> None:
        """The state `name` is reached ("weights": the model is on its device). It is held a few
        sample periods and measured, like the walkthrough's prints; "training" lasts until
        `end()` (or the next phase)."""
        if self.reporter.open_phase:
            self.reporter.end(self.reporter.open_phase)
        if name == "training":
            self.reporter.begin(name)
        else:
            self.reporter.hold(name)

    def step(self, loss: float | None = None, *, step: int | None = None,
             total: int | None = None) -> None:
        """An optimizer step has ended (its number counts from 1 unless given)."""
        self.steps = step if step is not None else self.steps + 1
        allocated, reserved = _allocator()
        self.reporter.step(Step(self.reporter.now(), self.steps, total,
                                None if loss is None else float(loss), allocated, reserved))

    def note(self, text: str, level: str = "info") -> None:
        self.reporter.tell(level, text)

    def describe(self, **environment: Any) -> None:
        """Facts about the training (model, options) for the run's environment."""
        self.reporter.environment(environment)

    def end(self, error: BaseException | str | None = None) -> None:
        """Close the run: completed, or failed / oom / stopped by `error`."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
        if isinstance(error, KeyboardInterrupt):
            status, text = "stopped", "interrupted (Ctrl-C)"
        elif isinstance(error, BaseException):
            status, text = ("oom" if is_oom(error) else "failed"), f"{type(error).__name__}: {error}"
        elif error is not None:
            status, text = "failed", str(error)
        else:
            status, text = "completed", None
        if self.reporter.open_phase:
            self.reporter.end(self.reporter.open_phase)
        self.link.close(status, text, self.reporter.now())
        global _current
        with _current_lock:
            if _current is self:
                _current = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.end(error)


def current() -> Run | None:
    """The run this process records, if one was started (by `start` or the callback)."""
    return _current


def start(name: str | None = None, *, sample_rate: int = DEFAULT_SAMPLE_RATE,
          store: str | os.PathLike | None = None, gpus: Sequence[int] | None = None,
          kernel: bool = True, baseline: bool = True) -> Run:
    """Start recording this process's training (or join the run `anatomy watch` runs it in).

    Call it at the top of the script, before the model exists, to see the baseline and (with
    `kernel`) torch and the CUDA context loaded, as the walkthrough does. `gpus`: the visible
    GPUs to sample (default: all). A second call returns the run already started."""
    global _current
    with _current_lock:
        if _current is not None:
            return _current
        if not 1 <= sample_rate <= 2000:
            raise ValueError(f"sample_rate: {sample_rate} is out of range: 1 to 2000")
        dwell = max(0.1, 5.0 / sample_rate)
        address = os.environ.get(WATCH_ENV)
        if address:
            t0 = float(os.environ.get(T0_ENV) or time.monotonic())
            link: _LocalRecording | _WatchLink | _Unrecorded = _WatchLink(
                address, os.environ[WATCH_KEY_ENV])
        elif _rank() and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            t0 = time.monotonic()
            link = _Unrecorded()  # rank 0 records the run; see _Unrecorded
        else:
            t0 = time.monotonic()
            link = _LocalRecording(Store(store), name, sample_rate, gpus, t0)
        run = Run(link, t0, dwell)
        _current = run
    _install_exit_hooks(run)
    if baseline:
        run.phase("baseline")
    if kernel:
        _load_kernel(run)
    return run


def _load_kernel(run: Run) -> None:
    """The walkthrough's second moment: torch's runtime loaded and, with a GPU, its CUDA
    context (a tiny tensor on the device), held and measured."""
    import torch

    if torch.cuda.is_available():
        local = _local_rank()  # a rank of several: its own GPU's context, never GPU 0's
        device = "cuda" if local is None else f"cuda:{local}"
        torch.ones((1, 1)).to(device)
        torch.cuda.synchronize(device)
    run.phase("kernel")


def _install_exit_hooks(run: Run) -> None:
    """An uncaught error ends the run as failed (or oom), with the error; the end of the process
    ends a run left open as completed."""
    previous = sys.excepthook

    def hook(kind, error, traceback):
        if not run.ended:
            run.end(error)
        previous(kind, error, traceback)

    sys.excepthook = hook

    def at_exit() -> None:
        if not run.ended:
            run.end()

    atexit.register(at_exit)

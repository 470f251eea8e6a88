"""`anatomy watch -- COMMAND`: any command's GPU memory, recorded as a run.

The command runs as a child, untouched but for a few environment variables: the sampler samples
the GPUs it can use (or, without a GPU, the RSS of its process tree), and where the command
records itself (the Trainer callback, the phase API) its phase marks and steps reach this
process's collector over a local socket (attach.WATCH_ENV). A command that marks nothing gets one
"process" phase, from its start to its exit. The status comes from the exit code, from "out of
memory" in what it printed, and from Ctrl-C (stopped).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_module
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from typing import TextIO

from anatomy.analysis.machine import Device, Machine
from anatomy.engine import attach, protocol, sampler
from anatomy.engine.collector import FLUSH_SECONDS, Collector
from anatomy.engine.lifeline import Lifeline, launch
from anatomy.engine.manager import TAIL_SECONDS, terminate_tree
from anatomy.store import PROCESS, PhaseMark, Store
from anatomy.units import mib

READY = "sampling"  # told to each process that connects, once the sampler measures it
STOP_GRACE_SECONDS = 10.0  # after Ctrl-C the command may save and exit on its own
PROGRESS_SECONDS = 1.0
OOM_WORDS = ("out of memory", "outofmemoryerror")


class WatchRefused(ValueError):
    """Bad input to `watch`: nothing was started."""


@dataclass
class _Output:
    """What the command printed, passed through to our terminal and scanned for an OOM."""
    oom: bool = False
    tail: list[str] = field(default_factory=list)

    def tee(self, stream, out: TextIO) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode(errors="replace")
            out.write(text)
            out.flush()
            if any(word in text.lower() for word in OOM_WORDS):
                self.oom = True
            self.tail = (self.tail + [text.rstrip()])[-20:]


def choose_devices(info: Machine, gpus: str | None) -> list[Device]:
    """The GPUs to sample: `--gpus 0,1` (torch's indices among the visible ones), else all."""
    if gpus is None:
        return list(info.devices)
    chosen = []
    for word in gpus.split(","):
        word = word.strip()
        if not word.isdigit() or int(word) >= info.gpu_count:
            visible = f"0 to {info.gpu_count - 1}" if info.gpu_count else "none: no GPU here"
            raise WatchRefused(f"--gpus: {word!r} is not a visible GPU ({visible})")
        chosen.append(info.devices[int(word)])
    return chosen


class Watch:
    def __init__(self, command: Sequence[str], store: Store, info: Machine, devices: list[Device],
                 name: str | None = None, sample_rate: int = 200):
        if not command:
            raise WatchRefused("no command: write it after `--`, e.g. anatomy watch -- python "
                               "train.py")
        if not 1 <= sample_rate <= 2000:
            raise WatchRefused(f"--sample-rate: {sample_rate} is out of range: 1 to 2000")
        if shutil.which(command[0]) is None:
            raise WatchRefused(f"cannot run {command[0]!r}: no such command or not executable")
        self.command = list(command)
        self.store, self.info, self.devices = store, info, devices
        self.name, self.sample_rate = name, sample_rate
        self.context = mp.get_context("spawn")
        self.collector: Collector | None = None
        self.events: queue_module.Queue = queue_module.Queue()
        self.marked_phases = False
        self.interrupted = False
        self.asked: list[int] = []  # the signals that stop the command, as they came
        self.sampling = threading.Event()  # the sampler has measured the command
        self.run_id: int | None = None
        self._ended: list[PhaseMark] = []  # phase ends not printed yet
        self.ranks: dict[int, int] = {0: 0}  # rank -> its local rank (several processes)
        self._shown_step: int | None = None

    # --- the socket the command's processes report through ---
    def _listen(self, directory: str) -> tuple[Listener, str]:
        key = secrets.token_bytes(16)
        listener = Listener(os.path.join(directory, "watch.sock"), family="AF_UNIX", authkey=key)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return listener, key.hex()

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
            self.sampling.wait(attach.FIRST_SAMPLE_TIMEOUT)
            try:
                connection.send(READY)
            except OSError:
                return
            while True:
                try:
                    self.events.put(connection.recv())
                except (EOFError, OSError):
                    return

    def _keep(self, message) -> bool:
        """Every rank's phase marks and steps, each stored with its rank (issue 12); the first
        word of a rank other than 0 makes the run one of several processes (its GPU: the rank's
        LOCAL_RANK among the command's visible GPUs). Only rank 0's phase ends are printed."""
        if isinstance(message, (protocol.Phase, protocol.StepReport)):
            rank = message.source.rank or 0
            if rank and rank not in self.ranks:
                self._join(rank, message.source.device)
            if isinstance(message, protocol.Phase):
                self.marked_phases = True
                if message.mark.edge == "end" and not rank:
                    self._ended.append(message.mark)
        return True

    def _join(self, rank: int, local: int | None) -> None:
        """A rank of several has joined: the run's world size and each rank's GPU, as known."""
        self.ranks[rank] = local if local is not None else rank
        world = max(self.ranks) + 1
        values: dict = {"world_size": world}
        if self.devices:
            gpus = [self.devices[min(self.ranks.get(r, r), len(self.devices) - 1)].nvml_index
                    for r in range(world)]
            values["gpus"] = gpus
        if self.collector is not None and self.run_id is not None:
            self.collector.flush()
            self.store.merge_environment(self.run_id, values)

    # --- running ---
    def run(self, out: TextIO = sys.stderr) -> int:
        """Run the command to its end; the exit code to give back (the command's own, 130
        after Ctrl-C)."""
        with self._signals_as_flags():
            return self._run(out)

    def _run(self, out: TextIO) -> int:
        info, devices = self.info, self.devices
        environment = {"driver": info.driver, "cuda_driver": info.cuda_driver,
                       "gpu_count": info.gpu_count, "host": socket.gethostname(),
                       "gpus_sampled": [d.index for d in devices]}
        if devices:
            environment.update(gpu_name=devices[0].name, gpu_total=devices[0].total,
                               gpu_uuid=devices[0].uuid)
        else:
            environment.update(gpu_name=None, ram_total=info.ram_total, why_no_gpu=info.why_no_gpu)
        run_id = self.store.create_run(
            {}, info.backend, info.memory_api, devices[0].nvml_index if devices else 0,
            environment, name=self.name or " ".join(self.command),
            preset=_label(self.command),
            source={"kind": "watch", "command": self.command, "cwd": os.getcwd(),
                    "host": socket.gethostname()})
        self.collector = Collector(self.store, run_id)
        self.run_id = run_id
        t0 = time.monotonic()
        samples = self.context.Queue()
        stop_sampler = self.context.Event()
        child_pid = self.context.Value("i", 0)
        sampler_process = self.context.Process(
            target=sampler.run, name=f"anatomy-sampler-{run_id}", daemon=True,
            args=(samples, stop_sampler, info.backend, self.sample_rate, t0,
                  [d.nvml_index for d in devices], child_pid,
                  Lifeline("anatomy-sampler", death_signal=signal.SIGTERM)))
        launch(sampler_process)
        output = _Output()
        with tempfile.TemporaryDirectory(prefix="anatomy-watch-") as directory:
            listener, key = self._listen(directory)
            env = {**os.environ, attach.WATCH_ENV: listener.address, attach.WATCH_KEY_ENV: key,
                   attach.RUN_ID_ENV: str(run_id), attach.T0_ENV: repr(t0),
                   "ANATOMY_STORE": str(self.store.path), "PYTHONUNBUFFERED": "1"}
            started = time.monotonic() - t0
            try:
                child = subprocess.Popen(self.command, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
            except OSError as error:
                stop_sampler.set()
                sampler_process.join(timeout=5)
                self.store.finish(run_id, "failed", f"could not start {self.command[0]!r}: "
                                  f"{error.strerror or error}")
                listener.close()
                raise WatchRefused(f"cannot run {self.command[0]!r}: {error.strerror or error}") \
                    from None
            child_pid.value = child.pid
            self.store.update_run(run_id, worker_pid=child.pid)
            print(f"run {run_id}: watching {' '.join(self.command)} (pid {child.pid}) on "
                  f"{', '.join(d.name for d in devices) or 'the CPU (RSS)'}", file=out, flush=True)
            tees = [threading.Thread(target=output.tee, args=(stream, target), daemon=True)
                    for stream, target in ((child.stdout, sys.stdout), (child.stderr, sys.stderr))]
            for tee in tees:
                tee.start()
            code = self._follow(child, samples, out)
            ended = time.monotonic() - t0
            for tee in tees:
                tee.join(timeout=5)
            self._finish_sampling(samples, stop_sampler, sampler_process)
            listener.close()
        if not self.marked_phases:
            self.store.write(run_id, phases=[PhaseMark("start", PROCESS, started),
                                             PhaseMark("end", PROCESS, ended)])
        self.store.close_phases(run_id, ended)
        self._print_progress(out)
        self._record_end(run_id, code, output)
        self._print_end(run_id, out)
        return 130 if self.interrupted else code

    def _pump(self, samples) -> None:
        collector = self.collector
        try:
            message = samples.get(timeout=FLUSH_SECONDS / 2)
        except queue_module.Empty:
            message = None
        if message is not None:
            collector.handle(message)
            if isinstance(message, protocol.Samples) and message.samples:
                self.sampling.set()
        while True:
            try:
                message = self.events.get_nowait()
            except queue_module.Empty:
                break
            if self._keep(message):
                collector.handle(message)
        collector.flush_when_due()

    def _follow(self, child: subprocess.Popen, samples, out: TextIO) -> int:
        """Collect until the command exits. Ctrl-C, SIGTERM or SIGHUP to us stop it (the flags
        `_signals_as_flags` raises)."""
        shown_at = 0.0
        stop_by = None
        while child.poll() is None:
            self._pump(samples)
            if self.asked and stop_by is None:
                stop_by = self._stop(child, self.asked[0], out)
            if stop_by is not None and time.monotonic() > stop_by:
                terminate_tree(_Popened(child))  # it did not exit on its own: end its tree
            if time.monotonic() - shown_at >= PROGRESS_SECONDS:
                self._print_progress(out)
                shown_at = time.monotonic()
        if self.asked and not self.interrupted:
            # At a terminal the same Ctrl-C reached the command, which may end before we look.
            self._stop(child, self.asked[0], out)
        return child.returncode

    @contextlib.contextmanager
    def _signals_as_flags(self):
        """While the command runs and its record is written, Ctrl-C, SIGTERM and SIGHUP only
        raise a flag (`asked`): a write to the store is never cut in half, a batch of samples
        never written twice, and a signal that lands as the command ends is still a stop."""
        watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.getsignal(sig) for sig in watched}
        for sig in watched:
            signal.signal(sig, lambda signum, frame: self.asked.append(signum))
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, child: subprocess.Popen, signum: int, out: TextIO) -> float:
        """Ask the command to stop; the time after which its whole tree is ended instead. At a
        terminal Ctrl-C reached the command too (one process group); a SIGTERM or SIGHUP to us
        is passed on as the Ctrl-C it stands for."""
        self.interrupted = True
        print("\nstopping the command…", file=out, flush=True)
        if signum != signal.SIGINT:
            try:
                child.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
        return time.monotonic() + STOP_GRACE_SECONDS

    def _finish_sampling(self, samples, stop_sampler, sampler_process) -> None:
        deadline = time.monotonic() + TAIL_SECONDS
        while time.monotonic() < deadline:
            self._pump(samples)
        stop_sampler.set()
        give_up = time.monotonic() + 10
        while self.collector.outcome.samples_sent is None and time.monotonic() < give_up:
            self._pump(samples)
            if not sampler_process.is_alive() and samples.empty():
                break
        self._pump(samples)
        self.collector.flush()
        sampler_process.join(timeout=5)
        if sampler_process.is_alive():
            sampler_process.kill()

    def _record_end(self, run_id: int, code: int, output: _Output) -> None:
        outcome = self.collector.outcome
        values: dict = {"samples_sent": outcome.samples_sent, "summary": {
            **self.collector.summary_values(), "exit_code": code}}
        self.store.update_run(run_id, **values)
        if self.interrupted:
            self.store.finish(run_id, "stopped", "stopped by the user (Ctrl-C)")
        elif outcome.failure is not None:
            self.store.finish(run_id, outcome.failure.status, outcome.failure.text)
        elif code != 0 and output.oom:
            self.store.finish(run_id, "oom", "\n".join(output.tail[-10:]))
        elif code != 0:
            last = "\n".join(output.tail[-10:])
            self.store.finish(run_id, "failed", f"the command exited with code {code}"
                              + (f":\n{last}" if last else ""))
        else:
            self.store.finish(run_id, "completed")

    # --- the terminal ---
    def _print_progress(self, out: TextIO) -> None:
        """Each phase's memory as it ends (the walkthrough's line, a line per GPU), and the
        latest step when it changed."""
        if self._ended:
            self.collector.flush()
        for mark in self._ended:
            for device in self.devices or [None]:
                used = self.store.memory_before(self.run_id, device.nvml_index if device else 0,
                                                mark.t)
                what = f"GPU {device.index} memory" if device else "CPU memory (RSS)"
                print(f"{what} occupied: {mib(used) if used is not None else '?'} MB."
                      f"  ({mark.name})", file=out, flush=True)
        self._ended.clear()
        step = self.collector.outcome.last_step
        if step is not None and step.step != self._shown_step:
            self._shown_step = step.step
            total = f"/{step.total}" if step.total else ""
            loss = f", loss {step.loss:.4f}" if step.loss is not None else ""
            print(f"  step {step.step}{total}{loss}", file=out, flush=True)

    def _print_end(self, run_id: int, out: TextIO) -> None:
        run = self.store.run(run_id)
        for device in self.devices or [None]:
            gpu = device.nvml_index if device else 0
            peak = self.store.peak(run_id, gpu)
            where = f"GPU {device.index} ({device.name})" if device else "CPU (RSS)"
            print(f"{where}: peak {mib(peak)} MB", file=out)
        print(f"status: {run.status}; {self.store.sample_count(run_id)} samples stored in "
              f"{self.store.path} as run {run_id}", file=out, flush=True)


def _label(command: list[str]) -> str:
    """The command in a word for lists: the script a Python command runs, else the program."""
    script = next((os.path.basename(a) for a in command[1:] if a.endswith(".py")), None)
    return script or os.path.basename(command[0])


class _Popened:
    """A Popen seen as terminate_tree expects a multiprocessing process."""

    def __init__(self, child: subprocess.Popen):
        self.child, self.pid = child, child.pid

    def terminate(self) -> None:
        self.child.terminate()

    def kill(self) -> None:
        self.child.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def is_alive(self) -> bool:
        return self.child.poll() is None


def watch(command: Sequence[str], store: Store, info: Machine, gpus: str | None = None,
          name: str | None = None, sample_rate: int = 200, out: TextIO = sys.stderr) -> int:
    return Watch(command, store, info, choose_devices(info, gpus), name, sample_rate).run(out)


"""`anatomy run`: train once, printing memory at the end of each phase."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from anatomy.analysis import models
from anatomy.analysis.options import Checked, InvalidOptions, lora_words, validated
from anatomy.analysis.report import RunReport, report
from anatomy.cli.arguments import add_run_options, add_store_option, values_from_args
from anatomy.cli.metrics import add_metrics_options, served
from anatomy.cli.render import PhaseEnds, peak, refused, say
from anatomy.cli.signals import POLL_SECONDS, StopSignals
from anatomy.engine.manager import DeviceBusy, RunManager, machine
from anatomy.engine.predicting import Answer, Predicting
from anatomy.engine.prometheus import EndpointRefused
from anatomy.store import DatabaseError, Step, Store, StoreError, unreachable
from anatomy.views import text
from anatomy.vocabulary import Phase, Status

T = TypeVar("T")


def register(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="train once, printing memory at the end of each phase")
    add_run_options(run)
    add_store_option(run)
    add_metrics_options(run)
    run.set_defaults(func=cmd_run)


def _progress(step: int, total: int, elapsed: float, width: int = 30) -> str:
    """The bar, from the step reached and the seconds the training took to reach it (the run's
    own clock: counted from when the CLI first saw the training, 3 steps done read "0 s
    left")."""
    done = min(1.0, step / total) if total else 0.0
    left = max(0.0, elapsed) / step * (total - step) if step else None
    bar = "#" * int(done * width) + "-" * (width - int(done * width))
    eta = f"{left:5.0f} s left" if left is not None else "   ?  s left"
    return f"\rtraining [{bar}] {step}/{total} steps, {eta}"


def _news(store: Store, run_id: int, ends: PhaseEnds) -> tuple[RunReport, Step | None, list[str]]:
    """The run's report, its last step and the lines of the phases ended since the last call,
    read as one moment on one connection (a connection a read cost more than the reads, five
    times a second) and without counting the samples, which nothing printed here shows (a count
    reads every sample: longer at each look as the run grows)."""
    with store.snapshot():
        rep = report(store, run_id, counted=False)
        step = store.last_step(run_id)
        return rep, step, ends.new(rep)


class _StoppedWhileAway(Exception):
    """A signal asked for a stop while the store's server was away: nothing more can be read."""


def _once_reachable(read: Callable[[], T], signals: StopSignals) -> T:
    """`read()`, once the store answers: a database server that is away is waited for (the
    recording keeps what it records meanwhile, and says so), until a signal asks for a stop."""
    while True:
        try:
            return read()
        except DatabaseError as error:
            if not unreachable(error):
                raise
            if signals.received is not None:
                raise _StoppedWhileAway from error
            time.sleep(POLL_SECONDS)


def _follow(manager: RunManager, store: Store, run_id: int, signals: StopSignals) -> None:
    """Print each phase's memory as it ends and the training's progress, until the run is over
    or a signal asks for a stop."""
    ends = PhaseEnds(store, held=(Phase.TRAINING,))  # the walkthrough prints it with the summary
    tty = sys.stderr is not None and sys.stderr.isatty()  # None: started with it closed
    trained = False
    last_progress = 0.0
    while signals.received is None:
        active = manager.is_active(run_id)
        rep, step, lines = _once_reachable(lambda: _news(store, run_id, ends), signals)
        for line in lines:
            print(line, flush=True)
        for phase in rep.phases:
            if phase.name == Phase.TRAINING and phase.done and not trained:
                trained = True
                if tty:
                    print(file=sys.stderr)  # the progress bar's line is over
            if phase.name == Phase.TRAINING and not phase.done:
                now = time.monotonic()
                if step and (tty or now - last_progress > 5):
                    line = _progress(step.step, step.total, step.t - phase.start_s)
                    print(line if tty else line.strip(), end="" if tty else "\n",
                          file=sys.stderr, flush=True)
                    last_progress = now
        if not active:
            return
        time.sleep(POLL_SECONDS)


def cmd_run(args: argparse.Namespace) -> int:
    info = machine()
    try:  # judged before the store is made: a refused run leaves nothing behind
        checked = validated(values_from_args(args, info.has_gpu), info.gpu_count)
    except InvalidOptions as error:
        return refused(error)
    manager: RunManager | None = None
    said = Said()
    try:
        # The endpoint before the store: one refused (its port taken) leaves no store behind
        with served(args, lambda: [] if manager is None else
                    [r.figures for r in list(manager.recordings.values())]):
            store = Store(args.store)
            manager = RunManager(store, tell=said, front="anatomy run")
            return _run(args, checked, store, manager, said)
    except EndpointRefused as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


class Said:
    """What the run's recording said at once (a database server gone, and back), printed as it
    happens and kept, so that the run's end does not print it again from its messages."""

    def __init__(self) -> None:
        self.lines: set[str] = set()

    def __call__(self, line: str) -> None:
        self.lines.add(line)
        say(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, checked: Checked, store: Store, manager: RunManager,
         said: Said) -> int:
    options = checked.options
    quantized = models.named_quantization(options.model)  # read before the run starts
    with StopSignals() as signals, contextlib.ExitStack() as ending:
        try:
            run_id = manager.start(checked)
        except InvalidOptions as error:
            return refused(error)
        except DeviceBusy as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if args.metrics_port is not None:  # ended with the run: no process outlives it
            ending.callback(_predict_for_metrics(manager, store, run_id).end)
        signals.on_stop = lambda: manager.request_stop(run_id, signals.reason())
        signals.on_pause = manager.pause
        if signals.received is not None:  # it came while the run started
            signals.on_stop()
        reason = "stopped as the command that followed it failed"
        closed: OSError | None = None
        try:
            rep = _once_reachable(lambda: report(store, run_id), signals)
            lora = f", {lora_words(options)}" if options.lora else ""
            print(f"run {run_id}: {models.display_name(options.model)}, batch size "
                  f"{options.batch_size}, {options.precision}{lora}, {rep.device_name}")
            if quantized:
                print(f"model: {quantized}")
            if rep.environment.data is not None:
                print(text.data_line(rep.environment.data))
            print(f"measuring: {text.source(rep.backend, rep.memory_api)}")
            print(f"store: {store.path}", flush=True)
            _follow(manager, store, run_id, signals)
        except _StoppedWhileAway:
            pass  # stopped below; the recording says where what waits for the store is kept
        except OSError as error:  # the terminal or the pipe it printed to is gone
            reason = "stopped as its output was closed (the terminal or the pipe it printed to)"
            closed = error
        finally:  # a signal, a closed terminal, an error: the run never goes on unattended
            if manager.is_active(run_id):
                if signals.received is not None:
                    reason = signals.reason()
                    say(f"\nstopping ({signals.name})…", file=sys.stderr)
                manager.stop(run_id, reason)
    if signals.received is not None:
        # A hang-up's terminal may be gone, and a server gone for good has had its line on
        # where the run's rows are kept: the status says the rest.
        with contextlib.suppress(OSError, StoreError, DatabaseError):
            _outcome(manager, store, run_id, said)
        return signals.exit_code()
    if closed is not None:  # the run is recorded; the output's end is said as every command's
        raise closed
    return _outcome(manager, store, run_id, said)


def _predict_for_metrics(manager: RunManager, store: Store, run_id: int) -> Predicting:
    """The predicted peak beside the measured memory on /metrics, once the run can be predicted
    (a CPU run's RSS prediction stands on its weights phase). In a child of its own, as a
    user's Trainer's is (engine/predicting.py): traced in a thread of this process, torch's
    threads still ran as the interpreter exited after the run, which aborted it ("terminate
    called without an active exception", exit status 134)."""
    figures = manager.recordings[run_id].figures

    def answered(answer: Answer) -> None:
        if answer.peak is not None:  # none: /metrics goes on without it
            figures.predicted_peak = answer.peak

    return Predicting(store.locator(), run_id, None, answered)


def _outcome(manager: RunManager, store: Store, run_id: int, said: Said) -> int:
    """Print how the run ended, the walkthrough's way (the run's messages not said yet); its
    exit status."""
    rep = report(store, run_id)
    status, error = rep.status, rep.error
    ending = manager.ending(run_id)
    if ending is not None and not ending.recorded:  # the store could not take it (full disk)
        status, error = ending.status, ending.error + " (not recorded yet: the store is full)"
    for message in rep.messages:
        if f"run {run_id}: {message.text}" not in said.lines:
            print(f"{message.level}: {message.text}", file=sys.stderr)
    summary = rep.summary
    if status in (Status.COMPLETED, Status.STOPPED):
        for line in text.timing_lines(rep, status):
            print(line)
    if rep.training:
        print(text.phase_line(rep, rep.training))
    print(f"peak: {peak(summary.peak_bytes)}; status: {status}; "
          f"{rep.samples} samples stored in {store.path} as run {run_id}")
    if status != Status.COMPLETED:
        # A stop's words name it already ("stopped by SIGTERM"), not "stopped: stopped by …".
        print(error if error and error.startswith(status) else f"{status}: {error}",
              file=sys.stderr)
        return 1
    return 0

"""`python -m anatomy`: run, predict, sweep, runs, show, rename, tag, delete, export, import —
the engine, headless."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

from anatomy.analysis import components, models, prediction, transfer
from anatomy.analysis.operations import comparison
from anatomy.analysis.options import FIELDS, InvalidOptions, RunOptions, defaults_for, validate
from anatomy.analysis.prediction import device_constants
from anatomy.analysis.report import RunReport, report, run_rows, when
from anatomy.analysis.sweeps import SweepGrid, grid, parse_vary
from anatomy.engine import watch
from anatomy.engine.manager import DeviceBusy, RunManager, is_live, machine
from anatomy.engine.sweep import Sweep, SweepEvent
from anatomy.store import STATUSES, Store, StoreError, StoreMissing, resolve_path
from anatomy.store.database import why
from anatomy.units import MIB
from anatomy.views import text

POLL_SECONDS = 0.2
MAX_RUN_ID = 2**63 - 1  # SQLite's INTEGER

EXIT_CODES = """exit status:
  0    done (a run: completed)
  1    the run failed, ran out of memory or could not be recorded (a full disk); a command
       failed (no such run, a file or store that cannot be written)
  2    refused before anything started: bad options or arguments, a file or store that is not
       anatomy's, an import refused, or the device is busy
  128+N  stopped by signal N (130: Ctrl-C, 143: SIGTERM, 129: SIGHUP): the run is recorded as
       stopped, with everything measured until then
  141  the output was closed early (a pipe to head): nothing more is printed"""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """While a run or sweep trains: Ctrl-C, SIGTERM and SIGHUP each ask for a Stop — as the
    dashboard's button does — instead of killing the CLI and leaving its processes. `on_stop` is
    called in the handler (it must only mark the stop); the loop does the stopping."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.on_stop: Callable[[], None] | None = None
        self._saved: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
        if self.on_stop is not None:
            self.on_stop()

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name

    def exit_code(self) -> int:
        return 128 + self.received


def _say(*args, **kwargs) -> None:
    """Print, unless the terminal is gone (a hang-up): the run is recorded either way."""
    try:
        print(*args, **kwargs)
    except OSError:
        pass


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    f = FIELDS
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", dest="model", metavar="NAME|PATH|HUB_ID",
                       help=f["model"].help + f" (presets: {', '.join(f['model'].choices)}; "
                       "default: bert-large-uncased on a GPU, tiny without one)")
    model.add_argument("--preset", dest="model", metavar="NAME", help="the same as --model")
    for name in ("batch_size", "seq_len", "dataset_size", "grad_accum", "seed", "sample_rate",
                 "gpu", "profile_steps", "lora_rank", "processes"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, dest=name,
                            help=f"{f[name].help} ({f[name].low} to {f[name].high})")
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument("--epochs", type=int, help=f["epochs"].help)
    steps.add_argument("--max-steps", type=int, dest="max_steps", help=f["max_steps"].help)
    parser.add_argument("--precision", choices=f["precision"].choices, help=f["precision"].help)
    parser.add_argument("--gpus", metavar="I,J", help=f["gpus"].help)
    parser.add_argument("--strategy", choices=f["strategy"].choices,
                        help=f["strategy"].help + " (default ddp)")
    parser.add_argument("--gradient-checkpointing", action="store_true", default=None,
                        help=f["gradient_checkpointing"].help)
    parser.add_argument("--optim", help=f"{f['optim'].help}: {', '.join(f['optim'].choices)}")
    parser.add_argument("--lora-targets", dest="lora_targets", nargs="+", metavar="MODULE",
                        help=f["lora_targets"].help + " (with --lora-rank)")


def options_from_args(args: argparse.Namespace, has_gpu: bool) -> RunOptions:
    values = defaults_for(has_gpu).to_dict()
    for name in FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if isinstance(values.get("lora_targets"), list):  # --lora-targets q_proj v_proj, or q,v
        values["lora_targets"] = ",".join(t.strip(",") for t in values["lora_targets"])
    return RunOptions.from_dict(values)


def _progress(step: int, total: int, started: float, width: int = 30) -> str:
    done = min(1.0, step / total) if total else 0.0
    elapsed = time.monotonic() - started
    left = elapsed / step * (total - step) if step else None
    bar = "#" * int(done * width) + "-" * (width - int(done * width))
    eta = f"{left:5.0f} s left" if left is not None else "   ?  s left"
    return f"\rtraining [{bar}] {step}/{total} steps, {eta}"


def _refused(error: InvalidOptions) -> int:
    for message in error.errors.values():
        print(f"error: {message}", file=sys.stderr)
    return 2


def _follow(manager: RunManager, store: Store, run_id: int, signals: StopSignals) -> None:
    """Print each phase's memory as it ends and the training's progress, until the run is over
    or a signal asks for a stop."""
    printed: set[str] = set()
    tty = sys.stderr.isatty()
    train_started = None
    last_progress = 0.0
    while signals.received is None:
        active = manager.is_active(run_id)
        rep = report(store, run_id)
        for phase in rep.phases:
            if phase.done and phase.name not in printed:
                printed.add(phase.name)
                if phase.name == "training":
                    if tty:
                        print(file=sys.stderr)
                    continue  # the walkthrough prints it with the summary
                line = text.occupied_line(phase.memory_bytes, rep.backend)
                print(f"{line}  ({phase.name})", flush=True)
            if phase.name == "training" and not phase.done:
                train_started = train_started or time.monotonic()
                step = store.last_step(run_id)
                now = time.monotonic()
                if step and (tty or now - last_progress > 5):
                    line = _progress(step.step, step.total, train_started)
                    print(line if tty else line.strip(), end="" if tty else "\n",
                          file=sys.stderr, flush=True)
                    last_progress = now
        if not active:
            return
        time.sleep(POLL_SECONDS)


def cmd_run(args: argparse.Namespace) -> int:
    info = machine()
    options = options_from_args(args, info.has_gpu)
    errors = validate(options, info.gpu_count)
    if errors:
        return _refused(InvalidOptions(errors))
    store = Store(args.store)
    manager = RunManager(store)
    with StopSignals() as signals:
        try:
            run_id = manager.start(options)
        except InvalidOptions as error:
            return _refused(error)
        except DeviceBusy as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        signals.on_stop = lambda: manager.request_stop(run_id, _stopped_by(signals))
        if signals.received is not None:  # it came while the run started
            signals.on_stop()
        reason = "stopped: the command that followed it failed"
        try:
            rep = report(store, run_id)
            print(f"run {run_id}: {models.display_name(options.model)}, batch size "
                  f"{options.batch_size}, "
                  f"{options.precision}, {rep.device_name}")
            print(f"measuring: {text.source(rep.backend, rep.memory_api)}")
            _follow(manager, store, run_id, signals)
        except OSError:  # the terminal or the pipe it printed to is gone
            reason = "stopped: its output was closed (the terminal or the pipe it printed to)"
        finally:  # a signal, a closed terminal, an error: the run never goes on unattended
            if manager.is_active(run_id):
                if signals.received is not None:
                    reason = _stopped_by(signals)
                    _say(f"\nstopping ({signals.name})…", file=sys.stderr)
                manager.stop(run_id, reason)
    try:
        code = _outcome(manager, store, run_id)
    except OSError:  # nowhere to print to: the run is recorded all the same
        code = 1
    return signals.exit_code() if signals.received is not None else code


def _stopped_by(signals: StopSignals) -> str:
    words = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM",
             signal.SIGHUP: "SIGHUP: its terminal was closed"}
    return f"stopped by {words.get(signals.received, signals.name)}"


def _outcome(manager: RunManager, store: Store, run_id: int) -> int:
    """Print how the run ended, the walkthrough's way; its exit status."""
    rep = report(store, run_id)
    status, error = rep.status, rep.error
    ending = manager.ending(run_id)
    if ending is not None and not ending.recorded:  # the store could not take it (full disk)
        status, error = ending.status, ending.error + " (not recorded yet: the store is full)"
    for message in rep.messages:
        print(f"{message.level}: {message.text}", file=sys.stderr)
    summary = rep.summary
    if status == "completed":
        print(f"Time: {summary.time_s:.2f}")
        print(f"Samples/second: {summary.samples_per_second:.2f}")
    if rep.training:
        print(f"{text.occupied_line(rep.training.memory_bytes, rep.backend)}  (training)")
    print(f"peak: {summary.peak_mb} MB; status: {status}; "
          f"{rep.samples} samples stored in {store.path} as run {run_id}")
    if status != "completed":
        print(f"{status}: {error}", file=sys.stderr)
        return 1
    return 0


def _prediction_target(args: argparse.Namespace, info) -> tuple[str, str | None, int]:
    """The device kind a prediction assumes, the GPU model whose constants it takes, and the
    memory that device has: this machine's, unless --device / --gpu-model say otherwise."""
    device = args.device or ("cuda" if info.has_gpu else "cpu")
    if device == "cpu":
        return device, None, info.ram_total
    gpu = info.devices[args.gpu or 0] if info.has_gpu and (args.gpu or 0) < info.gpu_count \
        else None
    name = args.gpu_model or (gpu.name if gpu else None)
    constants = device_constants.load(name)
    total = gpu.total if gpu and gpu.name == (name or gpu.name) else constants.total_bytes
    return device, name or constants.device, total


def cmd_predict(args: argparse.Namespace) -> int:
    info = machine()
    options = options_from_args(args, info.gpu_count > 0)
    device, gpu_name, total = _prediction_target(args, info)
    # A prediction for another machine's GPU is judged as that GPU would judge it.
    # Several GPUs (--gpus 0,1) are judged as a machine with that many would judge them.
    gpus = max(info.gpu_count, (options.world_size if options.gpus.strip() else 1)
               if device == "cuda" else 0)
    errors = validate(options, gpus, here=info.has_gpu or device == "cpu")
    for message in errors.values():
        print(f"error: {message}", file=sys.stderr)
    if errors:
        return 2
    try:
        if args.max_batch_size:
            return _print_batch_fit(options, device, gpu_name, total, args.json)
        predicted = prediction.predict(options, device=device, gpu_name=gpu_name)
        ranks = (prediction.predict_ranks(options, device=device, gpu_name=gpu_name)
                 if options.distributed else None)
    except prediction.PredictionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = predicted.to_dict()
        if ranks is not None:  # each rank's, beside the single process's
            out["ranks"] = ranks.to_dict()
        print(json.dumps(out, indent=2))
        return 0
    print(_run_words(options, predicted))
    if ranks is not None:
        print(ranks.line())
        print("  per rank (MB): " + ", ".join(
            f"{name.replace('_', ' ')} {value / MIB:,.1f}"
            for name, value in ranks.components().items() if value))
    if device == "cuda":
        print(f"kernels and constants: {predicted.gpu}"
              f"{'' if predicted.calibrated else ' (not calibrated: docs/MEASUREMENTS.md figures)'}"
              f"; attention: {', '.join(sorted(set(predicted.attention_kernels))) or 'none'}")
    rows = [[name.replace("_", " "), f"{value / MIB:,.1f}",
             f"{value / predicted.parameters:.2f}"] for name, value in predicted.components().items()]
    rows.append(["sum of the parts", f"{predicted.sum_of_parts / MIB:,.1f}", ""])
    if device == "cuda":
        rows += [["allocator reserve (peak)", f"{predicted.peak_reserved / MIB:,.1f}", ""],
                 ["CUDA context", f"{predicted.context / MIB:,.1f}", ""],
                 ["outside PyTorch", f"{predicted.outside / MIB:,.1f}", ""],
                 ["NVML peak", f"{predicted.nvml_peak / MIB:,.1f}", ""]]
    print(_table(rows, ["component", "MB", "bytes/param"]))
    print(predicted.need_line())
    return 0


def _run_words(options: RunOptions, predicted) -> str:
    spec = models.resolve(options.model)
    shape = (f"images {spec.image_size}×{spec.image_size}" if spec.task == models.IMAGE_CLASSIFICATION
             else f"sequence length {options.seq_len}")
    lora = (f", LoRA rank {options.lora_rank} ({predicted.trainable_parameters:,} trainable)"
            if options.lora else "")
    return (f"{spec.display_name} ({predicted.parameters:,} parameters, {spec.task}), batch size "
            f"{options.batch_size}, {shape}, {options.precision}, {options.optim}"
            f"{', gradient checkpointing' if options.gradient_checkpointing else ''}"
            f"{f', accumulation {options.grad_accum}' if options.grad_accum > 1 else ''}{lora}")


def _print_batch_fit(options: RunOptions, device: str, gpu_name: str | None, total: int,
                     as_json: bool) -> int:
    fit = prediction.max_batch_size(options, device=device, total=total, gpu_name=gpu_name)
    where = (f"{gpu_name} ({total / 2**30:.1f} GiB)" if device == "cuda"
             else f"this machine's RAM ({total / 2**30:.1f} GiB)")
    if as_json:
        print(json.dumps({"max_batch_size": fit.batch_size, "capacity": fit.capacity,
                          "peak": fit.peak_at_fit, "device": device, "gpu": gpu_name,
                          "total": total, "tried": list(fit.searched),
                          "linear": not fit.exact}, indent=2))
    else:
        print(fit.line(where))
    return 0 if fit.batch_size is not None else 1


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [header, *rows]]
    return "\n".join(lines)


def _reading(path: str | None) -> Store | None:
    """The store opened read-only (nothing written, whatever the file); None when there is none
    yet."""
    try:
        return Store(path, read_only=True)
    except StoreMissing:
        return None


def cmd_runs(args: argparse.Namespace) -> int:
    filters = {"tag": args.tag, "preset": args.preset, "status": args.status}
    store = _reading(args.store)
    rows = [] if store is None else run_rows(store, **filters)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    if not rows:
        chosen = ", ".join(f"{k} {v}" for k, v in filters.items() if v is not None)
        print(f"no stored run has {chosen}" if chosen else
              "no runs stored yet: start one with `python -m anatomy run`")
        return 0
    header = ["id", "created", "status", "model", "batch", "prec", "peak MB", "Time", "Samples/s",
              "tags", "name"]
    body = [[r.id, r.created, r.status, r.preset, r.batch_size or "", r.precision or "",
             r.peak_mb if r.peak_mb is not None else "",
             f"{r.time_s:.2f}" if r.time_s else "",
             f"{r.samples_per_second:.2f}" if r.samples_per_second else "",
             ",".join(r.tags), r.name or ""] for r in rows]
    print(_table(body, header))
    return 0


def _run_or_error(store: Store, run_id: int):
    run = store.run(run_id)
    if run is None:
        print(f"error: run {run_id} is not in {store.path}", file=sys.stderr)
    return run


def cmd_rename(args: argparse.Namespace) -> int:
    store = Store(args.store)
    if _run_or_error(store, args.run_id) is None:
        return 1
    store.rename_run(args.run_id, args.name.strip() or None)
    print(f"run {args.run_id}: {store.run(args.run_id).name or '(no name)'}")
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    store = Store(args.store)
    run = _run_or_error(store, args.run_id)
    if run is None:
        return 1
    if args.remove:
        tags = [t for t in run.tags if t not in {x.strip() for x in args.tags}]
    else:
        tags = [*run.tags, *args.tags]
    try:
        store.set_tags(args.run_id, tags)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"run {args.run_id} tags: {', '.join(store.run(args.run_id).tags) or '(none)'}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    store = Store(args.store)
    run = _run_or_error(store, args.run_id)
    if run is None:
        return 1
    if is_live(run, RunManager(store)):
        print(f"error: run {args.run_id} is still running: stop it first", file=sys.stderr)
        return 2
    if not args.yes:
        if not sys.stdin.isatty():
            print("error: deleting cannot be undone: confirm with --yes (no terminal to ask on)",
                  file=sys.stderr)
            return 2
        samples = store.sample_count(args.run_id)
        what = f"run {args.run_id} ({run.preset}, {run.status}, {samples} samples)"
        if input(f"Delete {what}? This cannot be undone. [y/N] ").strip().lower() not in ("y", "yes"):
            print("not deleted")
            return 1
    store.delete_run(args.run_id)
    print(f"deleted run {args.run_id}")
    return 0


def _report_or_error(store: Store | None, run_id: int) -> RunReport | None:
    rep = None if store is None else report(store, run_id)
    if rep is None:
        where = store.path if store is not None else f"{resolve_path(None)} (no store there yet)"
        print(f"error: run {run_id} is not in {where}", file=sys.stderr)
    return rep


def cmd_show(args: argparse.Namespace) -> int:
    store = _reading(args.store)
    if store is None:
        print(f"error: run {args.run_id} is not in {resolve_path(args.store)} (no store there"
              " yet)", file=sys.stderr)
        return 1
    rep = _report_or_error(store, args.run_id)
    if rep is None:
        return 1
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2, default=str))
        return 0
    env = rep.environment
    print(f"run {rep.id}  status: {rep.status}  created: {when(rep.created_at)}")
    print(f"device: {rep.device_name}  driver: {env.get('driver') or '-'}  "
          f"torch: {env.get('torch', '-')}  transformers: {env.get('transformers', '-')}")
    print(f"measuring: {text.source(rep.backend, rep.memory_api)}")
    if not rep.started_by_anatomy:
        print(f"started by: {rep.origin}")
    print("options: " + (", ".join(f"{k}={v}" for k, v in rep.stored_options.items())
                         or "(not reported)"))
    print(_table([[p.name, f"{p.start_s:.2f}", p.memory_mb] for p in rep.phases],
                 ["phase", "start s", "memory at end (MB)"]))
    s = rep.summary
    if s.time_s is not None:
        print(f"Time: {s.time_s:.2f}")
    if s.samples_per_second is not None:
        print(f"Samples/second: {s.samples_per_second:.2f}")
    print(f"peak: {s.peak_mb} MB   samples: {rep.samples}   steps: {rep.steps}")
    if rep.components:
        parts = rep.components
        print("measured components (MB): " + ", ".join(
            f"{name}={parts.get(name) / MIB:.1f}" for name in components.ORDER
            if parts.get(name) is not None))
    if rep.ranks:
        print(f"{rep.world_size} processes ({rep.strategy}); each rank's memory at its phases' ends"
              + ("" if rep.on_gpu else " (the CPU: all ranks' RSS together)") + ":")
        names = ["kernel", "weights", "training"]
        print(_table([[r.label(), *[(r.phase(n).memory_mb if r.phase(n) else None)
                                     for n in names], r.peak_mb] for r in rep.ranks],
                     ["rank", *[f"{n} (MB)" for n in names], "peak (MB)"]))
    if rep.operations:
        profile = rep.operations
        print(f"operation classes ({profile.time_source}, {profile.steps} profiled steps):")
        print(_table([[r.kind, f"{100 * r.flop_share:.2f}%", f"{100 * r.time_share:.1f}%"]
                      for r in comparison(profile)], ["class", "flop", "time"]))
    if rep.error:
        print(f"error: {rep.error}")
    return 0


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written, judged before any work; None when it can."""
    if path.is_dir():
        return "it is a directory"
    folder = path.absolute().parent
    if not folder.is_dir():
        return f"its directory {folder} does not exist"
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "it cannot be written here (permissions, or read-only media)"
    return None


def cmd_export(args: argparse.Namespace) -> int:
    if args.output:
        problem = _unwritable(Path(args.output))
        if problem:
            print(f"error: cannot write {args.output}: {problem}", file=sys.stderr)
            return 2
    store = _reading(args.store)
    if store is None:
        print(f"error: run {args.run_ids[0]} is not in {resolve_path(args.store)} (no store there"
              " yet)", file=sys.stderr)
        return 1
    try:
        if args.format == "json":
            content = json.dumps(transfer.export_runs(store, args.run_ids), default=str)
        elif args.format == "html":
            from anatomy.views import export  # plotly loads for this export only

            content = export.runs_html(store, args.run_ids)
        else:
            content = transfer.samples_csv(store, args.run_ids)
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 1
    if args.output:
        try:
            Path(args.output).write_text(content)
        except OSError as error:
            print(f"error: cannot write {args.output}: {error.strerror}", file=sys.stderr)
            return 1
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(content)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    try:
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as error:
        print(f"error: cannot read {args.file}: {error.strerror}", file=sys.stderr)
        return 1
    store = Store(args.store)
    try:
        run_ids = transfer.import_runs(store, data, copy=args.copy)
    except transfer.AlreadyImported as error:
        print(f"error: {args.file}: {error}; nothing was imported (--copy imports "
              f"{'them' if len(error.found) > 1 else 'it'} again)", file=sys.stderr)
        return 2
    except transfer.ImportRefused as error:
        print(f"error: {args.file} is refused, nothing was imported: {error}", file=sys.stderr)
        return 2
    except sqlite3.Error as error:
        print(f"error: writing to {store.path} failed, nothing was imported: {why(error)}",
              file=sys.stderr)
        return 1
    for run_id in run_ids:
        print(run_id)
    return 0


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _sweep_printer(sweep: Sweep, out: TextIO) -> Callable[[SweepEvent], None]:
    told: list[SweepEvent] = []

    def tell(event: SweepEvent) -> None:
        if not told:  # here, not after start(): the sweep's thread may speak first
            print(f"sweep {sweep.id}: {sweep.name}, {len(sweep.planned)} runs planned"
                  f"{' (then doubling batch size until out of memory)' if sweep.until_oom else ''}",
                  file=out, flush=True)
        told.append(event)
        where = f"[{event.index}/{event.planned}{'+' if sweep.until_oom else ''}]"
        if event.kind == "start":
            print(f"{where} run {event.run_id}: {_values_text(event.values)} …", file=out, flush=True)
        elif event.kind == "end":
            s = report(sweep.store, event.run_id).summary
            speed = (f", {s.samples_per_second:.2f} samples/s, {s.time_s:.2f} s"
                     if s.samples_per_second is not None else "")
            print(f"{where} run {event.run_id}: {_values_text(event.values)} → {event.status}, "
                  f"peak {s.peak_mb} MB{speed}", file=out, flush=True)
        else:
            print(f"skipped {_values_text(event.values)}: a smaller batch size ran out of memory",
                  file=out, flush=True)
    return tell


def _print_grid(result: SweepGrid) -> None:
    names = list(result.vary)
    rows = [[r.run, *(r.values[n] for n in names), r.status,
             r.peak_mb if r.peak_mb is not None else "",
             f"{r.samples_per_second:.2f}" if r.samples_per_second is not None else "",
             f"{r.time_s:.2f}" if r.time_s is not None else ""] for r in result.runs]
    print(_table(rows, ["run", *names, "status", "peak MB", "Samples/s", "Time"]))
    fitting = result.largest_fitting
    if isinstance(fitting, dict):
        other = next(n for n in names if n != "batch_size")
        print("largest batch size that fit: " + "; ".join(
            f"{other}={value}: {size if size is not None else 'none'}" for value, size in fitting.items()))
    elif "batch_size" in names:
        print(f"largest batch size that fit: {fitting if fitting is not None else 'none'}")


def _predicted_ladder(base: RunOptions, info) -> tuple[dict[str, list], str]:
    """--from-prediction: the batch size predicted to fit and the next one, to be confirmed by
    two runs (the first should fit, the second not) instead of a doubling ladder."""
    errors = validate(base, info.gpu_count)
    if errors:
        raise InvalidOptions(errors)
    device = "cuda" if info.has_gpu else "cpu"
    gpu = info.devices[base.gpu] if info.has_gpu else None
    try:
        fit = prediction.max_batch_size(base, device=device,
                                        total=gpu.total if gpu else info.ram_total,
                                        gpu_name=gpu.name if gpu else None)
    except prediction.PredictionError as error:
        raise InvalidOptions({"model": str(error)}) from None
    if fit.batch_size is None:
        raise InvalidOptions({"batch_size": "batch_size: not even 1 is predicted to fit"})
    size = fit.batch_size
    return {"batch_size": [size, size + 1] if size < FIELDS["batch_size"].high else [size]}, \
        f"predicted to fit: batch size {size}; confirming with {size} and {size + 1}"


def cmd_sweep(args: argparse.Namespace) -> int:
    info = machine()
    base = options_from_args(args, info.has_gpu)
    store = Store(args.store)
    try:
        if args.from_prediction:
            if args.vary:
                raise InvalidOptions({"vary": "--from-prediction picks the batch sizes: drop "
                                              "--vary"})
            vary, said = _predicted_ladder(base, info)
            print(said, file=sys.stderr if args.json else sys.stdout, flush=True)
        elif not args.vary:
            raise InvalidOptions({"vary": "give --vary OPTION=V1,V2,… (or --from-prediction)"})
        else:
            vary = parse_vary(args.vary)
        sweep = Sweep(RunManager(store), base, vary, args.until_oom, args.name, info.gpu_count)
    except InvalidOptions as error:
        for message in error.errors.values():
            print(f"error: {message}", file=sys.stderr)
        return 2
    # with --json, stdout holds the JSON alone
    sweep.on_event = _sweep_printer(sweep, sys.stderr if args.json else sys.stdout)
    with StopSignals() as signals:
        try:
            sweep_id = sweep.start()
        except DeviceBusy as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        try:
            while signals.received is None and sweep.wait(POLL_SECONDS) is None:
                pass
        finally:  # a signal, a closed terminal: the sweep never goes on unattended
            if sweep.status is None:
                _say(f"\nstopping the sweep{f' ({signals.name})' if signals.received else ''}…",
                     file=sys.stderr)
                sweep.stop()
                sweep.wait()
    result = grid(store, sweep_id)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_grid(result)
    if sweep.status != "completed":
        print(f"sweep {sweep.status}{': ' + sweep.error if sweep.error else ''}", file=sys.stderr)
        return signals.exit_code() if signals.received is not None else 1
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    info = machine()
    try:
        return watch.watch(command, Store(args.store), info, gpus=args.gpus, name=args.name,
                           sample_rate=args.sample_rate)
    except watch.WatchRefused as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _store_path(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no store: give a file, or leave "
                                         "--store out for $ANATOMY_STORE or data/anatomy.sqlite")
    return text


def _run_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a run id (a whole number)") from None
    if not 1 <= value <= MAX_RUN_ID:
        raise argparse.ArgumentTypeError(f"{text} is out of range for a run id: 1 to {MAX_RUN_ID}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with the exit statuses under every command's --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)


def parser() -> argparse.ArgumentParser:
    root = _Parser(prog="anatomy", description="GPU memory during model training, phase "
                   "by phase (also: python -m anatomy)")
    commands = root.add_subparsers(dest="command", required=True, parser_class=_Parser)
    store_help = "the run store (default: $ANATOMY_STORE, then data/anatomy.sqlite)"

    run = commands.add_parser("run", help="train once, printing memory at the end of each phase")
    _add_run_options(run)
    run.add_argument("--store", type=_store_path, help=store_help)
    run.set_defaults(func=cmd_run)

    predict = commands.add_parser("predict", help="the memory a run should need, by component")
    _add_run_options(predict)
    predict.add_argument("--json", action="store_true", help="bytes, as one JSON object")
    predict.add_argument("--max-batch-size", action="store_true",
                         help="the largest batch size predicted to fit the device, instead")
    predict.add_argument("--device", choices=prediction.DEVICES,
                         help="the kernels and allocator to assume (default: this machine's)")
    predict.add_argument("--gpu-model", metavar="NAME",
                         help="the GPU whose calibrated constants to use, e.g. 'NVIDIA H200' "
                              "(default: this machine's GPU)")
    predict.set_defaults(func=cmd_predict)

    runs = commands.add_parser("runs", help="the stored runs")
    runs.add_argument("--json", action="store_true")
    runs.add_argument("--tag", help="only runs with this tag")
    runs.add_argument("--model", "--preset", dest="preset", metavar="MODEL",
                      help="only runs of this model (as the run named it)")
    runs.add_argument("--status", choices=STATUSES, help="only runs that ended so (or still run)")
    runs.add_argument("--store", type=_store_path, help=store_help)
    runs.set_defaults(func=cmd_runs)

    show = commands.add_parser("show", help="one run: options, phases, summary")
    show.add_argument("run_id", type=_run_id, metavar="RUN_ID")
    show.add_argument("--json", action="store_true")
    show.add_argument("--store", type=_store_path, help=store_help)
    show.set_defaults(func=cmd_show)

    export = commands.add_parser("export", help="runs as JSON (everything) or CSV (samples)")
    export.add_argument("run_ids", type=_run_id, nargs="+", metavar="RUN_ID")
    export.add_argument("--format", choices=("json", "csv", "html"), required=True,
                        help="json: everything, to import elsewhere; csv: the samples; "
                             "html: the memory charts, a standalone page")
    export.add_argument("--output", help="file to write (default: standard output)")
    export.add_argument("--store", type=_store_path, help=store_help)
    export.set_defaults(func=cmd_export)

    load = commands.add_parser("import", help="runs from an exported JSON file, under new ids")
    load.add_argument("file", metavar="FILE", help="the file `export --format json` wrote (- reads"
                      " standard input)")
    load.add_argument("--copy", action="store_true",
                      help="import runs this store holds already (imported before, or recorded"
                           " here) once more, as copies")
    load.add_argument("--store", type=_store_path, help=store_help)
    load.set_defaults(func=cmd_import)

    sweep = commands.add_parser("sweep", help="runs one after another, one or two options varied")
    _add_run_options(sweep)
    sweep.add_argument("--vary", action="append", metavar="OPTION=V1,V2,…",
                       help="an option and its values, e.g. batch-size=1,2,4 or precision=fp32,bf16"
                            " or gradient-checkpointing=off,on (once or twice)")
    sweep.add_argument("--until-oom", action="store_true",
                       help="with --vary batch-size: keep doubling past the list until a run is out"
                            " of memory")
    sweep.add_argument("--from-prediction", action="store_true",
                       help="run the batch size predicted to fit and the next one (with "
                            "--until-oom: keep doubling if that one fits too)")
    sweep.add_argument("--name", help="the sweep's name (default: what it varies)")
    sweep.add_argument("--json", action="store_true",
                       help="print the grid as one JSON object (progress goes to stderr)")
    sweep.add_argument("--store", type=_store_path, help=store_help)
    sweep.set_defaults(func=cmd_sweep)

    watched = commands.add_parser(
        "watch", help="any command's GPU memory as a run: anatomy watch -- python train.py",
        description="Runs COMMAND and records the memory of the GPUs it can use (without a GPU: "
                    "the RSS of its processes). Where the command records itself (the Trainer "
                    "callback or anatomy.start()), its phases and steps join this run; else the "
                    "run has one 'process' phase. Exits with the command's exit code (130 after "
                    "Ctrl-C, which stops the command and keeps the record).")
    watched.add_argument("--name", help="the run's name (default: the command)")
    watched.add_argument("--sample-rate", type=int, default=200, dest="sample_rate",
                         help="samples per second per GPU (1 to 2000, default 200)")
    watched.add_argument("--gpus", help="the visible GPUs to sample, e.g. 0,1 (default: all); "
                                        "the command's own CUDA_VISIBLE_DEVICES is left as is")
    watched.add_argument("--store", help=store_help)
    watched.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS…")
    watched.set_defaults(func=cmd_watch)

    rename = commands.add_parser("rename", help="name a run (an empty name removes it)")
    rename.add_argument("run_id", type=_run_id, metavar="RUN_ID")
    rename.add_argument("name", metavar="NAME")
    rename.add_argument("--store", type=_store_path, help=store_help)
    rename.set_defaults(func=cmd_rename)

    tag = commands.add_parser("tag", help="add tags to a run, or remove them")
    tag.add_argument("run_id", type=_run_id, metavar="RUN_ID")
    tag.add_argument("tags", nargs="+", metavar="TAG")
    tag.add_argument("--remove", action="store_true", help="remove these tags instead")
    tag.add_argument("--store", type=_store_path, help=store_help)
    tag.set_defaults(func=cmd_tag)

    delete = commands.add_parser("delete", help="delete a run and all it recorded")
    delete.add_argument("run_id", type=_run_id, metavar="RUN_ID")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.add_argument("--store", type=_store_path, help=store_help)
    delete.set_defaults(func=cmd_delete)
    return root


def main(argv: list[str] | None = None) -> int:
    """The command's exit status (EXIT_CODES); every error is one line on stderr."""
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except StoreError as error:
        print(f"error: the store {error}", file=sys.stderr)
        return 1 if error.full else 2
    except sqlite3.Error as error:
        print(f"error: the store {resolve_path(getattr(args, 'store', None))}: {why(error)}",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader left (`runs | head`): say nothing more, and let Python's exit say nothing
        # either (its final flush would fail on the same pipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141

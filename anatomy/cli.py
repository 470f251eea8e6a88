"""`python -m anatomy`: run, predict, runs, show, export — the engine, headless."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

from anatomy import components, measurement, prediction, transfer
from anatomy.operations import OperationProfile, comparison
from anatomy.options import FIELDS, RunOptions, defaults_for, validate
from anatomy.runs import DeviceBusy, InvalidOptions, RunManager, machine
from anatomy.store import Store, report

POLL_SECONDS = 0.2


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    f = FIELDS
    parser.add_argument("--preset", choices=f["preset"].choices, help=f["preset"].help +
                        " (default: bert-large-uncased on a GPU, tiny without one)")
    for name in ("batch_size", "seq_len", "dataset_size", "grad_accum", "seed", "sample_rate",
                 "gpu", "profile_steps"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, dest=name,
                            help=f"{f[name].help} ({f[name].low} to {f[name].high})")
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument("--epochs", type=int, help=f["epochs"].help)
    steps.add_argument("--max-steps", type=int, dest="max_steps", help=f["max_steps"].help)
    parser.add_argument("--precision", choices=f["precision"].choices, help=f["precision"].help)
    parser.add_argument("--gradient-checkpointing", action="store_true", default=None,
                        help=f["gradient_checkpointing"].help)
    parser.add_argument("--optim", help=f"{f['optim'].help}: {', '.join(f['optim'].choices)}")


def options_from_args(args: argparse.Namespace, has_gpu: bool) -> RunOptions:
    values = defaults_for(has_gpu).to_dict()
    for name in FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    return RunOptions.from_dict(values)


def _progress(step: int, total: int, started: float, width: int = 30) -> str:
    done = min(1.0, step / total) if total else 0.0
    elapsed = time.monotonic() - started
    left = elapsed / step * (total - step) if step else None
    bar = "#" * int(done * width) + "-" * (width - int(done * width))
    eta = f"{left:5.0f} s left" if left is not None else "   ?  s left"
    return f"\rtraining [{bar}] {step}/{total} steps, {eta}"


def cmd_run(args: argparse.Namespace) -> int:
    store = Store(args.store)
    info = machine()
    options = options_from_args(args, info["gpu_count"] > 0)
    manager = RunManager(store)
    try:
        run_id = manager.start(options)
    except InvalidOptions as error:
        for message in error.errors.values():
            print(f"error: {message}", file=sys.stderr)
        return 2
    except DeviceBusy as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run = store.run(run_id)
    print(f"run {run_id}: {options.preset}, batch size {options.batch_size}, "
          f"{options.precision}, {run['environment'].get('gpu_name') or 'CPU'}")
    print(f"measuring: {measurement.source(run['backend'], run['memory_api'])}")
    printed: set[str] = set()
    tty = sys.stderr.isatty()
    train_started = None
    last_progress = 0.0
    try:
        while True:
            active = manager.is_active(run_id)
            rep = report(store, run_id)
            for phase in rep["phases"]:
                if phase["end_s"] is not None and phase["name"] not in printed:
                    printed.add(phase["name"])
                    if phase["name"] == "training":
                        if tty:
                            print(file=sys.stderr)
                        continue  # the walkthrough prints it with the summary
                    line = measurement.occupied_line(phase["memory_bytes"], rep["backend"])
                    print(f"{line}  ({phase['name']})", flush=True)
                if phase["name"] == "training" and phase["end_s"] is None:
                    train_started = train_started or time.monotonic()
                    step = store.last_step(run_id)
                    now = time.monotonic()
                    if step and (tty or now - last_progress > 5):
                        line = _progress(step["step"], step["total"], train_started)
                        print(line if tty else line.strip(), end="" if tty else "\n",
                              file=sys.stderr, flush=True)
                        last_progress = now
            if not active:
                break
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        print("\nstopping…", file=sys.stderr)
        manager.stop(run_id)
    rep = report(store, run_id)
    for message in rep["messages"]:
        print(f"{message['level']}: {message['text']}", file=sys.stderr)
    summary = rep["summary"]
    if rep["status"] == "completed":
        print(f"Time: {summary['time_s']:.2f}")
        print(f"Samples/second: {summary['samples_per_second']:.2f}")
    training = next((p for p in rep["phases"] if p["name"] == "training"), None)
    if training:
        print(f"{measurement.occupied_line(training['memory_bytes'], rep['backend'])}  (training)")
    print(f"peak: {summary['peak_mb']} MB; status: {rep['status']}; "
          f"{rep['samples']} samples stored in {store.path} as run {run_id}")
    if rep["status"] != "completed":
        print(f"{rep['status']}: {rep['error']}", file=sys.stderr)
        return 1
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    gpu_count = machine()["gpu_count"]
    options = options_from_args(args, gpu_count > 0)
    errors = validate(options, gpu_count)
    for message in errors.values():
        print(f"error: {message}", file=sys.stderr)
    if errors:
        return 2
    predicted = prediction.predict(options, device="cuda" if gpu_count else "cpu")
    if args.json:
        print(json.dumps(predicted.to_dict(), indent=2))
        return 0
    print(f"{options.preset} ({predicted.parameters:,} parameters), batch size "
          f"{options.batch_size}, sequence length {options.seq_len}, {options.precision}, "
          f"{options.optim}{', gradient checkpointing' if options.gradient_checkpointing else ''}")
    rows = [[name.replace("_", " "), f"{value / measurement.MIB:,.1f}",
             f"{value / predicted.parameters:.2f}"] for name, value in predicted.components().items()]
    rows.append(["sum of the parts", f"{predicted.sum_of_parts / measurement.MIB:,.1f}", ""])
    print(_table(rows, ["component", "MB", "bytes/param"]))
    print(predicted.need_line())
    return 0


def _when(timestamp: float | None) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S") if timestamp else ""


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [header, *rows]]
    return "\n".join(lines)


def run_rows(store: Store) -> list[dict]:
    """One row per stored run: the list the CLI prints and the Runs page shows."""
    rows = []
    for run in store.runs():
        rep = report(store, run["id"])
        o = run["options"]
        rows.append({
            "id": run["id"], "name": run["name"], "created": _when(run["created_at"]),
            "status": run["status"], "preset": run["preset"], "batch_size": o.get("batch_size"),
            "seq_len": o.get("seq_len"), "precision": o.get("precision"),
            "gradient_checkpointing": o.get("gradient_checkpointing"),
            "grad_accum": o.get("grad_accum"), "optim": o.get("optim"),
            "backend": run["backend"], "tags": run["tags"], "sweep": run["sweep"],
            "peak_mb": rep["summary"]["peak_mb"], "time_s": rep["summary"]["time_s"],
            "samples_per_second": rep["summary"]["samples_per_second"],
        })
    return rows


def cmd_runs(args: argparse.Namespace) -> int:
    rows = run_rows(Store(args.store))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no runs stored yet: start one with `python -m anatomy run`")
        return 0
    header = ["id", "created", "status", "preset", "batch", "prec", "peak MB", "Time", "Samples/s"]
    body = [[r["id"], r["created"], r["status"], r["preset"], r["batch_size"], r["precision"],
             r["peak_mb"] if r["peak_mb"] is not None else "",
             f"{r['time_s']:.2f}" if r["time_s"] else "",
             f"{r['samples_per_second']:.2f}" if r["samples_per_second"] else ""] for r in rows]
    print(_table(body, header))
    return 0


def _report_or_error(store: Store, run_id: int) -> dict | None:
    rep = report(store, run_id)
    if rep is None:
        print(f"error: run {run_id} is not in {store.path}", file=sys.stderr)
    return rep


def cmd_show(args: argparse.Namespace) -> int:
    store = Store(args.store)
    rep = _report_or_error(store, args.run_id)
    if rep is None:
        return 1
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
        return 0
    env = rep["environment"]
    print(f"run {rep['id']}  status: {rep['status']}  created: {_when(rep['created_at'])}")
    print(f"device: {env.get('gpu_name') or 'CPU'}  driver: {env.get('driver') or '-'}  "
          f"torch: {env.get('torch', '-')}  transformers: {env.get('transformers', '-')}")
    print(f"measuring: {measurement.source(rep['backend'], rep['memory_api'])}")
    print("options: " + ", ".join(f"{k}={v}" for k, v in rep["options"].items()))
    print(_table([[p["name"], f"{p['start_s']:.2f}", p["memory_mb"]] for p in rep["phases"]],
                 ["phase", "start s", "memory at end (MB)"]))
    s = rep["summary"]
    if s["time_s"] is not None:
        print(f"Time: {s['time_s']:.2f}\nSamples/second: {s['samples_per_second']:.2f}")
    print(f"peak: {s['peak_mb']} MB   samples: {rep['samples']}   steps: {rep['steps']}")
    if rep["components"]:
        parts = rep["components"]
        print("measured components (MB): " + ", ".join(
            f"{name}={parts[name] / 2**20:.1f}" for name in components.ORDER if name in parts))
    if rep["operations"]:
        profile = OperationProfile.from_dict(rep["operations"])
        print(f"operation classes ({profile.time_source}, {profile.steps} profiled steps):")
        print(_table([[r["class"], f"{100 * r['flop_share']:.2f}%", f"{100 * r['time_share']:.1f}%"]
                      for r in comparison(profile)], ["class", "flop", "time"]))
    if rep["error"]:
        print(f"error: {rep['error']}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = Store(args.store)
    try:
        if args.format == "json":
            text = json.dumps(transfer.export_runs(store, args.run_ids), default=str)
        else:
            text = transfer.samples_csv(store, args.run_ids)
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 1
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m anatomy",
                                   description="GPU memory during model training, phase by phase")
    commands = root.add_subparsers(dest="command", required=True)
    store_help = "the run store (default: $ANATOMY_STORE, then data/anatomy.sqlite)"

    run = commands.add_parser("run", help="train once, printing memory at the end of each phase")
    _add_run_options(run)
    run.add_argument("--store", help=store_help)
    run.set_defaults(func=cmd_run)

    predict = commands.add_parser("predict", help="the memory a run should need, by component")
    _add_run_options(predict)
    predict.add_argument("--json", action="store_true", help="bytes, as one JSON object")
    predict.set_defaults(func=cmd_predict)

    runs = commands.add_parser("runs", help="the stored runs")
    runs.add_argument("--json", action="store_true")
    runs.add_argument("--store", help=store_help)
    runs.set_defaults(func=cmd_runs)

    show = commands.add_parser("show", help="one run: options, phases, summary")
    show.add_argument("run_id", type=int)
    show.add_argument("--json", action="store_true")
    show.add_argument("--store", help=store_help)
    show.set_defaults(func=cmd_show)

    export = commands.add_parser("export", help="runs as JSON (everything) or CSV (samples)")
    export.add_argument("run_ids", type=int, nargs="+", metavar="RUN_ID")
    export.add_argument("--format", choices=("json", "csv"), required=True)
    export.add_argument("--output", help="file to write (default: standard output)")
    export.add_argument("--store", help=store_help)
    export.set_defaults(func=cmd_export)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)

"""`anatomy sweep`: runs one after another, one or two options varied, as a grid."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TextIO

from anatomy import prediction
from anatomy.analysis import models
from anatomy.analysis.options import FIELDS, Checked, InvalidOptions, validated
from anatomy.analysis.report import report
from anatomy.analysis.sweeps import SweepGrid, grid, parse_vary, shown_value
from anatomy.cli.arguments import (
    add_run_options,
    add_store_option,
    one_line_name,
    values_from_args,
)
from anatomy.cli.render import SaidMeasurer, peak, refused, say, table
from anatomy.cli.signals import POLL_SECONDS, StopSignals
from anatomy.engine.locks import gpu_key
from anatomy.engine.manager import DeviceBusy, RunManager, machine
from anatomy.engine.sweep import Sweep, SweepEvent
from anatomy.prediction import Request, answer, target
from anatomy.prediction.workspaces import WorkspaceError
from anatomy.store import Store
from anatomy.units import in_mib
from anatomy.vocabulary import Status


def register(commands: argparse._SubParsersAction) -> None:
    sweep = commands.add_parser("sweep", help="runs one after another, one or two options varied")
    add_run_options(sweep)
    sweep.add_argument("--vary", action="append", metavar="OPTION=V1,V2,…",
                       help="an option and its values, e.g. batch-size=1,2,4 or precision=fp32,bf16"
                            " or gradient-checkpointing=off,on (once or twice); a list's values"
                            " are one name each, an empty one none: frozen=,model.embed_tokens")
    sweep.add_argument("--until-oom", action="store_true",
                       help="with --vary batch-size: keep doubling past the list until a run is out"
                            " of memory")
    sweep.add_argument("--from-prediction", action="store_true",
                       help="run the batch size predicted to fit and the next one (with "
                            "--until-oom: keep doubling if that one fits too); on a GPU, a "
                            "run's convolutions get their cuDNN workspaces measured first")
    sweep.add_argument("--name", type=one_line_name,
                       help="the sweep's name (default: what it varies)")
    sweep.add_argument("--json", action="store_true",
                       help="print the grid as one JSON object (progress goes to stderr)")
    add_store_option(sweep)
    sweep.set_defaults(func=cmd_sweep)


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={shown_value(k, v)}" for k, v in values.items())


def _sweep_printer(sweep: Sweep, out: TextIO, closed: list[OSError]
                   ) -> Callable[[SweepEvent], None]:
    """What the sweep's thread says of each run; where its output is gone (`sweep | head`), the
    sweep is stopped and the error kept in `closed`, for the command to end as `run` does."""
    told: list[SweepEvent] = []

    def tell(event: SweepEvent) -> None:
        if closed:
            return
        try:
            _tell(event)
        except OSError as error:
            closed.append(error)
            sweep.stop()

    def _tell(event: SweepEvent) -> None:
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
                  f"peak {peak(s.peak_bytes)}{speed}", file=out, flush=True)
        else:
            print(f"skipped {_values_text(event.values)}: a smaller batch size ran out of memory",
                  file=out, flush=True)
    return tell


def _print_grid(result: SweepGrid) -> None:
    names = list(result.vary)
    rows = [[r.run, *(shown_value(n, r.values[n]) for n in names), r.status,
             r.peak_mb if r.peak_mb is not None else "",
             f"{r.samples_per_second:.2f}" if r.samples_per_second is not None else "",
             f"{r.time_s:.2f}" if r.time_s is not None else ""] for r in result.runs]
    print(table(rows, ["run", *names, "status", in_mib("peak"), "Samples/s", "Time (s)"]))
    fitting = result.largest_fitting
    if isinstance(fitting, dict):
        other = next(n for n in names if n != "batch_size")
        print("largest batch size that fit: " + "; ".join(
            f"{other}={value}: {_fitted(result, size, value)}" for value, size in fitting.items()))
    elif "batch_size" in names:
        print(f"largest batch size that fit: {_fitted(result, fitting)}")


def _fitted(result: SweepGrid, size: int | None, value=None) -> str:
    """The ladder's answer; where nothing ran out of memory, only a floor (as the Compare page
    says it); where nothing completed and nothing ran out (a sweep stopped in its first run),
    nothing is known."""
    if size is None:
        return "none" if result.ran_out(value) else "not known (no run completed)"
    return str(size) if result.ran_out(value) else f"≥ {size} (no run ran out of memory)"


def _verdict(result: SweepGrid, predicted: int) -> str | None:
    """--from-prediction: what the two runs say of the prediction."""
    status = {r.values["batch_size"]: r.status for r in result.runs}
    if status.get(predicted) == Status.OOM:
        return f"the prediction was above: {predicted} ran out of memory"
    if status.get(predicted) != Status.COMPLETED:
        return None  # stopped, failed: nothing to judge
    after = status.get(predicted + 1)
    if after == Status.OOM:
        return f"the prediction is the largest that fits: {predicted} ran, {predicted + 1} did not"
    if after == Status.COMPLETED:
        return f"the prediction was below: {predicted + 1} fits too"
    return None


def _predicted_ladder(values: dict, info) -> tuple[dict[str, list], str]:
    """--from-prediction: the batch size predicted to fit and the next one, to be confirmed by
    two runs (the first should fit, the second not) instead of a doubling ladder."""
    base = validated(values, info.gpu_count).options
    if base.on_dataset:  # each batch size forms a longest batch of its own
        raise InvalidOptions({"dataset": "dataset: --from-prediction searches the dummy data's "
                                         "batches of one length: give --vary batch-size=… for a "
                                         "dataset"})
    said = answer(Request(base, target(info, base.gpu)))
    gpu = info.devices[base.gpu] if info.has_gpu else None
    fit_with = said.largest_batch

    # The runs are on this GPU: a run with convolutions gets their cuDNN workspaces measured
    # on it (predict --measure-convolutions), the margin's answer where they cannot be.
    measure = SaidMeasurer(base.gpu, gpu_key(gpu.nvml_index)) \
        if gpu is not None and not base.distributed else None
    try:
        try:
            fit = fit_with(measure)
        except WorkspaceError as error:
            print(f"convolution workspaces not measured ({error}): the margin's answer",
                  file=sys.stderr, flush=True)
            fit = fit_with(None)
        finally:
            if measure is not None:
                measure.close()
    except prediction.PredictionError as error:
        raise InvalidOptions({"model": str(error)}) from None
    if fit.batch_size is None:
        raise InvalidOptions({"batch_size": "batch_size: not even 1 is predicted to fit"})
    size = fit.batch_size
    how = " (cuDNN's convolution workspaces measured on this GPU)" \
        if fit.workspaces_measured else ""
    if size >= FIELDS["batch_size"].high:  # the option's limit: nothing larger to confirm
        return {"batch_size": [size]}, \
            f"predicted to fit: batch size ≥ {size}{how} (the option's limit); confirming {size}"
    return {"batch_size": [size, size + 1]}, \
        f"predicted to fit: batch size {size}{how}; confirming with {size} and {size + 1}"


def unquantized(planned: list[Checked]) -> list[str]:
    """What the sweep's runs leave out of their models' configs, as `run`'s header says it: a
    line for each model whose quantization_config is left out (the weights unquantized, in the
    runs and the prediction that picks their batch sizes)."""
    named = dict.fromkeys(checked.options.model for checked in planned)
    return [f"model {models.display_name(model)}: {quantized}" for model in named
            if (quantized := models.named_quantization(model))]


def cmd_sweep(args: argparse.Namespace) -> int:
    info = machine()
    base = values_from_args(args, info.has_gpu)
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
        sweep = Sweep(RunManager(store, front="anatomy sweep"), base, vary, args.until_oom,
                      args.name, info.gpu_count)
    except InvalidOptions as error:
        return refused(error)
    for line in unquantized(sweep.planned):
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)
    # with --json, stdout holds the JSON alone
    closed: list[OSError] = []
    sweep.on_event = _sweep_printer(sweep, sys.stderr if args.json else sys.stdout, closed)
    with StopSignals() as signals:
        signals.on_pause = sweep.manager.pause
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
                say(f"\nstopping the sweep{f' ({signals.name})' if signals.received else ''}…",
                     file=sys.stderr)
                sweep.stop()
                sweep.wait()
    if closed:  # the sweep is recorded, stopped; the output's end is said as every command's
        raise closed[0]
    result = grid(store, sweep_id)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_grid(result)
        verdict = _verdict(result, vary["batch_size"][0]) if args.from_prediction else None
        if verdict:
            print(verdict)
    if sweep.status != Status.COMPLETED:
        print(f"sweep {sweep.status}{': ' + sweep.error if sweep.error else ''}", file=sys.stderr)
        return signals.exit_code() if signals.received is not None else 1
    return 0

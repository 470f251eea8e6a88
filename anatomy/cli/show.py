"""`anatomy show`: one run — options, phases, summary, its ranks and operations."""

from __future__ import annotations

import argparse
import json
import sys

from anatomy.analysis import components
from anatomy.analysis.compare import option
from anatomy.analysis.data import data_change
from anatomy.analysis.operations import comparison
from anatomy.analysis.report import IMPORTED, when
from anatomy.cli.arguments import add_store_option, run_id
from anatomy.cli.render import peak, printable, table
from anatomy.cli.stores import reading, report_or_error
from anatomy.store import resolve_path
from anatomy.units import MIB, in_mib
from anatomy.views import text
from anatomy.vocabulary import Phase, Status, phase_name


def register(commands: argparse._SubParsersAction) -> None:
    show = commands.add_parser("show", help="one run: options, phases, summary")
    show.add_argument("run_id", type=run_id, metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="everything stored of the run, as one JSON "
                      "object (what an export carries of it)")
    add_store_option(show)
    show.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    store = reading(args.store)
    if store is None:
        print(f"error: run {args.run_id} is not in {resolve_path(args.store)} (no store there"
              " yet)", file=sys.stderr)
        return 1
    rep = report_or_error(store, args.run_id)
    if rep is None:
        return 1
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2, default=str))
        return 0
    env = rep.environment
    print(f"run {rep.id}  status: {rep.status}  created: {when(rep.created_at)}")
    # What the user gave it (rename, tag, a sweep), as the Runs table lists it.
    labels = {"name": rep.name, "tags": ", ".join(rep.tags), "sweep": rep.sweep}
    if any(labels.values()):
        print("  ".join(f"{what}: {printable(value)}" for what, value in labels.items() if value))
    print(f"device: {rep.device_name}  driver: {env.driver or '-'}  "
          f"torch: {env.torch or '-'}  transformers: {env.transformers or '-'}")
    print(f"measuring: {text.source(rep.backend, rep.memory_api)}")
    if not rep.started_by_anatomy:
        print(f"started by: {rep.origin}")
    if rep.imported is not None:
        print(f"{IMPORTED} from: {rep.imported.words()}")
    # As Compare reads them: nothing unreported, no GPU index on a CPU, no strategy for one
    # process; and no empty value (no LoRA targets).
    shown = {k: option(rep, k) for k in rep.option_names}
    print("options: " + (", ".join(f"{k}={v}" for k, v in shown.items() if v not in (None, ""))
                         or "(not reported)"))
    origin = text.model_origin(rep)
    if origin:
        print(f"model: {rep.model} from {origin} (its config kept in the run)")
    if env.data is not None:
        print(text.data_line(env.data))
        change = data_change(env)
        if change is not None:
            print(text.data_change_line(change))
    print(table([[phase_name(p.name, rep.on_gpu), f"{p.start_s:.2f}", p.memory_mb]
                 for p in rep.phases],
                 ["phase", "start s", in_mib("memory at end")]))
    s = rep.summary
    for line in text.timing_lines(rep):
        print(line)
    print(f"peak: {peak(s.peak_bytes)}   samples: {rep.samples}   steps: {rep.steps}")
    if rep.components:
        parts = rep.components
        print(in_mib("measured components") + ": " + ", ".join(
            f"{name}={parts.get(name) / MIB:.1f}" for name in components.ORDER
            if parts.get(name) is not None))
        for line in (text.measured_batch_words(rep), text.partial_micro_batch_words(rep)):
            if line:
                print(line)
        if rep.evaluated_from is not None:
            print(f"evaluated from {rep.evaluated_from:,.1f} s: the components' "
                  "peak is the training's before the first evaluation; the peak above is the "
                  "whole run's")
    if rep.ranks:
        together = not all(r.measured_alone for r in rep.ranks)  # a store of before
        print(f"{rep.processes}; each rank's memory at its phases' ends"
              + ("" if rep.on_gpu else " (the CPU: all ranks' RSS together)" if together else
                 " (the CPU: the RSS of each rank's own processes)") + ":")
        names = [Phase.KERNEL, Phase.WEIGHTS, Phase.TRAINING]
        print(table([[r.label(), *[(r.phase(n).memory_mb if r.phase(n) else None)
                                     for n in names], r.peak_mb] for r in rep.ranks],
                     ["rank", *[in_mib(phase_name(n, rep.on_gpu)) for n in names],
                      in_mib("peak")]))
        if (silent := text.unrecorded_ranks(rep)) is not None:
            print(silent)
    if rep.operations:
        profile = rep.operations
        print(f"operation classes ({profile.time_source}, {profile.steps} profiled steps):")
        print(table([[r.kind, f"{100 * r.flop_share:.2f}%", f"{100 * r.time_share:.1f}%"]
                      for r in comparison(profile)], ["class", "flop", "time"]))
    for message in rep.messages:  # what the run said, as the pages show it under the summary
        print(f"{message.level}: {printable(message.text)}")
    if rep.error:  # a stop says who stopped it ("stopped by SIGTERM"): no error
        print(rep.error if rep.error.startswith(Status.STOPPED) else f"error: {rep.error}")
    return 0

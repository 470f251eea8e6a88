"""`anatomy watch -- COMMAND`: any command's GPU memory, recorded as a run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection

from anatomy.analysis.report import report
from anatomy.cli.arguments import add_store_option, one_line_name
from anatomy.cli.metrics import add_metrics_options, served
from anatomy.cli.render import PhaseEnds
from anatomy.engine import launch, watch
from anatomy.engine.manager import machine
from anatomy.engine.prometheus import EndpointRefused
from anatomy.store import Store, resolve_path
from anatomy.vocabulary import Phase


def register(commands: argparse._SubParsersAction) -> None:
    watched = commands.add_parser(
        "watch", help="any command's GPU memory as a run: anatomy watch -- python train.py",
        description="Runs COMMAND and records the memory of the GPUs it can use (without a GPU: "
                    "the RSS of its processes). Where the command records itself (the Trainer "
                    "callback or anatomy.start()), its phases and steps join this run; else the "
                    f"run has one '{Phase.PROCESS}' phase. Exits with the command's exit status "
                    "(128+N when signal N killed it), or 128+N when signal N stopped the watch "
                    "(130: Ctrl-C, which stops the command and keeps the record). On several "
                    "hosts, the same watch on each (torchrun --nnodes N --rdzv-id JOB, or "
                    "ANATOMY_RUN_KEY and ANATOMY_RUN_HOSTS) with --store postgresql://user@host/db"
                    " records one run of every host's GPUs and ranks.")
    watched.add_argument("--name", type=one_line_name,
                         help="the run's name (default: the name the command's "
                              "anatomy.start(name=…) gives, else none: lists name it by its "
                              "command)")
    watched.add_argument("--sample-rate", type=int, default=200, dest="sample_rate",
                         help="samples per second per GPU (1 to 2000, default 200)")
    watched.add_argument("--gpus", help="the visible GPUs to sample, e.g. 0,1 (default: all); "
                                        "the command's own CUDA_VISIBLE_DEVICES is left as is")
    add_store_option(watched)
    add_metrics_options(watched)
    watched.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS…")
    watched.set_defaults(func=cmd_watch)


def _phase_lines(store: Store) -> Callable[[int, Collection[int] | None], list[str]]:
    """What the watch prints of each phase as it ends: what `anatomy run` prints (on several
    hosts, each host its own ranks')."""
    ends = PhaseEnds(store)
    return lambda run_id, ranks: ends.new(report(store, run_id), ranks)


def cmd_watch(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    info = machine()
    try:
        across = launch.launch_of(command)
        devices = watch.choose_devices(info, args.gpus)
        if across is not None:  # before the store is made: a file would be left behind
            launch.refuse_file(resolve_path(args.store), across)
        watched: watch.Watch | None = None
        # The endpoint before the store: one refused (its port taken) leaves no store behind
        with served(args, lambda: [] if watched is None else _figures(watched)):
            store = Store(args.store)
            watched = watch.Watch(command, store, info, devices, args.name, args.sample_rate,
                                  across, phase_lines=_phase_lines(store))
            return watched.run()
    except (watch.WatchRefused, launch.LaunchRefused, EndpointRefused) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _figures(watched: watch.Watch) -> list:
    """The watch's run's live figures, once its recording exists."""
    return [] if watched.recording is None else [watched.recording.figures]

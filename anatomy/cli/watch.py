"""`anatomy watch -- COMMAND`: any command's GPU memory, recorded as a run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from anatomy.analysis.report import report
from anatomy.cli.arguments import add_store_option
from anatomy.cli.metrics import add_metrics_options, served
from anatomy.cli.render import PhaseEnds
from anatomy.engine import hosts, joined, watch
from anatomy.engine.manager import machine
from anatomy.engine.prometheus import EndpointRefused
from anatomy.store import Store
from anatomy.vocabulary import Phase


def register(commands: argparse._SubParsersAction) -> None:
    watched = commands.add_parser(
        "watch", help="any command's GPU memory as a run: anatomy watch -- python train.py",
        description="Runs COMMAND and records the memory of the GPUs it can use (without a GPU: "
                    "the RSS of its processes). Where the command records itself (the Trainer "
                    "callback or anatomy.start()), its phases and steps join this run; else the "
                    f"run has one '{Phase.PROCESS}' phase. Exits with the command's exit status "
                    "(128+N when signal N killed it), or 128+N when signal N stopped the watch "
                    "(130: Ctrl-C, which stops the command and keeps the record).")
    watched.add_argument("--name", help="the run's name (default: the name the command's "
                                        "anatomy.start(name=…) gives, else none: lists name it "
                                        "by its command)")
    watched.add_argument("--sample-rate", type=int, default=200, dest="sample_rate",
                         help="samples per second per GPU (1 to 2000, default 200)")
    watched.add_argument("--gpus", help="the visible GPUs to sample, e.g. 0,1 (default: all); "
                                        "the command's own CUDA_VISIBLE_DEVICES is left as is")
    watched.add_argument("--join", metavar="HOST:PORT",
                         help="ranks on several hosts, one run: give every host's watch the same "
                              "address (as torchrun's --rdzv-endpoint) and the same key in "
                              f"{hosts.JOIN_KEY_ENV}; the watch on HOST records the run, the "
                              "others send it their GPUs' samples, phases and steps")
    add_store_option(watched)
    add_metrics_options(watched)
    watched.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS…")
    watched.set_defaults(func=cmd_watch)


def _phase_lines(store: Store) -> Callable[[int], list[str]]:
    """What the watch prints of each phase as it ends: what `anatomy run` prints."""
    ends = PhaseEnds(store)
    return lambda run_id: ends.new(report(store, run_id))


def cmd_watch(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    info = machine()
    try:
        if args.join is None:
            store = Store(args.store)
            watched = watch.Watch(command, store, info, watch.choose_devices(info, args.gpus),
                                  args.name, args.sample_rate, phase_lines=_phase_lines(store))
            with served(args, lambda: _figures(watched)):
                return watched.run()
        return _joining(command, info, args)
    except (watch.WatchRefused, hosts.JoinRefused, EndpointRefused) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _joining(command: list[str], info, args: argparse.Namespace) -> int:
    """One host of a run on several: the run's host where this one can listen on
    --join's address, else one that joins it there."""
    address, key = hosts.join_address(args.join), hosts.join_key()
    devices = watch.choose_devices(info, args.gpus)
    # The command is checked before anything listens or connects.
    store = Store(args.store)
    watched = watch.Watch(command, store, info, devices, args.name, args.sample_rate,
                          phase_lines=_phase_lines(store))
    with served(args, lambda: _figures(watched)):
        listener = hosts.listen(address, key)
        if listener is not None:
            watched.hosts_listener = listener
            return watched.run()
        return joined.Joined(watched, address, key).run()


def _figures(watched: watch.Watch) -> list:
    """The watch's run's live figures, once its recording exists."""
    return [] if watched.recording is None else [watched.recording.figures]

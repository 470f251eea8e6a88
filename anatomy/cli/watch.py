"""`anatomy watch -- COMMAND`: any command's GPU memory, recorded as a run."""

from __future__ import annotations

import argparse
import sys

from anatomy.cli.arguments import add_store_option
from anatomy.engine import watch
from anatomy.engine.manager import machine
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
    watched.add_argument("--name", help="the run's name (default: the command)")
    watched.add_argument("--sample-rate", type=int, default=200, dest="sample_rate",
                         help="samples per second per GPU (1 to 2000, default 200)")
    watched.add_argument("--gpus", help="the visible GPUs to sample, e.g. 0,1 (default: all); "
                                        "the command's own CUDA_VISIBLE_DEVICES is left as is")
    add_store_option(watched)
    watched.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS…")
    watched.set_defaults(func=cmd_watch)


def cmd_watch(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    info = machine()
    try:
        return watch.watch(command, Store(args.store), info, gpus=args.gpus, name=args.name,
                           sample_rate=args.sample_rate)
    except watch.WatchRefused as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

"""The one entry point: the commands' parsers assembled, and every error one line on stderr."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys

from anatomy import __version__
from anatomy.analysis.transformers_index import index_once
from anatomy.cli import dashboard, edit, export, import_, predict, run, runs, show, sweep, watch
from anatomy.cli.arguments import Parser
from anatomy.store import StoreError, resolve_path, store_error

# In the order --help lists them.
COMMANDS = (run, predict, runs, show, export, import_, sweep, watch, edit, dashboard)


def parser() -> argparse.ArgumentParser:
    root = Parser(prog="anatomy", description="GPU memory during model training, phase "
                  "by phase (also: python -m anatomy)")
    root.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = root.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(commands)
    return root


def main(argv: list[str] | None = None) -> int:
    """The command's exit status (EXIT_CODES); every error is one line on stderr."""
    index_once()  # a command that loads transformers (predict, sweep) reads its models once
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except StoreError as error:
        print(f"error: the store {error}", file=sys.stderr)
        return 1 if error.full else 2
    except sqlite3.Error as error:
        print(f"error: the store {store_error(resolve_path(getattr(args, 'store', None)), error)}",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader left (`runs | head`): say nothing more, and let Python's exit say nothing
        # either (its final flush would fail on the same pipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141

"""`anatomy export`: runs as JSON (everything), CSV (the samples), HTML (the charts) or
TensorBoard's event files (a folder per run)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from anatomy.analysis import trackers, transfer
from anatomy.cli.arguments import add_store_option, file_path, run_id
from anatomy.cli.stores import reading
from anatomy.store import resolve_path


def register(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser("export", help="runs as JSON (everything) or CSV (samples)")
    export.add_argument("run_ids", type=run_id, nargs="+", metavar="RUN_ID")
    export.add_argument("--format", choices=("json", "csv", "html", "tensorboard"), required=True,
                        help="json: everything, to import elsewhere; csv: the samples; "
                             "html: the memory charts, a standalone page; tensorboard: event "
                             "files, a folder per run under --output DIR (`tensorboard --logdir "
                             "DIR`; needs pip install \"anatomy[tensorboard]\")")
    export.add_argument("-o", "--output", type=file_path,
                        help="file to write (default, or -: standard output, as import reads -); "
                             "for tensorboard, the folder to write into")
    add_store_option(export)
    export.set_defaults(func=cmd_export)


SQLITE_HEADER = b"SQLite format 3\x00"  # the first bytes of every SQLite database file


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written, judged before any work; None when it can."""
    if path.is_dir():
        return "it is a directory"
    folder = path.absolute().parent
    if not folder.is_dir():
        return f"{folder} is not a directory" if folder.exists() else \
            f"its directory {folder} does not exist"
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "it cannot be written here (permissions, or read-only media)"
    if path.is_file() and _is_sqlite(path):  # `--output runs.sqlite`: every run of it lost
        return "it is an SQLite database (a run store?): the export would write over it"
    return None


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def cmd_export(args: argparse.Namespace) -> int:
    if args.output == "-":  # as import's "-": standard output (a file named "-" was written)
        args.output = None
    # A run named twice (`export 3 3`, a shell's list) once: twice, its JSON was a file import
    # refuses ("the same run as runs[0]") and its CSV held every sample twice.
    args.run_ids = list(dict.fromkeys(args.run_ids))
    if args.format == "tensorboard":
        return _tensorboard(args)
    if args.output:
        problem = _unwritable(Path(args.output))
        where = resolve_path(args.store)  # a file, or a database (never an output's file)
        if isinstance(where, Path) and Path(args.output).resolve() == where.resolve():
            problem = "it is the store the runs are read from"
        if problem:
            print(f"error: cannot write {args.output}: {problem}", file=sys.stderr)
            return 2
    store = _stored(args)
    if store is None:
        return 1
    try:
        if args.format == "json":
            content = json.dumps(transfer.export_runs(store, args.run_ids), default=str)
        elif args.format == "html":
            try:
                from anatomy.views import export  # plotly loads for this export only
            except ModuleNotFoundError as error:
                if error.name != "plotly" and not (error.name or "").startswith("plotly."):
                    raise
                print('error: the HTML export draws with plotly: pip install "anatomy[dashboard]"',
                      file=sys.stderr)
                return 2
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


def _tensorboard(args: argparse.Namespace) -> int:
    """`--format tensorboard --output DIR`: each run's event files under DIR/run-ID."""
    if not args.output:
        print("error: --format tensorboard writes a folder: give --output DIR", file=sys.stderr)
        return 2
    output = Path(args.output)
    try:
        trackers.check_event_folders(output, args.run_ids)
    except trackers.ExportRefused as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("tensorboard") is None:
        print("error: the TensorBoard export writes with tensorboard: "
              'pip install "anatomy[tensorboard]"', file=sys.stderr)
        return 2
    store = _stored(args)
    if store is None:
        return 1
    try:
        written = trackers.write_tensorboard(store, args.run_ids, output)
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot write {output}: {error.strerror or error}", file=sys.stderr)
        return 1
    for folder in written:
        print(f"wrote {folder}")
    print(f"tensorboard --logdir {output}")
    return 0


def _stored(args: argparse.Namespace):
    """The store the runs are read from; None, said in one line, where there is none yet."""
    store = reading(args.store)
    if store is None:
        print(f"error: run {args.run_ids[0]} is not in {resolve_path(args.store)} (no store there"
              " yet)", file=sys.stderr)
    return store

"""`anatomy import`: runs from an exported JSON file, under new ids, all or nothing."""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

from anatomy.analysis import transfer
from anatomy.cli.arguments import add_store_option, file_path
from anatomy.store import DatabaseError, Store, why


def register(commands: argparse._SubParsersAction) -> None:
    load = commands.add_parser("import", help="runs from an exported JSON file, under new ids")
    load.add_argument("file", metavar="FILE", type=file_path,
                      help="the file `export --format json` wrote (- reads standard input)")
    load.add_argument("--copy", action="store_true",
                      help="import runs this store holds already (imported before, or recorded"
                           " here) once more, as copies")
    add_store_option(load)
    load.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    try:
        if args.file == "-":
            if sys.stdin is None:  # started with it closed (`<&-`)
                raise OSError(errno.EBADF, "standard input is closed")
            data = transfer.read_file(sys.stdin.buffer)
        else:
            with Path(args.file).open("rb") as file:
                data = transfer.read_file(file)
    except OSError as error:
        print(f"error: cannot read {args.file}: {error.strerror}", file=sys.stderr)
        return 1
    except transfer.ImportRefused as error:
        print(f"error: {args.file} is refused, nothing was imported: {error}", file=sys.stderr)
        return 2
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
    except DatabaseError as error:
        print(f"error: writing to {store.path} failed, nothing was imported: {why(error)}",
              file=sys.stderr)
        return 1
    for run_id in run_ids:
        print(run_id)
    return 0

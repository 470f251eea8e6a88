"""`anatomy rename`, `tag` and `delete`: a stored run named, tagged or deleted."""

from __future__ import annotations

import argparse
import sys

from anatomy.cli.arguments import add_store_option, run_id
from anatomy.cli.stores import editing, run_or_error
from anatomy.vocabulary import Status


def register(commands: argparse._SubParsersAction) -> None:
    rename = commands.add_parser("rename", help="name a run (an empty name removes it)")
    rename.add_argument("run_id", type=run_id, metavar="RUN_ID")
    rename.add_argument("name", metavar="NAME")
    add_store_option(rename)
    rename.set_defaults(func=cmd_rename)

    tag = commands.add_parser("tag", help="add tags to a run, or remove them")
    tag.add_argument("run_id", type=run_id, metavar="RUN_ID")
    tag.add_argument("tags", nargs="+", metavar="TAG")
    tag.add_argument("--remove", action="store_true", help="remove these tags instead")
    add_store_option(tag)
    tag.set_defaults(func=cmd_tag)

    delete = commands.add_parser("delete", help="delete a run and all it recorded")
    delete.add_argument("run_id", type=run_id, metavar="RUN_ID")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_store_option(delete)
    delete.set_defaults(func=cmd_delete)


def cmd_rename(args: argparse.Namespace) -> int:
    store = editing(args.store, args.run_id)
    if store is None or run_or_error(store, args.run_id) is None:
        return 1
    try:
        store.rename_run(args.run_id, args.name.strip() or None)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"run {args.run_id}: {store.run(args.run_id).name or '(no name)'}")
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    store = editing(args.store, args.run_id)
    run = None if store is None else run_or_error(store, args.run_id)
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
    store = editing(args.store, args.run_id)
    run = None if store is None else run_or_error(store, args.run_id)
    if run is None:
        return 1
    if run.status == Status.RUNNING:  # being recorded still (store/liveness.py)
        print(f"error: run {args.run_id} is still running: stop it first", file=sys.stderr)
        return 2
    if not args.yes:
        if sys.stdin is None or not sys.stdin.isatty():  # None: started with it closed
            print("error: deleting cannot be undone: confirm with --yes (no terminal to ask on)",
                  file=sys.stderr)
            return 2
        samples = store.sample_count(args.run_id)
        what = f"run {args.run_id} ({run.preset}, {run.status}, {samples} samples)"
        try:
            answer = input(f"Delete {what}? This cannot be undone. [y/N] ")
        except EOFError:  # Ctrl-D: no answer, so no
            answer = ""
            print()
        if answer.strip().lower() not in ("y", "yes"):
            print("not deleted")
            return 1
    store.delete_run(args.run_id)
    print(f"deleted run {args.run_id}")
    return 0

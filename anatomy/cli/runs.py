"""`anatomy runs`: the stored runs, as a table or JSON."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from anatomy.analysis.options import located
from anatomy.analysis.report import IMPORTED, run_rows
from anatomy.cli.arguments import add_store_option
from anatomy.cli.render import table
from anatomy.cli.stores import reading
from anatomy.store import STATUSES, checks
from anatomy.units import in_mib
from anatomy.views import text


def register(commands: argparse._SubParsersAction) -> None:
    runs = commands.add_parser("runs", help="the stored runs")
    runs.add_argument("--json", action="store_true", help="the runs as a JSON list, a line's fields by name")
    runs.add_argument("--tag", type=_tag, help="only runs with this tag")
    runs.add_argument("--model", "--preset", dest="preset", metavar="MODEL",
                      help="only runs of this model (a preset, a Hub id, or a path, from here)")
    # the names (a refusal lists choices by repr: "<Status.RUNNING: 'running'>" for a member)
    runs.add_argument("--status", choices=[status.value for status in STATUSES],
                      help="only runs that ended so (or still run)")
    add_store_option(runs)
    runs.set_defaults(func=cmd_runs)


def _tag(value: str) -> str:
    """A tag as `tag` stores it: stripped, not empty, no comma. An empty one (`--tag "$TAG"`,
    TAG unset) listed every untagged run, the column's empty list matching it."""
    if not checks.is_tag(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a tag: a tag is not empty and holds"
                                         " no comma")
    return value.strip()


def cmd_runs(args: argparse.Namespace) -> int:
    filters = {"tag": args.tag, "model": args.preset, "status": args.status}
    # A model as typed, and as a run stores a path (absolute): runs stored before kept it typed.
    models = ({args.preset, located(args.preset, model=True)} if args.preset is not None
              else {None})
    store = reading(args.store)
    rows = []
    if store is not None:
        with store.snapshot():  # one moment's rows: a run deleted meanwhile is listed whole
            rows = sorted((row for model in models for row in
                           run_rows(store, tag=args.tag, preset=model, status=args.status)),
                          key=lambda row: row.id, reverse=True)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    if not rows:
        chosen = ", ".join(f"{k} {v}" for k, v in filters.items() if v is not None)
        print(f"no stored run has {chosen}" if chosen else
              "no runs stored yet: start one with `python -m anatomy run`")
        return 0
    header = ["id", "created", "status", "model", "data", "batch", "prec", in_mib("peak"),
              "Time (s)", "Samples/s", "tags", "name"]
    body = [[r.id, r.created, r.status, r.model or r.preset, text.data_name(r.dataset),
             r.batch_size or "", r.precision or "",
             r.peak_mb if r.peak_mb is not None else "",
             f"{r.time_s:.2f}" if r.time_s else "",
             f"{r.samples_per_second:.2f}" if r.samples_per_second else "",
             ",".join(r.tags), " ".join(w for w in (r.name, f"({IMPORTED})" * bool(r.imported)) if w)]
            for r in rows]
    print(table(body, header))
    return 0

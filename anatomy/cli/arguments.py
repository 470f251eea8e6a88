"""The arguments several commands share: a run's options, the store, a run id, and the exit
statuses under every --help."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from anatomy.analysis.options import FIELDS, RunOptions, defaults_for
from anatomy.store import STORE_ENV, checks, default_store

EXIT_CODES = """exit status:
  0    done (a run: completed)
  1    the run failed, ran out of memory or could not be recorded (a full disk); a command
       failed (no such run, a file or store that cannot be written)
  2    refused before anything started: bad options or arguments, a file or store that is not
       anatomy's, an import refused, or the device is busy
  128+N  stopped by signal N (130: Ctrl-C, 143: SIGTERM, 129: SIGHUP): the run is recorded as
       stopped, with everything measured until then
  141  the output was closed early (a pipe to head): nothing more is printed"""


class Parser(argparse.ArgumentParser):
    """argparse, with the exit statuses under every command's --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def _print_message(self, message: str, file=None) -> None:
        """As argparse's, but a failed write is not dropped: `--help | head` ends as every
        command does when its reader leaves (cli.entry: 141), not with status 0."""
        if message:
            (file or sys.stderr).write(message)


# What a run is given that its memory does not depend on: a prediction takes none of them.
RUN_ONLY = ("seed", "sample_rate", "profile_steps")
# The dataset's text options, as --help names their values.
DATA_METAVARS = {"dataset": "PATH|HUB_ID", "split": "S", "text_column": "C",
                 "tokenizer": "NAME|PATH"}


def _option_default(name: str) -> str:
    """An option's default in words: the same on every machine, or a GPU's and a CPU's."""
    on_gpu, on_cpu = getattr(defaults_for(True), name), getattr(defaults_for(False), name)
    return (f"default {on_gpu}" if on_gpu == on_cpu else
            f"default {on_gpu} on a GPU, {on_cpu} without one")


def add_run_options(parser: argparse.ArgumentParser, predicting: bool = False) -> None:
    """A run's options as flags, each with its range and default; `predicting`: those a
    prediction reads (not RUN_ONLY)."""
    f = FIELDS
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", dest="model", metavar="NAME|PATH|HUB_ID",
                       help=f["model"].help + f" (presets: {', '.join(f['model'].choices)}; "
                       f"{_option_default('model')})")
    model.add_argument("--preset", dest="model", metavar="NAME", help="the same as --model")
    for name in ("batch_size", "seq_len", "dataset_size", "grad_accum", "seed", "sample_rate",
                 "gpu", "profile_steps", "lora_rank", "processes", "max_length"):
        if predicting and name in RUN_ONLY:
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=int, dest=name,
                            help=f"{f[name].help} ({f[name].low} to {f[name].high}; "
                                 f"{_option_default(name)})")
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument("--epochs", type=int,
                       help=f"{f['epochs'].help} ({f['epochs'].low} to {f['epochs'].high}; "
                            f"{_option_default('epochs')})")
    steps.add_argument("--max-steps", type=int, dest="max_steps",
                       help=f"{f['max_steps'].help} ({f['max_steps'].low} to "
                            f"{f['max_steps'].high}; default none: the epochs decide)")
    parser.add_argument("--precision", choices=f["precision"].choices,
                        help=f"{f['precision'].help} ({_option_default('precision')})")
    parser.add_argument("--gpus", metavar="I,J", help=f["gpus"].help)
    parser.add_argument("--strategy", choices=f["strategy"].choices,
                        help=f"{f['strategy'].help} ({_option_default('strategy')})")
    parser.add_argument("--gradient-checkpointing", action="store_true", default=None,
                        help=f["gradient_checkpointing"].help)
    parser.add_argument("--optim", help=f"{f['optim'].help}: {', '.join(f['optim'].choices)} "
                                        f"({_option_default('optim')})")
    for name, metavar in DATA_METAVARS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, metavar=metavar,
                            help=f[name].help)
    parser.add_argument("--padding", choices=f["padding"].choices,
                        help=f"{f['padding'].help} ({_option_default('padding')})")
    parser.add_argument("--lora-targets", dest="lora_targets", nargs="+", metavar="MODULE",
                        help="the module names the adapters wrap, e.g. --lora-targets q_proj "
                             "v_proj, or all-linear (every linear layer but the task's output; "
                             "default: the architecture's; with --lora-rank)")


def options_from_args(args: argparse.Namespace, has_gpu: bool) -> RunOptions:
    values = defaults_for(has_gpu).to_dict()
    for name in FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if isinstance(values.get("lora_targets"), list):  # --lora-targets q_proj v_proj, or q,v
        values["lora_targets"] = ",".join(t.strip(",") for t in values["lora_targets"])
    return RunOptions.from_dict(values)


def add_store_option(parser: argparse.ArgumentParser) -> None:
    """--store, its help saying the file the command would use without it."""
    parser.add_argument("--store", type=store_path, help=f"the run store (default: {_default()})")


def _default() -> str:
    """Where runs go without --store, as this process sees it (%% for argparse's formatting)."""
    home, fallback = str(Path.home()), str(default_store())
    if fallback.startswith(home + os.sep):
        fallback = "~" + fallback[len(home):]
    chosen = os.environ.get(STORE_ENV)
    text = (f"${STORE_ENV}, now {chosen}; without it {fallback}" if chosen else
            f"${STORE_ENV} if set, else {fallback}")
    return text.replace("%", "%%")


def store_path(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no store: give a file, or leave "
                                         f"--store out for the default ({_default()})")
    return text


def file_path(text: str) -> str:
    """A file a command reads or writes: an empty path (`--output "$OUT"` with OUT unset) names
    none, where it was read as the current directory or as standard output."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file")
    return text


def run_id(text: str) -> int:
    """A run id read as the pages read one from their URL: ASCII digits within SQLite's
    integers (int() took "٣" as run 3 and "1_0" as run 10)."""
    value = checks.digits(text.strip())
    if not value:
        raise argparse.ArgumentTypeError(
            f"{checks.shown(text)} is not a run id: a whole number from 1 to {checks.MAX_INTEGER}")
    return value

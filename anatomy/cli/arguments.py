"""The arguments several commands share: a run's options, the store, a run id, and the exit
statuses under every --help."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from anatomy.analysis.options import FIELDS, Kind, OptionField, defaults_for
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


def _option_default(name: str) -> str:
    """An option's default in words: the same on every machine, or a GPU's and a CPU's."""
    on_gpu, on_cpu = getattr(defaults_for(True), name), getattr(defaults_for(False), name)
    return (f"default {on_gpu}" if on_gpu == on_cpu else
            f"default {on_gpu} on a GPU, {on_cpu} without one")


def _help(field: OptionField) -> str:
    """An option's help as RunOptions declares it, with its range and its default."""
    if field.kind == Kind.NUMBER:
        default = (f"default none: {field.unset}" if field.optional else
                   _option_default(field.name))
        return f"{field.help} ({field.limits()}; {default})"
    if field.kind == Kind.CHOICE and _names_its_choices(field):
        return f"{field.help} ({_option_default(field.name)})"
    if field.kind == Kind.CHOICE:
        return f"{field.help}: {', '.join(field.choices)} ({_option_default(field.name)})"
    if field.choices:  # text with suggestions: the model's presets
        return f"{field.help} (presets: {', '.join(field.choices)}; {_option_default(field.name)})"
    if field.example:  # names apart, as the parser takes them
        flag = "--" + field.name.replace("_", "-")
        return f"{field.help}; e.g. {flag} {' '.join(field.example)}"
    return field.help


def _names_its_choices(field: OptionField) -> bool:
    """Whether the option's help says each of its values already (precision, strategy): argparse
    offers them; else the help lists them, and the usage line names the option alone."""
    return all(choice in field.help for choice in field.choices or ())


def add_run_options(parser: argparse.ArgumentParser, predicting: bool = False) -> None:
    """A run's options as flags, generated from RunOptions' declaration: each with its range and
    default; `predicting`: those a prediction reads (not RUN_ONLY). The model's old name
    (--preset) and epochs against max steps are each one choice."""
    model, steps = parser.add_mutually_exclusive_group(), parser.add_mutually_exclusive_group()
    for field in FIELDS.values():
        if predicting and field.name in RUN_ONLY:
            continue
        group = model if field.name == "model" else steps if field.name in STEPS else parser
        flag = "--" + field.name.replace("_", "-")
        kinds: dict[str, Any] = {
            Kind.NUMBER: {"type": int if field.whole else float},
            Kind.FLAG: {"action": "store_true", "default": None},
            # Values the help lists (the optimizers, many) are judged as the form's are.
            Kind.CHOICE: ({"choices": field.choices} if _names_its_choices(field) else
                          {"metavar": field.name.upper()}),
            Kind.TEXT: {"metavar": field.metavar},
            Kind.LIST: {"metavar": field.metavar,
                        **({} if field.name == "gpus" else {"nargs": "+"})},
        }[field.kind]
        group.add_argument(flag, dest=field.name, help=_help(field), **kinds)
        for old in field.old_names:
            group.add_argument("--" + old, dest=field.name, metavar="NAME",
                               help=f"the same as {flag}")


STEPS = ("epochs", "max_steps")  # max steps overrides the epochs: one or the other


def values_from_args(args: argparse.Namespace, has_gpu: bool) -> dict[str, Any]:
    """The options the flags give, over the machine's defaults: RunOptions' values, judged by
    `options.validated` (or `RunOptions.read`)."""
    given = {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}
    return {**defaults_for(has_gpu).to_dict(), **given}


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


def one_line_name(text: str) -> str:
    """A run's or sweep's name: one line of printable text (`checks.one_line`)."""
    try:
        return checks.one_line(text, "name").strip()
    except checks.InvalidValue as error:
        raise argparse.ArgumentTypeError(error.what) from None


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

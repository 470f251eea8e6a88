"""The one entry point: the commands' parsers assembled, and every error one line on stderr."""

from __future__ import annotations

import argparse
import errno
import io
import os
import sys

from anatomy import __version__
from anatomy.analysis import libraries
from anatomy.analysis.transformers_index import index_once
from anatomy.cli import dashboard, edit, export, import_, predict, run, runs, show, sweep, watch
from anatomy.cli.arguments import Parser
from anatomy.store import (
    STORE_ENV,
    BadLocation,
    DatabaseError,
    StoreError,
    resolve_path,
    store_error,
)

# In the order --help lists them.
COMMANDS = (run, predict, runs, show, export, import_, sweep, watch, edit, dashboard)
# The commands that build, train or trace a model, each with the extras it needs beside the
# package: refused where a library they need is older than the package declares. The others
# read the store alone (watch samples a command's memory; the callback in that command says for
# itself whether it can predict).
TRAINING_COMMANDS = {command.__name__: extras for command, extras in (
    (run, ()), (predict, ()), (sweep, ()), (dashboard, (libraries.DASHBOARD,)))}


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
    argv = sys.argv[1:] if argv is None else argv
    refused = _undecodable(argv)
    if refused is not None:
        print(f"error: the argument {refused!r} is not UTF-8 text: anatomy keeps names, tags, "
              "paths and commands as UTF-8", file=sys.stderr)
        return 2
    if isinstance(sys.stdout, io.TextIOWrapper):
        # A terminal or pipe whose encoding lacks a character of a name or tag (LANG=C on an old
        # Python, PYTHONIOENCODING=ascii, Latin-1): its escape, as stderr writes it, not a
        # UnicodeEncodeError traceback.
        sys.stdout.reconfigure(errors="backslashreplace")
    output = _Output(sys.stdout)
    sys.stdout = output
    args = None
    try:
        try:
            index_once()  # a command that loads transformers (predict, sweep) reads its models once
            args = parser().parse_args(argv)  # --help and --version print here, and exit
            extras = TRAINING_COMMANDS.get(args.func.__module__)  # the command's module
            refused = None if extras is None else libraries.refusal(extras)
            if refused is not None:
                print(f"error: {refused}", file=sys.stderr)
                return 2
            return args.func(args)
        finally:
            # What the buffer holds, written while a reader that left can still be told apart:
            # at Python's exit it is "Exception ignored … BrokenPipeError" and status 120.
            output.flush()
    except StoreError as error:
        print(f"error: the store {error}", file=sys.stderr)
        return 1 if error.full else 2
    except BadLocation as error:
        named = "--store" if getattr(args, "store", None) else f"${STORE_ENV}"  # resolve_path's
        print(f"error: {named} {error}", file=sys.stderr)
        return 2
    except DatabaseError as error:
        print(f"error: the store {store_error(resolve_path(getattr(args, 'store', None)), error)}",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader left (`runs | head`, `--help | head`, `run | head`): every command ends
        # alike, 141 and nothing on stderr (as a SIGPIPE would), and Python's exit says nothing
        # either (its final flush would fail on the same pipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        # Ctrl-C in a command that keeps no run going (predict's trace, runs, export): it
        # stops, in a line. run, sweep and watch take their signals themselves (cli.signals).
        print("\ninterrupted", file=sys.stderr)
        return 130
    except OutputFailed as error:
        # `> file` on a full disk: one line, and no second try at exit (its flush would fail).
        if error.fileno is not None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), error.fileno)
        print(f"error: cannot write the output: {error.strerror}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = output.stream


def _undecodable(argv: list[str]) -> bytes | str | None:
    """The first argument that is no UTF-8 text, as its bytes: a Latin-1 terminal's or file
    name's, which Python keeps as lone surrogates and the store (UTF-8) raised on."""
    for word in argv:
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            try:
                return word.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a surrogate of another kind (a caller's own string)
                return word
    return None


class OutputFailed(OSError):
    """Standard output could not be written (a full disk, /dev/full): told apart from the
    command's other OSErrors, which say what they could not read or write themselves."""

    def __init__(self, error: OSError, fileno: int | None):
        super().__init__(error.errno, error.strerror)
        self.fileno = fileno  # None: there is none (started with it closed)


class _Output:
    """Standard output, its write errors raised as OutputFailed (a closed pipe stays a
    BrokenPipeError: the reader left, nothing to say)."""

    def __init__(self, stream):
        self.stream = stream

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as error:
            raise OutputFailed(error, self.stream.fileno()) from None

    def write(self, text: str) -> int:
        if self.stream is None:  # started with it closed (`>&-`): what it had to say is lost
            raise OutputFailed(OSError(errno.EBADF, "standard output is closed"), None)
        return self._guarded(self.stream.write, text)

    def flush(self) -> None:
        if self.stream is not None:
            self._guarded(self.stream.flush)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

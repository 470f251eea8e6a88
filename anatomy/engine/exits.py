"""How a user's script ends, as the phase API learns it, for a run the script left open.

An uncaught error reaches `sys.excepthook`, and Ctrl-C is one (KeyboardInterrupt). But
`sys.exit(1)` and `raise SystemExit("fatal")` skip the hook, and the atexit handler that ends the
run learns nothing of them: Python keeps no trace of the exit it is making. So the exits are
watched where they are made — `sys.exit`, `exit()` and `quit()` — and the script's own frame
says whether it ended by one (its last instruction a return, or not), or by a `raise
SystemExit(...)` of its own whose code its bytecode holds. The name `SystemExit` itself is left
alone: a class put in its place would be what every `except SystemExit:` of the process looks
up, and the real one, which `sys.exit` raises, would pass through them all (a script's own
handler, a forked multiprocessing worker's). A
SIGTERM or SIGHUP, whose default kills the process with no atexit at all, is ended here as a stop
when the script has no handler of its own: the run is recorded, then the signal does what it
would have done.
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from anatomy.engine.endings import Ending, is_oom, stopped_by
from anatomy.vocabulary import Status

RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_UNKNOWN = object()


@contextlib.contextmanager
def stops_while_starting() -> Iterator[list[int]]:
    """While inside, SIGTERM and SIGHUP (where the script leaves them to their default) are
    held: each is noted in the list yielded, for the start to stop its run by once it has one
    (before the run's own handlers were set, such a stop killed the process mid-start and left
    its run to be found "ended without a word"). Noted, not raised: an exception raised in a
    handler lands inside whatever library code runs then (a database connection's close)."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def handle(signum, frame) -> None:
        held.append(signum)

    taken = [signum for signum in STOP_SIGNALS if signal.getsignal(signum) is signal.SIG_DFL]
    for signum in taken:
        signal.signal(signum, handle)

    def give_back() -> None:
        for signum in taken:
            if signal.getsignal(signum) is handle:
                signal.signal(signum, signal.SIG_DFL)

    try:
        yield held
    except BaseException:  # the start failed: a stop held meanwhile ends the process now
        give_back()
        if held:
            deliver(held[0])
        raise
    give_back()


def ending_of(error: BaseException | str | None) -> Ending:
    """How a run ends when the script ends so: by nothing (completed), an error, Ctrl-C, an
    exit."""
    if error is None:
        return Ending(Status.COMPLETED)
    if isinstance(error, KeyboardInterrupt):
        return Ending(Status.STOPPED, stopped_by(signal.SIGINT))
    if isinstance(error, SystemExit):
        return exit_ending(error.code)
    if isinstance(error, BaseException):
        return Ending(Status.OOM if is_oom(error) else Status.FAILED,
                      f"{type(error).__name__}: {error}")
    return Ending(Status.FAILED, str(error))


def exit_ending(code: object) -> Ending:
    """The ending of `sys.exit(code)`: Python's exit status is 0 for None and 0, the number for
    another int, 1 (the text printed) for anything else."""
    if code is None or code == 0:
        return Ending(Status.COMPLETED)
    if isinstance(code, int):
        return Ending(Status.FAILED, f"the script exited with code {code} (sys.exit)")
    return Ending(Status.FAILED, f"the script exited with code 1: {code}")


class ExitWatch:
    """Watches the script's exits while it runs; `ending()` says how it ended, at exit."""

    def __init__(self) -> None:
        self.frame = _script_frame()
        self.code: object = _UNKNOWN
        watch = self

        original_exit = sys.exit

        def exit(status: object = None) -> None:  # noqa: A001 - sys.exit's own name
            watch.code = status
            original_exit(status)

        sys.exit = exit
        for name in ("exit", "quit"):  # site's Quitter objects (absent under python -S)
            if callable(getattr(builtins, name, None)):
                setattr(builtins, name, _Quitter(getattr(builtins, name), self))

    def ending(self) -> Ending:
        """At exit: completed when the script ran to its end, else the exit it made."""
        frame = self.frame
        if frame is None or frame.f_code.co_code[frame.f_lasti] in RETURNS:
            return Ending(Status.COMPLETED)
        code = self.code if self.code is not _UNKNOWN else raised_code(frame)
        if code is _UNKNOWN:
            # `raise SystemExit(main())`, an idiom of scripts that succeed: the code was on the
            # stack and is gone. Called completed, with what is not known said beside it, rather
            # than every such script's run failed.
            return Ending(Status.COMPLETED,
                          "the script ended by raise SystemExit(…), whose exit code anatomy "
                          "cannot read (sys.exit(…) it follows; `anatomy watch` reads any exit)")
        return exit_ending(code)


class _Quitter:
    """`exit()` and `quit()` as site made them, their code noted first (they raise SystemExit
    themselves, never through sys.exit)."""

    def __init__(self, quitter: Callable, watch: ExitWatch):
        self.quitter, self.watch = quitter, watch

    def __call__(self, code: object = None) -> None:
        self.watch.code = code
        self.quitter(code)

    def __repr__(self) -> str:
        return repr(self.quitter)


# What may stand between `SystemExit`, its argument and the raise, by Python version.
_CALLS = {"PRECALL", "CALL", "CALL_FUNCTION"}
_NAMES = {"LOAD_NAME", "LOAD_GLOBAL"}


def raised_code(frame: FrameType) -> object:
    """The code of the `raise SystemExit` or `raise SystemExit(constant)` the frame stopped at,
    read from its bytecode; _UNKNOWN for any other instruction or argument."""
    code = list(dis.get_instructions(frame.f_code))
    at = next((i for i, ins in enumerate(code) if ins.offset == frame.f_lasti), None)
    if at is None or code[at].opname != "RAISE_VARARGS" or code[at].arg != 1:
        return _UNKNOWN
    before = [ins for ins in code[:at] if ins.opname not in ("PUSH_NULL", "NOP", "EXTENDED_ARG")]
    if before and before[-1].opname in _NAMES and before[-1].argval == "SystemExit":
        return None  # `raise SystemExit`
    calls = 0
    while before and before[-1].opname in _CALLS:
        calls += 1
        before.pop()
    if not calls:
        return _UNKNOWN
    if len(before) >= 1 and before[-1].opname in _NAMES and before[-1].argval == "SystemExit":
        return None  # `raise SystemExit()`
    if (len(before) >= 2 and before[-1].opname == "LOAD_CONST"
            and before[-2].opname in _NAMES and before[-2].argval == "SystemExit"):
        return before[-1].argval
    return _UNKNOWN


def _script_frame() -> FrameType | None:
    """The frame of the script `python` runs (`__main__`'s module code), if it runs one."""
    main = sys.modules.get("__main__")
    frame, found = sys._getframe(), None
    while frame is not None:
        if main is not None and frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            found = frame
        frame = frame.f_back
    return found


def on_stop_signals(stop: Callable[[int], bool]) -> None:
    """SIGTERM and SIGHUP, where the script leaves them to their default (ending the process
    unrecorded), call `stop(signum)` first and then end the process as the default would —
    unless `stop` says False: it has taken the signal over, to deliver once the code it
    interrupted has written the run's ending (`deliver`). Only the main thread can set handlers;
    elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handle(signum, frame) -> None:
        now = True
        try:
            now = stop(signum) is not False
        finally:
            if now:
                deliver(signum)

    handle.anatomy_stop = True  # ours: `default_stop_signals` knows it by this
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, handle)


def deliver(signum: int) -> None:
    """End the process by `signum` as its default would."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def default_stop_signals() -> None:
    """In a forked child (a Pool's or a DataLoader's worker), whose run is its parent's: the stop
    signals back to their default where `on_stop_signals` set them, as without anatomy. A
    Python-level handler runs only between bytecodes, so a SIGTERM that lands just before a
    worker blocks on its queue's lock is held until another signal comes: Pool.terminate()
    then waited forever on that worker (1 run in about 20; by default the kernel ends it)."""
    for signum in STOP_SIGNALS:
        if getattr(signal.getsignal(signum), "anatomy_stop", False):
            try:
                signal.signal(signum, signal.SIG_DFL)
            except ValueError:  # not the main thread's to set: nothing changes
                pass

"""The task a process pool's worker runs (a `multiprocessing.Pool`'s, a `ProcessPoolExecutor`'s):
which one, and the moment it returns.

A pool's worker runs task after task, each a trial of a hyperparameter search, say: a run a task
starts with `anatomy.start()` is that task's. The worker's loop frame tells the tasks apart (the
count of tasks it has run, the work item's id) and, on the stack, whether the task's function
still runs; the loop sends each task's result through its results queue, where the task's
return is heard (`on_return`), before the worker waits for its next task.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NamedTuple


class _Loop(NamedTuple):
    """A pool's worker loop: what tells its tasks apart, the local its results go through, and
    where the error of the task whose result it sends is (the frame's function, its local)."""

    key: Callable[[dict], object]
    results: str
    error_in: tuple[str, str]


def _error(value: object) -> BaseException | None:
    """A task's error as its loop sends it: (False, error) from a Pool's, an exception from an
    executor's; wrapped with its traceback (`.exc`) by both."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] is False:
        value = value[1]
    value = getattr(value, "exc", value)
    return value if isinstance(value, BaseException) else None


_LOOPS = {
    ("multiprocessing.pool", "worker"): _Loop(lambda locals_: locals_.get("completed"),
                                              "outqueue", ("worker", "result")),
    ("concurrent.futures.process", "_process_worker"): _Loop(
        lambda locals_: getattr(locals_.get("call_item"), "work_id", None), "result_queue",
        ("_sendback_result", "exception")),
}


class Task(NamedTuple):
    """Where this thread is in a pool's worker: its loop's frame (by id), the task's key, and
    what the loop runs now (the task's function while it runs; once its result is being sent,
    the loop's own queue calls)."""

    loop: int
    key: object
    running: object


def _loop_frame(frame: FrameType | None) -> tuple[FrameType, _Loop, Any] | None:
    callee = None
    while frame is not None:
        loop = _LOOPS.get((frame.f_globals.get("__name__"), frame.f_code.co_name))
        if loop is not None:
            return frame, loop, callee
        frame, callee = frame.f_back, frame.f_code
    return None


def current() -> Task | None:
    """The pool task this thread is in; None outside a pool's worker."""
    found = _loop_frame(sys._getframe(1))
    if found is None:
        return None
    frame, loop, callee = found
    return Task(id(frame), loop.key(frame.f_locals), callee)


class _BeforeSending:
    """The lock a worker's results queue takes to send a result (its writer where it has
    none), which first says that the task whose result it sends has returned (or failed): said
    before the lock is taken, so that the other workers' results do not wait on it."""

    def __init__(self, wrapped, returned: Callable[[BaseException | None], None]):
        self._wrapped, self._returned = wrapped, returned

    def _say(self) -> None:
        try:
            self._returned(_sent_error(sys._getframe(2)))
        except Exception:  # noqa: BLE001, S110 - the task's result goes out whatever anatomy did
            pass

    def __enter__(self):
        self._say()
        return self._wrapped.__enter__()

    def __exit__(self, *exc):
        return self._wrapped.__exit__(*exc)

    def send_bytes(self, *args, **kwargs):
        self._say()
        return self._wrapped.send_bytes(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._wrapped, name)


def _sent_error(frame: FrameType | None) -> BaseException | None:
    """The error of the task whose result the frames up from `frame` are sending."""
    found = _loop_frame(frame)
    if found is None:
        return None
    function, name = found[1].error_in
    while frame is not None:
        if frame.f_code.co_name == function:
            return _error(frame.f_locals.get(name))
        frame = frame.f_back
    return None


def on_return(returned: Callable[[BaseException | None], None]) -> None:
    """Call `returned(error)` each time the pool task this thread is in, or a later one of its
    worker, sends its result (in the worker's thread, before it waits for its next task)."""
    found = _loop_frame(sys._getframe(1))
    if found is None:
        return
    frame, loop, _ = found
    queue = frame.f_locals.get(loop.results)
    for name in ("_wlock", "_writer"):  # SimpleQueue.put: `with _wlock: _writer.send_bytes`
        wrapped = getattr(queue, name, None)
        if isinstance(wrapped, _BeforeSending):
            return
        if wrapped is not None:
            setattr(queue, name, _BeforeSending(wrapped, returned))
            return

"""A fork never copies an open SQLite connection: `os.fork()` waits until this process's store
connections are closed, and none opens until the fork is made.

SQLite keeps each open file's locks in the process's memory (its WAL index's too), and a forked
child inherits that memory without the locks themselves. A child that opened the store while
its parent's collector was mid-write believed it held the locks the parent held: 2 of 12
children's `anatomy.start()` waited 30 s on a lock no process held, and children writing at once
corrupted the store ("database disk image is malformed"). The recording's connections last a
write each (milliseconds), so the fork waits that long at most; a connection the forking thread
itself holds cannot be waited for and is not (SQLite's own advice is not to fork with one open).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

FORK_WAIT_SECONDS = 5.0  # a write stuck on another process's lock is not waited for longer


class _Gate:
    def __init__(self) -> None:
        self.changed = threading.Condition(threading.Lock())
        self.open = 0  # connections open in this process
        self.forking = False
        self.mine = threading.local()  # this thread's open connections

    @contextlib.contextmanager
    def connection(self) -> Iterator[None]:
        with self.changed:
            if not getattr(self.mine, "open", 0):  # a thread that holds one goes on (nesting)
                self.changed.wait_for(lambda: not self.forking, FORK_WAIT_SECONDS)
            self.open += 1
            self.mine.open = getattr(self.mine, "open", 0) + 1
        try:
            yield
        finally:
            with self.changed:
                self.open -= 1
                self.mine.open -= 1
                self.changed.notify_all()

    def before_fork(self) -> None:
        self.changed.acquire()
        self.forking = True
        if not getattr(self.mine, "open", 0):
            self.changed.wait_for(lambda: self.open == 0, FORK_WAIT_SECONDS)
        # held across the fork: no thread is halfway through counting when the child is made

    def after_fork_in_parent(self) -> None:
        self.forking = False
        self.changed.notify_all()
        self.changed.release()

    def after_fork_in_child(self) -> None:
        # Only the forking thread lives on, and it opened nothing (or kept what it held).
        held = getattr(self.mine, "open", 0)
        self.__init__()
        self.open = self.mine.open = held


_GATE = _Gate()
os.register_at_fork(before=_GATE.before_fork, after_in_parent=_GATE.after_fork_in_parent,
                    after_in_child=_GATE.after_fork_in_child)


def connection() -> contextlib.AbstractContextManager[None]:
    """Held while a connection to a store is open: a fork waits for it to close."""
    return _GATE.connection()

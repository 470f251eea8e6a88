"""What ties a run's processes to the process that started them, so that none outlives it.

- **Parent-death signal**: each child asks Linux (`prctl(PR_SET_PDEATHSIG)`) for a signal the
  moment its parent ends — the worker SIGKILL, the sampler SIGTERM, on which it kills the worker's
  whole process group and exits. Where prctl is not available a watchdog thread polls the
  parent's pid. Either way a child whose parent died before the signal was set ends at once.
- **One long-lived launching thread** (`launch`): the kernel sends that signal when the *thread*
  that started the child ends, and a dashboard page's script thread ends after every rerun.
- **The worker leads a process group of its own**: Ctrl-C at a terminal (SIGINT to the
  foreground group) does not reach it — the CLI turns it into a Stop — and a stop ends it with
  every descendant at once (`signal_group`).
- **The kernel ends the training first**: out of memory, Linux's out-of-memory killer ends the
  process of the largest score. The worker (and its ranks) and, where anatomy owns the training,
  the sampler raise theirs (`EXPENDABLE_SCORE`), so that the process that records them is not the
  one ended: after killing the worker, the kernel may kill again before that worker's memory is
  given back (seen in a 1.2 GB cgroup: the CLI ended 3 ms after its worker), and the next largest
  must then be the sampler, whose loss costs the run its last count, not the recorder, whose loss
  costs it its ending. Raising a score needs no privilege; the recorder's own is left as it is.
- **The device lock travels**: the lock file's descriptor is inherited by the children, so the
  `flock` is shared and the device stays taken while any process of the run lives, even when the
  manager died first; it is released when the last of them ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from multiprocessing import reduction

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
WATCH_SECONDS = 0.5  # the watchdog's period, where prctl is not available
# Added to the kernel's badness as thousandths of the memory it can hand out (the cgroup's limit,
# or RAM and swap): half of it puts an expendable process before the recorder and before the
# user's other programs of like size, not before one that holds half the memory more.
EXPENDABLE_SCORE = 500
OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def prctl(option: int, value) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Lifeline:
    """Handed to a child process with its arguments; the child calls `attach()` first thing.

    `lock_fd` is the device lock's file descriptor in the parent (or a tuple of them: a run on
    several GPUs holds one lock each): pickled for a spawned child as multiprocessing's `DupFd`,
    it arrives as the same open file, holding the same flock."""

    def __init__(self, name: str, lock_fd: int | tuple[int, ...] | None = None,
                 own_group: bool = False, death_signal: int = signal.SIGKILL,
                 expendable: bool = False):
        self.name = name
        self.expendable = expendable
        self.parent = os.getpid()
        self.lock_fd = lock_fd
        self.own_group = own_group
        self.death_signal = death_signal

    def __reduce__(self):
        if self.lock_fd is None:
            fd = None
        elif isinstance(self.lock_fd, tuple):
            fd = tuple(reduction.DupFd(f) for f in self.lock_fd)
        else:
            fd = reduction.DupFd(self.lock_fd)
        return _rebuild, (self.name, self.parent, fd, self.own_group, self.death_signal,
                          self.expendable)

    def parent_gone(self) -> bool:
        return os.getppid() != self.parent

    def attach(self) -> None:
        """In the child: lead a group if asked, take the name, be ended first out of memory if
        expendable, and die with the parent."""
        if self.own_group:
            os.setpgid(0, 0)
        if self.expendable:
            raise_oom_score()
        prctl(PR_SET_NAME, self.name.encode()[:15])  # what ps and top show
        if not prctl(PR_SET_PDEATHSIG, int(self.death_signal)):
            threading.Thread(target=self._watch, name="anatomy-lifeline", daemon=True).start()
        if self.parent_gone():  # the parent ended before the signal was asked for
            self._die()

    def _watch(self) -> None:
        while not self.parent_gone():
            time.sleep(WATCH_SECONDS)
        self._die()

    def _die(self) -> None:
        if self.own_group:
            signal_group(os.getpid(), self.death_signal)
        else:
            os.kill(os.getpid(), self.death_signal)


def raise_oom_score(score: int = EXPENDABLE_SCORE) -> None:
    """This process (and the children it starts after) before its parent, out of memory: its
    out-of-memory score raised to `score`, never lowered (that needs a privilege). Nothing where
    Linux's /proc is not."""
    try:
        with open(OOM_SCORE_ADJ, "r+") as adj:
            if int(adj.read()) < score:
                adj.seek(0)
                adj.write(str(score))
    except (OSError, ValueError):
        pass


def _rebuild(name, parent, fd, own_group, death_signal, expendable) -> Lifeline:
    lifeline = Lifeline.__new__(Lifeline)
    lifeline.name, lifeline.parent, lifeline.own_group = name, parent, own_group
    lifeline.death_signal, lifeline.expendable = death_signal, expendable
    # Kept open for the process's life.
    if fd is None:
        lifeline.lock_fd = None
    elif isinstance(fd, tuple):
        lifeline.lock_fd = tuple(f.detach() for f in fd)
    else:
        lifeline.lock_fd = fd.detach()
    return lifeline


RANK_NAME = "anatomy-rank-{}"  # a rank's process name (its local rank): the sampler finds it


def name_rank(local_rank: int) -> None:
    """In a rank of several forked by a launcher: the process's name says its rank (what ps and
    top show, and what the sampler reads to measure each rank's processes apart; a fork keeps no
    environment variable a launcher set after it)."""
    prctl(PR_SET_NAME, RANK_NAME.format(local_rank).encode()[:15])


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a process forked by a launcher (a rank of several): `sig` when its parent ends. A fork
    does not inherit the parent-death signal; without prctl, a watchdog thread."""
    parent = os.getppid()
    if not prctl(PR_SET_PDEATHSIG, int(sig)):
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(WATCH_SECONDS)
            os.kill(os.getpid(), sig)

        threading.Thread(target=watch, name="anatomy-lifeline", daemon=True).start()


def signal_group(pid: int, sig: int) -> None:
    """`sig` to the process group that `pid` leads (itself and its descendants), or to `pid`
    alone when it leads none (yet). Only a live process's group is signalled: a group id is a
    pid, and a pid that ended may come back as someone else's."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def forget_names(*shared) -> None:
    """Unlink the names of the semaphores under `shared` (spawn-context queues, events and
    values), once every process that needed them has opened them (a spawned child opens them by
    name as it unpickles its arguments): their handles work on, and a process killed by SIGKILL
    leaves no name behind for multiprocessing's resource tracker to clean up and warn of
    ("resource_tracker: There appear to be 9 leaked semaphore objects"). Each name's own
    finalizer does it (unlink, unregister), so that nothing is done twice at exit."""
    from multiprocessing import synchronize, util

    names = {lock._semlock.name for lock in _semaphores(shared, depth=4)}
    for finalizer in list(util._finalizer_registry.values()):
        if finalizer._callback is synchronize.SemLock._cleanup and finalizer._args[0] in names:
            finalizer()


def _semaphores(objects, depth: int) -> list:
    """The multiprocessing semaphores held by `objects`, in their attributes `depth` deep."""
    from multiprocessing import synchronize

    found = []
    for shared in objects:
        if isinstance(shared, synchronize.SemLock):
            found.append(shared)
        elif depth and type(shared).__module__.startswith("multiprocessing"):
            found += _semaphores(vars(shared).values() if hasattr(shared, "__dict__") else (),
                                 depth - 1)
    return found


_MAIN_SWAP = threading.Lock()


def _start_clean(process) -> None:
    """Start a spawned process without re-importing the caller's main module in it.

    Spawn re-runs the parent's `__main__` in every child (as `__mp_main__`): a script without an
    `if __name__ == "__main__":` guard would start runs from inside its own worker, and under
    `python -m streamlit` every child imports Streamlit first (+40 MB of RSS in a CPU baseline,
    seconds of start-up). Our targets live in importable modules and need none of it, so the
    main module is hidden while the child's preparation data is written.
    """
    # A Pool's worker is daemonic, and multiprocessing refuses it children ("daemonic processes
    # are not allowed to have children": anatomy.start() in a trial failed it), as it would not
    # end them at exit. Ours end with their parent (the parent-death signal): allowed here.
    config = multiprocessing.current_process()._config
    daemonic = config.get("daemon", False)
    with _MAIN_SWAP:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        config["daemon"] = False
        try:
            process.start()
        finally:
            sys.modules["__main__"] = main
            config["daemon"] = daemonic


# Signals whose Python handlers must run: in the main thread, which only runs them when the
# kernel gives it the signal (or it next runs Python code).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_as_a_job(pause: Callable[[bool], None]) -> None:
    """A SIGTSTP handler's work, in a process whose training leads a process group of its own (a
    terminal's Ctrl-Z reaches the foreground group alone): `pause(True)` stops the training,
    this process then stops as the job does, and `pause(False)` continues the training once this
    process is continued (fg, bg). Where its process group is orphaned (no shell can continue
    it) the kernel ignores the stop, and it returns at once."""
    handler = signal.getsignal(signal.SIGTSTP)
    pause(True)
    signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    try:
        signal.raise_signal(signal.SIGTSTP)  # to this thread: stopped before it returns
    finally:
        signal.signal(signal.SIGTSTP, handler)
        pause(False)


def signals_to_the_main_thread(block: bool = True) -> None:
    """This thread of anatomy's takes no stop signal: the kernel gives a process's signal to any
    thread that does not block it, and one given to a helper thread left the main thread, blocked
    in a lock's wait (a Pool's worker waiting for its next task), unaware of it — its handler
    never ran, the worker never ended, and Pool.terminate() waited for it forever. (`block`
    False: it takes them again, as a thread that starts a child must: the child inherits its
    mask.)"""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no pthread_sigmask here
        signal.pthread_sigmask(signal.SIG_BLOCK if block else signal.SIG_UNBLOCK, STOP_SIGNALS)


class _Launcher:
    """One thread for the process's life starts every child: the parent-death signal follows the
    thread that started a child, not the process. A daemon thread: Python joins its other
    threads when the process begins to exit (before its atexit handlers, where a script's run is
    still being ended), and the children must not take that for their parent's death."""

    def __init__(self) -> None:
        self._jobs: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def _serve(self) -> None:
        while True:
            signals_to_the_main_thread()  # while it waits, which is nearly always
            job, done = self._jobs.get()
            signals_to_the_main_thread(block=False)  # the child starts with none blocked
            try:
                job()
            except BaseException as error:  # noqa: BLE001 - handed back to the caller
                done.error = error
            done.set()

    def run(self, job) -> None:
        with self._guard:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="anatomy-launcher",
                                                daemon=True)
                self._thread.start()
        done = threading.Event()
        done.error = None
        self._jobs.put((job, done))
        done.wait()
        if done.error is not None:
            raise done.error


_LAUNCHER = _Launcher()


_LAUNCHED: weakref.WeakSet = weakref.WeakSet()  # the children `launch` started, while they live


def launch(process) -> None:
    """Start `process` (a spawn-context Process) from the launching thread, main module hidden."""
    _LAUNCHER.run(lambda: _start_clean(process))
    _LAUNCHED.add(process)


def _disown_launched() -> None:
    """In a child forked from this process (os.fork in a user's script): multiprocessing's list
    of children came across the fork, and at the child's exit it would SIGTERM the daemons on
    it and try to join them — ending the parent's sampler, and with it the parent's recording,
    and printing "can only join a child process". They are the parent's, not the child's."""
    from multiprocessing import process as mp_process

    children = getattr(mp_process, "_children", set())
    for child in list(_LAUNCHED):
        children.discard(child)


os.register_at_fork(after_in_child=_disown_launched)

"""Ending a process and everything under it: its process group where it leads one, and its tree
walked to the leaves (psutil) — never the direct child alone, whose children would run on.

The root of a tree is a child of ours that its owner (multiprocessing, subprocess) must reap to
learn its exit code: it is signalled here but waited for through the owner (`wait`), never by
psutil, which would reap it first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterator

import psutil

from anatomy.engine.lifeline import prctl, signal_group

KILL_WAIT_SECONDS = 2.0
LIST_SECONDS = 0.5  # how often a followed tree is listed
FREEZE_ROUNDS = 10  # the tree is walked again until no new process appears (a fork bomb ends)


def descendants(pid: int) -> list[psutil.Process]:
    """Every live process under `pid`, nearest first; [] when it is gone."""
    try:
        root = psutil.Process(pid)
        if not sys.platform.startswith("linux"):
            return root.children(recursive=True)
        born = root.create_time()
    except psutil.Error:
        return []
    children = _children_by_parent()
    found, level = [], children.get(pid, [])
    while level:
        nearer = []
        for child in level:
            try:
                process = psutil.Process(child)
                if process.create_time() >= born:  # not a pid reused by an older process
                    found.append(process)
                    nearer += children.get(child, [])
            except psutil.Error:
                pass  # gone meanwhile: nor are its children under it any more
        level = nearer
    return found


def _children_by_parent() -> dict[int, list[int]]:
    """Each process's children, from one pass over /proc: psutil's own pass (`children`) costs
    three times the CPU (a file object a process), and a sampler lists a run's tree ten times a
    second."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = os.open(f"/proc/{name}/stat", os.O_RDONLY)
        except OSError:
            continue  # gone since listed
        try:
            fields = os.read(stat, 512).rsplit(b")", 1)[1].split(None, 2)  # after "pid (comm)"
        except (OSError, IndexError):
            continue
        finally:
            os.close(stat)
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(pid: int, root: bool = True, known: list[psutil.Process] = ()) -> None:
    """SIGKILL every process under `pid` (and `pid` itself with `root`), and those of `known`
    (found earlier, perhaps no longer under it). Each is frozen first (SIGSTOP), so that none
    starts another meanwhile, and the tree is walked again until no new one appears."""
    frozen: dict[int, psutil.Process] = {}
    found = [*known, *descendants(pid)]
    if root:
        try:
            found.insert(0, psutil.Process(pid))
        except psutil.Error:
            pass
    for _ in range(FREEZE_ROUNDS):
        new = [p for p in found if p.pid not in frozen and alive(p)]
        if not new:
            break
        for process in new:
            try:
                process.suspend()
            except psutil.Error:
                pass
            frozen[process.pid] = process
        found = [d for p in new for d in _children(p)]
    for process in frozen.values():
        try:
            process.kill()
        except psutil.Error:
            pass


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def end_tree(pid: int, exited: Callable[[], bool], wait: Callable[[float], None],
             grace: float) -> None:
    """SIGTERM to `pid`'s group (where it leads one) and to every process under it; after `grace`
    seconds SIGKILL to whatever of the tree is left, found again to its leaves. `exited` says
    whether the root has ended and `wait(seconds)` waits for it, both through its owner."""
    known = descendants(pid)  # before the root ends: its orphans are no longer under it then
    if not exited():
        signal_group(pid, signal.SIGTERM)
    for process in known:
        try:
            process.terminate()
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace
    wait(grace)
    psutil.wait_procs([p for p in known if alive(p)],
                      timeout=max(0.0, deadline - time.monotonic()))
    if not exited():
        signal_group(pid, signal.SIGKILL)
        kill_tree(pid, known=known)
        wait(KILL_WAIT_SECONDS)
    else:
        kill_tree(pid, root=False, known=known)


PR_SET_CHILD_SUBREAPER = 36  # Linux's prctl option (linux/prctl.h)


@contextlib.contextmanager
def adopting_orphans() -> Iterator[bool]:
    """While inside, this process is the subreaper of the processes under it (Linux): one whose
    parent ends is re-parented here rather than to init, so that what a command leaves running
    (a `sleep 60 &` of a script that exits at once, before any listing of its tree saw it) is
    still found (`adopted`) and ended. Yields whether the kernel took it."""
    taken = prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield taken
    finally:
        if taken:  # later orphans go to init again: a test process goes on
            prctl(PR_SET_CHILD_SUBREAPER, 0)


def adopted(since: float, own: Collection[int],
            ours: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
    """This process's live children made at `since` (a create_time) or later, not among `own`
    (the command itself), that `ours` says are of the command (not this process's own helpers):
    with `adopting_orphans`, the processes a command's tree left behind as their parents
    ended, and those under them."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            if child.pid not in own and child.create_time() >= since and alive(child) \
                    and ours(child):
                found += [child, *descendants(child.pid)]
        except psutil.Error:
            continue
    return found


class Tree:
    """A process and those under it, listed while it runs (`refresh`), so that the ones it leaves
    when it ends — orphans, no longer under it — are still known and can be ended too."""

    def __init__(self, pid: int):
        self.pid = pid
        self.known: list[psutil.Process] = []

    def refresh(self) -> None:
        listed = descendants(self.pid)
        pids = {p.pid for p in listed}
        self.known = listed + [p for p in self.known if p.pid not in pids and alive(p)]

    def kill(self) -> None:
        """SIGKILL to it and everything of it, listed now or before."""
        kill_tree(self.pid, known=self.known)

    def end_left(self, grace: float) -> None:
        """Its root has ended: what it left (SIGTERM, SIGKILL after `grace` seconds)."""
        end_left(self.known, grace)


def end_left(known: list[psutil.Process], grace: float) -> None:
    """End what is left of `known` (the tree of a process that has ended: its orphans, found
    while it lived): SIGTERM, then SIGKILL after `grace` seconds to each and all under it."""
    left = [p for p in known if alive(p)]
    if not left:
        return
    for process in left:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(left, timeout=grace)
    for process in still:
        kill_tree(process.pid, root=False, known=[process])

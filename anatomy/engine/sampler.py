"""The sampler process: memory of the GPUs a run can use (NVML), or of the worker's process tree
(RSS).

It starts before the worker, so the baseline is measured, and stops after it, so the end is too.
Samples go out in batches (`protocol.Samples`); the last message is `protocol.SamplerDone` with
the count sent, so the store can prove it lost nothing.

As a process it ignores Ctrl-C and hang-ups (the front decides what they mean: a Stop), counting
them for the front (which learns so that they reached its whole process group); SIGTERM
ends it cleanly, count sent, unless its parent is gone — then nobody reads it, and it kills the
training its parent started (anatomy's worker, a watched command: its group and its whole tree)
before it goes (engine/lifeline.py).

Every STATUS_SECONDS it also reads what nvitop shows (`protocol.DeviceStatus`): a few NVML and
/proc calls, far slower than memory.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import NamedTuple

from anatomy.engine import nvml
from anatomy.engine.lifeline import RANK_NAME, Lifeline, signal_group
from anatomy.engine.processes import LIST_SECONDS, Tree, descendants
from anatomy.engine.protocol import (
    DeviceStatus,
    GpuProcess,
    GpuStatus,
    HostStatus,
    Sample,
    SamplerDone,
    Samples,
    WorkerLeft,
)
from anatomy.store import checks, rank_series
from anatomy.vocabulary import Backend

BATCH_SECONDS = 0.05
UTIL_SECONDS = 0.1  # NVML's utilisation counter itself only changes every ~1/6 s
TREE_SECONDS = 0.1
RANK_SECONDS = 0.5  # a process not known as a rank is asked again after this long
# ... but every tick in its first second seen: a rank just forked names itself a moment later,
# and its first phase (the kernel, 0.1 s) would otherwise end before it is read as the rank's.
FORK_SECONDS = 1.0
RANK_NAME_PATTERN = re.compile(RANK_NAME.format(r"(\d+)"))
STATUS_SECONDS = 0.5  # the device panel: nvitop's own refresh is 2 s; a live chart wants more
# How often a forked copy's pages shared with its parent are read again (/proc/PID/smaps_rollup:
# ~1.5 ms for a process with torch loaded, 150 times an RSS read: never at every tick).
SHARED_SECONDS = 1.0

PARENT_WAIT_SECONDS = 0.5  # a SIGTERM from a dying parent, told from one from outside
PF_EXITING = 0x4  # Linux's task flag: set as a process begins to exit, before its memory goes


def _exiting(pid: int) -> bool:
    """Whether the process has begun to exit (or is gone): from then on it gives its memory back,
    so what is read of it is no longer what it held."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()  # after "pid (comm)"
        except OSError:
            return True
        return bool(int(fields[6]) & PF_EXITING)  # the 9th field: flags
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def rollup(pid: int) -> tuple[int, int, int] | None:
    """A process's resident bytes, its anonymous resident bytes and its proportional share of
    them (Pss_Anon: a page shared by n processes counts 1/n in each), from
    /proc/PID/smaps_rollup; None where it cannot be read (gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as read:
            fields = dict(line.split(b":", 1) for line in read.read().splitlines()[1:])
        return tuple(int(fields[name].split()[0]) * 1024
                     for name in (b"Rss", b"Anonymous", b"Pss_Anon"))
    except (OSError, ValueError, KeyError, IndexError):
        return None


class Family(NamedTuple):
    """A process with forked copies, as last read (every SHARED_SECONDS, and when its copies
    change): the anonymous pages its copies hold that it does not (each counted once,
    whoever shares it), and the RSS then of each copy read (one gone meanwhile is not)."""
    beyond: int
    read: dict[int, int]
    copies: frozenset[int]
    read_at: float

    def counted(self, copies: dict[int, int]) -> int:
        """What the copies add to their head's RSS, at their RSS now (`copies`): what they held
        beyond it when read, and their growth since."""
        return max(0, self.beyond + sum(copies[pid] - rss for pid, rss in self.read.items()
                                        if pid in copies))


class _ProcessTree:
    """RSS of a process and its descendants, and of each training rank's own processes among them
    (a rank and what it started: its data loaders). Finding the descendants walks /proc, which
    costs more than a tick at 1,000 Hz, so the tree is re-listed every TREE_SECONDS, not every
    tick; a process's rank is read once, from its name (lifeline.name_rank: a rank anatomy's
    worker forked) or its LOCAL_RANK (a launcher's exec'd rank, under `anatomy watch`).

    A forked copy of a process of the tree (a DataLoader worker: its command line and rank are
    its parent's) shares its parent's pages until either writes one, and each process's RSS
    counts them: four workers of a 700 MiB training made 1,895 MiB of the tree's RSS where the
    memory in use (PSS) was 736 MiB. A process and its copies (a family) count the process's
    RSS and, once, the anonymous pages its copies hold beyond it — those it wrote since the
    fork, its copies' own, and the old pages they share among themselves once it wrote its own
    (an optimizer step rewrites every weight): the family's anonymous PSS less its head's
    anonymous RSS, read every SHARED_SECONDS; the copies' RSS growth since counts in full at
    every tick. (Counting a copy's RSS less its shared pages missed those old pages: 1,066 MiB
    for a tree whose PSS was 1,431.)"""

    def __init__(self, pid: int):
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.own_pid = os.getpid()
        self.members: list = []
        self.listed_at = float("-inf")
        # pid -> the local rank whose processes it is (found once), or when none was last found:
        # a rank just forked still bears its launcher's name for a moment.
        self.ranks: dict[int, int | float] = {}
        self.first_seen: dict[int, float] = {}  # pid -> when the tree first held it
        self.copies: dict[int, bool] = {}  # pid -> whether it is a forked copy (found once)
        self.young: dict[int, tuple[bool, float]] = {}  # the same in its first FORK_SECONDS
        self.parents: dict[int, int] = {}  # a copy's pid -> its parent's
        self.families: dict[int, Family] = {}  # by the pid of the process the copies are of
        # A root that is itself a rank (the callback or the phase API in one rank of a launch)
        # is the one rank: its data loaders, which inherit its LOCAL_RANK, are not another's.
        self.one_rank = self._local_rank(self.root) is not None

    def _local_rank(self, process) -> int | None:
        try:
            named = RANK_NAME_PATTERN.fullmatch(process.name())
            local = named.group(1) if named else process.environ().get("LOCAL_RANK", "")
        except self.psutil.Error:
            return None  # gone, or another user's: counted in the whole tree alone
        return checks.digits(local)

    def _rank(self, process, t: float) -> int | None:
        if self.one_rank or process is self.root:
            return None
        known = self.ranks.get(process.pid)
        if isinstance(known, int):
            return known
        first = self.first_seen.setdefault(process.pid, t)
        if known is not None and t - known < RANK_SECONDS and t - first >= FORK_SECONDS:
            return None
        found = self._local_rank(process)
        self.ranks[process.pid] = found if found is not None else float(t)
        return found

    def _copy(self, process, t: float) -> bool:
        """Whether `process` is a forked copy of its parent in the tree: its command line and
        its rank (its name, LOCAL_RANK: a fork inherits both) are its parent's; never the root.
        From its first reading (a DataLoader's workers, made again each epoch, peak as they
        start), asked again at each listing in its first FORK_SECONDS: a rank anatomy's worker
        forks bears the worker's name until it names itself."""
        known = self.copies.get(process.pid)
        if known is not None:
            return known
        if process is self.root:
            return False
        asked = self.young.get(process.pid)
        if asked is not None and t - asked[1] < TREE_SECONDS:
            return asked[0]
        try:
            parent = process.parent()
            copy = (parent is not None and parent.pid != self.own_pid
                    and any(m.pid == parent.pid for m in self.members)
                    and self._local_rank(process) == self._local_rank(parent)
                    and process.cmdline() == parent.cmdline())
        except self.psutil.Error:
            copy = False
        if copy:
            self.parents[process.pid] = parent.pid
        if t - self.first_seen.setdefault(process.pid, t) >= FORK_SECONDS:
            self.copies[process.pid] = copy
            self.young.pop(process.pid, None)
        else:
            self.young[process.pid] = (copy, t)
        return copy

    def _head(self, pid: int) -> int:
        """The process a copy is a copy of, through copies of copies (a worker's own fork)."""
        while pid in self.parents and self.copies.get(pid, self.young.get(pid, (False,))[0]):
            pid = self.parents[pid]
        return pid

    def _family(self, head: int, copies: dict[int, int], t: float) -> Family | None:
        """`head`'s family as last read, read again where due; None where it cannot be read."""
        known = self.families.get(head)
        pids = frozenset(copies)
        # Read again when a copy is new (it has no reading), else once due — but not while a
        # copy exits: as its pages go, its siblings' shares rise between one reading and the
        # next, and a family read then added them up twice (a transient 762 MiB of 615 as three
        # copies ended together). A copy gone keeps its share of what its siblings still
        # hold until the next reading: only its own pages are counted a while too long.
        if known is not None and pids <= known.copies and (
                t - known.read_at < SHARED_SECONDS or any(map(_exiting, pids))):
            return known
        own = rollup(head)
        if own is None:  # gone: each counts its RSS, as without copies
            self.families.pop(head, None)
            return None
        # A copy gone meanwhile (a worker ending) is read as nothing: it holds nothing now, and
        # the others are still what they were (not each its whole RSS again).
        theirs = {pid: read for pid, read in zip(pids, map(rollup, pids)) if read is not None}
        beyond = own[2] + sum(pss for _, _, pss in theirs.values()) - own[1]
        family = Family(max(0, beyond), {pid: rss for pid, (rss, _, _) in theirs.items()}, pids,
                        t)
        self.families[head] = family
        return family

    def rss(self, t: float) -> tuple[int, dict[int, int]] | None:
        """The tree's RSS and each rank's (by local rank; {} for a single process)."""
        psutil = self.psutil
        if t - self.listed_at >= TREE_SECONDS:
            # Not the sampler itself: a user's process that records its own run is the
            # sampler's parent, and its tree would otherwise hold the sampler too. A root gone
            # lists nothing under it, and its own RSS, unread, says it is gone (below).
            self.members = [self.root, *(p for p in descendants(self.root.pid)
                                         if p.pid != self.own_pid)]
            self.listed_at = t
        read: dict[int, int] = {}
        for process in self.members:
            try:
                read[process.pid] = process.memory_info().rss
            except psutil.Error:
                read[process.pid] = 0
        if read[self.root.pid] == 0:
            # The worker is gone, or a zombie (whose RSS reads 0): nothing of it to measure.
            # Its last phase keeps the last real figure instead of a 0 MB that never was.
            return None
        counted = dict(read)
        families: dict[int, dict[int, int]] = {}
        for process in self.members:
            if read[process.pid] and self._copy(process, t):
                head = self._head(process.pid)
                if read.get(head):
                    families.setdefault(head, {})[process.pid] = read[process.pid]
        for head, copies in families.items():
            family = self._family(head, copies, t)
            if family is None:
                continue  # unread (a copy just gone): each counts its RSS, as before
            for pid in copies:
                counted[pid] = 0
            counted[head] += family.counted(copies)
        total, by_rank = 0, {}
        for process in self.members:
            rss = counted[process.pid]
            total += rss
            rank = self._rank(process, t)
            # A rank gone or a zombie (RSS 0) until the tree is listed again: no 0 MB for it.
            if rank is not None and rss:
                by_rank[rank] = by_rank.get(rank, 0) + rss
        return total, by_rank


class Reader:
    """One tick's readings, NVML or RSS; the same object is used by tests without a process."""

    def __init__(self, backend: str, gpus: Sequence[int] = (0,), worker_pid=None):
        self.backend = backend
        self.worker_pid = worker_pid  # a multiprocessing.Value, set once the worker has started
        self.gpus = list(gpus) if backend == Backend.NVML else [0]  # NVML indices
        self._util: dict[int, int | None] = {}
        self._util_at = float("-inf")
        self._tree: _ProcessTree | None = None
        self.worker_left: float | None = None  # the last tick the worker was whole, once it exits
        self._whole_at: float | None = None
        if backend == Backend.CPU_RSS:
            from anatomy.engine.cgroups import usable_ram

            self._ram_total = usable_ram()  # a container's limit, where less than the RAM

    def _watch_worker(self, t: float) -> bool:
        """Whether the worker is whole at `t`; the first tick it is not, `worker_left` is set to
        the tick before."""
        pid = self.worker_pid.value if self.worker_pid is not None else 0
        if not pid or self.worker_left is not None:
            return bool(pid) and self.worker_left is None
        if _exiting(pid):
            self.worker_left = self._whole_at if self._whole_at is not None else t
            return False
        self._whole_at = t
        return True

    def read(self, t: float) -> list[Sample]:
        whole = self._watch_worker(t)
        if self.backend == Backend.NVML:  # the device's memory: read before, during and after the worker
            if t - self._util_at >= UTIL_SECONDS:
                self._util = {g: nvml.utilization(g) for g in self.gpus}
                self._util_at = t
            rows = []
            for gpu in self.gpus:
                reading = nvml.memory(gpu)
                if reading is not None:
                    rows.append(Sample(t, gpu, reading.used, reading.reserved, reading.total,
                                       self._util.get(gpu)))
            return rows
        if not whole:
            return []  # not started yet, or exiting: nothing of it to measure (not a 0 MB)
        if self._tree is None:
            pid = self.worker_pid.value
            try:
                self._tree = _ProcessTree(pid)
            except Exception:  # psutil.NoSuchProcess: it ended before its first sample
                return []
        read = self._tree.rss(t)
        if read is None:
            return []
        total, by_rank = read
        # The whole tree under 0, as always; each rank's own processes under 1 + its local rank.
        return [Sample(t, 0, total, None, self._ram_total, None),
                *(Sample(t, rank_series(rank), rss, None, self._ram_total, None)
                  for rank, rss in sorted(by_rank.items()))]


class StatusReader:
    """The device panel's readings: the host's CPU and RAM, and on a GPU machine each GPU's
    utilisation, power and temperature and the processes on it, named by psutil."""

    def __init__(self, backend: str, gpus: Sequence[int] = (0,)):
        import psutil

        self.psutil = psutil
        self.gpus = list(gpus) if backend == Backend.NVML else []
        self.names: dict[int, str | None] = {}
        self.read_at = float("-inf")
        psutil.cpu_percent(None)  # the first call starts the interval the next one measures

    def due(self, t: float) -> bool:
        return t - self.read_at >= STATUS_SECONDS

    def _name(self, pid: int) -> str | None:
        if pid not in self.names:
            try:
                self.names[pid] = self.psutil.Process(pid).name()
            except self.psutil.Error:
                self.names[pid] = None  # another container's, or already gone
        return self.names[pid]

    def read(self, t: float) -> DeviceStatus:
        self.read_at = t
        ram = self.psutil.virtual_memory()
        host = HostStatus(t, self.psutil.cpu_percent(None), ram.total - ram.available, ram.total)
        gpus, processes = [], []
        for gpu in self.gpus:
            gpus.append(GpuStatus(t, gpu, nvml.utilization(gpu), nvml.power(gpu),
                                  nvml.power_limit(gpu), nvml.temperature(gpu)))
            processes += [GpuProcess(t, gpu, p.pid, self._name(p.pid), p.used)
                          for p in nvml.processes(gpu) or ()]
        return DeviceStatus(host, gpus, processes)


class _Training:
    """The training the sampler's parent started (anatomy's worker, a watched command), listed as
    it runs: when the parent dies, nobody reads the sampler, and it ends all of it — the
    processes the training left too, no longer under it once it has died (a command killed by
    its own broken pipe when the watch died), and the folder it trained in (`output_dir`: the
    parent, who removes it as a run ends, is gone). A user's own process, the parent itself, is
    never the sampler's to end."""

    def __init__(self, worker_pid, lifeline: Lifeline, output_dir: str | None = None):
        self.worker_pid, self.lifeline, self.output_dir = worker_pid, lifeline, output_dir
        self.tree: Tree | None = None
        self.listed_at = float("-inf")

    def _pid(self) -> int:
        pid = self.worker_pid.value if self.worker_pid is not None else 0
        return pid if pid != self.lifeline.parent else 0

    def refresh(self, now: float) -> None:
        pid = self._pid()
        if pid and now - self.listed_at >= LIST_SECONDS:
            if self.tree is None or self.tree.pid != pid:
                self.tree = Tree(pid)
            self.tree.refresh()
            self.listed_at = now

    def kill(self) -> None:
        pid = self._pid()
        if pid:
            (self.tree if self.tree is not None and self.tree.pid == pid else Tree(pid)).kill()
            signal_group(pid, signal.SIGKILL)
        if self.output_dir is not None:
            shutil.rmtree(self.output_dir, ignore_errors=True)


def _parent_dying(lifeline: Lifeline, wait: float = PARENT_WAIT_SECONDS) -> bool:
    """Whether the parent is gone or going. The parent-death signal is sent as the *thread*
    that started this process ends, which in a dying process can come a moment before the
    process itself is gone: it is waited for that long."""
    deadline = time.monotonic() + wait
    while True:
        if lifeline.parent_gone() or _exiting(lifeline.parent):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def _as_process(lifeline: Lifeline, training: _Training, heard=None) -> threading.Event:
    """The sampler's own signals, once it is a process of its own; the event is set by a SIGTERM
    (a stop from outside: finish as if told). Each stop signal is counted in `heard` (indexed by
    the signal's number; shared with the front): a process of the front's group, the sampler
    tells it which signals that group got — those its command got too."""
    signalled = threading.Event()

    def hear(signum, frame):  # otherwise ignored
        if heard is not None:
            heard[signum] += 1

    def on_term(signum, frame):
        hear(signum, frame)
        if _parent_dying(lifeline):  # whoever recorded died: the training it started goes too
            training.kill()
            os._exit(0)
        signalled.set()

    signal.signal(signal.SIGINT, hear)
    signal.signal(signal.SIGHUP, hear)
    signal.signal(signal.SIGTERM, on_term)
    lifeline.attach()
    return signalled


def run(queue, stop, backend: str, rate: float, t0: float, gpus: Sequence[int] = (0,),
        worker_pid=None, lifeline: Lifeline | None = None, heard=None,
        output_dir: str | None = None) -> None:
    """Process target: sample the devices `gpus` (NVML indices) at `rate` Hz until `stop` is set.
    `lifeline` is given when it runs as a process of its own (tests run it in a thread); `heard`
    counts the stop signals it gets (`_as_process`); `output_dir`: the training's folder, removed
    with the training when the parent dies (`_Training`)."""
    training = _Training(worker_pid, lifeline, output_dir) if lifeline is not None else None
    signalled = _as_process(lifeline, training, heard) if lifeline is not None else None
    period = 1.0 / rate
    batch: list[Sample] = []
    sent = 0
    ended_by = None
    told_left = False
    try:
        reader = Reader(backend, gpus, worker_pid)
        status = StatusReader(backend, gpus)
        flushed_at = time.monotonic()
        next_tick = flushed_at
        while True:
            if signalled is not None and signalled.is_set():
                ended_by = "SIGTERM"
            stopping = stop.is_set() or ended_by is not None
            now = time.monotonic()
            batch.extend(reader.read(now - t0))
            if status.due(now - t0):
                queue.put(status.read(now - t0))
            if reader.worker_left is not None and not told_left:
                queue.put(WorkerLeft(reader.worker_left))
                told_left = True
            if batch and (stopping or now - flushed_at >= BATCH_SECONDS):
                queue.put(Samples(batch))
                sent += len(batch)
                batch = []
                flushed_at = now
            if stopping:
                break
            if training is not None:
                training.refresh(now)
            if lifeline is not None and lifeline.parent_gone():  # where no signal says so
                os.kill(os.getpid(), signal.SIGTERM)
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -10 * period:
                next_tick = time.monotonic()  # fell far behind (a stalled machine): don't burst
    except Exception:  # noqa: BLE001 - the collector is told why the samples stop here
        ended_by = "an error: " + traceback.format_exc(limit=3).strip().splitlines()[-1]
        if batch:  # what was read before it is kept
            queue.put(Samples(batch))
            sent += len(batch)
    queue.put(SamplerDone(sent, ended_by))

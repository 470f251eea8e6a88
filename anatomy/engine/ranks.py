"""Several training processes on one machine, started through accelerate.

The worker has measured the baseline (before torch loads); it then starts one process per GPU
(`--gpus 0,1`) or per CPU rank (`--processes N`, gloo) with accelerate's `notebook_launcher`:
torch's elastic agent, inside the worker, forks the ranks (so no CUDA context may exist in the
worker yet: it has none), sets RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, and,
when one rank fails, terminates the others (SIGTERM, then SIGKILL) and raises `ChildFailedError`.
Every rank runs the worker's own phases (kernel, weights, training) on its device, and reports
them tagged with its rank (`Source(rank, pid, device)`).

What ties the ranks to the run:
- they are forked into the worker's process group, so a stop (the manager signals the group)
  ends every rank with the worker;
- each asks for SIGKILL when its parent (the worker, where the elastic agent runs) ends;
- each rank writes on a queue of its own, which a thread of the worker forwards to the run's
  queue: a rank killed in the middle of a message (the launcher ends the siblings of one that
  failed) can then only break its own queue, never the collector's.
"""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing as mp
import os
import queue as queue_module
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import psutil

from anatomy import strategies
from anatomy.analysis.models import ModelSpec
from anatomy.analysis.options import RunOptions
from anatomy.engine import protocol
from anatomy.engine.endings import STOP_WORDS, OomKills, death, killed_for_memory, rank_signalled
from anatomy.engine.lifeline import RANK_NAME, die_with_parent, name_rank
from anatomy.engine.reporter import Reporter
from anatomy.engine.training import (
    EXIT_FAILED,
    EXIT_OOM,
    EXIT_PEER_LOST,
    guarded,
    output_folder,
    train_phases,
)
from anatomy.vocabulary import Level, Status

FORWARD_SECONDS = 0.02
WRITTEN_SECONDS = 2.0  # each rank's end written down by its thread, once all have ended
OOM_LOOK_SECONDS = 0.1  # each rank's cgroup's count of out-of-memory kills, read this often
QUIET_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing")


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_words(rank: int, use_cuda: bool, run: RunOptions) -> str:
    """A rank as errors name it: "rank 1 (GPU 3)" (the GPU as --gpus names it), or "rank 1" on
    the CPU."""
    gpus = run.gpu_list()
    return f"rank {rank} (GPU {gpus[rank] if rank < len(gpus) else rank})" if use_cuda \
        else f"rank {rank}"


def _rank(queue, reporter_args: tuple, run: RunOptions, spec: ModelSpec, dataset,
          use_cuda: bool, output_dir: str | None = None) -> None:
    """One rank: the worker's phases on its device; exits with the worker's status."""
    die_with_parent(signal.SIGKILL)
    _default_signals()
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    name_rank(local)
    t0, dwell = reporter_args
    reporter = Reporter(queue, t0, dwell,
                        protocol.Source(rank=rank, device=local if use_cuda else None))
    code = guarded(reporter, lambda: train_phases(reporter, run, spec, dataset, use_cuda, local,
                                                  output_dir),
                   who=rank_words(rank, use_cuda, run))
    queue.close()
    queue.join_thread()  # what it said is in the pipe before the launcher sees it exit
    if code:
        sys.exit(code)


def _default_signals() -> None:
    """A rank is forked from the elastic agent, whose handlers raise `SignalException` on SIGTERM,
    SIGINT, SIGHUP and SIGQUIT: a rank signalled would fail with that traceback as its error (and
    its siblings, which the agent ends with SIGTERM, with theirs). The system's defaults instead
    (SIGINT's too: a KeyboardInterrupt's traceback would be the error; no Ctrl-C reaches a rank,
    which is in the worker's own process group): a rank signalled dies of the signal, and the
    run names it as it names a rank killed."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class _Forwarder:
    """A thread of the worker: every rank's queue into the run's, until told to stop."""

    def __init__(self, queues: list, target):
        self.queues, self.target = queues, target
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="anatomy-ranks", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        for q in self.queues:
            while True:
                try:
                    self.target.put(q.get_nowait())
                except queue_module.Empty:
                    break
                except (EOFError, OSError, ValueError):  # a rank killed mid-message
                    break

    def _run(self) -> None:
        while not self.done.wait(FORWARD_SECONDS):
            self._drain()
        self._drain()

    def stop(self, timeout: float = 2.0) -> None:
        self.done.set()
        self.thread.join(timeout)


def _quiet_launcher() -> None:
    """The elastic agent logs a rank's end with its traceback on the terminal; the run says it
    in one line instead. Each of its modules sets its logger's own level: each is quietened."""
    import torch.distributed.elastic.agent.server.api  # noqa: F401 - its loggers exist then
    import torch.distributed.elastic.multiprocessing.api  # noqa: F401
    import torch.multiprocessing.spawn  # noqa: F401

    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith(QUIET_LOGGERS) and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)


class RankEnd(NamedTuple):
    """How a rank ended, seen the instant it died."""
    t: float  # monotonic
    code: int  # its exit code (-N: killed by signal N)
    for_memory: bool  # by the kernel's out-of-memory killer (endings.OomKills)


class _Deaths:
    """When and how each rank ended, seen the instant it dies. The launcher names only the rank
    its poll met first: with a rank killed, a sibling whose collective lost it may end before
    that poll and be the one named. A thread per rank waits for its end without reaping it
    (waitid with WNOWAIT: the launcher still reaps it), so the first to end is known; the
    out-of-memory killer's count of each rank's cgroup is read while it lives, so that its
    SIGKILL is told from anyone else's. A thread's clock is read when it next holds the GIL: on
    a loaded machine the launcher's SIGTERM to the other ranks can be seen first, so a rank
    ended otherwise is the cause before any ended by that SIGTERM."""

    def __init__(self, world: int):
        self.names = {RANK_NAME.format(local)[:15]: local for local in range(world)}
        self.ended: dict[int, RankEnd] = {}  # by local rank
        self.kills: dict[int, OomKills] = {}  # local ranks whose end a thread waits for
        self.waiting: list[threading.Thread] = []
        self.done = threading.Event()
        threading.Thread(target=self._find, name="anatomy-rank-deaths", daemon=True).start()

    def _find(self) -> None:
        """Each rank names itself as it starts: a thread for each rank found among the children;
        then each one's cgroup's count, read while it lives."""
        me = psutil.Process()
        looked_at = time.monotonic()
        while not self.done.wait(FORWARD_SECONDS):
            if len(self.kills) < len(self.names):
                self._found(me)
            if time.monotonic() - looked_at >= OOM_LOOK_SECONDS:
                for local, kills in list(self.kills.items()):
                    if local not in self.ended:
                        kills.look()
                looked_at = time.monotonic()

    def _found(self, me: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            for child in me.children():
                with contextlib.suppress(psutil.Error):
                    local = self.names.get(child.name())
                    if local is not None and local not in self.kills:
                        self.kills[local] = OomKills(child.pid)
                        self.waiting.append(threading.Thread(
                            target=self._wait, args=(local, child.pid), daemon=True))
                        self.waiting[-1].start()

    def _wait(self, local: int, pid: int) -> None:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped before this thread waited: the launcher names it
            return
        if info is not None:
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            self.ended.setdefault(local, RankEnd(time.monotonic(), code,
                                                 self.kills[local].killed(code)))

    def first_cause(self) -> tuple[int, RankEnd] | None:
        """(local rank, its end) of the first rank to end on its own account: not in success,
        not as a peer that lost it, not by a SIGTERM where another was ended otherwise; None if
        none was seen. Called once the launcher has ended every rank: each thread has seen its
        rank's end, and is let finish writing it down."""
        deadline = time.monotonic() + WRITTEN_SECONDS
        for thread in self.waiting:
            thread.join(max(0.0, deadline - time.monotonic()))
        causes = [(end.code == -signal.SIGTERM, end.t, local) for local, end
                  in list(self.ended.items()) if end.code not in (0, EXIT_PEER_LOST)]
        return (min(causes)[2], self.ended[min(causes)[2]]) if causes else None


@contextlib.contextmanager
def _launcher_files_in(folder: str) -> Iterator[None]:
    """torch's elastic agent keeps its ranks' logs and error files in a temporary folder of its
    own that nothing removes (a /tmp/torchelastic_* a run), and accelerate's launcher takes no
    `logs_specs` to say where: it makes that folder by `tempfile`, here pointed into the run's
    output folder, which goes as the run ends (the ranks, forked meanwhile, keep it too)."""
    saved = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = saved


def launch_ranks(reporter: Reporter, run: RunOptions, spec: ModelSpec, dataset,
                 use_cuda: bool, output_dir: str | None = None) -> int:
    """Train on `run.world_size` processes through accelerate; the worker's exit status (0, or
    the first failing rank's: EXIT_OOM when a rank ran out of memory). `output_dir`: the
    Trainer's, shared by the ranks (training.output_folder)."""
    from accelerate import notebook_launcher
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    world = run.world_size
    what = f"{world} GPUs" if use_cuda else f"{world} CPU processes (gloo)"
    reporter.tell(Level.INFO, f"training on {what} with {strategies.named(run.strategy).label},"
                  " launched through accelerate")
    fork = mp.get_context("fork")
    queues = [fork.Queue() for _ in range(world)]
    forwarder = _Forwarder(queues, reporter.queue)
    deaths = _Deaths(world)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # accelerate's own default, without its warning
    _quiet_launcher()
    try:
        # accelerate prints "Launching training on N CUDAs." even for CPU ranks: not ours to say.
        with output_folder(output_dir) as folder, _launcher_files_in(folder), \
                contextlib.redirect_stdout(io.StringIO()):
            notebook_launcher(_dispatch, args=(queues, (reporter.t0, reporter.dwell), run,
                                               spec, dataset, use_cuda, folder),
                              num_processes=world, master_addr="127.0.0.1",
                              use_port=str(_free_port()))
    except SignalException as error:
        # The worker was signalled (a SIGTERM from outside): its agent has ended the ranks, and
        # the worker dies of the signal as one process does, for the run to say so in one line
        # (not the agent's traceback), once every rank's last words are on the run's queue.
        deaths.done.set()
        forwarder.stop()
        reporter.queue.close()
        reporter.queue.join_thread()
        signal.signal(error.sigval, signal.SIG_DFL)
        os.kill(os.getpid(), error.sigval)
        raise
    except (ChildFailedError, RuntimeError) as error:
        deaths.done.set()
        forwarder.stop()  # every rank's last words reach the run before the worker's own
        failures = getattr(error, "failures", {})
        codes = [f.exitcode for f in failures.values()]
        first = deaths.first_cause()
        # The worker's word on a rank ended without one is dated at that rank's end, not at
        # the launcher's return: of the ranks' failures, the earliest is the run's cause.
        ended_at = None if first is None else first[1].t - reporter.t0
        if failures and first is not None and first[1].for_memory:
            # Killed for memory, without a word; whatever its peers said came after it.
            reporter.failure(Status.OOM, f"{killed_for_memory(rank_words(first[0], use_cuda, run))}"
                             "; the launcher ended the other ranks", at=ended_at)
            return EXIT_OOM
        if not failures:  # the launch itself failed (a rendezvous, a port)
            reporter.failure(Status.FAILED, f"accelerate's launcher failed: {error}")
        elif not any(code in (EXIT_OOM, EXIT_FAILED) for code in codes):
            # No rank said why (killed, os._exit; the others at most lost it as a peer): name
            # the first to end without a word.
            silent = {rank: f for rank, f in failures.items() if f.exitcode != EXIT_PEER_LOST}
            rank, failure = (min(silent.items(), key=lambda item: item[1].timestamp) if silent
                             else error.get_first_failure() if hasattr(error, "get_first_failure")
                             else next(iter(failures.items())))
            rank, code = (first[0], first[1].code) if first else (rank, failure.exitcode)
            who = rank_words(rank, use_cuda, run)
            how = rank_signalled(who, -code) if -code in STOP_WORDS else \
                f"{who} {death(code)} (killed or crashed)"
            reporter.failure(Status.FAILED, f"{how}; the launcher ended the other ranks",
                             at=ended_at)
        return EXIT_OOM if EXIT_OOM in codes else EXIT_FAILED
    deaths.done.set()
    forwarder.stop()
    return 0


def _dispatch(queues: list, reporter_args: tuple, run: RunOptions, spec: ModelSpec, dataset,
              use_cuda: bool, output_dir: str | None = None) -> None:
    """The launcher's entry point in each rank: the rank's own queue, then its training."""
    own = queues[int(os.environ.get("LOCAL_RANK", "0"))]
    _rank(own, reporter_args, run, spec, dataset, use_cuda, output_dir)
